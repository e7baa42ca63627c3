"""The evidence about where GPU nodes can be had, and which vCPU quota an instance family counts against.

Data only, and facts known without asking AWS: `readers` fill these records from AWS and
`ranking` turns them into verdicts, so the two never need each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class QuotaClass:
    """The On-Demand and Spot vCPU quotas an instance family counts against."""

    name: str
    on_demand_code: str
    spot_code: str | None


_G = QuotaClass("G and VT", "L-DB2E81BA", "L-3819A6DF")
_STANDARD = QuotaClass("Standard (A, C, D, H, I, M, R, T, Z)", "L-1216C47A", "L-34B43A08")
# Keyed by the family's leading letters: g6e -> g, p5en -> p, inf2 -> inf, u-6tb1 -> u.
QUOTA_CLASSES: dict[str, QuotaClass] = {
    "g": _G, "gr": _G, "vt": _G,
    "p": QuotaClass("P", "L-417A185B", "L-7212CCBC"),
    "inf": QuotaClass("Inf", "L-1945791B", "L-B5D1601B"),
    "trn": QuotaClass("Trn", "L-2C3B7624", "L-6B0D517C"),
    "dl": QuotaClass("DL", "L-6E869C2A", "L-85EED4F7"),
    "f": QuotaClass("F", "L-74FC7D96", "L-88CF9481"),
    "x": QuotaClass("X", "L-7295265B", "L-E3A00192"),
    "hpc": QuotaClass("HPC", "L-F7808C92", None),
    "u": QuotaClass("High Memory", "L-43DA4232", None),
}


def quota_class(instance_type: str) -> QuotaClass:
    head = re.match(r"[a-z]*", instance_type.lower())
    return QUOTA_CLASSES.get(head.group(0) if head else "", _STANDARD)


@dataclass(frozen=True)
class Signal(Generic[T]):
    """One piece of evidence: a value, or the reason it could not be read."""

    value: T | None = None
    unknown: str | None = None

    @property
    def known(self) -> bool:
        return self.unknown is None


@dataclass(frozen=True)
class Zone:
    name: str
    zone_id: str | None


@dataclass(frozen=True)
class InstanceFacts:
    instance_type: str
    vcpus: int
    gpus: int
    gpu_model: str | None
    gpu_memory_gib: float | None
    efa_supported: bool
    max_efa_interfaces: int
    network_performance: str | None


@dataclass(frozen=True)
class QuotaValue:
    code: str
    name: str
    value: float
    source: Literal["applied", "default"]


@dataclass(frozen=True)
class SubnetFacts:
    """The cluster's VPC and the AZs where it has a private subnet; cluster None = not created yet."""

    cluster: str | None
    vpc_id: str | None = None
    private_zones: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Signals:
    zones: Signal[list[Zone]]
    offered: Signal[frozenset[str]]
    facts: Signal[InstanceFacts]
    on_demand_quota: Signal[QuotaValue]
    used_vcpus: Signal[int]
    spot_scores: Signal[dict[str, int]]  # by AZ id
    spot_quota: Signal[QuotaValue]
    subnets: Signal[SubnetFacts]
    spot_prices: Signal[dict[str, float]] = Signal()  # USD/hour by AZ name; empty: not read

    def unknowns(self) -> dict[str, str]:
        return {name: s.unknown for name, s in vars(self).items() if isinstance(s, Signal) and s.unknown}

