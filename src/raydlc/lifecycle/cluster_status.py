"""`raydlc status`: one view of where the cluster stands and what it costs per hour.

Each resource's state as `up` would see it (reads only), the nodes with their role, type, AZ and
allocatable GPUs and EFA interfaces, the RayCluster with its pods and their nodes, and an hourly
cost estimate of what bills (instances, the EKS control plane, NAT gateways) from raydlc's price table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from raydlc.capacity.prices import GpuPrices, read_gpu_prices
from raydlc.edges import kube as k8s
from raydlc.errors import RaydlcError
from raydlc.facts import prices
from raydlc.lifecycle import cloud, nodegroups
from raydlc.lifecycle.resources import raycluster
from raydlc.lifecycle.resources.device_plugins import node_devices
from raydlc.render.nodes import GPU_ROLE, ROLE

if TYPE_CHECKING:
    from raydlc.lifecycle.context import Context
    from raydlc.lifecycle.resource import Resource

ZONE_LABEL = "topology.kubernetes.io/zone"
TYPE_LABEL = "node.kubernetes.io/instance-type"


@dataclass(frozen=True)
class StepState:
    step: str
    state: str
    reason: str
    ownership: str = "made"  # made: raydlc's to create and remove; found: the platform's, read as a fact (attached)
    source: str = ""  # a found fact: the read it came from


@dataclass(frozen=True)
class NodeRow:
    name: str
    role: str
    instance_type: str
    zone: str
    ready: bool
    gpu: int
    efa: int
    ray_pod: str | None = None  # the Ray pod on it, if any
    empty_min: float | None = None  # a GPU node without a Ray pod: minutes since it joined (see `gpu_idleness`)


@dataclass(frozen=True)
class ClusterStatus:
    """What `raydlc status` reports; `to_dict()` is what `raydlc status --json` prints.

    `cost` is the estimate `hourly_cost` makes: items, total_usd_per_hour, unpriced, estimate, prices; and
    `idle_cost`'s when_idle_usd_per_hour (the GPU nodes gone; the total itself at IDLE_MINUTES=0) and idle_minutes.
    """

    name: str
    region: str
    status: str  # EKS's, or NOT_FOUND
    kubeconfig: str
    steps: tuple[StepState, ...]
    nodes: tuple[NodeRow, ...]
    raycluster: raycluster.RayClusterView | None
    cost: Mapping[str, Any]
    storage: Mapping[str, Any] | None = None  # bucket, uri, objects, size_bytes, newest checkpoint per run
    gpu_prices: Mapping[str, Any] | None = None  # raydlc.capacity.prices.GpuPrices.to_dict(): on-demand beside Spot
    attach: Mapping[str, Any] | None = None  # attached: the context, the facts found (with sources), what raydlc made

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": {"name": self.name, "region": self.region, "status": self.status, "kubeconfig": self.kubeconfig},
            "steps": [asdict(s) for s in self.steps], "nodes": [asdict(n) for n in self.nodes],
            "raycluster": self.raycluster.to_dict() if self.raycluster is not None else None, "cost": dict(self.cost),
            "storage": dict(self.storage) if self.storage is not None else None,
            "gpu_prices": dict(self.gpu_prices) if self.gpu_prices is not None else None,
            "attach": dict(self.attach) if self.attach is not None else None,
        }


def _storage(cfg: Any, facts: Mapping[str, Any]) -> dict[str, Any] | None:
    from raydlc.render.bucket import bucket_of

    bucket, held = bucket_of(cfg), facts.get("contents")
    if bucket is None or held is None:
        return None
    return {"bucket": bucket.name, "uri": bucket.uri, "objects": held.objects, "size_bytes": held.size,
            "newest_checkpoints": dict(held.newest), "code_zips": held.code_objects, "code_size_bytes": held.code_size}


def hourly_cost(instance_types: Iterable[str], clusters: int, nat_gateways: int, *,
                spot_types: Iterable[str] = (), spot_prices: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The estimate from counts (pure): per item and total, with unpriced instance types named. `spot_types`: the
    running Spot instances, priced at `spot_prices` (USD per instance-hour by type, read live; unpriced without)."""
    from raydlc.capacity import hourly_cost as instance_cost

    items: list[dict[str, Any]] = []
    unpriced: list[str] = []
    for itype, n in sorted(Counter(instance_types).items()):
        price = instance_cost(itype, n)
        if price is None:
            unpriced.append(f"{n} × {itype}")
            continue
        items.append({"item": f"{itype} instance", "count": n, "usd_per_hour": price})
    for itype, n in sorted(Counter(spot_types).items()):
        each = (spot_prices or {}).get(itype)
        if each is None:
            unpriced.append(f"{n} × {itype} (Spot: price unknown)")
            continue
        items.append({"item": f"{itype} instance (Spot)", "count": n, "usd_per_hour": round(each * n, 4)})
    if clusters:
        items.append({"item": "EKS control plane", "count": clusters,
                      "usd_per_hour": round(prices.EKS_CONTROL_PLANE_HOURLY_USD * clusters, 4)})
    if nat_gateways:
        items.append({"item": "NAT gateway", "count": nat_gateways,
                      "usd_per_hour": round(prices.NAT_GATEWAY_HOURLY_USD * nat_gateways, 4)})
    return {
        "items": items,
        "total_usd_per_hour": round(sum(i["usd_per_hour"] for i in items), 2),
        "unpriced": unpriced,
        "estimate": True,
        "prices": f"estimate: {prices.PRICE_REGION} On-Demand list prices as of {prices.PRICES_AS_OF} "
                  "(other regions differ; data transfer, EBS and NAT data processing not included)",
    }


