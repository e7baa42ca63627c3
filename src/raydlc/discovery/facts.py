"""The facts `up --attach` and `status` read from a cluster someone else runs: frozen values, each with its source.

A fact is *known* (read, with the call that read it), *unknown* (the read was refused or failed: the note
says why, and nothing is assumed), or *not applicable* (an AWS fact on a cluster that is not EKS). A
forbidden read is never an error here: discovery reports what it could see, and the checks that need a
fact decide what an unknown means for them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class State(StrEnum):
    KNOWN = "known"
    UNKNOWN = "unknown"
    NOT_APPLICABLE = "not-applicable"


@dataclass(frozen=True)
class Fact(Generic[T]):
    """One thing discovery found (or could not), and where from: `source` names the read (`list nodes`)."""

    state: State
    source: str
    value: T | None = None
    note: str = ""

    @classmethod
    def known(cls, value: T, source: str, note: str = "") -> Fact[T]:
        return cls(State.KNOWN, source, value, note)

    @classmethod
    def unknown(cls, source: str, note: str) -> Fact[T]:
        return cls(State.UNKNOWN, source, None, note)

    @classmethod
    def not_applicable(cls, source: str, note: str) -> Fact[T]:
        return cls(State.NOT_APPLICABLE, source, None, note)

    @property
    def is_known(self) -> bool:
        return self.state is State.KNOWN

    def get(self, default: T) -> T:
        """The value when known, else `default` (an unknown list reads as empty only where the caller says so)."""
        return self.value if self.state is State.KNOWN and self.value is not None else default

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state.value, "source": self.source, "value": plain(self.value)}
        if self.note:
            out["note"] = self.note
        return out


# ---------------------------------------------------------------------- KubeRay


@dataclass(frozen=True)
class Crd:
    """A CustomResourceDefinition: its name (`rayclusters.ray.io`), the versions served and the one stored."""

    name: str
    served_versions: tuple[str, ...]
    storage_version: str | None
    established: bool


@dataclass(frozen=True)
class Watch:
    """The namespaces a KubeRay operator reconciles: `all` (no `--watch-namespace`), or the list it was given.
    `configured_by_file`: the operator reads `--config` (the chart's `configuration.enabled`), so the list is
    in a ConfigMap and not read here."""

    all_namespaces: bool
    namespaces: tuple[str, ...] = ()
    configured_by_file: bool = False

    def covers(self, namespace: str) -> bool | None:
        """Whether the operator reconciles RayClusters in `namespace`; None when the list is not known."""
        if self.configured_by_file:
            return None
        return self.all_namespaces or namespace in self.namespaces


@dataclass(frozen=True)
class Operator:
    """A KubeRay operator Deployment found in the cluster: where it runs, its image, the version the tag says."""

    namespace: str
    name: str
    image: str
    version: str | None  # "1.7.0" from the image tag `v1.7.0`; None for a digest or a tag that is no version
    watch: Watch
    available: bool


@dataclass(frozen=True)
class KubeRayFacts:
    crds: Fact[tuple[Crd, ...]]
    operators: Fact[tuple[Operator, ...]]  # known and empty: no operator found


# ---------------------------------------------------------------------- GPU capacity


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class GpuNode:
    """A node with `nvidia.com/gpu` allocatable (Ready or not: `ready` says), as the kubelet reports it."""

    name: str
    instance_type: str | None  # node.kubernetes.io/instance-type: `g6.12xlarge`, or HyperPod's `ml.p5.48xlarge`
    gpus: int
    efa: int  # vpc.amazonaws.com/efa allocatable
    taints: tuple[Taint, ...]
    labels: tuple[tuple[str, str], ...]
    ready: bool
    capacity_type: str | None  # "on-demand", "spot", "capacity-block", "reserved"; None when no label says
    hyperpod: bool  # a SageMaker HyperPod node (sagemaker.amazonaws.com/* labels)
    cpu_m: int = 0  # allocatable CPU in millicores (0: not reported)
    memory_mi: int = 0  # allocatable memory in MiB (0: not reported)

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass(frozen=True)
class NodePool:
    """A Karpenter v1 NodePool whose requirements admit a GPU instance type: capacity that can come."""

    name: str
    instance_types: tuple[str, ...]  # the GPU types its requirements admit (of those raydlc knows)
    capacity_types: tuple[str, ...]  # karpenter.sh/capacity-type values admitted; empty: Karpenter's default
    taints: tuple[Taint, ...]
    labels: tuple[tuple[str, str], ...]  # spec.template.metadata.labels: on every node it makes
    gpu_limit: int | None  # spec.limits["nvidia.com/gpu"]


@dataclass(frozen=True)
class AsgGroup:
    """A Cluster Autoscaler node group at zero, read from its Auto Scaling group's tags (AWS, when readable)."""

    name: str
    instance_type: str | None
    min_size: int
    max_size: int
    desired: int
    labels: tuple[tuple[str, str], ...]  # k8s.io/cluster-autoscaler/node-template/label/*
    taints: tuple[Taint, ...]  # k8s.io/cluster-autoscaler/node-template/taint/*


@dataclass(frozen=True)
class DevicePlugin:
    """A device-plugin DaemonSet (NVIDIA or EFA): where, which resource it advertises, how many pods are ready."""

    name: str
    namespace: str
    resource: str  # nvidia.com/gpu or vpc.amazonaws.com/efa
    desired: int
    ready: int


@dataclass(frozen=True)
class EksCluster:
    name: str
    region: str | None
    version: str | None


# ---------------------------------------------------------------------- all of it


@dataclass(frozen=True)
class ClusterFacts:
    """What `up --attach` found in the cluster and namespace it was pointed at; `status --json` prints `to_dict()`."""

    context: str | None
    namespace: str
    server_version: Fact[str]
    eks: Fact[EksCluster]  # not-applicable: not EKS (kind, another Kubernetes)
    kuberay: KubeRayFacts
    gpu_nodes: Fact[tuple[GpuNode, ...]]
    node_pools: Fact[tuple[NodePool, ...]]
    asg_groups: Fact[tuple[AsgGroup, ...]]
    device_plugins: Fact[tuple[DevicePlugin, ...]]
    node_autoscaler: Fact[str] = field(default_factory=lambda: Fact.unknown("discovery", "not looked at"))

    def to_dict(self) -> dict[str, Any]:
        out = plain(self)
        assert isinstance(out, dict)
        return out


def plain(value: Any) -> Any:
    """Facts as JSON-ready data: dataclasses as dicts, tuples as lists, label pairs as mappings, states as text."""
    if isinstance(value, Fact):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            out[f.name] = dict(v) if f.name == "labels" else plain(v)
        return out
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
