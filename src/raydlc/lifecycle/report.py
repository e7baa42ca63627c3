"""`raydlc status`: one view of where the cluster stands and what it costs per hour.

Every `up` step's check (reads only), the nodes with their role, type, AZ and allocatable GPUs
and EFA interfaces, the RayCluster with its pods and their nodes, and an hourly cost estimate of
what bills (instances, the EKS control plane, NAT gateways) from raydlc's price table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from raydlc import catalog
from raydlc import kube as k8s
from raydlc.errors import RaydlcError
from raydlc.lifecycle import cloud
from raydlc.lifecycle.context import Context
from raydlc.lifecycle.steps import order
from raydlc.lifecycle.up_steps import STEPS, node_devices
from raydlc.render.nodes import ROLE

ZONE_LABEL = "topology.kubernetes.io/zone"
TYPE_LABEL = "node.kubernetes.io/instance-type"


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


def _node_row(n: dict[str, Any]) -> dict[str, Any]:
    labels = k8s.labels_of(n)
    gpu, efa = node_devices(n)
    return {
        "name": k8s.name_of(n), "role": labels.get(ROLE, ""), "instance_type": labels.get(TYPE_LABEL, ""),
        "zone": labels.get(ZONE_LABEL, ""), "ready": k8s.node_ready(n), "gpu": gpu, "efa": efa,
    }


def _raycluster(ctx: Context, kube: k8s.Kube) -> dict[str, Any] | None:
    cfg = ctx.cfg
    rc = kube.get("ray.io/v1", "RayCluster", cfg.ray.cluster_name, cfg.cluster.namespace)
    pods = kube.pods(cfg.cluster.namespace, labels={"ray.io/cluster": cfg.ray.cluster_name})
    if rc is None and not pods:
        return None
    return {
        "name": cfg.ray.cluster_name, "namespace": cfg.cluster.namespace,
        "state": ((rc or {}).get("status") or {}).get("state", "absent" if rc is None else "unknown"),
        "pods": [{"name": k8s.name_of(p), "type": k8s.labels_of(p).get("ray.io/node-type", ""),
                  "phase": k8s.pod_phase(p), "ready": k8s.pod_ready(p), "node": k8s.pod_node(p)} for p in pods],
    }


def report(ctx: Context) -> dict[str, Any]:
    cfg = ctx.cfg
    ctx.aws("eks")  # no usable credentials: one error, not six unknown steps
    steps = []
    for s in order(STEPS):
        try:
            obs = s.check(ctx)
            steps.append({"step": s.name, "state": obs.state, "reason": obs.reason})
        except RaydlcError as e:
            steps.append({"step": s.name, "state": "unknown", "reason": e.message})
    name = cfg.cluster.name
    desc = cloud.cluster(ctx.aws("eks"), name)
    kube = ctx.kube_or_none() if desc is not None else None
    nodes: list[dict[str, Any]] = []
    ray = None
    if kube is not None:
        try:
            nodes = [_node_row(n) for n in kube.nodes()]
            ray = _raycluster(ctx, kube)
        except RaydlcError as e:
            steps.append({"step": "kubernetes", "state": "unknown", "reason": e.message})
    ec2 = ctx.aws("ec2")
    vpc = ((desc or {}).get("resourcesVpcConfig") or {}).get("vpcId")
    vpcs = cloud.vpcs(ec2, name, [vpc] if vpc else [])
    instances = cloud.instances(ec2, name)
    cost = hourly_cost([i["InstanceType"] for i in instances if i["State"]["Name"] in ("pending", "running")],
                       1 if desc is not None else 0, len(cloud.nat_gateways(ec2, name, vpcs)))
    return {
        "cluster": {"name": name, "region": cfg.cluster.region, "status": (desc or {}).get("status", "NOT_FOUND"),
                    "kubeconfig": str(ctx.kubeconfig)},
        "steps": steps, "nodes": nodes, "raycluster": ray, "cost": cost,
    }
