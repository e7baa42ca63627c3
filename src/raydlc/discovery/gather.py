"""The reads discovery makes, through the Kubernetes gateway (and AWS when it may): raw answers, never errors.

Each read is kept as a `Raw`: the objects it returned, or why it returned none (refused by RBAC, not served,
the API failed). A refused read is normal on a cluster a platform team runs: the user may hold a namespaced
Role only. `discover` (raydlc.discovery.read) turns the raws into facts; this module only asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydlc.errors import KubeError, RaydlcError

if TYPE_CHECKING:
    from raydlc.edges.kube import Kube

CRDS = ("rayclusters.ray.io", "rayjobs.ray.io")


@dataclass(frozen=True)
class Raw:
    """One read: `items` when it answered (None when the kind is not served), else `refused` (why, in one line)."""

    source: str
    items: tuple[dict[str, Any], ...] | None = None
    refused: str | None = None
    served: bool = True

    @property
    def answered(self) -> bool:
        return self.refused is None


@dataclass(frozen=True)
class Reads:
    """Everything discovery read from one cluster, for one namespace."""

    namespace: str
    version: Raw
    crds: Raw
    deployments: Raw  # cluster-wide (or, refused there, the namespace's own: a single-namespace operator)
    nodes: Raw
    daemonsets: Raw
    nodepools: Raw
    asgs: Raw | None = None  # AWS Auto Scaling groups; None when AWS was not read (not EKS, or not asked)


def _read(source: str, fn: Callable[[], Any]) -> Raw:
    """Run one read: its objects, or the reason it gave none (a refusal is a fact, not a failure)."""
    try:
        got = fn()
    except KubeError as e:
        status = getattr(e, "status", None)
        why = "forbidden by RBAC" if status == 403 else ("unauthorized" if status == 401 else "failed")
        return Raw(source, refused=f"{why}: {e.message}")
    if got is None:
        return Raw(source, items=(), served=False)
    return Raw(source, items=tuple(got if isinstance(got, list) else [got]))


def _crds(kube: Kube) -> list[dict[str, Any]]:
    found = [kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name) for name in CRDS]
    return [c for c in found if c is not None]


def _deployments(kube: Kube, namespace: str) -> Raw:
    everywhere = _read("list deployments (all namespaces)", lambda: kube.list("apps/v1", "Deployment"))
    if everywhere.answered:
        return everywhere
    mine = _read(f"list deployments in {namespace}", lambda: kube.list("apps/v1", "Deployment", namespace))
    if mine.answered:  # what this user may see: an operator installed in their own namespace
        return Raw(mine.source, items=mine.items, refused=None, served=True)
    return everywhere


def gather(kube: Kube, namespace: str, *, asgs: Callable[[], list[dict[str, Any]]] | None = None) -> Reads:
    """Read the cluster as this user may; `asgs` reads the Auto Scaling groups from AWS when that is possible."""
    version = _read("GET /version", lambda: {"gitVersion": kube.version()})
    nodes = _read("list nodes", kube.nodes)
    aws = asgs is not None and on_aws(version, nodes)  # kind or another Kubernetes: AWS is never asked
    return Reads(
        namespace=namespace,
        version=version,
        crds=_read("get customresourcedefinitions " + ", ".join(CRDS), lambda: _crds(kube)),
        deployments=_deployments(kube, namespace),
        nodes=nodes,
        daemonsets=_read("list daemonsets (all namespaces)", lambda: kube.list("apps/v1", "DaemonSet")),
        nodepools=_read("list nodepools.karpenter.sh/v1", lambda: kube.list_if_served("karpenter.sh/v1", "NodePool")),
        asgs=_aws_read("autoscaling:DescribeAutoScalingGroups", asgs) if aws and asgs is not None else None,
    )


def on_aws(version: Raw, nodes: Raw) -> bool:
    """EKS's server version carries `-eks-`; EC2 nodes have an `aws://` provider ID. Either says AWS may hold facts."""
    text = str(((version.items or ({},))[0]).get("gitVersion", "")) if version.answered else ""
    ids = [str((n.get("spec") or {}).get("providerID", "")) for n in (nodes.items or ())] if nodes.answered else []
    return "-eks-" in text or any(i.startswith("aws://") for i in ids)


def _aws_read(source: str, fn: Callable[[], list[dict[str, Any]]]) -> Raw:
    try:
        return Raw(source, items=tuple(fn()))
    except RaydlcError as e:
        return Raw(source, refused=e.message)


CA_CLUSTER_TAG = "k8s.io/cluster-autoscaler/{cluster}"  # the Cluster Autoscaler's ASG auto-discovery tag (AWS provider)


def auto_scaling_groups(client: Any, cluster: str) -> list[dict[str, Any]]:
    """The Auto Scaling groups the Cluster Autoscaler discovers for `cluster` (tag key `k8s.io/cluster-autoscaler/<cluster>`,
    as its `--node-group-auto-discovery=asg:tag=...` names them); `client` is an autoscaling client."""
    from raydlc.edges import aws

    flt = [{"Name": "tag-key", "Values": [CA_CLUSTER_TAG.format(cluster=cluster)]}]
    return list(aws.paginate(client, "describe_auto_scaling_groups", "AutoScalingGroups", Filters=flt))

