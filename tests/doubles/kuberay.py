"""The KubeRay operator and the scheduler, as the tests need them: a thread that advances RayClusters.

KubeRay's controller does not run here, so this does its visible part the way it would: for
each RayCluster (only while the operator's Deployment is Available) it creates a head pod and
one pod per worker replica, labelled `ray.io/cluster`, `ray.io/node-type`, `ray.io/group`, and
the head Service `<cluster>-head-svc` (its dashboard port is what `raydlc` port-forwards to);
binds each to a node the way kube-scheduler would (nodeSelector, taints and tolerations, and
requests against allocatable minus what is already bound), leaving it Pending with a
FailedScheduling event naming the shortfall otherwise; sets the RayCluster's status; and
deletes the pods of a RayCluster that is gone (owner-reference garbage collection). With
`enableInTreeAutoscaling` it makes the autoscaler's Role and RoleBinding as KubeRay v1.7.0 does
(`common/rbac.go` BuildRole, BuildRoleBinding; `raycluster_controller.go` reconcileAutoscalerRole/RoleBinding):
both named after the cluster, the binding's one subject the head's service account
(`utils.GetHeadGroupServiceAccountName`: the head template's `serviceAccountName`, else the cluster's name).

Pods are made from the group's template once and never changed after (KubeRay v1.7.0 does not
patch running pods). With `spec.upgradeStrategy.type: Recreate` it does what
`raycluster_controller.go` does: every head pod carries the annotation
`ray.io/upgrade-strategy-recreate-hash`, a hash of the spec with replicas, min/max replicas,
workersToDelete, tolerations, scheduling gates and the upgrade strategy muted
(`utils.GenerateHashWithoutReplicasAndWorkersToDelete`), and `ray.io/kuberay-version`; when the
head pod's hash is set and differs from the spec's, `shouldRecreatePodsForUpgrade` says so and
`reconcilePods` deletes every pod of the cluster, to be created again from the new templates.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
from typing import Any

from world import Kube, quantity, selector_matches, tolerated

RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "vpc.amazonaws.com/efa")
HASH_KEY, VERSION_KEY, KUBERAY_VERSION = "ray.io/upgrade-strategy-recreate-hash", "ray.io/kuberay-version", "v1.7.0"


def spec_hash(spec: dict[str, Any]) -> str:
    """The spec's hash with what does not call for new pods muted (GenerateHashWithoutReplicasAndWorkersToDelete)."""
    s = copy.deepcopy(spec)
    for tmpl in [(s.get("headGroupSpec") or {}).get("template") or {}] + [(g.get("template") or {}) for g in s.get("workerGroupSpecs") or []]:
        for key in ("tolerations", "schedulingGates"):
            (tmpl.get("spec") or {}).pop(key, None)
    for g in s.get("workerGroupSpecs") or []:
        for key in ("replicas", "minReplicas", "maxReplicas"):
            g.pop(key, None)
        (g.get("scaleStrategy") or {}).pop("workersToDelete", None)
    s.pop("upgradeStrategy", None)
    return hashlib.sha1(json.dumps(s, sort_keys=True).encode()).hexdigest()


def head_service_account(rc: dict[str, Any]) -> str:
    """KubeRay v1.7.0 utils.GetHeadGroupServiceAccountName."""
    name = ((rc["spec"]["headGroupSpec"].get("template") or {}).get("spec") or {}).get("serviceAccountName")
    return str(name or rc["metadata"]["name"])


def autoscaler_rbac(rc: dict[str, Any]) -> list[dict[str, Any]]:
    """The Role and RoleBinding KubeRay makes for the autoscaler sidecar; none without in-tree autoscaling."""
    if not rc["spec"].get("enableInTreeAutoscaling"):
        return []
    ns, name = rc["metadata"]["namespace"], rc["metadata"]["name"]
    meta = {"name": name, "namespace": ns, "labels": {"ray.io/cluster": name}}
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
             {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
             {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]}]
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": dict(meta), "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "subjects": [{"kind": "ServiceAccount", "name": head_service_account(rc), "namespace": ns}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
    ]


