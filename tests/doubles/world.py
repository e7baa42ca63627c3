"""The world the tool doubles share: a small Kubernetes HTTP client, node facts, DaemonSets, the log.

The doubles (`eksctl.py`, `helm.py`) run as subprocesses on PATH, so everything here is plain
Python over HTTP: urllib to the local Kubernetes API (kmock), boto3 to the moto server. They
change that state the way the real tools do (nodes join, DaemonSets schedule pods, a device
plugin makes GPUs allocatable), and each call is appended to DOUBLES_LOG. DOUBLES_SCENARIO
names a JSON file of knobs a test sets: delays per command, a plugin pod that never starts on
a given node, a cluster delete that leaves its NAT gateway behind.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

LOG_ENV = "DOUBLES_LOG"
SCENARIO_ENV = "DOUBLES_SCENARIO"
KUBE_URL_ENV = "DOUBLES_KUBE_URL"

EFA_DAEMONSET = "aws-efa-k8s-device-plugin"  # eksctl v0.230.0 pkg/addons/assets/efa-device-plugin.yaml
NVIDIA_DAEMONSET = "nvidia-device-plugin"
PLUGIN_RESOURCES = {EFA_DAEMONSET: "vpc.amazonaws.com/efa", NVIDIA_DAEMONSET: "nvidia.com/gpu"}

# What EC2 and EKS report for the node types the tests use: vCPUs, memory GiB, GPUs, EFA
# interfaces, max pods (the VPC CNI's ENI × IP limit).
NODE_FACTS: dict[str, tuple[int, int, int, int, int]] = {
    "m7i.xlarge": (4, 16, 0, 0, 58),
    "m7i.2xlarge": (8, 32, 0, 0, 58),
    "g6.12xlarge": (48, 192, 4, 1, 234),
    "g5.12xlarge": (48, 192, 4, 1, 234),
    "p4d.24xlarge": (96, 1152, 8, 4, 737),
}


def scenario() -> dict[str, Any]:
    path = os.environ.get(SCENARIO_ENV)
    if not path or not Path(path).is_file():
        return {}
    return dict(json.loads(Path(path).read_text() or "{}"))


def delay(key: str) -> None:
    """Sleep as long as the scenario says this command takes (the benchmark's known durations)."""
    seconds = float((scenario().get("delays") or {}).get(key, 0))
    if seconds > 0:
        time.sleep(seconds)


def log_call(tool: str, argv: list[str], rc: int, t0: float, **extra: Any) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    rec = {"tool": tool, "argv": argv, "rc": rc, "t0": t0, "t1": time.time(), **extra}
    with open(path, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def fail(message: str, code: int = 1) -> None:
    sys.stderr.write(message.rstrip() + "\n")
    sys.stderr.flush()
    raise SystemExit(code)


def say(message: str) -> None:
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------- quantities and scheduling


def quantity(v: Any) -> float:
    """A Kubernetes quantity as a number (cpu in cores, memory in bytes)."""
    s = str(v)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", s)
    if not m:
        return 0.0
    return float(m.group(1)) * units.get(m.group(2), 1)


def eks_reserved_cpu_m(vcpus: int) -> int:
    """kube-reserved CPU on EKS AMIs: 6 % of the first core, 1 % of the second, 0.5 % of the next two, 0.25 % beyond."""
    m = 60.0 + (10 if vcpus > 1 else 0) + 5 * min(max(vcpus - 2, 0), 2) + 2.5 * max(vcpus - 4, 0)
    return int(m)


def node_allocatable(instance_type: str) -> dict[str, str]:
    vcpus, mem_gib, _, _, max_pods = NODE_FACTS[instance_type]
    capacity_mi = int(mem_gib * 1024 * 0.94)  # what the kernel leaves
    reserved_mi = 255 + 11 * max_pods + 100  # kube-reserved + hard eviction
    return {
        "cpu": f"{vcpus * 1000 - eks_reserved_cpu_m(vcpus)}m",
        "memory": f"{capacity_mi - reserved_mi}Mi",
        "pods": str(max_pods),
        "ephemeral-storage": "95Gi",
    }


def selector_matches(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """A pod spec's nodeSelector and required node affinity (In / Exists) against node labels."""
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = req.get("nodeSelectorTerms") or []
    if not terms:
        return True
    for term in terms:
        ok = True
        for ex in term.get("matchExpressions") or []:
            have = labels.get(ex["key"])
            if (ex["operator"] == "In" and have not in ex.get("values", [])) or (ex["operator"] == "Exists" and have is None):
                ok = False
        if ok:
            return True
    return False


def tolerated(taints: list[dict[str, Any]], tolerations: list[dict[str, Any]]) -> bool:
    for t in taints:
        if t.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(
            (not tol.get("effect") or tol.get("effect") == t.get("effect"))
            and ((tol.get("operator") == "Exists" and (not tol.get("key") or tol.get("key") == t.get("key")))
                 or (tol.get("key") == t.get("key") and str(tol.get("value", "")) == str(t.get("value", ""))))
            for tol in tolerations
        ):
            return False
    return True


# ---------------------------------------------------------------------- Kubernetes over HTTP

PATHS = {
    "Namespace": ("/api/v1", "namespaces", False), "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True), "Secret": ("/api/v1", "secrets", True), "Event": ("/api/v1", "events", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True), "Service": ("/api/v1", "services", True),
    "Deployment": ("/apis/apps/v1", "deployments", True), "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "RayCluster": ("/apis/ray.io/v1", "rayclusters", True), "RayJob": ("/apis/ray.io/v1", "rayjobs", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
}


class Kube:
    """Just enough of the Kubernetes API for the doubles and the emulated controllers."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token  # a kubeconfig user's bearer token: its requests go through the API server's authorizer

    @classmethod
    def from_kubeconfig(cls, path: str, context: str | None = None) -> Kube:
        """The server of `context` (kubectl's --context), else of the first cluster; an unknown context fails as
        kubectl says it (client-go tools/clientcmd/validation.go `errContextNotFound`)."""
        doc = yaml.safe_load(Path(path).read_text())
        if context is None:
            return cls(doc["clusters"][0]["cluster"]["server"])
        ctx = next((c.get("context") or {} for c in doc.get("contexts") or [] if c.get("name") == context), None)
        if ctx is None:
            fail(f"Error in configuration: context was not found for specified context: {context}")
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user = next((u.get("user") or {} for u in doc.get("users") or [] if u.get("name") == ctx.get("user")), {})
        return cls(cluster["server"], user.get("token"))

    def path(self, kind: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base, plural, namespaced = PATHS[kind]
        p = base + (f"/namespaces/{namespace}" if namespaced and namespace else "") + f"/{plural}"
        return p + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def call(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": ctype, "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode("utf-8", "replace")

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        status, body = self.call("GET", self.path(kind, namespace, name))
        return body if status == 200 else None

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        status, body = self.call("GET", self.path(kind, namespace))
        return list((body or {}).get("items") or []) if status == 200 else []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        status, body = self.call("POST", self.path(obj["kind"], meta.get("namespace")), obj)
        if status >= 300:
            raise RuntimeError(f"create {obj['kind']} {meta['name']}: {status} {body}")
        return body or obj

    def ensure(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        if self.get(obj["kind"], meta["name"], meta.get("namespace")) is None:
            return self.create(obj)
        return self.patch(obj["kind"], meta["name"], {k: v for k, v in obj.items() if k != "status"}, meta.get("namespace"))

    def patch(self, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None,
              sub: str | None = None) -> dict[str, Any]:
        status, body = self.call("PATCH", self.path(kind, namespace, name, sub), patch, "application/merge-patch+json")
        if status >= 300:
            raise RuntimeError(f"patch {kind} {name}: {status} {body}")
        return body

    def delete(self, kind: str, name: str, namespace: str | None = None) -> bool:
        status, _ = self.call("DELETE", self.path(kind, namespace, name))
        return status < 300


def pod_name(prefix: str, seed: str) -> str:
    import hashlib

    return f"{prefix}-{hashlib.sha1(seed.encode()).hexdigest()[:5]}"


def running_pod(name: str, namespace: str, node: str, labels: dict[str, str], spec: dict[str, Any],
                owner: tuple[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1]}]
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {**spec, "nodeName": node},
        "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"},
                                                      {"type": "Ready", "status": "True"}]},
    }


def reconcile_daemonsets(kube: Kube) -> None:
    """The DaemonSet controller and the kubelet's device-plugin registration, for kube-system.

    Each DaemonSet gets a Running pod on every Ready node its selector, affinity and
    tolerations admit (unless the scenario says its pod never starts on that node); a device
    plugin's pod makes its resource allocatable on the node, and the resource goes when the
    pod goes.
    """
    missing = scenario().get("plugin_missing") or {}
    stuck = scenario().get("plugin_stuck") or {}  # {daemonset: {node pattern: kubelet state}}: its pod there never starts
    nodes = kube.list("Node")
    gpu_nodes = sorted(n["metadata"]["name"] for n in nodes if (n["metadata"].get("labels") or {}).get("role") == "gpu-worker")
    dss = {d["metadata"]["name"]: d for d in kube.list("DaemonSet", "kube-system")}
    pods = kube.list("Pod", "kube-system")
    for ds_name, resource in PLUGIN_RESOURCES.items():
        ds = dss.get(ds_name)
        spec = ((ds or {}).get("spec") or {}).get("template", {}).get("spec", {})
        desired = 0
        ready = 0
        for node in nodes:
            nname = node["metadata"]["name"]
            labels = node["metadata"].get("labels") or {}
            fits = ds is not None and selector_matches(spec, labels) and tolerated(
                (node.get("spec") or {}).get("taints") or [], spec.get("tolerations") or [])
            skip = any(_names(pat, nname, gpu_nodes) for pat in missing.get(ds_name, []))
            pname = pod_name(ds_name, nname)
            have = next((p for p in pods if p["metadata"]["name"] == pname), None)
            if fits:
                desired += 1
            state = next((s for pat, s in (stuck.get(ds_name) or {}).items() if _names(pat, nname, gpu_nodes)), None)
            if fits and state is not None:
                skip = True
                if have is None:
                    _stuck_pod(kube, pname, nname, {"name": ds_name}, spec, ("DaemonSet", ds_name), state)
                have = None  # kept, as the DaemonSet controller keeps a pod that never starts
            elif fits and not skip:
                ready += 1
                if have is None:
                    kube.create(running_pod(pname, "kube-system", nname, {"name": ds_name}, spec, ("DaemonSet", ds_name)))
            elif have is not None:
                kube.delete("Pod", pname, "kube-system")
            count = _plugin_count(resource, node) if fits and not skip else 0
            current = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
            if str(current or "0") != str(count):
                kube.patch("Node", nname, {"status": {"allocatable": {resource: str(count)},
                                                      "capacity": {resource: str(count)}}})
        if ds is not None:
            kube.patch("DaemonSet", ds_name, {"status": {"desiredNumberScheduled": desired, "numberReady": ready,
                                                         "currentNumberScheduled": ready}}, "kube-system")


# What the kubelet reports for a container that cannot start: the waiting reason (pkg/kubelet/images/types.go,
# kuberuntime) with its message, or, for a volume, a FailedMount event on a pod left Pending.
KUBELET_STATES = {
    "ImagePullBackOff": 'Back-off pulling image "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.6"',
    "CrashLoopBackOff": "back-off 5m0s restarting failed container",
    "CreateContainerConfigError": 'secret "hf-token" not found',
}


def _stuck_pod(kube: Kube, name: str, node: str, labels: dict[str, str], spec: dict[str, Any], owner: tuple[str, str],
               state: str) -> None:
    pod = running_pod(name, "kube-system", node, labels, spec, owner)
    container = ((spec.get("containers") or [{}])[0]).get("name", "main")
    status: dict[str, Any] = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
    if state in KUBELET_STATES:
        status["containerStatuses"] = [{"name": container, "ready": False, "restartCount": 5 if state == "CrashLoopBackOff" else 0,
                                        "state": {"waiting": {"reason": state, "message": KUBELET_STATES[state]}}}]
    pod["status"] = status
    kube.create(pod)
    if state == "FailedMount":
        kube.create({"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{name}.failedmount", "namespace": "kube-system"},
                     "involvedObject": {"kind": "Pod", "name": name, "namespace": "kube-system"}, "reason": "FailedMount",
                     "type": "Warning", "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "message": 'MountVolume.SetUp failed for volume "infiniband-volume" : hostPath type check failed: '
                                "/dev/infiniband is not a directory"})


def _names(pattern: str, node: str, gpu_nodes: list[str]) -> bool:
    """A node by glob, or `gpu:N`: the N-th GPU node by name (names are only known once nodes exist)."""
    if pattern.startswith("gpu:"):
        i = int(pattern[4:])
        return i < len(gpu_nodes) and gpu_nodes[i] == node
    return fnmatch.fnmatch(node, pattern)


def _plugin_count(resource: str, node: dict[str, Any]) -> int:
    itype = (node["metadata"].get("labels") or {}).get("node.kubernetes.io/instance-type", "")
    facts = NODE_FACTS.get(itype)
    if facts is None:
        return 0
    return facts[2] if resource == "nvidia.com/gpu" else facts[3]
