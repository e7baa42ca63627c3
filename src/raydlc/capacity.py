"""Where can the GPU nodes actually be had? Signals from AWS, ranked into one AZ choice.

EFA node groups live in exactly one AZ, so the AZ is the decision everything else hangs
on. The answer is split in three: `gather` reads the independent signals in parallel
(clients passed in; a signal that cannot be read becomes unknown with its reason while
the others still answer), `rank` turns them into verdicts without touching AWS, and
`probe` is the definitive check: it holds a real On-Demand Capacity Reservation for a
moment and never leaves one behind.
"""

from __future__ import annotations

import math
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from raydlc import aws, catalog
from raydlc.errors import AwsError, CredentialsError, RaydlcError

if TYPE_CHECKING:
    from raydlc.config import Config

T = TypeVar("T")
Verdict = Literal["ready", "quota-short", "not-offered", "unknown"]
VERDICT_ORDER: dict[str, int] = {"ready": 0, "unknown": 1, "quota-short": 2, "not-offered": 3}
PROBE_TAG = "raydlc:capacity-probe"
PLATFORM = "Linux/UNIX"


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


# On-Demand Linux list prices, USD per instance-hour, us-east-1 (other regions differ by
# a few to ~30 %). A table, not the Pricing API: the probe must state the cost even when
# pricing:GetProducts is not granted. Types missing here report no price.
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
PRICE_SOURCE = "raydlc's built-in table of us-east-1 On-Demand Linux list prices (approximate elsewhere)"


# ---------------------------------------------------------------------------- signals


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

    def unknowns(self) -> dict[str, str]:
        return {name: s.unknown for name, s in vars(self).items() if isinstance(s, Signal) and s.unknown}


def _read(fn: Callable[[], T]) -> Signal[T]:
    """A signal from one reader: AWS failures become 'unknown'.

    Bad credentials and an unknown, disabled or unreachable region stop everything instead:
    every other signal would fail the same way and the report would say nothing.
    """
    try:
        return Signal(value=fn())
    except (CredentialsError, aws.RegionError):
        raise
    except RaydlcError as e:
        return Signal(unknown=e.message if not e.hint else f"{e.message}; hint: {e.hint}")


def read_zones(ec2: Any) -> list[Zone]:
    out = aws.call(ec2, "describe_availability_zones", Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}])
    zones = [
        Zone(z["ZoneName"], z.get("ZoneId"))
        for z in out.get("AvailabilityZones", [])
        if z.get("ZoneType", "availability-zone") == "availability-zone" and z.get("State", "available") == "available"
    ]
    return sorted(zones, key=lambda z: z.name)


def read_offered(ec2: Any, instance_type: str) -> frozenset[str]:
    items = aws.paginate(
        ec2, "describe_instance_type_offerings", "InstanceTypeOfferings",
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}],
    )
    return frozenset(o["Location"] for o in items if o.get("InstanceType") == instance_type)


def _facts(t: dict[str, Any]) -> InstanceFacts:
    gpu_info = t.get("GpuInfo") or {}
    gpus = gpu_info.get("Gpus") or []
    net = t.get("NetworkInfo") or {}
    mem = gpus[0].get("MemoryInfo", {}).get("SizeInMiB") if gpus else None
    return InstanceFacts(
        instance_type=t["InstanceType"],
        vcpus=int(t["VCpuInfo"]["DefaultVCpus"]),
        gpus=sum(int(g.get("Count", 0)) for g in gpus),
        gpu_model=gpus[0].get("Name") if gpus else None,
        gpu_memory_gib=round(mem / 1024, 1) if mem else None,
        efa_supported=bool(net.get("EfaSupported", False)),
        max_efa_interfaces=int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0)),
        network_performance=net.get("NetworkPerformance"),
    )


def read_facts(ec2: Any, instance_types: list[str]) -> dict[str, InstanceFacts]:
    out: dict[str, InstanceFacts] = {}
    for i in range(0, len(instance_types), 100):
        resp = aws.call(ec2, "describe_instance_types", InstanceTypes=instance_types[i : i + 100])
        out.update({t["InstanceType"]: _facts(t) for t in resp.get("InstanceTypes", [])})
    return out


def read_instance_facts(ec2: Any, instance_type: str) -> InstanceFacts:
    facts = read_facts(ec2, [instance_type])
    if instance_type not in facts:
        raise aws.AwsCallError(f"EC2 does not know instance type {instance_type!r}")
    return facts[instance_type]