def _requests(spec: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for k, v in req.items():
            out[k] = out.get(k, 0.0) + quantity(v)
    return out


class Operator:
    def __init__(self, url: str, interval: float = 0.1, pod_delay: float = 0.0) -> None:
        self.kube = Kube(url)
        self.interval = interval
        self.pod_delay = pod_delay  # how long the pods take to appear (image pull, container start)
        self.first_seen: dict[tuple[str, str], float] = {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="kuberay-emulator", daemon=True)
        self.errors: list[str] = []
        self.paused = threading.Event()

    def __enter__(self) -> Operator:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(5)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            if not self.paused.is_set():
                try:
                    self.tick()
                except Exception as e:  # kept for the test to see; the loop goes on
                    self.errors.append(repr(e))
            self.stop_event.wait(self.interval)

    def operator_up(self) -> bool:
        for d in self.kube.list("Deployment"):
            if d["metadata"]["name"] == "kuberay-operator":
                return int((d.get("status") or {}).get("availableReplicas", 0) or 0) >= 1
        return False

    def watched(self) -> set[str]:
        """The operator's `--watch-namespace` list (KubeRay v1.7.0 main.go: comma-separated; empty or absent: all)."""
        for d in self.kube.list("Deployment"):
            if d["metadata"]["name"] == "kuberay-operator":
                pod = ((d.get("spec") or {}).get("template") or {}).get("spec") or {}  # tests' bare Deployments have none
                args = [str(a) for c in pod.get("containers") or [] for a in c.get("args") or []]
                for i, a in enumerate(args):
                    if a == "--watch-namespace" and i + 1 < len(args):
                        return {n for n in args[i + 1].split(",") if n}
                    if a.startswith("--watch-namespace="):
                        return {n for n in a.split("=", 1)[1].split(",") if n}
        return set()

    def tick(self) -> None:
        clusters = self.kube.list("RayCluster")
        if not clusters and not self.first_seen:
            return  # nothing to run yet, and no pods of ours to collect
        pods = self.kube.list("Pod")
        names = {(c["metadata"]["namespace"], c["metadata"]["name"]) for c in clusters}
        for kind, objs in (("Pod", pods), ("Service", self.kube.list("Service"))):
            for p in objs:
                owner = (p["metadata"].get("labels") or {}).get("ray.io/cluster")
                if owner and (p["metadata"]["namespace"], owner) not in names and (p["metadata"].get("ownerReferences")):
                    self.kube.delete(kind, p["metadata"]["name"], p["metadata"]["namespace"])
        if not self.operator_up():
            return
        watched = self.watched()
        for rc in clusters:
            if watched and rc["metadata"]["namespace"] not in watched:
                continue  # an operator started with --watch-namespace reconciles only those namespaces
            try:
                self._reconcile(rc, pods)
            except RuntimeError as e:
                if ": 404 " not in str(e):  # deleted meanwhile, as a controller sees it
                    raise

    def _reconcile(self, rc: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        ns, name = rc["metadata"]["namespace"], rc["metadata"]["name"]
        if time.monotonic() - self.first_seen.setdefault((ns, name), time.monotonic()) < self.pod_delay:
            return
        spec = rc["spec"]
        mine = [p for p in pods if (p["metadata"].get("labels") or {}).get("ray.io/cluster") == name
                and p["metadata"]["namespace"] == ns]
        if self._should_recreate(spec, mine):
            for p in mine:
                self.kube.delete("Pod", p["metadata"]["name"], ns)
            return
        for obj in autoscaler_rbac(rc):
            if self.kube.get(obj["kind"], name, ns) is None:
                self.kube.create(obj)
        wanted = [("head", "headgroup", f"{name}-head", spec["headGroupSpec"]["template"])]
        for g in spec.get("workerGroupSpecs") or []:
            for i in range(int(g.get("replicas", 0))):
                wanted.append(("worker", g["groupName"], f"{name}-{g['groupName']}-worker-{i:05x}", g["template"]))
        have = {p["metadata"]["name"]: p for p in mine}
        for kind, group, pname, template in wanted:
            if pname not in have:
                labels = {**(template.get("metadata", {}).get("labels") or {}),
                          "ray.io/cluster": name, "ray.io/node-type": kind, "ray.io/group": group}
                annotations = {HASH_KEY: spec_hash(spec), VERSION_KEY: KUBERAY_VERSION} if kind == "head" else {}
                have[pname] = self.kube.create({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pname, "namespace": ns, "labels": labels, "annotations": annotations,
                                 "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name}]},
                    "spec": template.get("spec") or {}, "status": {"phase": "Pending"},
                })
        self._head_service(ns, name)
        self._schedule(ns, [have[w[2]] for w in wanted])
        fresh = {p["metadata"]["name"]: p for p in self.kube.list("Pod", ns)}
        head_ready = any(_ready(fresh.get(w[2])) for w in wanted if w[0] == "head")
        running = sum(1 for w in wanted if w[0] == "worker" and (fresh.get(w[2]) or {}).get("status", {}).get("phase") == "Running")
        want_workers = len(wanted) - 1
        state = "ready" if head_ready and running == want_workers else ""
        self.kube.patch("RayCluster", name, {"status": {"state": state or None, "readyWorkerReplicas": running,
                                                        "desiredWorkerReplicas": want_workers}}, ns, sub="status")

    @staticmethod
    def _should_recreate(spec: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
        """shouldRecreatePodsForUpgrade: Recreate asked for, and the head pod's hash set and not the spec's."""
        if ((spec.get("upgradeStrategy") or {}).get("type")) != "Recreate":
            return False
        heads = [p for p in pods if (p["metadata"].get("labels") or {}).get("ray.io/node-type") == "head"]
        if not heads:
            return False
        notes = heads[0]["metadata"].get("annotations") or {}
        if notes.get(VERSION_KEY, "") not in ("", KUBERAY_VERSION):
            return False  # another operator version made it: KubeRay only re-annotates the head pod
        return bool(notes.get(HASH_KEY)) and notes[HASH_KEY] != spec_hash(spec)

    def _head_service(self, ns: str, name: str) -> None:
        """KubeRay's `<cluster>-head-svc`: ClusterIP, selecting the head pod, GCS/dashboard/client ports."""
        svc = f"{name}-head-svc"
        if self.kube.get("Service", svc, ns) is not None:
            return
        head = {"ray.io/cluster": name, "ray.io/node-type": "head"}
        self.kube.create({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": svc, "namespace": ns, "labels": dict(head),
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name}]},
            "spec": {"type": "ClusterIP", "selector": head, "ports": [
                {"name": "gcs-server", "port": 6379}, {"name": "dashboard", "port": 8265}, {"name": "client", "port": 10001}]},
        })

    def _schedule(self, ns: str, pods: list[dict[str, Any]]) -> None:
        nodes = self.kube.list("Node")
        bound = self.kube.list("Pod")
        for pod in pods:
            if (pod.get("spec") or {}).get("nodeName"):
                continue
            need = _requests(pod.get("spec") or {})
            reasons: dict[str, int] = {}
            chosen = None
            for n in nodes:
                nname = n["metadata"]["name"]
                labels = n["metadata"].get("labels") or {}
                if not selector_matches(pod["spec"], labels):
                    reasons["node(s) didn't match Pod's node affinity/selector"] = reasons.get(
                        "node(s) didn't match Pod's node affinity/selector", 0) + 1
                    continue
                taints = (n.get("spec") or {}).get("taints") or []
                if not tolerated(taints, pod["spec"].get("tolerations") or []):
                    key = f"node(s) had untolerated taint {{{taints[0]['key']}: {taints[0].get('value', '')}}}"
                    reasons[key] = reasons.get(key, 0) + 1
                    continue
                alloc = (n.get("status") or {}).get("allocatable") or {}
                used = dict.fromkeys(RESOURCES, 0.0)
                for b in bound:
                    if (b.get("spec") or {}).get("nodeName") == nname:
                        for r, v in _requests(b["spec"]).items():
                            used[r] = used.get(r, 0.0) + v
                short = [r for r in RESOURCES if need.get(r, 0) > 0 and need[r] > quantity(alloc.get(r, 0)) - used.get(r, 0) + 1e-9]
                if short:
                    for r in short:
                        reasons[f"Insufficient {r}"] = reasons.get(f"Insufficient {r}", 0) + 1
                    continue
                chosen = nname
                break
            pname = pod["metadata"]["name"]
            if chosen is not None:
                self.kube.patch("Pod", pname, {"spec": {"nodeName": chosen}, "status": {
                    "phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                                       {"type": "Ready", "status": "True"}]}}, ns)
                bound.append({**pod, "spec": {**pod["spec"], "nodeName": chosen}})
                continue
            msg = f"0/{len(nodes)} nodes are available: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())) + "."
            self.kube.patch("Pod", pname, {"status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg}]}}, ns)
            ev = f"{pname}.failedscheduling"
            body = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": ev, "namespace": ns},
                    "involvedObject": {"kind": "Pod", "name": pname, "namespace": ns}, "reason": "FailedScheduling",
                    "message": msg, "type": "Warning", "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            if self.kube.get("Event", ev, ns) is None:
                self.kube.create(body)
            else:
                self.kube.patch("Event", ev, {"message": msg, "lastTimestamp": body["lastTimestamp"]}, ns)


def _ready(pod: dict[str, Any] | None) -> bool:
    if not pod:
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])
