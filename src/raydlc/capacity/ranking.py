"""Signals to AZ verdicts, pure: every branch of the decision is testable without AWS."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from raydlc import catalog
from raydlc.capacity.signals import InstanceFacts, QuotaValue, Signal, Signals, SubnetFacts, Zone, quota_class

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
class ProbeResult:
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
    probe: ProbeResult | None = None

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
    known = catalog.instance_type(instance_type)
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
    known = catalog.instance_type(facts.instance_type)
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


# Long on purpose: one pass judges each AZ on every signal (offering, Spot score, subnets) and writes its reason as it goes, so the verdict and its words cannot disagree.
def rank(
    signals: Signals, *, region: str, instance_type: str, count: int, gpus_per_node: int | None = None,
) -> CapacityReport:
    """Signals to ordered AZs with a verdict each; pure, so every branch is testable offline."""
    qc = quota_class(instance_type)
    per_node = _vcpus_per_node(signals, instance_type)
    need = per_node * count if per_node is not None else None
    quota = _quota_report(signals.on_demand_quota, signals.used_vcpus, qc.on_demand_code, f"Running On-Demand {qc.name} instances")
    sq = signals.spot_quota
    spot_quota = QuotaReport(
        qc.spot_code or "", sq.value.name if sq.value else f"All {qc.name} Spot Instance Requests",
        sq.value.value if sq.value else None, None, None, sq.unknown,
    )

    # quota state: "ok", "short" or an unknown reason
    short = False
    quota_unknown: str | None = None
    request: QuotaRequest | None = None
    if need is None:
        quota_unknown = f"the vCPUs of {instance_type} could not be read"
    elif quota.value is None:
        quota_unknown = f"On-Demand quota {qc.on_demand_code} could not be read"
    elif quota.headroom is None:
        if quota.value < need:
            short = True
        else:
            quota_unknown = f"the vCPUs in use under {qc.on_demand_code} could not be counted"
    else:
        short = quota.headroom < need
    if short and need is not None and quota.value is not None:
        request = QuotaRequest("ec2", quota.code, quota.name, float(math.ceil((quota.used or 0) + need)), region)

    if signals.zones.value is not None:
        zones = signals.zones.value
    elif signals.offered.value is not None:
        zones = [Zone(name, None) for name in sorted(signals.offered.value)]
    else:
        zones = []
    scores = signals.spot_scores.value
    subnets = signals.subnets.value

    reports: list[ZoneReport] = []
    for z in zones:
        offered = None if signals.offered.value is None else z.name in signals.offered.value
        score = scores.get(z.zone_id or "") if scores is not None and z.zone_id else None
        private = None
        if subnets is not None and subnets.cluster is not None:
            private = z.name in subnets.private_zones
        verdict: Verdict
        if offered is False:
            verdict, reason = "not-offered", f"{instance_type} is not offered in {z.name}"
        elif offered is None:
            verdict, reason = "unknown", "the instance type offerings could not be read"
        elif short:
            assert need is not None and quota.value is not None
            assert request is not None
            used = "unknown" if quota.used is None else str(quota.used)
            verdict = "quota-short"
            reason = (
                f"offered; On-Demand {qc.name} quota {quota.value:g} vCPUs with {used} in use "
                f"leaves less than the {need} needed; request {quota.code} = {request.value:g}"
            )
        elif quota_unknown is not None:
            verdict, reason = "unknown", f"offered; {quota_unknown}"
        else:
            assert quota.headroom is not None
            verdict, reason = "ready", f"offered; quota headroom {quota.headroom:g} >= {need} vCPUs"
        notes = []
        if offered and score is not None:
            notes.append(f"spot score {score}/10")
        if offered and private is False:
            notes.append(f"no private subnet of {subnets.vpc_id if subnets else 'the cluster VPC'} here")
        if notes:
            reason = f"{reason}; {'; '.join(notes)}"
        reports.append(ZoneReport(z.name, z.zone_id, offered, score, private, verdict, reason))

    reports.sort(key=lambda r: (
        VERDICT_ORDER[r.verdict], r.private_subnet is False, -(r.spot_score if r.spot_score is not None else -1), r.zone,
    ))
    best = next((r.zone for r in reports if r.verdict in ("ready", "unknown") and r.offered), None)
    checks = check_instance(signals.facts.value, gpus_per_node) if signals.facts.value and gpus_per_node else []
    return CapacityReport(
        region=region, instance_type=instance_type, count=count, vcpus_needed=need,
        instance=signals.facts.value, quota=quota, spot_quota=spot_quota, zones=reports, best_zone=best,
        quota_request=request, cluster=subnets if subnets is not None and subnets.cluster else None,
        checks=checks, unknown=signals.unknowns(),
    )


