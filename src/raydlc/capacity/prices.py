"""What the GPU nodes cost an hour bought each way: the On-Demand list price beside the current Spot price.

The On-Demand price is raydlc's table (`raydlc.facts.prices`, offline, one region and date); the Spot
price is live, EC2's DescribeSpotPriceHistory for the type in the GPU AZ (`readers.read_spot_prices`),
and unknown, with the reason, when it cannot be read (no credentials, no permission, no AZ yet).
A run is priced at what it is bought at: Spot for GPU_CAPACITY_TYPE spot, and for spot-then-on-demand
while the node group is Spot (`on_spot`); the On-Demand price otherwise, or when the Spot price is unknown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from raydlc.errors import RaydlcError
from raydlc.facts.prices import HOURLY_USD_US_EAST_1, PRICE_SOURCE

if TYPE_CHECKING:
    from raydlc.config import Config

SPOT_SOURCE = "EC2 DescribeSpotPriceHistory, now (Linux/UNIX)"


@dataclass(frozen=True)
class GpuPrices:
    """USD per hour of the GPU nodes (`nodes` × `instance_type` in `az`), On-Demand and Spot; None = unknown."""

    instance_type: str
    nodes: int
    az: str | None
    capacity_type: str  # GPU_CAPACITY_TYPE
    on_demand_usd_per_node_hour: float | None
    spot_usd_per_node_hour: float | None
    spot_unknown: str | None = None  # why the Spot price is unknown
    on_spot: bool = False  # the run is bought (and so priced) at Spot

    @property
    def on_demand_usd_per_hour(self) -> float | None:
        p = self.on_demand_usd_per_node_hour
        return None if p is None else round(p * self.nodes, 4)

    @property
    def spot_usd_per_hour(self) -> float | None:
        p = self.spot_usd_per_node_hour
        return None if p is None else round(p * self.nodes, 4)

    @property
    def run_usd_per_node_hour(self) -> float | None:
        """The price a run on these nodes is charged at: Spot when bought at Spot and known, else On-Demand."""
        if self.on_spot and self.spot_usd_per_node_hour is not None:
            return self.spot_usd_per_node_hour
        return self.on_demand_usd_per_node_hour

    @property
    def run_price(self) -> str:
        if self.on_spot and self.spot_usd_per_node_hour is not None:
            return "spot"
        return "on-demand"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "on_demand_usd_per_hour": self.on_demand_usd_per_hour,
                "spot_usd_per_hour": self.spot_usd_per_hour, "run_price": self.run_price,
                "on_demand_source": PRICE_SOURCE, "spot_source": SPOT_SOURCE}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GpuPrices:
        """Back from `to_dict()` (what `--json` printed)."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def line(self) -> str:
        """One line for people: both prices of the GPU nodes and which one a run is charged at."""
        def usd(v: float | None) -> str:
            return "unknown" if v is None else f"${v:,.2f}/h"
        spot = usd(self.spot_usd_per_hour) + (f" ({self.spot_unknown})" if self.spot_usd_per_hour is None and self.spot_unknown else "")
        where = f" in {self.az}" if self.az else ""
        return (f"GPU nodes {self.nodes} × {self.instance_type}{where}: on-demand {usd(self.on_demand_usd_per_hour)}, "
                f"spot {spot}; GPU_CAPACITY_TYPE={self.capacity_type}, runs priced at {self.run_price}")


def gpu_prices(cfg: Config, az: str | None, spot_by_az: dict[str, float] | None, *, unknown: str | None = None,
               on_spot: bool | None = None) -> GpuPrices:
    """The prices from what was read (pure): `spot_by_az` from DescribeSpotPriceHistory (None: not read, `unknown` why).
    `on_spot`: whether the nodes are Spot now (the node group's capacityType); None: as GPU_CAPACITY_TYPE says."""
    g = cfg.gpu_nodes
    spot = (spot_by_az or {}).get(az) if az else None
    why = unknown
    if spot is None and why is None:
        why = "no GPU AZ yet" if not az else f"EC2 has no Spot price of {g.instance_type} in {az}"
    return GpuPrices(g.instance_type, g.count, az, g.capacity_type, HOURLY_USD_US_EAST_1.get(g.instance_type), spot,
                     None if spot is not None else why,
                     g.capacity_type != "on-demand" if on_spot is None else on_spot)


def read_gpu_prices(cfg: Config, az: str | None, ec2: Any = None, *, on_spot: bool | None = None) -> GpuPrices:
    """The prices with the Spot price read live (`ec2`: a client; None: one from raydlc.edges.aws). Nothing raises:
    no credentials, a denied call or no AZ leave the Spot price unknown with the reason."""
    from raydlc.capacity.readers import read_spot_prices
    from raydlc.edges import aws

    if not az:
        return gpu_prices(cfg, None, None, on_spot=on_spot)
    try:
        client = ec2 if ec2 is not None else aws.client(aws.session(cfg.cluster.region), "ec2")
        found = read_spot_prices(client, cfg.gpu_nodes.instance_type, az)
    except RaydlcError as e:
        return gpu_prices(cfg, az, None, unknown=e.message, on_spot=on_spot)
    return gpu_prices(cfg, az, found, on_spot=on_spot)


def cluster_gpu_prices(cfg: Config) -> GpuPrices:
    """The prices of the cluster's GPU nodes as they are bought now: the node group's AZ and capacityType (SPOT or
    not) from EKS, else GPU_AZ and GPU_CAPACITY_TYPE; the Spot price read live. Nothing raises (see read_gpu_prices)."""
    from raydlc.edges import aws

    az, on_spot = cfg.gpu_nodes.az, None
    try:
        sess = aws.session(cfg.cluster.region)
        eks, ec2 = aws.client(sess, "eks"), aws.client(sess, "ec2")
        ng = aws.call(eks, "describe_nodegroup", clusterName=cfg.cluster.name,
                      nodegroupName=cfg.gpu_nodes.nodegroup_name)["nodegroup"]
        on_spot = ng.get("capacityType") == "SPOT"
        subnets = ng.get("subnets") or []
        if subnets:
            found = aws.call(ec2, "describe_subnets", SubnetIds=subnets[:1])["Subnets"]
            az = found[0]["AvailabilityZone"] if found else az
    except RaydlcError as e:
        return read_gpu_prices(cfg, az, on_spot=on_spot) if az else gpu_prices(cfg, None, None, unknown=e.message)
    return read_gpu_prices(cfg, az, ec2, on_spot=on_spot)
