"""The GPU zone decision as a frozen value, from hand-built capacity reports (no AWS)."""

from __future__ import annotations

import dataclasses

import pytest

from raydlc.capacity.choice import ZoneChoice, choose, existing_choice
from raydlc.capacity.ranking import CapacityReport, QuotaReport, QuotaRequest, ZoneReport
from raydlc.capacity.signals import SubnetFacts
from raydlc.config import load_config


def zone(name: str, verdict: str = "ready", offered: bool | None = True, reason: str = "fits",
         zone_id: str | None = None) -> ZoneReport:
    return ZoneReport(name, zone_id, offered, None, None, verdict, reason)  # type: ignore[arg-type]


def report(*zones: ZoneReport, cluster: SubnetFacts | None = None, quota: QuotaRequest | None = None) -> CapacityReport:
    q = QuotaReport("L-DB2E81BA", "Running On-Demand G and VT instances", 96.0, 0, 96.0)
    return CapacityReport("us-east-2", "g6.12xlarge", 2, 96, None, q, q, list(zones), zones[0].zone if zones else None,
                          quota, cluster)


def test_raydlc_picks_the_best_usable_zone_and_ranks_the_rest_as_candidates() -> None:
    cfg = load_config(env={})
    got = choose(cfg, report(zone("us-east-2b"), zone("us-east-2a", "unknown"), zone("us-east-2c", "not-offered", False)))
    assert got == ZoneChoice("us-east-2b", ("us-east-2b", "us-east-2a"), "us-east-2b: ready (fits)", True,
                             ("us-east-2b", "us-east-2a"), None)
    assert got.zones_for("us-east-2a") == ["us-east-2a", "us-east-2b"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.zone = "us-east-2c"  # type: ignore[misc]


def test_an_existing_vpc_narrows_the_candidates_to_its_private_zones() -> None:
    cfg = load_config(env={})
    vpc = SubnetFacts("eks-cluster", "vpc-1", frozenset({"us-east-2c"}))
    got = choose(cfg, report(zone("us-east-2a"), zone("us-east-2c"), cluster=vpc))
    assert (got.zone, got.candidates, got.cluster_zones) == ("us-east-2c", ("us-east-2c",), ("us-east-2c", "us-east-2a"))


def test_a_zone_the_user_set_is_kept_and_never_left() -> None:
    cfg = load_config(env={"RAYDLC_GPU_AZ": "us-east-2c"})
    got = choose(cfg, report(zone("us-east-2a"), zone("us-east-2c", "unknown", None, "no spot score")))
    assert (got.zone, got.candidates, got.chosen) == ("us-east-2c", ("us-east-2c",), False)
    assert got.reason.startswith("us-east-2c: set by GPU_AZ (") and "unknown: no spot score" in got.reason
    assert got.cluster_zones == ("us-east-2c", "us-east-2a")


def test_a_user_zone_without_the_type_or_quota_is_no_choice_with_the_quota_hint() -> None:
    cfg = load_config(env={"RAYDLC_GPU_AZ": "us-east-2a"})
    ask = QuotaRequest("ec2", "L-DB2E81BA", "G and VT", 96, "us-east-2")
    got = choose(cfg, report(zone("us-east-2a", "quota-short", True, "needs 96 vCPUs, 0 free"), quota=ask))
    assert got.zone is None and got.candidates == () and "is quota-short: needs 96 vCPUs" in got.reason
    assert got.hint == ask.command


def test_no_usable_zone_says_why_with_the_best_zones_reason() -> None:
    cfg = load_config(env={})
    got = choose(cfg, report(zone("us-east-2a", "not-offered", False, "g6.12xlarge is not offered in us-east-2a")))
    assert got.zone is None
    assert got.reason == "no AZ of us-east-2 can take 2 × g6.12xlarge: g6.12xlarge is not offered in us-east-2a"


def test_the_cluster_gets_the_gpu_az_its_retry_zones_and_no_more_than_eks_needs() -> None:
    cfg = load_config(env={"RAYDLC_REGION": "us-east-1"})
    zones = [zone("us-east-1a", zone_id="use1-az6"), zone("us-east-1c", "not-offered", False, zone_id="use1-az2"),
             zone("us-east-1d", "not-offered", False, zone_id="use1-az4"), zone("us-east-1f", zone_id="use1-az5")]
    got = choose(cfg, dataclasses.replace(report(*zones), region="us-east-1"))
    assert (got.zone, got.candidates, got.cluster_zones) == ("us-east-1a", ("us-east-1a", "us-east-1f"), ("us-east-1a", "us-east-1f"))
    many = [zone(f"us-east-1{c}", zone_id=f"use1-az{i}") for i, c in zip((1, 2, 4, 5, 6), "abcdf")]
    most = choose(cfg, dataclasses.replace(report(*many), region="us-east-1"))
    assert most.candidates == most.cluster_zones == ("us-east-1a", "us-east-1b", "us-east-1c"), "eksctl's recommended 3"
    one = choose(cfg, dataclasses.replace(report(*zones[:3]), region="us-east-1"))
    assert one.candidates == ("us-east-1a",) and one.cluster_zones == ("us-east-1a", "us-east-1c"), "EKS needs two AZs"


@pytest.mark.parametrize(("region", "name", "zone_id"), [
    ("us-east-1", "us-east-1e", "use1-az3"), ("us-west-1", "us-west-1c", "usw1-az2"), ("ca-central-1", "ca-central-1c", "cac1-az3")])
def test_a_zone_id_eks_refuses_for_control_planes_is_never_a_cluster_zone(region: str, name: str, zone_id: str) -> None:
    """eksctl's pkg/az/az.go avoids these only when it picks the zones; raydlc always names them."""
    cfg = load_config(env={"RAYDLC_REGION": region})
    zones = [zone(name, zone_id=zone_id), zone(f"{region}a", "unknown", zone_id="x-az1"),
             zone(f"{region}b", "not-offered", False, zone_id="x-az9")]
    got = choose(cfg, report(*zones))
    assert got.zone == f"{region}a" and name not in got.candidates and name not in got.cluster_zones
    assert got.cluster_zones == (f"{region}a", f"{region}b")
    user = choose(load_config(env={"RAYDLC_REGION": region, "RAYDLC_GPU_AZ": name}), report(*zones))
    assert user.zone is None and user.refused and user.hint == "raydlc capacity"
    assert f"GPU_AZ {name}" in user.reason and f"zone ID {zone_id}" in user.reason and "EKS refuses" in user.reason


def test_an_existing_node_group_stays_where_it_is() -> None:
    got = existing_choice(load_config(env={}), "us-east-2b", {"us-east-2c", "us-east-2b", "us-east-2a"})
    assert got == ZoneChoice("us-east-2b", ("us-east-2b",), "us-east-2b: the AZ of the existing node group gpu-workers",
                             False, ("us-east-2b", "us-east-2a", "us-east-2c"))


@pytest.mark.slow
def test_one_run_decides_the_zone_once_and_keeps_it_off_the_context(world) -> None:
    """capacity's check, the cluster's ClusterConfig and the GPU node group all ask; discovery runs once."""
    import raydlc.capacity
    from raydlc import lifecycle
    from raydlc.lifecycle import Context, Timings

    calls: list[str] = []
    real = raydlc.capacity.discover
    world.monkeypatch.setattr(raydlc.capacity, "discover", lambda cfg, **kw: calls.append(cfg.cluster.name) or real(cfg, **kw))
    fast = Timings(poll_s=0.1, cluster_s=60, nodegroup_s=60, stack_s=60, helm_s=60, nodes_s=30)
    run = lifecycle.up(world.config(), until="gpu-nodegroup", timings=fast)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert calls == ["eks-cluster"]
    assert "Ready in us-east-2a" in run.results[-1].reason
    ctx = Context(world.config())
    assert not {"zones", "gpu_az", "az_chosen", "candidates", "capacity", "capacity_reason"} & set(vars(ctx))