def _node_row(n: dict[str, Any]) -> NodeRow:
    labels = k8s.labels_of(n)
    gpu, efa = node_devices(n)
    return NodeRow(k8s.name_of(n), labels.get(ROLE, ""), labels.get(TYPE_LABEL, ""), labels.get(ZONE_LABEL, ""),
                   k8s.node_ready(n), gpu, efa)


def _joined(n: Mapping[str, Any]) -> datetime | None:
    stamp = (n.get("metadata") or {}).get("creationTimestamp")
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None
    except ValueError:
        return None


def gpu_idleness(rows: Sequence[NodeRow], nodes: Sequence[Mapping[str, Any]], pods: Iterable[Any], now: datetime) -> list[NodeRow]:
    """Each node with the Ray pod on it and, for a GPU node without one, the minutes since it joined (pure).

    What Kubernetes can say, and no more: a node with a Ray worker pod is in Ray's hands (Ray's autoscaler
    removes the pod after IDLE_MINUTES without a task or actor: `ray status -v` on the head shows how long
    it has been idle); a node without one holds no Ray work, and has held none at most since it joined
    (Kubernetes keeps no record of when the last Ray pod left it). The Cluster Autoscaler removes it."""
    on = {p.node: p.name for p in pods if getattr(p, "node", None)}
    joined = {k8s.name_of(n): _joined(n) for n in nodes}
    out = []
    for r in rows:
        since = joined.get(r.name)
        empty = None
        if r.role == GPU_ROLE and r.name not in on and since is not None:
            empty = round(max(0.0, (now - since).total_seconds() / 60), 1)
        out.append(replace(r, ray_pod=on.get(r.name), empty_min=empty))
    return out


def idle_cost(cost: Mapping[str, Any], gpu_type: str, idle_minutes: int) -> dict[str, Any]:
    """The estimate with what the cluster costs once its GPU nodes are gone (pure): at IDLE_MINUTES=0 that never happens."""
    gpu_item = f"{gpu_type} instance"
    idle = round(sum(i["usd_per_hour"] for i in cost["items"] if i["item"] != gpu_item), 2)
    return {**cost, "idle_minutes": idle_minutes,
            "when_idle_usd_per_hour": idle if idle_minutes > 0 else cost["total_usd_per_hour"]}


def _step_state(resource: Resource, ctx: Context) -> StepState:
    from raydlc.lifecycle.resource import Found

    obs = resource.status(ctx)
    return StepState(resource.name, obs.state, obs.reason, "found" if isinstance(resource, Found) else "made",
                     str(obs.facts.get("source", "")))


