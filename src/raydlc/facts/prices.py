"""Every price raydlc uses, in one table with one as-of date: what a cluster and a run cost per hour.

A table, not the Pricing API: estimates must work without pricing:GetProducts and offline.
"""

from __future__ import annotations

PRICES_AS_OF = "2025-06"
PRICE_REGION = "us-east-1"
PLATFORM = "Linux/UNIX"  # what the table prices (and the capacity probe reserves)

# On-Demand Linux list prices, USD per instance-hour, in PRICE_REGION (other regions differ by
# a few to ~30 %). The capacity probe, `raydlc status` and a run's dollar budget all read this
# table; types missing here report no price.
HOURLY_USD_US_EAST_1: dict[str, float] = {
    "g5.12xlarge": 5.672,
    "g5.24xlarge": 8.144,
    "g5.48xlarge": 16.288,
    "g6.12xlarge": 4.6016,
    "g6.24xlarge": 6.6752,
    "g6.48xlarge": 13.3504,
    "g6e.12xlarge": 10.49264,
    "g6e.24xlarge": 15.06559,
    "g6e.48xlarge": 30.13118,
    "p4d.24xlarge": 21.96,
    "p5.48xlarge": 55.04,
    "m7i.xlarge": 0.2016,
}
EKS_CONTROL_PLANE_HOURLY_USD = 0.10  # standard support; extended support is 0.60
NAT_GATEWAY_HOURLY_USD = 0.045  # per gateway, before data processing (0.045 per GB)


PRICE_SOURCE = f"raydlc's built-in table of {PRICE_REGION} On-Demand Linux list prices as of {PRICES_AS_OF} (approximate elsewhere)"


def hourly_cost(instance_type: str, count: int) -> float | None:
    """USD per hour of `count` instances of this type at the table's price; None when the table has no price."""
    price = HOURLY_USD_US_EAST_1.get(instance_type)
    return None if price is None else round(price * count, 4)
