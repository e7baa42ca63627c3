"""The AWS side of capacity discovery: each signal read by one function, all of them in parallel.

Clients are passed in (made by `raydlc.edges.aws`), so tests hand in clients that talk to a local
moto server. A signal that cannot be read becomes unknown with its reason while the others
still answer; what makes every signal fail the same way (credentials, region, an endpoint
that cannot be reached) stops the whole read instead.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from raydlc.capacity.signals import (
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
from raydlc.errors import CredentialsError, RaydlcError

T = TypeVar("T")


def _read(fn: Callable[[], T]) -> Signal[T]:
    """A signal from one reader: AWS failures become 'unknown'.

    Bad credentials, an unknown or disabled region and an endpoint that cannot be reached stop
    everything instead: every other signal would fail the same way, and a report of unknowns
    would read as a verdict about capacity.
    """
    try:
        return Signal(value=fn())
    except (CredentialsError, aws.RegionError, aws.UnreachableError):
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


def read_spot_prices(ec2: Any, instance_type: str, az: str | None = None) -> dict[str, float]:
    """The current Spot price (USD/hour, Linux) of the type in each AZ (or in `az`) that has one: the newest entry
    of DescribeSpotPriceHistory per AZ (StartTime now returns the price in effect now and later changes)."""
    newest: dict[str, tuple[Any, float]] = {}
    where = {"AvailabilityZone": az} if az else {}
    for p in aws.paginate(
        ec2, "describe_spot_price_history", "SpotPriceHistory",
        InstanceTypes=[instance_type], ProductDescriptions=["Linux/UNIX (Amazon VPC)", "Linux/UNIX"],
        StartTime=datetime.now(UTC), **where,
    ):
        az, ts = p.get("AvailabilityZone"), p.get("Timestamp")
        if not az or p.get("InstanceType", instance_type) != instance_type or az != (where.get("AvailabilityZone") or az):
            continue
        if az not in newest or (ts is not None and ts > newest[az][0]):
            newest[az] = (ts, float(p["SpotPrice"]))
    return {az: price for az, (_, price) in newest.items()}


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
        "spot_prices": lambda: read_spot_prices(ec2, instance_type),
    }
    with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="capacity") as pool:
        futures = {name: pool.submit(_read, fn) for name, fn in readers.items()}
        return Signals(**{name: f.result() for name, f in futures.items()})


