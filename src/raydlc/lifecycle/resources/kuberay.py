"""The KubeRay operator: its Helm release, its Deployment Available on a system node, its CRDs served."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raydlc.edges import kube as k8s
from raydlc.lifecycle.releases import HelmRelease
from raydlc.lifecycle.stuck import StuckWatch
from raydlc.lifecycle.types import Observation, StepFailed
from raydlc.render import helm as helm_render
from raydlc.render.nodes import ROLE, SYSTEM_ROLE

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.lifecycle.context import Context

CRDS = ("rayclusters.ray.io", "rayjobs.ray.io")
CRD = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")


def _operator(kube: k8s.Kube, cfg: Config) -> dict[str, Any] | None:
    return kube.get("apps/v1", "Deployment", "kuberay-operator", cfg.ray.operator_namespace)


class KubeRay(HelmRelease):
    name = "kuberay"
    scope = "cluster"
    fact = "the KubeRay operator and its CRDs"
    summary = "KubeRay operator and CRDs"
    removal = "uninstall kuberay"
    workload = ("apps/v1", "Deployment")

    def found(self, ctx: Context) -> Observation:
        from raydlc.lifecycle import attach

        return attach.found_kuberay(ctx)

    def release(self, cfg: Config) -> helm_render.Release:
        return helm_render.kuberay_operator(cfg)

    def working(self, ctx: Context, kube: k8s.Kube) -> Observation | None:
        if not k8s.deployment_available(_operator(kube, ctx.cfg)):
            return Observation("creating", "Deployment kuberay-operator is not available yet")
        missing = [c for c in CRDS if not k8s.crd_established(kube.get(*CRD, c))]
        if missing:
            return Observation("creating", f"CRDs not served yet: {', '.join(missing)}")
        return None

    def kept(self, ctx: Context) -> str:
        cfg = ctx.cfg
        kube = ctx.kube()
        ns, watch = cfg.ray.operator_namespace, StuckWatch(ctx.timings.stuck_s)
        ctx.wait(self.name, lambda: _operator(kube, cfg), k8s.deployment_available, timeout=ctx.timings.helm_s,
                 what="Deployment kuberay-operator to be Available",
                 stuck=lambda _: watch.verdict([p for p in kube.pods(ns) if k8s.name_of(p).startswith("kuberay-operator-")],
                                               kube.events(ns), kube.nodes()),
                 hint=f"kubectl -n {ns} describe pods --kubeconfig {ctx.kubeconfig}",
                 explain=lambda d: f"{(d or {}).get('status', {}).get('availableReplicas', 0)} available" if d else "no Deployment")
        ctx.wait(self.name, lambda: [kube.get(*CRD, c) for c in CRDS],
                 lambda crds: all(k8s.crd_established(c) for c in crds), timeout=ctx.timings.helm_s,
                 what="the RayCluster and RayJob CRDs to be served")
        nodes = {k8s.name_of(n): n for n in kube.nodes()}
        pods = [p for p in kube.pods(cfg.ray.operator_namespace)
                if k8s.name_of(p).startswith("kuberay-operator-") and k8s.pod_phase(p) == "Running"]
        where = sorted({k8s.pod_node(p) or "?" for p in pods})
        off = [w for w in where if k8s.labels_of(nodes.get(w, {})).get(ROLE) != SYSTEM_ROLE]
        if off:
            raise StepFailed(f"the KubeRay operator runs on {', '.join(off)}, not on a {ROLE}={SYSTEM_ROLE} node",
                             hint="check the nodeSelector in helm/kuberay-operator.values.yaml")
        return (f"kuberay-operator {cfg.images.kuberay_version} Available on {', '.join(where) or 'a system node'}; "
                f"CRDs {', '.join(CRDS)} served")
