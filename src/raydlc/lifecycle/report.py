"""`raydlc status`: one view of where the cluster stands and what it costs per hour.

Each resource's state as `up` would see it (reads only), the nodes with their role, type, AZ and
allocatable GPUs and EFA interfaces, the RayCluster with its pods and their nodes, and an hourly
cost estimate of what bills (instances, the EKS control plane, NAT gateways) from raydlc's price table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from raydlc import catalog
from raydlc import kube as k8s
from raydlc.errors import RaydlcError
from raydlc.lifecycle import cloud
from raydlc.lifecycle.resources import raycluster
from raydlc.lifecycle.resources.device_plugins import node_devices
from raydlc.render.nodes import ROLE

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


@dataclass(frozen=True)
class NodeRow:
    name: str
    role: str
    instance_type: str
    zone: str
    ready: bool
    gpu: int
    efa: int


@dataclass(frozen=True)
class ClusterStatus:
    """What `raydlc status` reports; `to_dict()` is what `raydlc status --json` prints.

    `cost` is the estimate `hourly_cost` makes: items, total_usd_per_hour, unpriced, estimate, prices.
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": {"name": self.name, "region": self.region, "status": self.status, "kubeconfig": self.kubeconfig},
            "steps": [asdict(s) for s in self.steps], "nodes": [asdict(n) for n in self.nodes],
            "raycluster": self.raycluster.to_dict() if self.raycluster is not None else None, "cost": dict(self.cost),
            "storage": dict(self.storage) if self.storage is not None else None,
        }


def _storage(cfg: Any, facts: Mapping[str, Any]) -> dict[str, Any] | None:
    from raydlc.render.storage import bucket_of

    bucket, held = bucket_of(cfg), facts.get("contents")
    if bucket is None or held is None:
        return None
    return {"bucket": bucket.name, "uri": bucket.uri, "objects": held.objects, "size_bytes": held.size,
            "newest_checkpoints": dict(held.newest)}


def hourly_cost(instance_types: Iterable[str], clusters: int, nat_gateways: int) -> dict[str, Any]:
    """The estimate from counts (pure): per item and total, with unpriced instance types named."""
    from raydlc.capacity import hourly_cost as instance_cost

    items: list[dict[str, Any]] = []
    unpriced: list[str] = []
    for itype, n in sorted(Counter(instance_types).items()):
        price = instance_cost(itype, n)
        if price is None:
            unpriced.append(f"{n} × {itype}")
            continue
        items.append({"item": f"{itype} instance", "count": n, "usd_per_hour": price})
    if clusters:
        items.append({"item": "EKS control plane", "count": clusters,
                      "usd_per_hour": round(catalog.EKS_CONTROL_PLANE_HOURLY_USD * clusters, 4)})
    if nat_gateways:
        items.append({"item": "NAT gateway", "count": nat_gateways,
                      "usd_per_hour": round(catalog.NAT_GATEWAY_HOURLY_USD * nat_gateways, 4)})
    return {
        "items": items,
        "total_usd_per_hour": round(sum(i["usd_per_hour"] for i in items), 2),
        "unpriced": unpriced,
        "estimate": True,
        "prices": f"estimate: {catalog.PRICE_REGION} On-Demand list prices as of {catalog.PRICES_AS_OF} "
                  "(other regions differ; data transfer, EBS and NAT data processing not included)",
    }


def _node_row(n: dict[str, Any]) -> NodeRow:
    labels = k8s.labels_of(n)
    gpu, efa = node_devices(n)
    return NodeRow(k8s.name_of(n), labels.get(ROLE, ""), labels.get(TYPE_LABEL, ""), labels.get(ZONE_LABEL, ""),
                   k8s.node_ready(n), gpu, efa)


def report(ctx: Context, resources: Sequence[Resource]) -> ClusterStatus:
    """Ask each resource where it stands, then list the nodes, the Ray pods and what bills."""
    cfg = ctx.cfg
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
            nodes = [_node_row(n) for n in kube.nodes()]
            ray = raycluster.view(ctx, kube)
        except RaydlcError as e:
            steps.append(StepState("kubernetes", "unknown", e.message))
    ec2 = ctx.aws("ec2")
    vpc = ((desc or {}).get("resourcesVpcConfig") or {}).get("vpcId")
    vpcs = cloud.vpcs(ec2, name, [vpc] if vpc else [])
    instances = cloud.instances(ec2, name)
    cost = hourly_cost([i["InstanceType"] for i in instances if i["State"]["Name"] in ("pending", "running")],
                       1 if desc is not None else 0, len(cloud.nat_gateways(ec2, name, vpcs)))
    return ClusterStatus(name, cfg.cluster.region, (desc or {}).get("status", "NOT_FOUND"), str(ctx.kubeconfig),
                         tuple(steps), tuple(nodes), ray, cost, storage)
