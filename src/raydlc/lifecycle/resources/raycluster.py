"""The RayCluster and what it needs in its namespace: the namespace, the HF token Secret, the NetworkPolicies.

`up` applies them (create or merge-patch) and is done when the head is Ready and every worker
Running, naming the scheduler's reason for each pod that is not. When the running pods differ from
the templates it would apply (image, env, resources, node selector), applying makes KubeRay
recreate every Ray pod (the rendered `upgradeStrategy: Recreate`), which stops running jobs: `up`
says what changed and goes ahead only with `--yes` or a "yes" on the terminal. `down` deletes them (and any
RayJob), waits until no Ray pod is left, and removes the namespace when raydlc made it.
"""

from __future__ import annotations

import base64
import copy
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from raydlc.edges import kube as k8s
from raydlc.lifecycle.resource import Resource, api_unreachable, gone, gone_or_unseen, kube_if_cluster, look_inside
from raydlc.lifecycle.resources import raytoken
from raydlc.lifecycle.stuck import StuckWatch
from raydlc.lifecycle.types import Observation, StepFailed, StepPlan
from raydlc.render import FILES, auth, ownership
from raydlc.render.autoscaler import enabled as elastic
from raydlc.render.bucket import SERVICE_ACCOUNT
from raydlc.render.eksctl import OWNER_TAG
from raydlc.render.netpol import render_netpol
from raydlc.render.raycluster import SECRET_KEYS, SECRET_NAME

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.lifecycle.context import Context

MANAGED_BY = {"app.kubernetes.io/managed-by": "raydlc"}
Pods = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # (head pods, worker pods)


@dataclass(frozen=True)
class PodRow:
    name: str
    type: str
    phase: str
    ready: bool
    node: str | None


@dataclass(frozen=True)
class RayClusterView:
    """The RayCluster as `raydlc status` shows it: its state and each pod with its node."""

    name: str
    namespace: str
    state: str
    pods: tuple[PodRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "state": self.state, "pods": [asdict(p) for p in self.pods]}


def _secret_values() -> dict[str, str]:
    """The Secret's keys set in the caller's environment (HF_TOKEN, the trackers' tokens): only their values travel, to the Secret."""
    return {key: v for key in SECRET_KEYS if (v := os.environ.get(key))}


def _keep_replicas(doc: dict[str, Any], live: dict[str, Any] | None) -> dict[str, Any]:
    """The RayCluster with each worker group's `replicas` as the live one has it: with IDLE_MINUTES > 0 Ray's
    autoscaler owns that number, and applying the rendered 0 would take the workers from a running job."""
    groups = ((live or {}).get("spec") or {}).get("workerGroupSpecs") or []
    have = {g.get("groupName"): g.get("replicas") for g in groups}
    doc = copy.deepcopy(doc)
    for g in doc["spec"]["workerGroupSpecs"]:
        if have.get(g["groupName"]) is not None:
            g["replicas"] = have[g["groupName"]]
    return doc


def _namespace_doc(ctx: Context, kube: k8s.Kube | None) -> list[dict[str, Any]]:
    """The namespace, when raydlc makes it. On its own cluster, always (eksctl may have made it first, for the pod
    identities: it is raydlc's all the same, labelled and deleted as such). Attached, only when absent (or made by
    raydlc before): one that exists without raydlc's labels was given, and is neither labelled nor ever deleted."""
    cfg = ctx.cfg
    ns = cfg.cluster.namespace
    if kube is not None and ctx.attach:
        have = kube.get("v1", "Namespace", ns)
        if have is not None and not _ours(have, ctx):
            return []
    return [{"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": ns, "labels": {OWNER_TAG: cfg.cluster.name, **ownership.labels(cfg)}}}]


def _service_account(ctx: Context) -> list[dict[str, Any]]:
    """Attached without SERVICE_ACCOUNT: the one the Ray pods run as, made in the namespace (no cloud identity)."""
    cfg = ctx.cfg
    if not cfg.cluster.attach or cfg.cluster.service_account:
        return []
    return [{"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": SERVICE_ACCOUNT, "namespace": cfg.cluster.namespace, "labels": ownership.labels(cfg)}}]


