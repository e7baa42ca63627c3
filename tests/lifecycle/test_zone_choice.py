"""The GPU zone decision as a frozen value, from hand-built capacity reports (no AWS)."""

from __future__ import annotations

import dataclasses

import pytest

from raydlc.capacity.choice import ZoneChoice, choose, existing_choice
from raydlc.capacity.ranking import CapacityReport, QuotaReport, QuotaRequest, ZoneReport
from raydlc.capacity.signals import SubnetFacts
from raydlc.config import load_config


def zone(name: str, verdict: str = "ready", offered: bool | None = True, reason: str = "fits") -> ZoneReport:
    return ZoneReport(name, None, offered, None, None, verdict, reason)  # type: ignore[arg-type]


def report(*zones: ZoneReport, cluster: SubnetFacts | None = None, quota: QuotaRequest | None = None) -> CapacityReport:
    q = QuotaReport("L-DB2E81BA", "Running On-Demand G and VT instances", 96.0, 0, 96.0)
    return CapacityReport("us-east-2", "g6.12xlarge", 2, 96, None, q, q, list(zones), zones[0].zone if zones else None,
                          quota, cluster)


def test_raydlc_picks_the_best_usable_zone_and_ranks_the_rest_as_candidates() -> None:
    cfg = load_config(env={})
    got = choose(cfg, report(zone("us-east-2b"), zone("us-east-2a", "unknown"), zone("us-east-2c", "not-offered", False)))
    assert got == ZoneChoice("us-east-2b", ("us-east-2b", "us-east-2a"), "us-east-2b: ready (fits)", True,
                             ("us-east-2b", "us-east-2a", "us-east-2c"), None)
    assert got.zones_for("us-east-2a") == ["us-east-2a", "us-east-2b", "us-east-2c"]
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
