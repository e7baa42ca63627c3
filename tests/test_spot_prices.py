"""Spot beside On-Demand: the GPU nodes' two prices, and a Spot run's budget kept at the Spot price (pure, offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raydlc.capacity import prices as gp
from raydlc.config import load_config
from raydlc.errors import CredentialsError
from raydlc.planner import budget
from raydlc.render.raycluster import job_deadline, render_rayjob


def _cfg(tmp_path: Path, **over: object):
    return load_config(env={}, overrides={"MODEL_ID": "tiny", "GPU_NODE_COUNT": 2, "STORAGE_PATH": "s3://b/runs",
                                          "JOB_DEADLINE_S": 86400, **over}, cwd=tmp_path)


def test_gpu_prices_show_both_and_charge_a_spot_run_at_spot(tmp_path: Path) -> None:
    spot = gp.gpu_prices(_cfg(tmp_path, GPU_CAPACITY_TYPE="spot"), "us-east-2a", {"us-east-2a": 1.5, "us-east-2b": 9.0})
    assert (spot.on_demand_usd_per_hour, spot.spot_usd_per_hour, spot.run_usd_per_node_hour, spot.run_price) == (
        9.2032, 3.0, 1.5, "spot")
    assert "on-demand $9.20/h, spot $3.00/h; GPU_CAPACITY_TYPE=spot, runs priced at spot" in spot.line()
    assert gp.GpuPrices.from_dict(spot.to_dict()) == spot
    od = gp.gpu_prices(_cfg(tmp_path), "us-east-2a", {"us-east-2a": 1.5})
    assert (od.spot_usd_per_hour, od.run_usd_per_node_hour, od.run_price) == (3.0, 4.6016, "on-demand")
    # spot-then-on-demand that fell back: the node group is On-Demand, so is the price
    fell = gp.gpu_prices(_cfg(tmp_path, GPU_CAPACITY_TYPE="spot-then-on-demand"), "us-east-2a", {"us-east-2a": 1.5}, on_spot=False)
    assert fell.run_price == "on-demand" and fell.run_usd_per_node_hour == 4.6016
    unknown = gp.gpu_prices(_cfg(tmp_path, GPU_CAPACITY_TYPE="spot"), "us-east-2a", None, unknown="no AWS credentials")
    assert (unknown.spot_usd_per_hour, unknown.spot_unknown, unknown.run_price) == (None, "no AWS credentials", "on-demand")
    assert "spot unknown (no AWS credentials)" in unknown.line()
    assert gp.gpu_prices(_cfg(tmp_path), None, {"us-east-2a": 1.5}).spot_unknown == "no GPU AZ yet"


def test_without_credentials_the_spot_price_is_unknown_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from raydlc.edges import aws

    def no_credentials(*a: object, **k: object) -> None:
        raise CredentialsError("no AWS credentials found")

    monkeypatch.setattr(aws, "session", no_credentials)
    got = gp.cluster_gpu_prices(_cfg(tmp_path, GPU_CAPACITY_TYPE="spot", GPU_AZ="us-east-2a"))
    assert got.spot_usd_per_node_hour is None and got.spot_unknown == "no AWS credentials found"
    assert got.on_demand_usd_per_node_hour == 4.6016 and got.run_price == "on-demand"


def test_a_spot_runs_budget_buys_the_time_the_spot_price_allows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from raydlc.jobs import submit

    cfg = _cfg(tmp_path, GPU_CAPACITY_TYPE="spot", JOB_MAX_COST_USD=10.0)
    at_list = job_deadline(cfg)
    assert at_list == int(10.0 / (2 * 4.6016) * 3600)
    spot = budget.prices_at("g6.12xlarge", 1.25)
    assert spot["g6.12xlarge"] == 1.25 and spot["m7i.xlarge"] == budget.list_prices()["m7i.xlarge"]
    assert budget.prices_at("g6.12xlarge", None) == budget.list_prices()
    assert render_rayjob(cfg, prices=spot)["spec"]["activeDeadlineSeconds"] == job_deadline(cfg, spot) == 14400
    # submit prices a Spot run at the price its nodes are bought at now; On-Demand, or no budget, asks nothing
    asked: list[str] = []

    def bought(c: object) -> gp.GpuPrices:
        asked.append("yes")
        return gp.gpu_prices(cfg, "us-east-2a", {"us-east-2a": 1.25})

    monkeypatch.setattr(gp, "cluster_gpu_prices", bought)
    assert submit.run_prices(cfg) == spot and asked == ["yes"]
    assert submit.run_prices(_cfg(tmp_path, JOB_MAX_COST_USD=10.0)) is None
    assert submit.run_prices(_cfg(tmp_path, GPU_CAPACITY_TYPE="spot")) is None and asked == ["yes"]


def test_plan_shows_the_on_demand_price_and_says_the_spot_price_is_read_elsewhere() -> None:
    import raydlc.api as api

    p = api.plan(model="qwen2.5-1.5b", nodes=2, gpus_per_node=4, settings={"GPU_CAPACITY_TYPE": "spot"})
    prices = p.to_dict()["prices"]
    assert (prices["on_demand_usd_per_hour"], prices["spot_usd_per_hour"], prices["capacity_type"]) == (9.2032, None, "spot")
    assert "raydlc capacity" in prices["spot_unknown"]
    assert "GPU nodes 2 × g6.12xlarge: on-demand $9.20/h, spot unknown" in " ".join(str(p).split())


def test_a_spot_runs_budget_inside_the_program_is_kept_at_the_spot_price_read_at_submit(tmp_path: Path) -> None:
    """GPU_USD_PER_HOUR (set by submit for Spot) into RunTarget, then the budget: 2 × $1.25 = $2.50/h, not the list's."""
    from raydlc.config import TrainConfig
    from raydlc.render.raycluster import price_env
    from raydlc.train.launch import target
    from raydlc.train.resolve import run_budget
    from raydlc.train.runspec import RunTarget

    train = TrainConfig(model_id="tiny", max_cost_usd=10.0)
    spot = run_budget(train, RunTarget(instance_type="g6.12xlarge", gpu_usd_per_node_hour=1.25), 2, started_at=0.0, now=0.0)
    listed = run_budget(train, RunTarget(instance_type="g6.12xlarge"), 2, started_at=0.0, now=0.0)
    assert spot is not None and listed is not None
    assert (spot.usd_per_hour, spot.price_label) == (2.5, "Spot price read at submit")
    assert (listed.usd_per_hour, listed.price_label) == (9.2032, None)
    assert spot.seconds == pytest.approx(4 * 3600) and listed.seconds == pytest.approx(10 / 9.2032 * 3600)
    # the job's env says it; the program reads it into its RunTarget; On-Demand (the list price) sets nothing
    cfg = _cfg(tmp_path, GPU_CAPACITY_TYPE="spot", JOB_MAX_COST_USD=10.0)
    assert price_env(cfg, budget.prices_at("g6.12xlarge", 1.25)) == {"RAYDLC_GPU_USD_PER_HOUR": "1.25"}
    assert price_env(cfg, None) == {} == price_env(cfg, budget.prices_at("g6.12xlarge", None))
    env = render_rayjob(cfg, prices=budget.prices_at("g6.12xlarge", 1.25))["spec"]["runtimeEnvYAML"]
    assert '"RAYDLC_GPU_USD_PER_HOUR": "1.25"' in env and "RAYDLC_GPU_USD_PER_HOUR" not in render_rayjob(cfg)["spec"]["runtimeEnvYAML"]
    in_job = load_config(env={"RAYDLC_GPU_USD_PER_HOUR": "1.25", "RAYDLC_MODEL_ID": "tiny"}, cwd=tmp_path)
    assert target(in_job, local=False, address="auto").gpu_usd_per_node_hour == 1.25
    assert target(_cfg(tmp_path), local=False, address="auto").gpu_usd_per_node_hour is None


def test_job_status_names_the_spot_price_its_spend_line_is_at() -> None:
    from raydlc.views.jobs import print_cost
    from raydlc.views.text import rendered

    cost = {"step": 12, "spent_usd": 1.2, "budget_usd": 5.0, "forecast_usd": None, "price": "Spot price read at submit, $1.25/h a node"}
    assert "spend at step 12: $1.20 of $5.00 (Spot price read at submit, $1.25/h a node)" in rendered(lambda c: print_cost(cost, c), width=200)