def desired_objects(ctx: Context, kube: k8s.Kube | None = None) -> list[dict[str, Any]]:
    """What `up` applies, in order: namespace (when raydlc makes it), service account (attached, when none is given),
    secret (when HF_TOKEN is set), policies, cluster; with `kube` and IDLE_MINUTES > 0 the cluster keeps the worker
    count Ray's autoscaler set. Each carries raydlc's ownership labels (raydlc.render.ownership)."""
    cfg = ctx.cfg
    ns = cfg.cluster.namespace
    labels = {OWNER_TAG: cfg.cluster.name, **ownership.labels(cfg)}
    out: list[dict[str, Any]] = [*_namespace_doc(ctx, kube), *_service_account(ctx)]
    values = _secret_values()
    if values:
        out.append({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET_NAME, "namespace": ns, "labels": labels},
            "data": {key: base64.b64encode(v.encode()).decode() for key, v in values.items()},
        })
    out.extend(ctx.documents("netpol")[FILES["netpol"]]["items"])
    cluster = ctx.documents("raycluster")[FILES["raycluster"]]
    if kube is not None and elastic(cfg):
        cluster = _keep_replicas(cluster, kube.get(cluster["apiVersion"], cluster["kind"], cfg.ray.cluster_name, ns))
    out.append(cluster)
    return out


def _owned_objects(ctx: Context, kube: k8s.Kube | None = None) -> list[tuple[str, str, str, str | None]]:
    """What `down` deletes, by (apiVersion, kind, name, namespace); the namespace itself comes last. Attached (with
    `kube`), exactly what carries this config's ownership labels, listed kind by kind: nothing found is touched."""
    cfg = ctx.cfg
    ns = cfg.cluster.namespace
    if cfg.cluster.attach and kube is not None:
        return [(av, kind, k8s.name_of(o), ns) for av, kind in ownership.NAMESPACED_KINDS
                for o in kube.list(av, kind, ns, labels=ownership.selector(cfg)) if ownership.made(o, cfg)]
    out: list[tuple[str, str, str, str | None]] = [
        ("ray.io/v1", "RayJob", cfg.ray.job_name, ns),
        ("ray.io/v1", "RayCluster", cfg.ray.cluster_name, ns),
    ]
    out += [(p["apiVersion"], p["kind"], p["metadata"]["name"], ns) for p in render_netpol(cfg)["items"]]
    out.append(("v1", "Secret", SECRET_NAME, ns))
    out.append(("v1", "Secret", auth.secret_name(cfg), ns))
    return out


def _describe(doc: dict[str, Any]) -> str:
    return f"{doc['kind']} {doc['metadata']['name']}"


def ray_pods(kube: k8s.Kube, ctx: Context) -> Pods:
    pods = kube.pods(ctx.cfg.cluster.namespace, labels={"ray.io/cluster": ctx.cfg.ray.cluster_name})
    head = [p for p in pods if k8s.labels_of(p).get("ray.io/node-type") == "head"]
    workers = [p for p in pods if k8s.labels_of(p).get("ray.io/node-type") == "worker"]
    return head, workers


def view(ctx: Context, kube: k8s.Kube) -> RayClusterView | None:
    """The RayCluster and its pods for `status`; None when neither exists."""
    cfg = ctx.cfg
    rc = kube.get("ray.io/v1", "RayCluster", cfg.ray.cluster_name, cfg.cluster.namespace)
    pods = kube.pods(cfg.cluster.namespace, labels={"ray.io/cluster": cfg.ray.cluster_name})
    if rc is None and not pods:
        return None
    return RayClusterView(
        cfg.ray.cluster_name, cfg.cluster.namespace,
        ((rc or {}).get("status") or {}).get("state", "absent" if rc is None else "unknown"),
        tuple(PodRow(k8s.name_of(p), k8s.labels_of(p).get("ray.io/node-type", ""), k8s.pod_phase(p), k8s.pod_ready(p),
                     k8s.pod_node(p)) for p in pods),
    )


