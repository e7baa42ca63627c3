"""Where can the GPU nodes actually be had? Signals from AWS, ranked into one AZ choice.

EFA node groups live in exactly one AZ, so the AZ is the decision everything else hangs
on. The answer is split in rooms: `readers` read the independent signals in parallel
(clients passed in), `ranking` turns them into verdicts without touching AWS, `reservation`
holds a real On-Demand Capacity Reservation for a moment and never leaves one behind, and
`raydlc.views.capacity` shows the report to people. `discover` runs them for a Config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raydlc.capacity.ranking import (
    VERDICT_ORDER,
    CapacityReport,
    QuotaReport,
    QuotaRequest,
    ReservationResult,
    Verdict,
    ZoneReport,
    check_instance,
    rank,
)
from raydlc.capacity.readers import gather, read_facts, read_quota, read_subnets
from raydlc.capacity.reservation import PROBE_TAG, ReservationInterrupted, ReservationLeftBehind, hold_and_cancel
from raydlc.capacity.signals import (
    QUOTA_CLASSES,
    InstanceFacts,
    QuotaClass,
    QuotaValue,
    Signal,
    Signals,
    SubnetFacts,
    Zone,
    quota_class,
)
from raydlc.edges import aws
from raydlc.errors import AwsError
from raydlc.facts.prices import hourly_cost

if TYPE_CHECKING:
    from raydlc.config import Config

__all__ = [
    "PROBE_TAG",
    "QUOTA_CLASSES",
    "VERDICT_ORDER",
    "CapacityReport",
    "InstanceFacts",
    "QuotaClass",
    "QuotaReport",
    "QuotaRequest",
    "QuotaValue",
    "ReservationInterrupted",
    "ReservationLeftBehind",
    "ReservationResult",
    "Signal",
    "Signals",
    "SubnetFacts",
    "Verdict",
    "Zone",
    "ZoneReport",
    "check_instance",
    "discover",
    "gather",
    "hold_and_cancel",
    "hourly_cost",
    "quota_class",
    "rank",
    "read_facts",
    "read_quota",
    "read_subnets",
]


def discover(cfg: Config, *, with_probe: bool = False) -> CapacityReport:
    """The whole check for a config: clients from raydlc.edges.aws, signals, ranking, optional probe."""
    region = cfg.cluster.region
    sess = aws.session(region)
    ec2, quotas, eks = (aws.client(sess, s) for s in ("ec2", "service-quotas", "eks"))
    gpu = cfg.gpu_nodes
    signals = gather(ec2, quotas, eks, region=region, instance_type=gpu.instance_type, count=gpu.count, cluster=cfg.cluster.name)
    report = rank(signals, region=region, instance_type=gpu.instance_type, count=gpu.count, gpus_per_node=gpu.gpus_per_node,
                  capacity_type=gpu.capacity_type)
    if gpu.az is not None:
        chosen = next((z for z in report.zones if z.zone == gpu.az), None)
        if chosen is not None and chosen.verdict not in ("ready", "unknown"):
            report.checks.append(f"GPU_AZ: {gpu.az} is {chosen.verdict}: {chosen.reason}")
    if with_probe:
        if report.best_zone is None:
            raise AwsError(
                f"no AZ in {region} can take {gpu.count} × {gpu.instance_type}; nothing to probe",
                hint=report.quota_request.command if report.quota_request else "try another REGION or GPU_NODE_TYPE",
            )
        report.probe = hold_and_cancel(ec2, region=region, zone=report.best_zone, instance_type=gpu.instance_type, count=gpu.count)
    return report