def attached_report(ctx: Context, resources: Sequence[Resource]) -> ClusterStatus:
    """Attached: each resource as found (the platform's, with where each fact was read) or made (raydlc's, in the
    namespace), the nodes as Kubernetes lists them, and the found GPU nodes priced from raydlc's table (an unknown
    price is said, never counted as $0). No AWS call is needed: a cluster without EKS is reported the same."""
    from raydlc.lifecycle import attach
    from raydlc.render import ownership

    cfg = ctx.cfg
    kube = attach.reach(ctx)
    try:
        ctx.target = attach.target_for(ctx, attach.facts(ctx))  # the RayCluster `up --attach` would apply, to compare
    except RaydlcError:
        ctx.target = None
    steps = [_step_state(r, ctx) for r in resources]
    found = kube.nodes()
    ray = raycluster.view(ctx, kube)
    rows = [replace(r, role=r.role or (GPU_ROLE if r.gpu else "")) for r in (_node_row(n) for n in found)]
    nodes = gpu_idleness(rows, found, ray.pods if ray is not None else (), datetime.now(UTC))
    facts = attach.facts(ctx)
    gpu = [n for n in facts.gpu_nodes.get(()) if n.ready]
    cost = hourly_cost([n.instance_type or "unknown type" for n in gpu if n.capacity_type != "spot"], 0, 0,
                       spot_types=[n.instance_type or "unknown type" for n in gpu if n.capacity_type == "spot"])
    cost = {**cost, "prices": cost["prices"] + "; the platform's GPU nodes, which it bills, not raydlc"}
    made = [f"{kind} {k8s.name_of(o)}" for av, kind in ownership.NAMESPACED_KINDS
            for o in kube.list(av, kind, cfg.cluster.namespace, labels=ownership.selector(cfg)) if ownership.made(o, cfg)]
    from raydlc.discovery.look import rows

    doc = {"context": ctx.kube_context, "kubeconfig": str(ctx.kubeconfig), "namespace": cfg.cluster.namespace,
           "made": made, "selector": ownership.selector(cfg), "facts": facts.to_dict(),
           "found": [{"what": w, "found": f, "source": src} for w, f, src in rows(facts)],
           "target": ctx.target.to_dict() if ctx.target is not None else None}
    eks = facts.eks.value if facts.eks.is_known else None
    return ClusterStatus(cfg.cluster.name, cfg.cluster.region, "ATTACHED" + (" (EKS)" if eks is not None else ""),
                         ctx.where, tuple(steps), tuple(nodes), ray, cost, None, None, doc)


def report(ctx: Context, resources: Sequence[Resource]) -> ClusterStatus:
    """Ask each resource where it stands, then list the nodes, the Ray pods and what bills."""
    cfg = ctx.cfg
    if ctx.attach:
        return attached_report(ctx, resources)
    ctx.aws("eks")  # no usable credentials: one error, not six unknown steps
    seen = {r.name: r.status(ctx) for r in resources}
    steps = [StepState(name, obs.state, obs.reason) for name, obs in seen.items()]
    storage = _storage(cfg, seen["storage"].facts) if "storage" in seen else None
    name = cfg.cluster.name
    desc = cloud.cluster(ctx.aws("eks"), name)
    kube = ctx.kube_or_none() if desc is not None else None
    nodes: list[NodeRow] = []
    ray = None
    if kube is not None:
        try:
            found = kube.nodes()
            ray = raycluster.view(ctx, kube)
            nodes = gpu_idleness([_node_row(n) for n in found], found, ray.pods if ray is not None else (),
                                 datetime.now(UTC))
        except RaydlcError as e:
            steps.append(StepState("kubernetes", "unknown", e.message))
    ec2 = ctx.aws("ec2")
    vpc = ((desc or {}).get("resourcesVpcConfig") or {}).get("vpcId")
    vpcs = cloud.vpcs(ec2, name, [vpc] if vpc else [])
    instances = [i for i in cloud.instances(ec2, name) if i["State"]["Name"] in ("pending", "running")]
    gpu = _gpu_prices(ctx, desc, nodes)
    spot = [i["InstanceType"] for i in instances if i.get("InstanceLifecycle") == "spot"]
    cost = hourly_cost([i["InstanceType"] for i in instances if i.get("InstanceLifecycle") != "spot"],
                       1 if desc is not None else 0, len(cloud.nat_gateways(ec2, name, vpcs)), spot_types=spot,
                       spot_prices={gpu.instance_type: gpu.spot_usd_per_node_hour} if gpu.spot_usd_per_node_hour else None)
    cost = idle_cost(cost, cfg.gpu_nodes.instance_type, cfg.gpu_nodes.idle_minutes)
    return ClusterStatus(name, cfg.cluster.region, (desc or {}).get("status", "NOT_FOUND"), str(ctx.kubeconfig),
                         tuple(steps), tuple(nodes), ray, cost, storage, gpu.to_dict())


def _gpu_prices(ctx: Context, desc: Mapping[str, Any] | None, nodes: Sequence[NodeRow]) -> GpuPrices:
    """The GPU nodes' On-Demand and Spot prices in their AZ (a GPU node's zone, the node group's, else GPU_AZ),
    priced at Spot when the node group is Spot capacity."""
    cfg = ctx.cfg
    ng = nodegroups.describe(ctx, cfg.gpu_nodes.nodegroup_name) if desc is not None else None
    az = next((n.zone for n in nodes if n.role == GPU_ROLE and n.zone), None)
    az = az or (nodegroups.zone_of(ctx, ng) if ng is not None else None) or cfg.gpu_nodes.az
    on_spot = None if ng is None else ng.get("capacityType") == "SPOT"
    return read_gpu_prices(cfg, az, ctx.aws("ec2"), on_spot=on_spot)