def read_quota(quotas: Any, code: str, name: str) -> QuotaValue:
    """The applied quota value, or AWS's default when none was ever applied."""
    try:
        q = aws.call(quotas, "get_service_quota", ServiceCode="ec2", QuotaCode=code)["Quota"]
        return QuotaValue(code, q.get("QuotaName") or name, float(q["Value"]), "applied")
    except aws.AwsCallError as e:
        if e.code != "NoSuchResourceException":
            raise
    q = aws.call(quotas, "get_aws_default_service_quota", ServiceCode="ec2", QuotaCode=code)["Quota"]
    return QuotaValue(code, q.get("QuotaName") or name, float(q["Value"]), "default")


def read_used_vcpus(ec2: Any, instance_type: str) -> int:
    """vCPUs of pending and running instances that count against the same On-Demand quota."""
    qc = quota_class(instance_type)
    counts: dict[str, int] = {}
    for reservation in aws.paginate(
        ec2, "describe_instances", "Reservations",
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}],
    ):
        for inst in reservation.get("Instances", []):
            it = inst["InstanceType"]
            if inst.get("InstanceLifecycle") == "spot" or quota_class(it) != qc:
                continue
            counts[it] = counts.get(it, 0) + 1
    if not counts:
        return 0
    facts = read_facts(ec2, sorted(counts))
    return sum(facts[it].vcpus * n for it, n in counts.items())


def read_spot_scores(ec2: Any, region: str, instance_type: str, count: int) -> dict[str, int]:
    out = aws.call(
        ec2, "get_spot_placement_scores",
        InstanceTypes=[instance_type], TargetCapacity=count, TargetCapacityUnitType="units",
        SingleAvailabilityZone=True, RegionNames=[region],
    )
    return {
        s["AvailabilityZoneId"]: int(s["Score"])
        for s in out.get("SpotPlacementScores", [])
        if s.get("AvailabilityZoneId") and s.get("Region", region) == region
    }


def _is_private(subnet: dict[str, Any]) -> bool:
    tags = {t["Key"]: t.get("Value", "") for t in subnet.get("Tags", [])}
    if "kubernetes.io/role/internal-elb" in tags:
        return True
    if "kubernetes.io/role/elb" in tags:
        return False
    return not subnet.get("MapPublicIpOnLaunch", False)


def read_subnets(eks: Any, ec2: Any, cluster: str) -> SubnetFacts:
    try:
        desc = aws.call(eks, "describe_cluster", name=cluster)["cluster"]
    except aws.AwsCallError as e:
        if e.code == "ResourceNotFoundException":
            return SubnetFacts(cluster=None)
        raise
    vpc_config = desc.get("resourcesVpcConfig", {})
    vpc_id = vpc_config.get("vpcId")
    if not vpc_id and vpc_config.get("subnetIds"):
        first = aws.call(ec2, "describe_subnets", SubnetIds=vpc_config["subnetIds"][:1])["Subnets"]
        vpc_id = first[0]["VpcId"] if first else None
    if not vpc_id:
        raise aws.AwsCallError(f"EKS cluster {cluster} reports no VPC or subnets")
    subnets = list(aws.paginate(ec2, "describe_subnets", "Subnets", Filters=[{"Name": "vpc-id", "Values": [vpc_id]}]))
    return SubnetFacts(
        cluster=cluster, vpc_id=vpc_id,
        private_zones=frozenset(s["AvailabilityZone"] for s in subnets if _is_private(s)),
    )


def _spot_quota(quotas: Any, qc: QuotaClass) -> QuotaValue:
    if qc.spot_code is None:
        raise aws.UnsupportedError(f"{qc.name} instances have no Spot quota")
    return read_quota(quotas, qc.spot_code, f"All {qc.name} Spot Instance Requests")


def gather(
    ec2: Any, quotas: Any, eks: Any, *, region: str, instance_type: str, count: int, cluster: str,
    max_workers: int = 8,
) -> Signals:
    """Every signal, read concurrently (boto3 clients are thread-safe; sessions are not)."""
    qc = quota_class(instance_type)
    readers: dict[str, Callable[[], Any]] = {
        "zones": lambda: read_zones(ec2),
        "offered": lambda: read_offered(ec2, instance_type),
        "facts": lambda: read_instance_facts(ec2, instance_type),
        "on_demand_quota": lambda: read_quota(quotas, qc.on_demand_code, f"Running On-Demand {qc.name} instances"),
        "used_vcpus": lambda: read_used_vcpus(ec2, instance_type),
        "spot_scores": lambda: read_spot_scores(ec2, region, instance_type, count),
        "spot_quota": lambda: _spot_quota(quotas, qc),
        "subnets": lambda: read_subnets(eks, ec2, cluster),
    }
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="capacity") as pool:
        futures = {name: pool.submit(_read, fn) for name, fn in readers.items()}
        return Signals(**{name: f.result() for name, f in futures.items()})


