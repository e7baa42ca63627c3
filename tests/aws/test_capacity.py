"""Capacity discovery against a real moto server, the pure ranking, the probe and the CLI.

moto answers over HTTP with its real offering and instance-type snapshots: AZs, offerings,
instance types, instances, VPCs/subnets, EKS clusters. Quota values come from moto's
Service Quotas backend, patched in this process (moto knows no EC2 quotas) and read over
HTTP. Calls moto lacks are answered by botocore handlers that record the request: each test
names them (GetSpotPlacementScores; Create/Cancel/DescribeCapacityReservations).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from awsstub import Answer, Quotas  # type: ignore[import-not-found]

from raydlc import capacity as cap
from raydlc.capacity import InstanceFacts, QuotaValue, Signal, Signals, SubnetFacts, Zone
from raydlc.cli import main

G = "L-DB2E81BA"
G_SPOT = "L-3819A6DF"


def gather(clients: Callable[[str], tuple[Any, Any, Any]], region: str, instance_type: str = "g5.12xlarge",
           count: int = 2, cluster: str = "eks-cluster", answers: tuple[Answer, ...] = ()) -> Signals:
    ec2, quotas, eks = clients(region)
    for a in answers:
        a.on({"ec2": ec2, "service-quotas": quotas, "eks": eks}[a.service])
    return cap.gather(ec2, quotas, eks, region=region, instance_type=instance_type, count=count, cluster=cluster)


def scores(by_zone_id: dict[str, int]) -> Answer:
    """Stub for GetSpotPlacementScores (moto lacks it): single-AZ scores for the region asked."""
    return Answer("ec2", "GetSpotPlacementScores", lambda p: (200, {"SpotPlacementScores": [
        {"Region": p["RegionNames"][0], "AvailabilityZoneId": z, "Score": s} for z, s in by_zone_id.items()
    ]}))


def zone(report: cap.CapacityReport, name: str) -> cap.ZoneReport:
    return next(z for z in report.zones if z.zone == name)


# ---------------------------------------------------------------- moto scenarios


def test_offered_in_some_zones_only_with_quota_and_scores(clients: Any, quotas: Quotas, offerings: Any) -> None:
    """Stubbed: GetSpotPlacementScores (the recorded request is checked)."""
    offerings("us-east-2", "g6.12xlarge", ["us-east-2b", "us-east-2c"])
    quotas.values[G] = 192
    quotas.values[G_SPOT] = 64
    spot = scores({"use2-az2": 3, "use2-az3": 9})
    signals = gather(clients, "us-east-2", "g6.12xlarge", answers=(spot,))
    report = cap.rank(signals, region="us-east-2", instance_type="g6.12xlarge", count=2, gpus_per_node=4)

    assert spot.calls == [{"InstanceTypes": ["g6.12xlarge"], "TargetCapacity": 2, "TargetCapacityUnitType": "units",
                           "SingleAvailabilityZone": True, "RegionNames": ["us-east-2"]}]
    assert ("ec2", G) in quotas.asked and ("ec2", G_SPOT) in quotas.asked
    assert report.vcpus_needed == 96
    assert (report.quota.value, report.quota.used, report.quota.headroom) == (192, 0, 192)
    assert report.spot_quota.value == 64
    verdicts = {z.zone: z.verdict for z in report.zones}
    assert verdicts == {"us-east-2a": "not-offered", "us-east-2b": "ready", "us-east-2c": "ready"}
    assert [z.zone for z in report.zones][:2] == ["us-east-2c", "us-east-2b"]  # higher Spot score first
    assert report.best_zone == "us-east-2c" and zone(report, "us-east-2c").spot_score == 9
    assert zone(report, "us-east-2a").reason == "g6.12xlarge is not offered in us-east-2a"
    assert report.unknown == {} and report.quota_request is None and report.checks == []
    assert report.instance is not None and (report.instance.gpus, report.instance.gpu_model) == (4, "L4")


def test_quota_zero_is_quota_short_with_the_exact_request(clients: Any, quotas: Quotas) -> None:
    """Stubbed: GetSpotPlacementScores."""
    quotas.values[G] = 0
    report = cap.rank(gather(clients, "us-east-2", answers=(scores({}),)), region="us-east-2",
                      instance_type="g5.12xlarge", count=2)
    offered = [z for z in report.zones if z.offered]
    assert offered and {z.verdict for z in offered} == {"quota-short"}
    assert report.best_zone is None
    req = report.quota_request
    assert req is not None and (req.service, req.quota_code, req.value, req.region) == ("ec2", G, 96.0, "us-east-2")
    assert "--quota-code L-DB2E81BA --desired-value 96 --region us-east-2" in req.command
    assert "request L-DB2E81BA = 96" in offered[0].reason


def test_quota_below_need_counts_running_instances_of_the_family(clients: Any, quotas: Quotas) -> None:
    """Instances are real moto instances; stubbed: GetSpotPlacementScores.

    eu-central-1 is the one region where tests create resources; us-west-2 stays untouched.
    """
    region = "eu-central-1"
    ec2, _, _ = clients(region)
    for itype, n, market in (("g5.12xlarge", 1, None), ("g6.xlarge", 2, None), ("m5.large", 3, None), ("g6.xlarge", 1, "spot")):
        extra = {"InstanceMarketOptions": {"MarketType": market}} if market else {}
        ec2.run_instances(ImageId="ami-12345678", InstanceType=itype, MinCount=n, MaxCount=n, **extra)
    quotas.values[G] = 128
    report = cap.rank(gather(clients, region, answers=(scores({}),)), region=region, instance_type="g5.12xlarge", count=2)
    # 48 (g5.12xlarge) + 2 × 4 (g6.xlarge On-Demand); m5 is Standard, the Spot g6 counts against Spot
    assert (report.quota.used, report.quota.headroom) == (56, 72)
    assert {z.verdict for z in report.zones if z.offered} == {"quota-short"}
    assert report.quota_request is not None and report.quota_request.value == 56 + 96


def test_spot_scores_denied_leaves_that_signal_unknown(clients: Any, quotas: Quotas) -> None:
    """Stubbed: GetSpotPlacementScores answers UnauthorizedOperation."""
    quotas.values[G] = 400
    denied = Answer("ec2", "GetSpotPlacementScores", lambda p: (403, {"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}))
    report = cap.rank(gather(clients, "us-west-2", answers=(denied,)), region="us-west-2", instance_type="g5.12xlarge", count=2)
    assert len(denied.calls) == 1
    assert "access denied" in report.unknown["spot_scores"] and "ec2:GetSpotPlacementScores" in report.unknown["spot_scores"]
    assert set(report.unknown) == {"spot_scores", "spot_quota"}  # moto has no G Spot quota either
    assert {z.zone: z.verdict for z in report.zones} == {
        "us-west-2a": "ready", "us-west-2b": "ready", "us-west-2c": "ready", "us-west-2d": "not-offered"}
    assert all(z.spot_score is None for z in report.zones)
    assert report.best_zone == "us-west-2a"


def test_quota_never_applied_falls_back_to_the_aws_default(clients: Any, quotas: Quotas) -> None:
    """GetServiceQuota is moto's (NoSuchResource for a code with no applied value);
    stubbed: GetAWSDefaultServiceQuota, which moto lacks."""
    _, sq, _ = clients("us-east-2")
    default = Answer("service-quotas", "GetAWSDefaultServiceQuota",
                     lambda p: (200, {"Quota": {"QuotaCode": p["QuotaCode"], "QuotaName": "P default", "Value": 0.0}})).on(sq)
    value = cap.read_quota(sq, "L-417A185B", "Running On-Demand P instances")
    assert quotas.asked[-1] == ("ec2", "L-417A185B")
    assert default.calls == [{"ServiceCode": "ec2", "QuotaCode": "L-417A185B"}]
    assert (value.value, value.source, value.name) == (0.0, "default", "P default")
    quotas.values["L-417A185B"] = 384
    assert cap.read_quota(sq, "L-417A185B", "P").source == "applied" and len(default.calls) == 1


def test_cluster_vpc_without_private_subnet_ranks_the_zone_lower(clients: Any, quotas: Quotas) -> None:
    """VPC, subnets and the EKS cluster are real moto objects; stubbed: GetSpotPlacementScores."""
    region = "eu-central-1"
    ec2, _, eks = clients(region)
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    public = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.1.0/24", AvailabilityZone=f"{region}a")["Subnet"]["SubnetId"]
    ec2.create_tags(Resources=[public], Tags=[{"Key": "kubernetes.io/role/elb", "Value": "1"}])
    private = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.2.0/24", AvailabilityZone=f"{region}b")["Subnet"]["SubnetId"]
    ec2.create_tags(Resources=[private], Tags=[{"Key": "kubernetes.io/role/internal-elb", "Value": "1"}])
    eks.create_cluster(name="lab", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": [public, private]})
    quotas.values[G] = 1000  # eu-central-1 also holds the instances of the test above: 56 vCPUs in use
    signals = gather(clients, region, "g5.12xlarge", cluster="lab", answers=(scores({"euc1-az1": 9, "euc1-az2": 1}),))
    report = cap.rank(signals, region=region, instance_type="g5.12xlarge", count=2)
    assert {z.verdict for z in report.zones} == {"ready"}
    assert report.cluster is not None and report.cluster.vpc_id == vpc
    assert zone(report, f"{region}a").private_subnet is False and zone(report, f"{region}b").private_subnet is True
    assert "no private subnet" in zone(report, f"{region}a").reason
    assert zone(report, f"{region}c").private_subnet is False
    assert [z.zone for z in report.zones] == [f"{region}b", f"{region}a", f"{region}c"]  # subnet before Spot score
    assert report.best_zone == f"{region}b"
    no_cluster = gather(clients, region, "g5.12xlarge", cluster="absent", answers=(scores({}),))
    assert no_cluster.subnets.value == SubnetFacts(cluster=None)


def test_unreachable_region_stops_instead_of_reporting_all_unknown(clients: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from raydlc.edges.aws import UnreachableError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(UnreachableError, match="cannot reach"):
        gather(clients, "us-west-2")


# ---------------------------------------------------------------- pure ranking


def _signals(**over: Any) -> Signals:
    base: dict[str, Any] = dict(
        zones=Signal([Zone("r-1a", "z1"), Zone("r-1b", "z2"), Zone("r-1c", "z3")]),
        offered=Signal(frozenset({"r-1a", "r-1b"})),
        facts=Signal(InstanceFacts("g6.12xlarge", 48, 4, "L4", 22.4, True, 1, "40 Gigabit")),
        on_demand_quota=Signal(QuotaValue(G, "G", 200.0, "applied")),
        used_vcpus=Signal(48),
        spot_scores=Signal({"z1": 2, "z2": 8}),
        spot_quota=Signal(QuotaValue(G_SPOT, "G spot", 0.0, "default")),
        subnets=Signal(SubnetFacts(cluster=None)),
    )
    base.update(over)
    return Signals(**base)


def test_rank_orders_ready_by_spot_score_and_needs_no_aws() -> None:
    r = cap.rank(_signals(), region="r-1", instance_type="g6.12xlarge", count=2, gpus_per_node=4)
    assert [(z.zone, z.verdict) for z in r.zones] == [("r-1b", "ready"), ("r-1a", "ready"), ("r-1c", "not-offered")]
    assert r.quota.headroom == 152 and r.best_zone == "r-1b"
    assert "quota headroom 152 >= 96 vCPUs; spot score 8/10" in r.zones[0].reason


def test_spot_ranks_equal_scores_by_the_current_spot_price_and_shows_it() -> None:
    prices = Signal({"r-1a": 1.61, "r-1b": 2.05})
    even = Signal({"z1": 8, "z2": 8})
    od = cap.rank(_signals(spot_scores=even, spot_prices=prices), region="r-1", instance_type="g6.12xlarge", count=2)
    assert [z.zone for z in od.zones][:2] == ["r-1a", "r-1b"]  # on-demand: by name after equal scores
    sq = Signal(QuotaValue(G_SPOT, "G spot", 192.0, "applied"))
    sp = cap.rank(_signals(spot_scores=even, spot_prices=Signal({"r-1a": 2.05, "r-1b": 1.61}), spot_quota=sq), region="r-1",
                  instance_type="g6.12xlarge", count=2, capacity_type="spot")
    assert [z.zone for z in sp.zones][:2] == ["r-1b", "r-1a"] and sp.best_zone == "r-1b" and sp.capacity_type == "spot"
    assert sp.zones[0].spot_price_usd == 1.61 and "spot $1.610/h a node" in sp.zones[0].reason
    # the placement score still comes first: a likelier zone beats a cheaper one
    sp = cap.rank(_signals(spot_prices=Signal({"r-1a": 1.0, "r-1b": 2.0}), spot_quota=sq), region="r-1", instance_type="g6.12xlarge",
                  count=2, capacity_type="spot-then-on-demand")
    assert sp.best_zone == "r-1b"


def test_spot_nodes_are_judged_on_the_spot_quota_not_the_on_demand_one() -> None:
    no_od = _signals(on_demand_quota=Signal(QuotaValue(G, "G", 0.0, "applied")),
                     spot_quota=Signal(QuotaValue(G_SPOT, "G spot", 192.0, "applied")))
    assert cap.rank(no_od, region="r-1", instance_type="g6.12xlarge", count=2).best_zone is None  # On-Demand: short
    sp = cap.rank(no_od, region="r-1", instance_type="g6.12xlarge", count=2, capacity_type="spot")
    assert (sp.best_zone, sp.quota.code, sp.quota_request) == ("r-1b", G_SPOT, None)
    assert sp.zones[0].verdict == "unknown" and f"the vCPUs in use under {G_SPOT} could not be counted" in sp.zones[0].reason
    # spot-then-on-demand: the On-Demand quota while it suffices, the Spot one when it is short
    both = cap.rank(_signals(spot_quota=Signal(QuotaValue(G_SPOT, "G spot", 192.0, "applied"))), region="r-1",
                    instance_type="g6.12xlarge", count=2, capacity_type="spot-then-on-demand")
    assert (both.quota.code, both.zones[0].verdict) == (G, "ready")
    assert cap.rank(no_od, region="r-1", instance_type="g6.12xlarge", count=2,
                    capacity_type="spot-then-on-demand").quota.code == G_SPOT
    assert not both.spot_quota_short
    # a Spot quota short of the nodes while On-Demand's holds them: spot-then-on-demand goes On-Demand at once
    od_only = cap.rank(_signals(), region="r-1", instance_type="g6.12xlarge", count=2, capacity_type="spot-then-on-demand")
    assert od_only.spot_quota_short and od_only.best_zone is not None and od_only.quota.code == G
    from raydlc.capacity.choice import choose
    from raydlc.config import load_config
    from raydlc.lifecycle.resources.gpu_nodegroup import attempts

    cfg = load_config(env={"RAYDLC_GPU_CAPACITY_TYPE": "spot-then-on-demand", "RAYDLC_REGION": "us-east-2"})
    choice = choose(cfg, od_only)
    assert choice.spot_quota_short and attempts(cfg, choice, []) and not any(spot for _, spot in attempts(cfg, choice, []))
    short = cap.rank(_signals(), region="r-1", instance_type="g6.12xlarge", count=2, capacity_type="spot")  # Spot quota 0
    assert short.best_zone is None and short.quota_request is not None and short.quota_request.quota_code == G_SPOT
    assert "offered; Spot G and VT quota 0 vCPUs" in short.zones[0].reason


def test_spot_prices_are_read_from_describe_spot_price_history(clients: Any, quotas: Quotas, offerings: Any) -> None:
    """moto answers DescribeSpotPriceHistory itself: one fixed price (0.00001) for each AZ offering the type."""
    offerings("us-east-2", "g6.12xlarge", ["us-east-2b", "us-east-2c"])
    quotas.values[G] = 192
    signals = gather(clients, "us-east-2", "g6.12xlarge", answers=(scores({}),))
    assert signals.spot_prices.value == {"us-east-2b": 0.00001, "us-east-2c": 0.00001}
    report = cap.rank(signals, region="us-east-2", instance_type="g6.12xlarge", count=2, capacity_type="spot")
    assert zone(report, "us-east-2b").spot_price_usd == 0.00001 and zone(report, "us-east-2a").spot_price_usd is None


def test_rank_unknown_signals_make_unknown_verdicts_not_errors() -> None:
    r = cap.rank(_signals(on_demand_quota=Signal(unknown="denied"), spot_scores=Signal(unknown="x")),
                 region="r-1", instance_type="g6.12xlarge", count=2)
    assert [z.verdict for z in r.zones] == ["unknown", "unknown", "not-offered"]
    assert r.best_zone == "r-1a" and r.quota.unknown == "denied"
    r2 = cap.rank(_signals(offered=Signal(unknown="denied")), region="r-1", instance_type="g6.12xlarge", count=2)
    assert {z.verdict for z in r2.zones} == {"unknown"} and r2.best_zone is None


def test_rank_quota_short_even_when_usage_is_unknown() -> None:
    r = cap.rank(_signals(on_demand_quota=Signal(QuotaValue(G, "G", 64.0, "applied")), used_vcpus=Signal(unknown="denied")),
                 region="r-1", instance_type="g6.12xlarge", count=2)
    assert {z.verdict for z in r.zones if z.offered} == {"quota-short"}
    assert r.quota_request is not None and r.quota_request.value == 96
    r2 = cap.rank(_signals(used_vcpus=Signal(unknown="denied")), region="r-1", instance_type="g6.12xlarge", count=2)
    assert {z.verdict for z in r2.zones if z.offered} == {"unknown"}  # 200 >= 96, but usage unseen


def test_rank_checks_gpus_per_node_against_live_facts() -> None:
    facts = InstanceFacts("p3dn.24xlarge", 96, 8, "V100", 32.0, True, 1, "100 Gigabit")
    r = cap.rank(_signals(facts=Signal(facts)), region="r-1", instance_type="p3dn.24xlarge", count=2, gpus_per_node=4)
    assert r.checks == ["GPUS_PER_NODE: p3dn.24xlarge has 8 GPUs per node, config says 4"]
    assert r.quota.code == G and cap.quota_class("p3dn.24xlarge").on_demand_code == "L-417A185B"


@pytest.mark.parametrize(("itype", "code"), [
    ("g6.12xlarge", "L-DB2E81BA"), ("g4dn.12xlarge", "L-DB2E81BA"), ("vt1.3xlarge", "L-DB2E81BA"),
    ("p5en.48xlarge", "L-417A185B"), ("inf2.48xlarge", "L-1945791B"), ("trn1.32xlarge", "L-2C3B7624"),
    ("m7i.xlarge", "L-1216C47A"), ("i4i.large", "L-1216C47A"), ("dl1.24xlarge", "L-6E869C2A"),
])
def test_quota_class_by_family(itype: str, code: str) -> None:
    assert cap.quota_class(itype).on_demand_code == code


# ---------------------------------------------------------------- probe


class Reservations:
    """Stubs for the capacity-reservation calls moto lacks; each records what it was sent."""

    def __init__(self, ec2: Any, *, create: tuple[int, dict[str, Any]] | None = None, found: list[str] | None = None) -> None:
        ok = (200, {"CapacityReservation": {"CapacityReservationId": "cr-0123456789abcdef0", "State": "active"}})
        self.create = Answer("ec2", "CreateCapacityReservation",
                             lambda p: (412, {"Error": {"Code": "DryRunOperation", "Message": "would succeed"}})
                             if p.get("DryRun") else (create or ok)).on(ec2)
        self.cancel = Answer("ec2", "CancelCapacityReservation", lambda p: (200, {"Return": True})).on(ec2)
        self.describe = Answer("ec2", "DescribeCapacityReservations", lambda p: (200, {"CapacityReservations": [
            {"CapacityReservationId": rid, "State": "active"} for rid in (found or [])]})).on(ec2)


def _hold_and_cancel(ec2: Any) -> cap.ReservationResult:
    return cap.hold_and_cancel(ec2, region="us-east-2", zone="us-east-2b", instance_type="g6.12xlarge", count=2)


def test_probe_dry_runs_then_reserves_and_cancels(clients: Any) -> None:
    """Stubbed: Create/CancelCapacityReservation."""
    ec2, _, _ = clients("us-east-2")
    stub = Reservations(ec2)
    result = _hold_and_cancel(ec2)
    dry, real = stub.create.calls
    assert dry["DryRun"] is True and "ClientToken" not in dry
    for p in (dry, real):
        assert {k: p[k] for k in ("InstanceType", "InstancePlatform", "AvailabilityZone", "InstanceCount", "InstanceMatchCriteria")} == {
            "InstanceType": "g6.12xlarge", "InstancePlatform": "Linux/UNIX", "AvailabilityZone": "us-east-2b",
            "InstanceCount": 2, "InstanceMatchCriteria": "targeted"}
    assert real["TagSpecifications"][0]["Tags"][0] == {"Key": cap.PROBE_TAG, "Value": real["ClientToken"]}
    assert stub.cancel.calls == [{"CapacityReservationId": "cr-0123456789abcdef0"}]
    assert (result.outcome, result.cancelled, result.hourly_usd) == ("available", True, round(2 * 4.6016, 4))
    assert "$9.20/h" in result.message and "us-east-1" in result.price_source


def test_probe_insufficient_capacity_creates_nothing_to_cancel(clients: Any) -> None:
    """Stubbed: CreateCapacityReservation answers InsufficientInstanceCapacity."""
    ec2, _, _ = clients("us-east-2")
    stub = Reservations(ec2, create=(500, {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "none"}}))
    result = _hold_and_cancel(ec2)
    assert result.outcome == "insufficient-capacity" and not result.cancelled
    assert stub.cancel.calls == [] and stub.describe.calls == []


def test_probe_dry_run_denied_stops_before_creating(clients: Any) -> None:
    """Stubbed: CreateCapacityReservation (DryRun) answers UnauthorizedOperation."""
    ec2, _, _ = clients("us-east-2")
    stub = Reservations(ec2)
    stub.create.reply = lambda p: (403, {"Error": {"Code": "UnauthorizedOperation", "Message": "no"}})
    from raydlc.edges.aws import AccessDeniedError

    with pytest.raises(AccessDeniedError, match="access denied") as e:
        _hold_and_cancel(ec2)
    assert "ec2:CreateCapacityReservation" in (e.value.hint or "")
    assert len(stub.create.calls) == 1 and stub.create.calls[0]["DryRun"] is True and stub.cancel.calls == []


def test_sigint_between_create_and_cancel_still_cancels(clients: Any) -> None:
    """Stubbed: Create/CancelCapacityReservation. A real SIGINT arrives right after the create returns."""
    ec2, _, _ = clients("us-east-2")
    stub = Reservations(ec2)
    ec2.meta.events.register("after-call.ec2.CreateCapacityReservation",
                             lambda **kw: os.kill(os.getpid(), signal.SIGINT) if not kw["parsed"].get("Error") else None)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(cap.ReservationInterrupted, match="cr-0123456789abcdef0 was cancelled") as e:
        _hold_and_cancel(ec2)
    assert e.value.exit_code == 130
    assert stub.cancel.calls == [{"CapacityReservationId": "cr-0123456789abcdef0"}]
    assert signal.getsignal(signal.SIGINT) is before  # the handler is restored


def test_keyboard_interrupt_that_loses_the_id_is_swept_and_cancelled(clients: Any) -> None:
    """Stubbed: Create/Describe/CancelCapacityReservation(s). KeyboardInterrupt is raised inside
    the create call after AWS answered, so the id never reaches the probe: the tag finds it."""
    ec2, _, _ = clients("us-east-2")
    stub = Reservations(ec2, found=["cr-0lost00000000000"])

    def interrupt(**kw: Any) -> None:
        if not kw["parsed"].get("Error"):
            raise KeyboardInterrupt

    ec2.meta.events.register("after-call.ec2.CreateCapacityReservation", interrupt)
    with pytest.raises(KeyboardInterrupt):
        _hold_and_cancel(ec2)
    token = stub.create.calls[-1]["ClientToken"]
    assert stub.describe.calls[0]["Filters"][0] == {"Name": f"tag:{cap.PROBE_TAG}", "Values": [token]}
    assert stub.cancel.calls == [{"CapacityReservationId": "cr-0lost00000000000"}]


def test_lost_id_and_failed_lookup_is_a_loud_error(clients: Any) -> None:
    """Stubbed: Create/DescribeCapacityReservations; the lookup answers UnauthorizedOperation."""
    ec2, _, _ = clients("us-east-2")
    stub = Reservations(ec2)
    stub.describe.reply = lambda p: (403, {"Error": {"Code": "UnauthorizedOperation", "Message": "no"}})

    def interrupt(**kw: Any) -> None:
        if not kw["parsed"].get("Error"):
            raise KeyboardInterrupt

    ec2.meta.events.register("after-call.ec2.CreateCapacityReservation", interrupt)
    with pytest.raises(cap.ReservationLeftBehind, match="could not be looked up") as e:
        _hold_and_cancel(ec2)
    assert f"Name=tag:{cap.PROBE_TAG},Values={stub.create.calls[-1]['ClientToken']}" in (e.value.hint or "")


def test_cancel_failure_says_how_to_cancel_by_hand(clients: Any) -> None:
    """Stubbed: Create/CancelCapacityReservation; the cancel answers InternalError."""
    ec2, _, _ = clients("us-east-2")
    stub = Reservations(ec2)
    stub.cancel.reply = lambda p: (400, {"Error": {"Code": "InvalidState", "Message": "busy"}})
    with pytest.raises(cap.ReservationLeftBehind, match="could NOT be cancelled") as e:
        _hold_and_cancel(ec2)
    assert "aws ec2 cancel-capacity-reservation --capacity-reservation-id cr-0123456789abcdef0 --region us-east-2" in (e.value.hint or "")


# ---------------------------------------------------------------- CLI


def test_cli_json_and_emit_env(aws_env: str, quotas: Quotas, offerings: Any, client_hooks: dict[str, Any],
                               capsys: pytest.CaptureFixture[str]) -> None:
    """In-process CLI against moto; stubbed: GetSpotPlacementScores."""
    offerings("us-east-2", "g6.12xlarge", ["us-east-2c"])
    quotas.values[G] = 96
    spot = scores({"use2-az3": 5})
    client_hooks.update(spot.events())
    args = ["capacity", "--region", "us-east-2", "--count", "2"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {k: doc[k] for k in ("region", "instance_type", "count", "vcpus_needed", "best_zone")} == {
        "region": "us-east-2", "instance_type": "g6.12xlarge", "count": 2, "vcpus_needed": 96, "best_zone": "us-east-2c"}
    assert {k: doc["quota"][k] for k in ("value", "used", "headroom")} == {"value": 96.0, "used": 0, "headroom": 96.0}
    assert set(doc["zones"][0]) >= {"zone", "zone_id", "offered", "spot_score", "verdict", "reason"}
    assert doc["zones"][0] == {**doc["zones"][0], "zone": "us-east-2c", "zone_id": "use2-az3", "spot_score": 5, "verdict": "ready"}
    assert main([*args, "--emit-env"]) == 0
    assert capsys.readouterr().out == "RAYDLC_GPU_AZ=us-east-2c\n"
    assert main([*args]) == 0
    table = capsys.readouterr().out
    assert "us-east-2c" in table and "best zone" in table
    assert main([*args, "--count", "3", "--json"]) == 3  # 144 vCPUs > 96: quota-short everywhere
    short = json.loads(capsys.readouterr().out)
    assert short["best_zone"] is None and short["quota_request"]["value"] == 144
    assert main([*args, "--count", "3", "--emit-env"]) == 3
    out = capsys.readouterr()
    assert out.out == "" and "request L-DB2E81BA = 144" in out.err
    assert main([*args, "--json", "--emit-env"]) == 2


def test_cli_shows_each_zones_spot_price_beside_the_on_demand_price_and_ranks_for_spot(
        aws_env: str, quotas: Quotas, offerings: Any, client_hooks: dict[str, Any], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stubbed: GetSpotPlacementScores (equal) and DescribeSpotPriceHistory (two entries per AZ: the newest wins)."""
    import datetime as dt

    offerings("us-east-2", "g6.12xlarge", ["us-east-2b", "us-east-2c"])
    quotas.values[G] = 96
    old, new = dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    history = [("us-east-2b", old, "1.10"), ("us-east-2b", new, "2.20"), ("us-east-2c", new, "1.90"), ("us-east-2c", old, "3.0")]
    prices = Answer("ec2", "DescribeSpotPriceHistory", lambda p: (200, {"SpotPriceHistory": [
        {"AvailabilityZone": z, "InstanceType": "g6.12xlarge", "ProductDescription": "Linux/UNIX", "SpotPrice": v,
         "Timestamp": t} for z, t, v in history]}))
    client_hooks.update({**scores({"use2-az2": 7, "use2-az3": 7}).events(), **prices.events()})
    monkeypatch.setenv("RAYDLC_GPU_CAPACITY_TYPE", "spot")
    args = ["capacity", "--region", "us-east-2", "--count", "2"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert prices.calls and prices.calls[0]["InstanceTypes"] == ["g6.12xlarge"]
    assert [(z["zone"], z["spot_price_usd"]) for z in doc["zones"]][:2] == [("us-east-2c", 1.9), ("us-east-2b", 2.2)]
    assert (doc["best_zone"], doc["capacity_type"], doc["on_demand_usd_per_node_hour"]) == ("us-east-2c", "spot", 4.6016)
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1.900" in out and "2.200" in out and "On-Demand list price: $4.602/h a node" in out


def test_cli_instance_type_flag_takes_gpus_from_catalog(aws_env: str, client_hooks: dict[str, Any],
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Stubbed: GetSpotPlacementScores (empty)."""
    client_hooks.update(scores({}).events())
    args = ["capacity", "--region", "us-west-2", "--instance-type", "g5.48xlarge", "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["instance"]["gpus"] == 8 and doc["checks"] == []
    monkeypatch.setenv("RAYDLC_GPUS_PER_NODE", "4")  # set on purpose: the mismatch is reported, not overridden
    assert main(args) == 2
    assert "GPUS_PER_NODE" in capsys.readouterr().err


def test_cli_probe_reserves_in_the_best_zone_and_reports_cost(
    aws_env: str, quotas: Quotas, offerings: Any, client_hooks: dict[str, Any], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In-process CLI against moto; stubbed: GetSpotPlacementScores, Create/CancelCapacityReservation."""
    offerings("us-east-2", "g6.12xlarge", ["us-east-2a", "us-east-2b"])
    quotas.values[G] = 500
    created = Answer("ec2", "CreateCapacityReservation", lambda p: (412, {"Error": {"Code": "DryRunOperation"}}) if p.get("DryRun")
                     else (200, {"CapacityReservation": {"CapacityReservationId": "cr-0probe", "State": "active"}}))
    cancelled = Answer("ec2", "CancelCapacityReservation", lambda p: (200, {"Return": True}))
    for a in (scores({"use2-az1": 2, "use2-az2": 7}), created, cancelled):
        client_hooks.update(a.events())
    monkeypatch.setenv("RAYDLC_GPU_AZ", "us-east-2c")
    assert main(["capacity", "--region", "us-east-2", "--probe", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["best_zone"] == "us-east-2b"  # use2-az2 has the higher Spot score
    assert [c["AvailabilityZone"] for c in created.calls] == ["us-east-2b", "us-east-2b"]
    assert cancelled.calls == [{"CapacityReservationId": "cr-0probe"}]
    assert {k: doc["probe"][k] for k in ("zone", "outcome", "reservation_id", "cancelled", "hourly_usd")} == {
        "zone": "us-east-2b", "outcome": "available", "reservation_id": "cr-0probe", "cancelled": True, "hourly_usd": 9.2032}
    assert any(c.startswith("GPU_AZ: us-east-2c is not-offered") for c in doc["checks"])


def _run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    src = str(Path(cap.__file__).resolve().parents[2])
    full = {**env, "PYTHONPATH": os.pathsep.join([src, env.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "raydlc.cli", *args], capture_output=True, text=True, env=full, timeout=120)


def test_acceptance_untouched_moto_lists_us_west_2d_not_offered(aws_env: str) -> None:
    """Nothing stubbed: the real CLI process, default retries; no test creates anything in us-west-2."""
    env = {k: v for k, v in os.environ.items() if k != "AWS_MAX_ATTEMPTS"}
    r = _run_cli(["capacity", "--region", "us-west-2", "--instance-type", "g5.12xlarge", "--count", "2", "--json"], env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    verdicts = {z["zone"]: z["verdict"] for z in doc["zones"]}
    assert verdicts["us-west-2d"] == "not-offered"
    assert {z: v for z, v in verdicts.items() if z != "us-west-2d"} == {
        "us-west-2a": "unknown", "us-west-2b": "unknown", "us-west-2c": "unknown"}  # moto has no EC2 quotas
    assert doc["best_zone"] in {"us-west-2a", "us-west-2b", "us-west-2c"}
    assert doc["vcpus_needed"] == 96 and doc["quota"]["value"] is None and doc["quota"]["used"] == 0


def test_no_credentials_fails_before_any_call(aws_env: str) -> None:
    """AWS_ENDPOINT_URL points at a socket this test listens on: nothing may connect to it."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.2)
        env = {k: v for k, v in os.environ.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:%d" % listener.getsockname()[1]
        r = _run_cli(["capacity", "--region", "us-west-2", "--json"], env)
        with pytest.raises(socket.timeout):
            listener.accept()
    assert r.returncode == 2 and r.stdout == ""
    assert "no AWS credentials" in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr


def test_cli_start_does_not_import_boto3(tmp_path: Path) -> None:
    code = "import sys; from raydlc.cli import main; main(['capacity', '--help']); print('boto3' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(cap.__file__).resolve().parents[2])})
    assert r.stdout.strip().endswith("False"), r.stdout[-300:]
