"""The GPU Availability Zone of a run as a frozen value, from capacity discovery's ranking (pure).

`raydlc up` asks for it once (`lifecycle/resources/capacity.py`) and hands it to the resources
that need it: the cluster (the ClusterConfig's AZs) and the GPU node group (its AZ, and where to
go next when raydlc chose the zone and it has no capacity).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raydlc.capacity.ranking import CapacityReport, ZoneReport
    from raydlc.config import Config

# Zone IDs EKS refuses control-plane subnets in (UnsupportedAvailabilityZoneException). eksctl avoids
# them only when it picks the zones itself (`pkg/az/az.go` `zoneIDsToAvoid`, v0.230.0); raydlc always
# names the zones, so it avoids them here. By ID: zone names map to IDs differently in each account.
EKS_REFUSED_ZONE_IDS: dict[str, frozenset[str]] = {
    "us-east-1": frozenset({"use1-az3"}),
    "us-west-1": frozenset({"usw1-az2"}),
    "ca-central-1": frozenset({"cac1-az3"}),
}
MIN_CLUSTER_ZONES = 2  # EKS wants control-plane subnets in at least two AZs (eksctl MinRequiredAvailabilityZones)
MAX_CLUSTER_ZONES = 3  # eksctl's RecommendedAvailabilityZones: the GPU AZ and at most two to retry in


def refused(region: str, zone: ZoneReport) -> bool:
    """Whether EKS refuses a control plane with a subnet in this zone (judged by its zone ID)."""
    return zone.zone_id is not None and zone.zone_id in EKS_REFUSED_ZONE_IDS.get(region, frozenset())


@dataclass(frozen=True)
class ZoneChoice:
    """The GPU Availability Zone of one run and why: decided once, passed on, never changed.

    `zone` is None when no AZ can take the node group (`reason` says why, `hint` what to do).
    `candidates` are the AZs the node group may go to, best first, `zone` first; `chosen` says
    raydlc picked it (so a capacity failure may move on to the next candidate; an AZ the user set,
    or the one an existing node group is in, stays). `cluster_zones` are the ClusterConfig's AZs:
    the GPU AZ, the other candidates (a retry needs a subnet there; at most two), and as few others
    as EKS needs (two AZs in all), never one whose zone ID EKS refuses for a control plane.
    """

    zone: str | None
    candidates: tuple[str, ...]
    reason: str
    chosen: bool
    cluster_zones: tuple[str, ...] = ()
    hint: str | None = None
    refused: bool = False  # the zone the user set (GPU_AZ) can never hold the cluster: their input to change
    spot_quota_short: bool = False  # spot-then-on-demand whose Spot vCPU quota cannot hold the nodes: On-Demand at once

    def zones_for(self, az: str) -> list[str]:
        """The ClusterConfig's AZs with `az` as the GPU node group's (it comes first)."""
        return [az, *[z for z in self.cluster_zones if z != az]]


def existing_choice(cfg: Config, az: str, cluster_zones: set[str]) -> ZoneChoice:
    """The zone of a node group that is already there: it stays where it is (pure)."""
    return ZoneChoice(az, (az,), f"{az}: the AZ of the existing node group {cfg.gpu_nodes.nodegroup_name}", False,
                      (az, *sorted(cluster_zones - {az})))


def choose(cfg: Config, report: CapacityReport) -> ZoneChoice:
    """The GPU zone from capacity discovery's ranking and GPU_AZ (pure)."""
    hint = report.quota_request.command if report.quota_request is not None else None
    region = cfg.cluster.region
    allowed = [z for z in report.zones if not refused(region, z)]  # the GPU AZ is one of the cluster's too
    usable = [z for z in allowed if z.offered and z.verdict in ("ready", "unknown")]
    if report.cluster is not None:  # an existing VPC has subnets only where it has them
        usable = [z for z in usable if z.zone in report.cluster.private_zones] or usable
    others = [z.zone for z in allowed if z not in usable]
    az = cfg.gpu_nodes.az
    if az:
        zone = next((z for z in report.zones if z.zone == az), None)
        if zone is not None and refused(region, zone):
            return ZoneChoice(None, (), f"GPU_AZ {az} ({cfg.origin('GPU_AZ')}) is zone ID {zone.zone_id}, where EKS "
                                        f"refuses control-plane subnets in {region}, and the GPU AZ is one of the "
                                        "cluster's; set GPU_AZ to another AZ (`raydlc capacity` lists each with its ID)",
                              False, hint="raydlc capacity", refused=True)
        if zone is not None and zone.verdict in ("not-offered", "quota-short"):
            return ZoneChoice(None, (), f"GPU_AZ {az} ({cfg.origin('GPU_AZ')}) is {zone.verdict}: {zone.reason}", False,
                              hint=hint)
        reason = f"{az}: set by GPU_AZ ({cfg.origin('GPU_AZ')})" + (f"; {zone.verdict}: {zone.reason}" if zone else "")
        candidates, chosen = (az,), False
    elif not usable:
        why = report.zones[0].reason if report.zones else "no Availability Zone could be read"
        return ZoneChoice(None, (), f"no AZ of {cfg.cluster.region} can take {cfg.gpu_nodes.count} × "
                                    f"{cfg.gpu_nodes.instance_type}: {why}", False, hint=hint)
    else:
        az, best = usable[0].zone, usable[0]
        reason = f"{az}: {best.verdict} ({best.reason})"
        candidates, chosen = tuple(z.zone for z in usable[:MAX_CLUSTER_ZONES]), True
    retry = [z for z in candidates if z != az]
    pad = [z for z in [u.zone for u in usable] + others if z != az and z not in retry]
    extra = retry + pad[: max(0, MIN_CLUSTER_ZONES - 1 - len(retry))]
    return ZoneChoice(az, candidates, reason, chosen, (az, *extra), hint, spot_quota_short=report.spot_quota_short)
