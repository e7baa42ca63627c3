"""Signals to AZ verdicts, pure: every branch of the decision is testable without AWS."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from raydlc.capacity.signals import InstanceFacts, QuotaValue, Signal, Signals, SubnetFacts, Zone, quota_class
from raydlc.facts import instances
from raydlc.facts.prices import HOURLY_USD_US_EAST_1

Verdict = Literal["ready", "quota-short", "not-offered", "unknown"]
VERDICT_ORDER: dict[str, int] = {"ready": 0, "unknown": 1, "quota-short": 2, "not-offered": 3}


@dataclass(frozen=True)
class ZoneReport:
    zone: str
    zone_id: str | None
    offered: bool | None
    spot_score: int | None
    private_subnet: bool | None  # None: no cluster yet (eksctl will create the subnets) or unknown
    verdict: Verdict
    reason: str
    spot_price_usd: float | None = None  # the current Spot price of one node here, USD/hour (DescribeSpotPriceHistory)


@dataclass(frozen=True)
class QuotaReport:
    code: str
    name: str
    value: float | None
    used: int | None
    headroom: float | None
    unknown: str | None = None


@dataclass(frozen=True)
class QuotaRequest:
    service: str
    quota_code: str
    quota_name: str
    value: float
    region: str

    @property
    def command(self) -> str:
        return (
            f"aws service-quotas request-service-quota-increase --service-code {self.service} "
            f"--quota-code {self.quota_code} --desired-value {self.value:g} --region {self.region}"
        )


@dataclass
class ReservationResult:
    """What holding and cancelling a reservation showed (`raydlc capacity --probe`, the JSON's `probe`)."""

    zone: str
    instance_type: str
    count: int
    outcome: Literal["available", "insufficient-capacity"]
    reservation_id: str | None
    cancelled: bool
    hourly_usd: float | None
    price_source: str
    message: str


@dataclass
class CapacityReport:
    region: str
    instance_type: str
    count: int
    vcpus_needed: int | None
    instance: InstanceFacts | None
    quota: QuotaReport
    spot_quota: QuotaReport
    zones: list[ZoneReport]
    best_zone: str | None
    quota_request: QuotaRequest | None
    cluster: SubnetFacts | None
    checks: list[str] = field(default_factory=list)
    unknown: dict[str, str] = field(default_factory=dict)
    probe: ReservationResult | None = None
    capacity_type: str = "on-demand"  # GPU_CAPACITY_TYPE the zones were ranked for
    on_demand_usd_per_node_hour: float | None = None  # raydlc's table (raydlc.facts.prices); each zone has its Spot price
    # spot-then-on-demand with a Spot vCPU quota below the nodes' vCPUs while On-Demand's holds them: `up` goes to
    # On-Demand at once (EC2 would refuse the Spot launches with MaxSpotInstanceCountExceeded)
    spot_quota_short: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["quota_request"] = None if self.quota_request is None else {**asdict(self.quota_request), "command": self.quota_request.command}
        if self.cluster is not None:
            d["cluster"] = {"name": self.cluster.cluster, "vpc_id": self.cluster.vpc_id,
                            "private_zones": sorted(self.cluster.private_zones)}
        return d


def _vcpus_per_node(signals: Signals, instance_type: str) -> int | None:
    if signals.facts.value is not None:
        return signals.facts.value.vcpus
    known = instances.instance_type(instance_type)
    return known.vcpus if known else None


def check_instance(facts: InstanceFacts, gpus_per_node: int) -> list[str]:
    """What the live instance facts say about the config; each line names the setting to change."""
    out: list[str] = []
    if facts.gpus == 0:
        out.append(f"GPU_NODE_TYPE: {facts.instance_type} has no GPUs")
    elif facts.gpus != gpus_per_node:
        out.append(f"GPUS_PER_NODE: {facts.instance_type} has {facts.gpus} GPUs per node, config says {gpus_per_node}")
    if not facts.efa_supported:
        out.append(f"GPU_NODE_TYPE: {facts.instance_type} does not support EFA; multi-node NCCL would fall back to TCP sockets")
    known = instances.instance_type(facts.instance_type)
    if known is not None and (known.vcpus, known.gpus, known.efa_interfaces) != (facts.vcpus, facts.gpus, facts.max_efa_interfaces):
        out.append(
            f"catalog: raydlc's catalog says {facts.instance_type} has {known.vcpus} vCPUs, {known.gpus} GPUs, "
            f"{known.efa_interfaces} EFA interfaces; EC2 says {facts.vcpus}, {facts.gpus}, {facts.max_efa_interfaces}"
        )
    return out


def _quota_report(q: Signal[QuotaValue], used: Signal[int], code: str, name: str) -> QuotaReport:
    if q.value is None:
        return QuotaReport(code, name, None, used.value, None, unknown=q.unknown)
    headroom = q.value.value - used.value if used.value is not None else None
    return QuotaReport(q.value.code, q.value.name, q.value.value, used.value, headroom,
                       unknown=None if used.known else f"vCPUs in use: {used.unknown}")


@dataclass(frozen=True)
class _Quota:
    """The On-Demand quota against the vCPUs needed: short of them, unknown (why), and the request that would fix a shortage."""

    report: QuotaReport
    need: int | None
    short: bool
    unknown: str | None
    request: QuotaRequest | None
    kind: str = "On-Demand"  # or "Spot": the quota the nodes are bought under


def _quota(signals: Signals, *, region: str, instance_type: str, count: int, spot: bool = False) -> _Quota:
    """The quota the GPU nodes are bought under: On-Demand, or (spot) the Spot vCPU quota, whose vCPUs in use
    raydlc does not count (a quota below the need is short; one above it leaves the verdict unknown)."""
    qc = quota_class(instance_type)
    per_node = _vcpus_per_node(signals, instance_type)
    need = per_node * count if per_node is not None else None
    kind = "Spot" if spot else "On-Demand"
    if spot:
        quota = _quota_report(signals.spot_quota, Signal(unknown="Spot vCPUs in use are not counted"), qc.spot_code or "",
                              f"All {qc.name} Spot Instance Requests")
    else:
        quota = _quota_report(signals.on_demand_quota, signals.used_vcpus, qc.on_demand_code, f"Running On-Demand {qc.name} instances")
    short = False
    unknown: str | None = None
    if need is None:
        unknown = f"the vCPUs of {instance_type} could not be read"
    elif quota.value is None:
        unknown = f"{kind} quota {quota.code} could not be read"
    elif quota.headroom is None:
        if quota.value < need:
            short = True
        else:
            unknown = f"the vCPUs in use under {quota.code} could not be counted"
    else:
        short = quota.headroom < need
    request: QuotaRequest | None = None
    if short and need is not None and quota.value is not None:
        request = QuotaRequest("ec2", quota.code, quota.name, float(math.ceil((quota.used or 0) + need)), region)
    return _Quota(quota, need, short, unknown, request, kind)


def _spot_quota(signals: Signals, instance_type: str) -> QuotaReport:
    qc, sq = quota_class(instance_type), signals.spot_quota
    return QuotaReport(
        qc.spot_code or "", sq.value.name if sq.value else f"All {qc.name} Spot Instance Requests",
        sq.value.value if sq.value else None, None, None, sq.unknown,
    )


def _zones(signals: Signals) -> list[Zone]:
    """The region's AZs, else those the offerings name, else none."""
    if signals.zones.value is not None:
        return signals.zones.value
    if signals.offered.value is not None:
        return [Zone(name, None) for name in sorted(signals.offered.value)]
    return []


def _verdict(zone: str, offered: bool | None, q: _Quota, instance_type: str) -> tuple[Verdict, str]:
    """One AZ's verdict on offering and quota, with the words that say why."""
    if offered is False:
        return "not-offered", f"{instance_type} is not offered in {zone}"
    if offered is None:
        return "unknown", "the instance type offerings could not be read"
    quota = q.report
    if q.short:
        assert q.need is not None and quota.value is not None
        assert q.request is not None
        used = "unknown" if quota.used is None else str(quota.used)
        return "quota-short", (
            f"offered; {q.kind} {quota_class(instance_type).name} quota {quota.value:g} vCPUs with {used} in use "
            f"leaves less than the {q.need} needed; request {quota.code} = {q.request.value:g}"
        )
    if q.unknown is not None:
        return "unknown", f"offered; {q.unknown}"
    assert quota.headroom is not None
    return "ready", f"offered; quota headroom {quota.headroom:g} >= {q.need} vCPUs"


def _judge(z: Zone, signals: Signals, q: _Quota, instance_type: str) -> ZoneReport:
    """One AZ on every signal (offering, quota, Spot score, subnets); its reason is written with its verdict, so they cannot disagree."""
    scores, subnets = signals.spot_scores.value, signals.subnets.value
    offered = None if signals.offered.value is None else z.name in signals.offered.value
    score = scores.get(z.zone_id or "") if scores is not None and z.zone_id else None
    private = None
    if subnets is not None and subnets.cluster is not None:
        private = z.name in subnets.private_zones
    verdict, reason = _verdict(z.name, offered, q, instance_type)
    price = (signals.spot_prices.value or {}).get(z.name)
    notes = []
    if offered and score is not None:
        notes.append(f"spot score {score}/10")
    if offered and price is not None:
        notes.append(f"spot ${price:.3f}/h a node")
    if offered and private is False:
        notes.append(f"no private subnet of {subnets.vpc_id if subnets else 'the cluster VPC'} here")
    if notes:
        reason = f"{reason}; {'; '.join(notes)}"
    return ZoneReport(z.name, z.zone_id, offered, score, private, verdict, reason, price)


def _order(spot: bool) -> Any:
    """The sort key of zones: verdict, a private subnet, then the Spot placement score (likelier capacity) best
    first; for Spot capacity the cheaper current Spot price breaks a tie of scores (an unknown price last)."""
    def key(r: ZoneReport) -> tuple[Any, ...]:
        score = -(r.spot_score if r.spot_score is not None else -1)
        price = (r.spot_price_usd if r.spot_price_usd is not None else math.inf) if spot else 0.0
        return (VERDICT_ORDER[r.verdict], r.private_subnet is False, score, price, r.zone)
    return key


def rank(
    signals: Signals, *, region: str, instance_type: str, count: int, gpus_per_node: int | None = None,
    capacity_type: str = "on-demand",
) -> CapacityReport:
    """Signals to ordered AZs with a verdict each; pure, so every branch is testable offline."""
    q = _quota(signals, region=region, instance_type=instance_type, count=count)
    spot_q = _quota(signals, region=region, instance_type=instance_type, count=count, spot=True)
    spot_short = False
    if capacity_type == "spot":
        q = spot_q  # Spot nodes count against the Spot quota
    elif capacity_type == "spot-then-on-demand":
        # Spot first, under the Spot quota; a short one is a fallback to On-Demand when its quota holds the nodes,
        # and when On-Demand is short, Spot's quota is the one that may still hold them
        spot_short = spot_q.short and not q.short
        if q.short:
            q = spot_q
    subnets = signals.subnets.value
    reports = [_judge(z, signals, q, instance_type) for z in _zones(signals)]
    reports.sort(key=_order(capacity_type != "on-demand"))
    best = next((r.zone for r in reports if r.verdict in ("ready", "unknown") and r.offered), None)
    checks = check_instance(signals.facts.value, gpus_per_node) if signals.facts.value and gpus_per_node else []
    return CapacityReport(
        region=region, instance_type=instance_type, count=count, vcpus_needed=q.need,
        instance=signals.facts.value, quota=q.report, spot_quota=_spot_quota(signals, instance_type), zones=reports, best_zone=best,
        quota_request=q.request, cluster=subnets if subnets is not None and subnets.cluster else None,
        checks=checks, unknown=signals.unknowns(), capacity_type=capacity_type,
        on_demand_usd_per_node_hour=HOURLY_USD_US_EAST_1.get(instance_type), spot_quota_short=spot_short,
    )


