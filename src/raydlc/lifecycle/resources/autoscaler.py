"""The Kubernetes Cluster Autoscaler: its Helm release, its Deployment Available on a system node.

Only when IDLE_MINUTES > 0 (raydlc.render.autoscaler); at 0 there is no release, the step has
nothing to do, and `down` has nothing to remove. A pod that cannot start (a bad image tag, a crash
loop because its role cannot describe the ASGs) ends the wait at once, named with its state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raydlc.edges import kube as k8s
from raydlc.edges.tools import ToolFailed
from raydlc.lifecycle.releases import HelmRelease
from raydlc.lifecycle.resource import gone
from raydlc.lifecycle.stuck import StuckWatch
from raydlc.lifecycle.types import Observation, StepFailed
from raydlc.render import autoscaler as render
from raydlc.render import helm as helm_render
from raydlc.render.nodes import ROLE, SYSTEM_ROLE

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.lifecycle.context import Context


def _deployment(kube: k8s.Kube) -> dict[str, Any] | None:
    return kube.get("apps/v1", "Deployment", render.RELEASE, render.NAMESPACE)


def _pods(kube: k8s.Kube) -> list[dict[str, Any]]:
    return [p for p in kube.pods(render.NAMESPACE) if k8s.name_of(p).startswith(render.RELEASE + "-")]


def pod_states(kube: k8s.Kube) -> str:
    """Each autoscaler pod's phase and waiting reason, for a message (`no pod` when there is none)."""
    lines = []
    for p in _pods(kube):
        waiting = [((cs.get("state") or {}).get("waiting") or {}).get("reason")
                   for cs in (p.get("status") or {}).get("containerStatuses") or []]
        why = ", ".join(w for w in waiting if w)
        lines.append(f"pod {k8s.name_of(p)} {k8s.pod_phase(p) or 'Pending'}" + (f" ({why})" if why else ""))
    return "; ".join(lines) or "no pod"


class ClusterAutoscaler(HelmRelease):
    name = "autoscaler"
    scope = "cluster"
    fact = "the node autoscaler (Karpenter or the Cluster Autoscaler)"
    summary = "Cluster Autoscaler for the GPU node group"
    removal = "uninstall the Cluster Autoscaler"
    workload = ("apps/v1", "Deployment")

    def found(self, ctx: Context) -> Observation:
        from raydlc.lifecycle import attach

        return attach.found_autoscaler(ctx)

    def release(self, cfg: Config) -> helm_render.Release | None:
        return helm_render.cluster_autoscaler(cfg)

    def working(self, ctx: Context, kube: k8s.Kube) -> Observation | None:
        if self.release(ctx.cfg) is None:
            return None
        if not k8s.deployment_available(_deployment(kube)):
            return Observation("creating", f"Deployment {render.RELEASE} is not available yet: {pod_states(kube)}")
        return None

    def ensure(self, ctx: Context, obs: Observation) -> None:
        """helm's own `--wait` failure says only "context deadline exceeded": name the pod's state with it."""
        try:
            super().ensure(ctx, obs)
        except ToolFailed as e:
            kube = ctx.kube()
            raise StepFailed(f"the Cluster Autoscaler did not start: {pod_states(kube)} (helm: {e.message.strip()[-200:]})",
                             hint=f"kubectl -n {render.NAMESPACE} describe pods --kubeconfig {ctx.kubeconfig}") from e

    def left(self, ctx: Context) -> Observation:
        if self.release(ctx.cfg) is None:
            return gone("IDLE_MINUTES=0: no Cluster Autoscaler release")
        return super().left(ctx)

    def kept(self, ctx: Context) -> str:
        cfg = ctx.cfg
        r = self.release(cfg)
        if r is None:
            return "IDLE_MINUTES=0: the GPU node group keeps its size; no Cluster Autoscaler"
        kube = ctx.kube()
        watch = StuckWatch(ctx.timings.stuck_s)
        try:
            ctx.wait(self.name, lambda: _deployment(kube), k8s.deployment_available, timeout=ctx.timings.helm_s,
                     what=f"Deployment {render.RELEASE} to be Available",
                     stuck=lambda _: watch.verdict(_pods(kube), kube.events(render.NAMESPACE), kube.nodes()),
                     hint=f"kubectl -n {render.NAMESPACE} describe pods --kubeconfig {ctx.kubeconfig}",
                     explain=lambda d: pod_states(kube) if d else "no Deployment")
        except k8s.KubeTimeout as e:
            raise StepFailed(f"the Cluster Autoscaler did not start: {pod_states(kube)}",
                             hint=f"kubectl -n {render.NAMESPACE} logs deploy/{render.RELEASE} --kubeconfig {ctx.kubeconfig}") from e
        nodes = {k8s.name_of(n): n for n in kube.nodes()}
        where = sorted({k8s.pod_node(p) or "?" for p in _pods(kube) if k8s.pod_phase(p) == "Running"})
        off = [w for w in where if k8s.labels_of(nodes.get(w, {})).get(ROLE) != SYSTEM_ROLE]
        if off:
            raise StepFailed(f"the Cluster Autoscaler runs on {', '.join(off)}, not on a {ROLE}={SYSTEM_ROLE} node",
                             hint=f"check the nodeSelector in {r.filename}")
        return (f"cluster-autoscaler {r.version} ({cfg.cluster.k8s_version}) Available on {', '.join(where) or 'a system node'}; "
                f"idle GPU nodes leave after {cfg.gpu_nodes.idle_minutes} min")