def _groups(rc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each group's pod template spec by the `ray.io/group` label KubeRay gives its pods (the head's is `headgroup`)."""
    spec = rc.get("spec") or {}
    out = {"headgroup": ((spec.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}}
    for g in spec.get("workerGroupSpecs") or []:
        out[g["groupName"]] = (g.get("template") or {}).get("spec") or {}
    return out


def _short(v: Any) -> str:
    """A value as a change line shows it: env values and resources cut short (images are never cut)."""
    text = str(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _container_changes(where: str, want: dict[str, Any], have: dict[str, Any]) -> list[str]:
    out = []
    if want.get("image") != have.get("image"):
        out.append(f"{where}: image {have.get('image')} -> {want.get('image')}")
    running = {e["name"]: e for e in have.get("env") or []}  # KubeRay adds its own variables: only ours are compared
    for e in want.get("env") or []:
        old = running.get(e["name"])
        if old is None:
            out.append(f"{where}: env {e['name']} added")
        elif k8s.differences({k: v for k, v in e.items() if k != "name"}, old):
            out.append(f"{where}: env {e['name']} {_short(old.get('value', '(from a reference)'))} -> "
                       f"{_short(e.get('value', '(from a reference)'))}")
    gone = sorted(set(running) - {e["name"] for e in want.get("env") or []} - set(_kuberay_env(have)))
    out += [f"{where}: env {n} removed" for n in gone]
    if k8s.differences(want.get("resources") or {}, have.get("resources") or {}):
        out.append(f"{where}: resources {_short(have.get('resources'))} -> {_short(want.get('resources'))}")
    return out


def _kuberay_env(container: dict[str, Any]) -> list[str]:
    """The variables KubeRay v1.7.0 sets in the Ray container itself (common/pod.go `setContainerEnvVars`, names in
    utils/constant.go: RAY_*, KUBERAY_GEN_*, FQ_RAY_IP), never ours to compare."""
    return [e["name"] for e in container.get("env") or [] if e["name"].startswith(("RAY_", "KUBERAY_")) or e["name"] == "FQ_RAY_IP"]


def template_changes(rc: dict[str, Any], pods: Pods) -> list[str]:
    """What applying `rc` would change in the running Ray pods (one pod per group is enough: KubeRay makes
    them all from the group's template), as short lines: "gpu-workers/ray-worker: image a -> b"."""
    head, workers = pods
    seen: set[str] = set()
    out: list[str] = []
    for pod in head + workers:
        group = k8s.labels_of(pod).get("ray.io/group", "")
        want = _groups(rc).get(group)
        if want is None or group in seen:
            continue
        seen.add(group)
        have_spec = pod.get("spec") or {}
        if k8s.differences(want.get("nodeSelector") or {}, have_spec.get("nodeSelector") or {}):
            out.append(f"{group}: nodeSelector {_short(have_spec.get('nodeSelector'))} -> {_short(want.get('nodeSelector'))}")
        running = {c["name"]: c for c in have_spec.get("containers") or []}
        for c in want.get("containers") or []:
            out += _container_changes(f"{group}/{c['name']}", c, running.get(c["name"], {}))
    return out


def _ours(ns: dict[str, Any], ctx: Context) -> bool:
    """A namespace raydlc made: its owner label (older raydlc) or the ownership labels."""
    return k8s.labels_of(ns).get(OWNER_TAG) == ctx.cfg.cluster.name or ownership.made(ns, ctx.cfg)


def _namespace_ours(kube: k8s.Kube, ctx: Context) -> bool:
    ns = kube.get("v1", "Namespace", ctx.cfg.cluster.namespace)
    return ns is not None and _ours(ns, ctx)


def _workers_due(cfg: Config) -> int:
    """Worker pods `up` waits for: every GPU node's, or none when Ray's autoscaler starts them for a job."""
    return 0 if elastic(cfg) else cfg.gpu_nodes.count


class RayCluster(Resource):
    name = "raycluster"
    scope = "namespace"
    summary = "namespace, NetworkPolicies, Ray token Secret, RayCluster"
    removal = "RayCluster, RayJob, NetworkPolicies, Secrets, namespace"

    # ------------------------------------------------------------------ up

    def _pods_ok(self, ctx: Context, pods: Pods) -> bool:
        head, workers = pods
        running = [w for w in workers if k8s.pod_phase(w) == "Running"]
        return any(k8s.pod_ready(h) for h in head) and len(running) >= _workers_due(ctx.cfg)

    def look(self, ctx: Context) -> Observation:
        kube = look_inside(ctx)
        if isinstance(kube, Observation):
            return kube
        differ: list[str] = []
        missing: list[str] = []
        for doc in desired_objects(ctx, kube):
            have = kube.get(doc["apiVersion"], doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace"))
            if have is None:
                missing.append(_describe(doc))
            elif k8s.differences({k: v for k, v in doc.items() if k != "status"}, have):
                differ.append(_describe(doc))
        if not raytoken.exists(kube, ctx):
            missing.append(f"Secret {auth.secret_name(ctx.cfg)}")
            head, workers = ray_pods(kube, ctx)
            if head or workers:  # deleted by hand: the running pods hold a token no new Secret will match
                return Observation("degraded", f"the Ray token Secret {auth.secret_name(ctx.cfg)} is missing (deleted by hand?): "
                                   "the running Ray pods keep the token they started with",
                                   {"apply": True, "token_lost": [k8s.name_of(p) for p in head + workers]})
        if missing and any(m.startswith("RayCluster ") for m in missing):
            return Observation("absent", f"not created yet: {', '.join(missing)}", {"apply": True})
        changes = template_changes(desired_objects(ctx, kube)[-1], ray_pods(kube, ctx))
        if changes:
            return Observation("degraded", f"the running Ray pods differ from the rendered templates: {'; '.join(changes)}",
                               {"apply": True, "recreate": changes})
        if missing or differ:
            return Observation("degraded", "; ".join(filter(None, [
                f"missing: {', '.join(missing)}" if missing else "",
                f"differs from the rendered: {', '.join(differ)}" if differ else ""])), {"apply": True})
        head, workers = ray_pods(kube, ctx)
        if not self._pods_ok(ctx, (head, workers)):
            return Observation("creating", f"head {'Ready' if any(k8s.pod_ready(h) for h in head) else 'not Ready'}, "
                                           f"{sum(k8s.pod_phase(w) == 'Running' for w in workers)}/"
                                           f"{_workers_due(ctx.cfg)} workers Running")
        running = sum(k8s.pod_phase(w) == "Running" for w in workers)
        return Observation("ready", f"RayCluster {ctx.cfg.ray.cluster_name}: head Ready, {running} workers Running"
                           + (f" (0..{ctx.cfg.gpu_nodes.count} as jobs need them)" if elastic(ctx.cfg) else ""))

    def plan_up(self, ctx: Context, obs: Observation) -> StepPlan:
        if obs.state == "ready":
            return StepPlan("none", obs.reason)
        what = ", ".join(_describe(d) for d in desired_objects(ctx, ctx.kube() if ctx.attach else None))
        named = ", ".join(_secret_values())
        secret = f" (the Secret's values come from {named} in the environment)" if named else ""
        cmd = f"kubernetes apply (create or merge-patch): {what}{secret}"
        if obs.facts.get("token_lost"):
            return StepPlan("replace", f"{obs.reason}; a new token reaches the head only through new pods: the Ray pods are "
                                   "recreated and running jobs stop (asks first; --yes agrees)",
                        (f"kubernetes create: Secret {auth.secret_name(ctx.cfg)} (a new random token)", cmd,
                         "kubernetes delete: the Ray pods (KubeRay creates them again, reading the new token)"))
        if obs.facts.get("recreate"):
            return StepPlan("replace", f"{obs.reason}; KubeRay recreates every Ray pod: running jobs will stop (asks first; --yes agrees)",
                        (cmd, "KubeRay deletes the Ray pods and creates them from the new templates"))
        if obs.facts.get("apply") or obs.state in ("absent", "unknown"):
            return StepPlan("create" if obs.state in ("absent", "unknown") else "repair", obs.reason, (cmd,))
        return StepPlan("wait", obs.reason, ("pods ray.io/cluster=" + ctx.cfg.ray.cluster_name + ": head Ready, workers Running",))

    def ensure(self, ctx: Context, obs: Observation) -> None:
        kube = ctx.kube()
        changes = list(obs.facts.get("recreate") or [])
        if changes:
            what = "; ".join(changes)
            question = f"the Ray pods will be recreated ({what}); running jobs on RayCluster {ctx.cfg.ray.cluster_name} will stop. Go on?"
            if not (ctx.yes or ctx.reporter.confirm(self.name, question)):
                raise StepFailed(f"the running Ray pods differ from the rendered templates ({what}); applying them recreates "
                                 "every Ray pod and stops the running jobs, so nothing was changed", hint="raydlc up --yes")
            ctx.reporter.line(self.name, f"recreating the Ray pods: {what}")
        lost = list(obs.facts.get("token_lost") or [])
        if lost:
            question = (f"the Ray token Secret {auth.secret_name(ctx.cfg)} is gone; a new one reaches the head only through new "
                        f"pods, so the {len(lost)} Ray pods will be recreated and running jobs will stop. Go on?")
            if not (ctx.yes or ctx.reporter.confirm(self.name, question)):
                raise StepFailed(f"the Ray token Secret {auth.secret_name(ctx.cfg)} is missing and the running Ray pods hold the "
                                 "old token; a new Secret needs new pods, which stops the running jobs, so nothing was changed",
                                 hint="raydlc up --yes")
        for doc in desired_objects(ctx, kube):
            if doc["kind"] == "RayCluster" and raytoken.ensure(kube, ctx):  # the Secret first: the pods read it when they start
                ctx.reporter.line(self.name, f"created Secret {auth.secret_name(ctx.cfg)} (a new random Ray token)")
            for applied in kube.apply(doc):
                if applied.action != "unchanged":
                    ctx.reporter.line(self.name, f"{applied.action} {applied.kind} {applied.name}")
        for pod in lost:  # KubeRay (reconcilePods) creates a missing head and missing workers again, from the Secret as it is now
            kube.delete("v1", "Pod", pod, ctx.cfg.cluster.namespace)
            ctx.reporter.line(self.name, f"deleted Pod {pod} (it held the old Ray token)")

    def kept(self, ctx: Context) -> str:
        cfg = ctx.cfg
        kube = ctx.kube()
        try:
            desired = desired_objects(ctx)[-1]
            watch = StuckWatch(ctx.timings.stuck_s)
            ns = cfg.cluster.namespace
            ctx.wait(self.name, lambda: ray_pods(kube, ctx), lambda p: self._pods_ok(ctx, p) and not template_changes(desired, p),
                     timeout=ctx.timings.pods_s, stuck=lambda p: watch.verdict(p[0] + p[1], kube.events(ns), kube.nodes()),
                     hint=f"kubectl -n {ns} describe pods -l ray.io/cluster={cfg.ray.cluster_name} --kubeconfig {ctx.kubeconfig}",
                     what=f"RayCluster {cfg.ray.cluster_name}: head Ready and {_workers_due(cfg)} workers Running")
        except k8s.KubeTimeout as e:
            raise StepFailed(f"RayCluster {cfg.ray.cluster_name} not up: " + " | ".join(self._diagnosis(ctx, kube) or [e.message]),
                             hint="Insufficient cpu/memory: the pod asks for more than the node offers (see `raydlc render`); "
                             "Insufficient nvidia.com/gpu or vpc.amazonaws.com/efa: see the device-plugins step") from e
        head, workers = ray_pods(kube, ctx)
        where = sorted({k8s.pod_node(w) or "?" for w in workers})
        return (f"head {k8s.name_of(head[0]) if head else '?'} Ready on {k8s.pod_node(head[0]) if head else '?'}; "
                f"{len(workers)} workers Running" + (f" on {', '.join(where)}" if where else "")
                + (f" (0..{cfg.gpu_nodes.count} as jobs need them)" if elastic(cfg) else ""))

    def _diagnosis(self, ctx: Context, kube: k8s.Kube) -> list[str]:
        """Each pod that is not up yet with the scheduler's reason; missing head or workers named."""
        cfg = ctx.cfg
        head, workers = ray_pods(kube, ctx)
        events = kube.events(cfg.cluster.namespace)
        lines = [f"pod {k8s.name_of(p)} ({k8s.labels_of(p).get('ray.io/node-type')}) is {k8s.pod_phase(p)}: "
                 f"{k8s.pending_reason(p, events)}"
                 for p in head + workers if not (k8s.pod_ready(p) if p in head else k8s.pod_phase(p) == "Running")]
        if not head:
            lines.append("no head pod exists (is the KubeRay operator running?)")
        if len(workers) < _workers_due(cfg):
            lines.append(f"{len(workers)}/{_workers_due(cfg)} worker pods exist")
        return lines

    # ------------------------------------------------------------------ down

    def _present(self, ctx: Context, kube: k8s.Kube) -> list[str]:
        return [f"{kind} {name}" for av, kind, name, ns in _owned_objects(ctx, kube) if kube.get(av, kind, name, ns) is not None]

    def left(self, ctx: Context) -> Observation:
        kube = kube_if_cluster(ctx)
        if kube is None:
            return gone_or_unseen(ctx, f"RayCluster {ctx.cfg.ray.cluster_name} and raydlc's objects in {ctx.cfg.cluster.namespace}",
                                  "the cluster is gone, and the Ray objects with it")
        present = self._present(ctx, kube)
        if _namespace_ours(kube, ctx):
            present.append(f"Namespace {ctx.cfg.cluster.namespace}")
        pods = sum(len(x) for x in ray_pods(kube, ctx))
        if pods:
            present.append(f"{pods} Ray pods")
        if not present:
            return gone(f"no RayCluster {ctx.cfg.ray.cluster_name} or other raydlc object in {ctx.cfg.cluster.namespace}")
        return Observation("ready", "present: " + ", ".join(present), {"present": present})

    def plan_down(self, ctx: Context, obs: Observation) -> StepPlan:
        if obs.state == "absent":
            return StepPlan("none", obs.reason)
        if obs.state == "unknown":  # the API server does not answer: what would be deleted once it does
            return StepPlan("delete", obs.reason, (f"kubernetes delete: RayCluster {ctx.cfg.ray.cluster_name}, its RayJobs, NetworkPolicies "
                                                   f"and Secret in {ctx.cfg.cluster.namespace}; wait until the Ray pods are gone",))
        return StepPlan("delete", obs.reason, (f"kubernetes delete: {', '.join(obs.facts.get('present', []))}; "
                                           "wait until the Ray pods are gone",))

    def remove(self, ctx: Context, obs: Observation) -> None:
        kube = kube_if_cluster(ctx)
        if kube is None:
            if ctx.keeps_cluster and (why := api_unreachable(ctx)) is not None:
                raise StepFailed(f"{why}: the Ray objects cannot be deleted", hint="check the kubeconfig and the network, then run down again")
            return
        cfg = ctx.cfg
        for av, kind, name, ns in _owned_objects(ctx, kube):
            if kube.delete(av, kind, name, ns):
                ctx.note(self.name, f"removed {kind} {name}")
                ctx.reporter.line(self.name, f"deleted {kind} {name}")
            else:
                ctx.note(self.name, f"absent {kind} {name}")
        ctx.wait(self.name, lambda: (kube.get("ray.io/v1", "RayCluster", cfg.ray.cluster_name, cfg.cluster.namespace),
                                     ray_pods(kube, ctx)),
                 lambda t: t[0] is None and not (t[1][0] or t[1][1]), timeout=ctx.timings.pods_s,
                 what="the RayCluster and its pods to be gone",
                 explain=lambda t: f"{len(t[1][0]) + len(t[1][1])} Ray pods left" + (", RayCluster still there" if t[0] else ""))
        if _namespace_ours(kube, ctx):
            ns = cfg.cluster.namespace
            kube.delete("v1", "Namespace", ns)
            ctx.wait(self.name, lambda: kube.get("v1", "Namespace", ns), lambda n: n is None, timeout=ctx.timings.pods_s,
                     what=f"namespace {ns} to be deleted")
            ctx.note(self.name, f"removed Namespace {ns}")

    def cleared(self, ctx: Context) -> str:
        kube = kube_if_cluster(ctx)
        if kube is None:
            return "no cluster API: nothing of Ray can be left in it"
        left = self._present(ctx, kube)
        pods = [k8s.name_of(p) for group in ray_pods(kube, ctx) for p in group]
        if left or pods:
            raise StepFailed(f"still present: {', '.join(left + pods)}")
        return f"no RayCluster, RayJob, NetworkPolicy, Secret or Ray pod of {ctx.cfg.ray.cluster_name} left"
