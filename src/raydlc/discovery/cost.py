"""What the found GPU nodes cost, from raydlc's one price table (raydlc.facts.prices): a price, or "unknown".

An instance type the table lacks, or a SageMaker HyperPod `ml.` type (billed by SageMaker, not at EC2's list
price), has no price: it is said as unknown, never shown as $0, and a dollar budget on it is refused
(raydlc.planner.budget.check_budget). Spot nodes are priced at the On-Demand list price, an upper bound, and
say so; the capacity type comes from the nodes' labels (EKS `eks.amazonaws.com/capacityType`, Karpenter
`karpenter.sh/capacity-type`), read by raydlc.discovery.read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raydlc.discovery.facts import ClusterFacts
from raydlc.discovery.target import WorkerTarget
from raydlc.facts import prices as table


@dataclass(frozen=True)
class NodePrice:
    instance_type: str
    usd_per_hour: float | None  # one node; None: unknown (never 0)
    spot: bool
    note: str

    def text(self) -> str:
        if self.usd_per_hour is None:
            return f"unknown price ({self.note})"
        return f"${self.usd_per_hour:.2f}/h per node ({self.note})"

    def to_dict(self) -> dict[str, Any]:
        return {"instance_type": self.instance_type, "usd_per_hour": self.usd_per_hour, "spot": self.spot, "note": self.note}


def price(instance_type: str, *, spot: bool = False, prices: Mapping[str, float] | None = None) -> NodePrice:
    """One node of `instance_type` an hour, from `prices` (the table by default)."""
    known = table.HOURLY_USD_US_EAST_1 if prices is None else prices
    if instance_type.startswith("ml."):
        return NodePrice(instance_type, None, spot, "a SageMaker HyperPod instance: SageMaker bills it, not at EC2's list price")
    usd = known.get(instance_type)
    if usd is None or usd <= 0:
        return NodePrice(instance_type, None, spot, f"{instance_type} is not in raydlc's price table")
    note = table.PRICE_SOURCE if not spot else f"Spot: the On-Demand list price, an upper bound; {table.PRICE_SOURCE}"
    return NodePrice(instance_type, usd, spot, note)


def target_price(target: WorkerTarget, prices: Mapping[str, float] | None = None) -> NodePrice:
    return price(target.instance_type, spot=target.spot, prices=prices)


def spot_nodes(facts: ClusterFacts) -> bool | None:
    """Whether any GPU node found is Spot (None when the nodes could not be read)."""
    if not facts.gpu_nodes.is_known:
        return None
    return any(n.capacity_type == "spot" for n in facts.gpu_nodes.value or ())