# ---------------------------------------------------------------------------- ranking


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


# ---------------------------------------------------------------------------- probe


class ProbeInterrupted(RaydlcError):
    """Interrupted during the probe; raised only after the reservation was cancelled."""

    exit_code = 130


class ReservationLeftBehind(AwsError):
    """A probe reservation could not be cancelled: it costs money until someone does."""


_INSUFFICIENT = ("InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientReservedInstanceCapacity")


def hourly_cost(instance_type: str, count: int) -> float | None:
    price = HOURLY_USD_US_EAST_1.get(instance_type)
    return None if price is None else round(price * count, 4)


@contextmanager
def _deferred_signals(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[list[int]]:
    """Hold SIGINT/SIGTERM for the window between create and cancel; yields what arrived.

    The default SIGINT handler raises KeyboardInterrupt wherever Python happens to be, which
    can lose a reservation id between AWS answering and the assignment. Only the main thread
    may install handlers; elsewhere the window is covered by `finally` and the tag sweep.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {s: signal.getsignal(s) for s in signums}

    def hold(signum: int, frame: Any) -> None:
        if not received:
            sys.stderr.write("raydlc: cancelling the probe's capacity reservation before stopping…\n")
        received.append(signum)

    for s in signums:
        signal.signal(s, hold)
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _cancel(ec2: Any, reservation_id: str, region: str) -> None:
    try:
        aws.call(ec2, "cancel_capacity_reservation", CapacityReservationId=reservation_id)
    except RaydlcError as e:
        raise ReservationLeftBehind(
            f"capacity reservation {reservation_id} in {region} could NOT be cancelled ({e.message}); "
            "it is billed until cancelled",
            hint=f"aws ec2 cancel-capacity-reservation --capacity-reservation-id {reservation_id} --region {region}",
        ) from e


def _sweep(ec2: Any, token: str, region: str) -> list[str]:
    """Reservations this probe created whose id never reached us (interrupted mid-call)."""
    try:
        out = aws.call(
            ec2, "describe_capacity_reservations",
            Filters=[{"Name": f"tag:{PROBE_TAG}", "Values": [token]}, {"Name": "state", "Values": ["active", "pending"]}],
        )
    except RaydlcError as e:
        raise ReservationLeftBehind(
            f"the probe's create was cut off and its reservation could not be looked up ({e.message}); "
            "one may be active and billed",
            hint=f"aws ec2 describe-capacity-reservations --region {region} --filters Name=tag:{PROBE_TAG},Values={token}",
        ) from e
    return [r["CapacityReservationId"] for r in out.get("CapacityReservations", [])]


def probe(ec2: Any, *, region: str, zone: str, instance_type: str, count: int) -> ProbeResult:
    """Reserve count × type in `zone` for an instant, then cancel; no reservation outlives this call.

    A DryRun first proves the permission without creating anything. The create carries a
    ClientToken and a tag, so a create whose answer was lost can still be found and cancelled.
    """
    params = dict(
        InstanceType=instance_type, InstancePlatform=PLATFORM, AvailabilityZone=zone, InstanceCount=count,
        InstanceMatchCriteria="targeted", EndDateType="unlimited", Tenancy="default",
    )
    try:
        dry = aws.call(ec2, "create_capacity_reservation", DryRun=True, **params)
    except aws.AwsCallError as e:
        if e.code != "DryRunOperation":
            raise
    else:
        rid = dry.get("CapacityReservation", {}).get("CapacityReservationId")
        if rid:
            _cancel(ec2, rid, region)
        raise aws.UnsupportedError(
            "ec2 CreateCapacityReservation ignored DryRun=True; refusing to probe against this endpoint"
            + (f" (reservation {rid} it created was cancelled)" if rid else ""),
            hint="check `aws ec2 describe-capacity-reservations` for leftovers",
        )

    token = uuid.uuid4().hex
    price = hourly_cost(instance_type, count)
    reservation_id: str | None = None
    answered = False  # AWS gave a definitive answer to the create, so nothing can be unaccounted for
    outcome: Literal["available", "insufficient-capacity"] = "available"
    message = ""
    with _deferred_signals() as received:
        try:
            out = aws.call(
                ec2, "create_capacity_reservation", ClientToken=token,
                TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": [{"Key": PROBE_TAG, "Value": token}]}],
                **params,
            )
            reservation_id = out["CapacityReservation"]["CapacityReservationId"]
            answered = True
        except aws.AwsCallError as e:
            answered = e.code is not None
            if e.code not in _INSUFFICIENT:
                raise
            outcome, message = "insufficient-capacity", f"AWS has no {count} × {instance_type} in {zone} right now ({e.code})"
        finally:
            if reservation_id:
                _cancel(ec2, reservation_id, region)
            elif not answered:
                found = _sweep(ec2, token, region)
                for rid in found:
                    _cancel(ec2, rid, region)
                reservation_id = found[0] if found else None
    cost = "" if price is None else f"; held, it would have cost ${price:,.2f}/h"
    if received:
        raise ProbeInterrupted(
            f"interrupted during the capacity probe; reservation {reservation_id or '(none created)'} was cancelled{cost}"
        )
    if outcome == "available":
        message = f"reserved {count} × {instance_type} in {zone} and cancelled it at once{cost}"
    return ProbeResult(zone, instance_type, count, outcome, reservation_id, reservation_id is not None, price, PRICE_SOURCE, message)


# ---------------------------------------------------------------------------- edge


def discover(cfg: Config, *, with_probe: bool = False) -> CapacityReport:
    """The whole check for a config: clients from raydlc.aws, signals, ranking, optional probe."""
    region = cfg.cluster.region
    sess = aws.session(region)
    ec2, quotas, eks = (aws.client(sess, s) for s in ("ec2", "service-quotas", "eks"))
    gpu = cfg.gpu_nodes
    signals = gather(ec2, quotas, eks, region=region, instance_type=gpu.instance_type, count=gpu.count, cluster=cfg.cluster.name)
    report = rank(signals, region=region, instance_type=gpu.instance_type, count=gpu.count, gpus_per_node=gpu.gpus_per_node)
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
        report.probe = probe(ec2, region=region, zone=report.best_zone, instance_type=gpu.instance_type, count=gpu.count)
    return report


# ---------------------------------------------------------------------------- output


def print_report(report: CapacityReport, console: Any) -> None:
    from rich.table import Table

    q = report.quota
    headroom = "?" if q.headroom is None else f"{q.headroom:g}"
    title = f"{report.count} × {report.instance_type} in {report.region}: {report.vcpus_needed or '?'} vCPUs needed"
    table = Table(title=title)
    for col in ("AZ", "id", "offered", "quota headroom", "spot score", "private subnet", "verdict"):
        table.add_column(col)
    style = {"ready": "green", "quota-short": "yellow", "not-offered": "red", "unknown": "dim"}
    yes_no = {True: "yes", False: "no", None: "?"}
    for z in report.zones:
        subnet = "-" if report.cluster is None and "subnets" not in report.unknown else yes_no[z.private_subnet]
        table.add_row(
            z.zone, z.zone_id or "?", yes_no[z.offered], headroom if z.offered else "",
            "?" if z.spot_score is None else str(z.spot_score), subnet, f"[{style[z.verdict]}]{z.verdict}[/]",
        )
    console.print(table)
    if q.value is not None:
        used = "?" if q.used is None else q.used
        console.print(f"On-Demand quota {q.code} ({q.name}): {q.value:g} vCPUs, {used} in use")
    if report.spot_quota.value is not None:
        console.print(f"Spot quota {report.spot_quota.code} ({report.spot_quota.name}): {report.spot_quota.value:g} vCPUs")
    for name, why in report.unknown.items():
        console.print(f"[dim]unknown {name}: {why}[/]")
    for line in report.checks:
        console.print(f"[yellow]check:[/] {line}")
    if report.quota_request:
        r = report.quota_request
        console.print(f"quota short: request {r.quota_code} ({r.quota_name}) = {r.value:g} vCPUs:")
        console.print(f"  {r.command}", soft_wrap=True, highlight=False)
    if report.probe:
        console.print(f"probe: {report.probe.message}")
    best = next((z for z in report.zones if z.zone == report.best_zone), None)
    if best is None:
        console.print("best zone: [bold red]none[/]" + (f" ({report.zones[0].reason})" if report.zones else ""))
    else:
        console.print(f"best zone: [bold]{best.zone}[/] ({best.verdict}: {best.reason})")
