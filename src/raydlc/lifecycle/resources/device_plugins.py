"""The device plugins: every GPU node advertises all its GPUs and at least one EFA interface.

Two plugins make that true: the NVIDIA device plugin, a Helm release raydlc installs (none where the
AMI family ships its own), and eksctl's EFA plugin DaemonSet, which eksctl installs with an EFA node
group and raydlc only checks. When a node falls short, the message names the node and the state of
the plugin pod that should serve it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raydlc.edges import kube as k8s
from raydlc.lifecycle.releases import HelmRelease
from raydlc.lifecycle.stuck import StuckWatch
from raydlc.lifecycle.types import Observation, StepFailed, StepPlan
from raydlc.render import helm as helm_render
from raydlc.render.autoscaler import enabled as elastic
from raydlc.render.nodes import EFA_RESOURCE, GPU_RESOURCE, GPU_ROLE, ROLE

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.lifecycle.context import Context

EFA_DAEMONSET = "aws-efa-k8s-device-plugin"  # eksctl v0.230.0's, in kube-system (pkg/addons/assets/efa-device-plugin.yaml)


def node_devices(node: dict[str, Any]) -> tuple[int, int]:
    return k8s.allocatable(node, GPU_RESOURCE), k8s.allocatable(node, EFA_RESOURCE)


def short_nodes(nodes: list[dict[str, Any]], gpus: int) -> list[dict[str, Any]]:
    """GPU nodes that do not yet advertise every GPU and at least one EFA interface (pure)."""
    return [n for n in nodes if node_devices(n)[0] != gpus or node_devices(n)[1] < 1]


def _node_devices_text(node: dict[str, Any], gpus: int) -> str:
    g, e = node_devices(node)
    return f"{k8s.name_of(node)}: {GPU_RESOURCE} {g}/{gpus}, {EFA_RESOURCE} {e}"


def _plugin_pod_state(kube: k8s.Kube, node: str, daemonset: str) -> str:
    pods = [p for p in kube.pods("kube-system", node=node)
            if k8s.name_of(p).startswith(daemonset + "-") and k8s.pod_node(p) == node]
    if not pods:
        ds = kube.get("apps/v1", "DaemonSet", daemonset, "kube-system")
        if ds is None:
            return f"DaemonSet {daemonset} does not exist"
        st = ds.get("status") or {}
        return (f"no {daemonset} pod on this node (DaemonSet: {st.get('numberReady', 0)} ready of "
                f"{st.get('desiredNumberScheduled', '?')} scheduled)")
    p = pods[0]
    return f"pod {k8s.name_of(p)} is {k8s.pod_phase(p)}" + (
        "" if k8s.pod_ready(p) else f" ({k8s.pending_reason(p, kube.events('kube-system', involved=k8s.name_of(p)))})")


def _nodes_due(cfg: Config) -> int:
    """GPU nodes that must exist: all of them, or with IDLE_MINUTES > 0 none (each one present is still checked)."""
    return 0 if elastic(cfg) else cfg.gpu_nodes.count


class DevicePlugins(HelmRelease):
    name = "device-plugins"
    scope = "cluster"
    fact = "the NVIDIA and EFA device plugins"
    summary = "GPUs and EFA allocatable on every GPU node"
    removal = "uninstall device-plugins"
    workload = ("apps/v1", "DaemonSet")

    def found(self, ctx: Context) -> Observation:
        from raydlc.lifecycle import attach

        return attach.found_plugins(ctx)

    def release(self, cfg: Config) -> helm_render.Release | None:
        return helm_render.nvidia_device_plugin(cfg)

    def working(self, ctx: Context, kube: k8s.Kube) -> Observation | None:
        cfg = ctx.cfg
        nodes = kube.nodes({ROLE: GPU_ROLE})
        if len(nodes) < _nodes_due(cfg):
            return Observation("absent", f"{len(nodes)}/{cfg.gpu_nodes.count} GPU nodes exist (the gpu-nodegroup step makes them)")
        short = short_nodes(nodes, cfg.gpu_nodes.gpus_per_node)
        if short:
            return Observation("creating", "; ".join(_node_devices_text(n, cfg.gpu_nodes.gpus_per_node) for n in short))
        return None

    def plan_up(self, ctx: Context, obs: Observation) -> StepPlan:
        p = super().plan_up(ctx, obs)
        if p.action == "wait":
            return StepPlan("wait", obs.reason, (f"nodes role={GPU_ROLE}: {GPU_RESOURCE} = {ctx.cfg.gpu_nodes.gpus_per_node} and "
                                              f"{EFA_RESOURCE} >= 1 (EFA plugin: eksctl's {EFA_DAEMONSET})",))
        return p

    def kept(self, ctx: Context) -> str:
        cfg = ctx.cfg
        kube = ctx.kube()
        gpus = cfg.gpu_nodes.gpus_per_node
        r = self.release(cfg)
        daemonsets = (EFA_DAEMONSET + "-", *((r.name + "-",) if r is not None else ()))
        watch = StuckWatch(ctx.timings.stuck_s)

        def stuck(gpu_nodes: list[dict[str, Any]]) -> str | None:
            pods = [p for p in kube.pods("kube-system") if k8s.name_of(p).startswith(daemonsets)]
            return watch.verdict(pods, kube.events("kube-system"), kube.nodes())

        try:
            nodes = ctx.wait(self.name, lambda: kube.nodes({ROLE: GPU_ROLE}),
                             lambda ns: len(ns) >= _nodes_due(cfg) and not short_nodes(ns, gpus),
                             timeout=ctx.timings.plugins_s, what=f"{GPU_RESOURCE} and {EFA_RESOURCE} on every GPU node",
                             stuck=stuck, hint=f"kubectl -n kube-system describe pods --kubeconfig {ctx.kubeconfig}")
        except k8s.KubeTimeout as e:
            raise StepFailed(
                "device plugins: " + " | ".join(self._diagnosis(ctx, kube) or [e.message]),
                hint="`kubectl -n kube-system describe pod` on the pods named shows why they are not running; "
                "eksctl's EFA plugin tolerates only the aws.amazon.com/efa taint",
            ) from e
        if not nodes:
            return f"no GPU node now (they join when a job needs them; each must then advertise {GPU_RESOURCE}={gpus})"
        return f"{len(nodes)} GPU nodes each advertise {GPU_RESOURCE}={gpus} and {EFA_RESOURCE}>=1"

    def _diagnosis(self, ctx: Context, kube: k8s.Kube) -> list[str]:
        """Per GPU node that falls short: what it advertises, and the state of the plugin pod that should serve it."""
        cfg = ctx.cfg
        gpus = cfg.gpu_nodes.gpus_per_node
        r = self.release(cfg)
        nvidia_ds = r.name if r is not None else "nvidia-device-plugin"
        ns = kube.nodes({ROLE: GPU_ROLE})
        lines = []
        for n in short_nodes(ns, gpus):
            name = k8s.name_of(n)
            g, efa = node_devices(n)
            parts = []
            if g != gpus:
                parts.append(f"{GPU_RESOURCE} {g} (want {gpus}); NVIDIA plugin: {_plugin_pod_state(kube, name, nvidia_ds)}")
            if efa < 1:
                parts.append(f"{EFA_RESOURCE} {efa} (want >= 1); EFA plugin: {_plugin_pod_state(kube, name, EFA_DAEMONSET)}")
            lines.append(f"node {name}: " + "; ".join(parts))
        if len(ns) < _nodes_due(cfg):
            lines.append(f"only {len(ns)}/{cfg.gpu_nodes.count} GPU nodes exist")
        return lines
