"""Where the Ray workers go on a cluster raydlc did not build: the worker group's shape, from what was found.

Pure: `ClusterFacts` in, a frozen `WorkerTarget` out. The order is what is there before what can come:
Ready GPU nodes (their instance type, GPUs per node, EFA where the nodes offer it, their taints), then a
Karpenter NodePool whose requirements admit a GPU type, then a Cluster Autoscaler node group at zero. With
none of them and no way to tell (the nodes could not be read), the configured GPU type is used as it is; with
none of them and every read answered, there is no GPU capacity and none can come: one error, exit 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raydlc.discovery.facts import AsgGroup, ClusterFacts, GpuNode, NodePool, Taint
from raydlc.discovery.read import EFA, INSTANCE_TYPE, base_type
from raydlc.errors import InputError
from raydlc.facts import instances

HYPERPOD_HEALTH = "sagemaker.amazonaws.com/node-health-status"
KARPENTER_POOL = "karpenter.sh/nodepool"  # Karpenter v1 labels every node it makes with its NodePool's name
GPU_TAINT_KEY = "nvidia.com/gpu"
# The per-node DaemonSets a worker leaves room for (aws-node, kube-proxy, the device plugins, …): the same margin
# as raydlc.render.sizing; a platform with heavier DaemonSets leaves the worker Pending, and its events say so.
DAEMONSET_CPU_M, DAEMONSET_MEMORY_MI = 500, 1024


@dataclass(frozen=True)
class WorkerTarget:
    """The GPU worker group as the cluster can run it; `source` says which found capacity it was made from."""

    instance_type: str
    gpus: int  # per worker = per node
    efa: int  # EFA interfaces per worker; 0: the nodes offer none, and none is requested
    node_selector: tuple[tuple[str, str], ...]
    tolerations: tuple[tuple[tuple[str, str], ...], ...]  # each a toleration's fields, in order
    source: str
    nodes_now: int = 0  # Ready nodes of the type found now
    spot: bool = False  # the nodes are (or may be) Spot: the worker gets the drain hook
    cpu_m: int = 0  # the worker's CPU request when the nodes' allocatable is known; 0: size from the type
    memory_mi: int = 0
    gpudirect_rdma: bool = False
    note: str = ""

    def selector(self) -> dict[str, str]:
        return dict(self.node_selector)

    def toleration_list(self) -> list[dict[str, str]]:
        return [dict(t) for t in self.tolerations]

    def to_dict(self) -> dict[str, Any]:
        return {"instance_type": self.instance_type, "gpus": self.gpus, "efa": self.efa, "node_selector": self.selector(),
                "tolerations": self.toleration_list(), "source": self.source, "nodes_now": self.nodes_now, "spot": self.spot,
                "cpu_m": self.cpu_m, "memory_mi": self.memory_mi, "note": self.note}


def toleration(t: Taint) -> tuple[tuple[str, str], ...]:
    """The toleration of exactly this taint (Equal on key and value, or Exists when the taint has no value)."""
    if t.value:
        return (("key", t.key), ("operator", "Equal"), ("value", t.value), ("effect", t.effect))
    return (("key", t.key), ("operator", "Exists"), ("effect", t.effect))


def tolerations_for(taints: Sequence[Taint]) -> tuple[tuple[tuple[str, str], ...], ...]:
    seen: dict[tuple[tuple[str, str], ...], None] = {}
    for t in taints:
        if t.effect in ("NoSchedule", "NoExecute"):
            seen.setdefault(toleration(t), None)
    return tuple(seen)


def _schedulable(n: GpuNode) -> bool:
    """Ready, and on HyperPod passed its health checks (SageMaker labels a node `Schedulable` when it may run work)."""
    return n.ready and (n.label(HYPERPOD_HEALTH) in (None, "Schedulable"))


def from_nodes(nodes: Sequence[GpuNode], prefer: str | None) -> WorkerTarget | None:
    usable = [n for n in nodes if _schedulable(n) and n.instance_type]
    if not usable:
        return None
    by_type: dict[str, list[GpuNode]] = {}
    for n in usable:
        by_type.setdefault(str(n.instance_type), []).append(n)
    itype = prefer if prefer in by_type else max(by_type, key=lambda t: (sum(n.gpus for n in by_type[t]), t))
    group = by_type[itype]
    selector = {INSTANCE_TYPE: itype}
    if any(n.label(HYPERPOD_HEALTH) for n in group):
        selector[HYPERPOD_HEALTH] = "Schedulable"
    cpu = min(n.cpu_m for n in group)
    mem = min(n.memory_mi for n in group)
    it = instances.instance_type(base_type(itype))
    efa = min(n.efa for n in group)
    note = "" if prefer in (None, itype) else f"no Ready node of {prefer}; the workers go on the {itype} nodes found"
    return WorkerTarget(
        instance_type=itype, gpus=min(n.gpus for n in group), efa=efa, node_selector=tuple(sorted(selector.items())),
        tolerations=tolerations_for([t for n in group for t in n.taints]), source=f"{len(group)} Ready node(s) of {itype}",
        nodes_now=len(group), spot=any(n.capacity_type == "spot" for n in group),
        cpu_m=max(cpu - DAEMONSET_CPU_M, 0) if cpu else 0, memory_mi=max(mem - DAEMONSET_MEMORY_MI, 0) if mem else 0,
        gpudirect_rdma=bool(it and it.gpudirect_rdma and efa), note=note)


def _cheapest(types: Sequence[str], prefer: str | None) -> str:
    from raydlc.facts.prices import HOURLY_USD_US_EAST_1

    if prefer in types:
        return str(prefer)
    return min(types, key=lambda t: (HOURLY_USD_US_EAST_1.get(t, math.inf), t))


def from_pools(pools: Sequence[NodePool], prefer: str | None, efa_plugin: bool) -> WorkerTarget | None:
    admitted = [(p, t) for p in pools for t in p.instance_types]
    if not admitted:
        return None
    itype = _cheapest(sorted({t for _, t in admitted}), prefer)
    pool = next(p for p, t in admitted if t == itype)
    it = instances.instance_type(itype)
    assert it is not None  # a pool's types come from the catalogue
    efa = it.efa_interfaces if efa_plugin else 0
    selector = {**dict(pool.labels), KARPENTER_POOL: pool.name, INSTANCE_TYPE: itype}
    return WorkerTarget(
        instance_type=itype, gpus=it.gpus, efa=efa, node_selector=tuple(sorted(selector.items())),
        tolerations=tolerations_for(pool.taints), source=f"Karpenter NodePool {pool.name} (no GPU node yet; it makes {itype})",
        spot="spot" in pool.capacity_types,  # no capacity-type requirement: Karpenter v1 makes on-demand nodes
        gpudirect_rdma=bool(it.gpudirect_rdma and efa),
        note="" if efa_plugin or not it.efa_interfaces else "no EFA device plugin found: the workers request no EFA")


def from_groups(groups: Sequence[AsgGroup], prefer: str | None, efa_plugin: bool) -> WorkerTarget | None:
    usable = [g for g in groups if g.instance_type]
    if not usable:
        return None
    g = next((x for x in usable if x.instance_type == prefer), usable[0])
    itype = str(g.instance_type)
    it = instances.instance_type(base_type(itype))
    gpus = int(dict(g.labels).get("nvidia.com/gpu.count", 0) or 0) or (it.gpus if it else 0)
    efa = it.efa_interfaces if it and efa_plugin else 0
    selector = {INSTANCE_TYPE: itype}
    return WorkerTarget(
        instance_type=itype, gpus=gpus, efa=efa, node_selector=tuple(sorted(selector.items())), tolerations=tolerations_for(g.taints),
        source=f"Cluster Autoscaler node group {g.name} at zero (max {g.max_size})",
        spot=dict(g.labels).get("eks.amazonaws.com/capacityType") == "SPOT", gpudirect_rdma=bool(it and it.gpudirect_rdma and efa))


def from_config(instance_type: str, gpus: int) -> WorkerTarget:
    """The nodes could not be read: the configured type, selected by its label, tolerating the usual GPU taint."""
    it = instances.instance_type(base_type(instance_type))
    gpu_taint = (("key", GPU_TAINT_KEY), ("operator", "Exists"), ("effect", "NoSchedule"))
    return WorkerTarget(instance_type=instance_type, gpus=gpus, efa=it.efa_interfaces if it else 0,
                        node_selector=((INSTANCE_TYPE, instance_type),), tolerations=(gpu_taint,),
                        source="GPU_NODE_TYPE (the cluster's nodes could not be read)",
                        gpudirect_rdma=bool(it and it.gpudirect_rdma),
                        note="nodes not readable: the worker group is rendered for the configured type, unchecked")


class NoGpuCapacity(InputError):
    """The attached cluster has no GPU node, and nothing that can make one."""


def pick(facts: ClusterFacts, *, prefer: str | None = None, configured: tuple[str, int] | None = None) -> WorkerTarget:
    """The worker group's target: found nodes, else a NodePool, else an ASG at zero; `configured` (type, GPUs) when
    the nodes could not be read. Raises NoGpuCapacity (exit 2) when every read answered and none can hold a worker."""
    efa_plugin = any(p.resource == EFA for p in facts.device_plugins.get(())) if facts.device_plugins.is_known else True
    nodes = facts.gpu_nodes
    if nodes.is_known and (t := from_nodes(nodes.value or (), prefer)):
        return t
    if facts.node_pools.is_known and (t := from_pools(facts.node_pools.value or (), prefer, efa_plugin)):
        return t
    if facts.asg_groups.is_known and (t := from_groups(facts.asg_groups.value or (), prefer, efa_plugin)):
        return t
    if not nodes.is_known and configured is not None:
        return from_config(*configured)
    unknown = [f"{name} ({fact.note})" for name, fact in (("nodes", nodes), ("NodePools", facts.node_pools),
                                                           ("node groups", facts.asg_groups)) if fact.state.value == "unknown"]
    seen = "no Ready node has nvidia.com/gpu allocatable, no Karpenter NodePool admits a GPU instance type, and no " \
           "Cluster Autoscaler node group at zero makes one"
    raise NoGpuCapacity(f"no GPU capacity in the cluster: {seen}" + (f"; not readable: {'; '.join(unknown)}" if unknown else ""),
                        hint="ask the platform team for GPU nodes or a GPU NodePool, or run CPU-only (USE_GPU=false)")


def scheduling(target: WorkerTarget) -> Mapping[str, Any]:
    """The pod-spec fields that land a worker on the target's nodes."""
    out: dict[str, Any] = {"nodeSelector": target.selector()}
    if target.tolerations:
        out["tolerations"] = target.toleration_list()
    return out
