"""The stall guard's decision and evidence, and the budget's arithmetic: pure, no Ray."""

from __future__ import annotations

import math

import pytest

from raydlc.config import TrainConfig, load_config
from raydlc.errors import ConfigError, InputError
from raydlc.planner import budget as B
from raydlc.train import stall as S

# ---- the budget ----------------------------------------------------------------------------------


def test_the_deadline_is_the_budget_over_the_hourly_price() -> None:
    assert B.seconds_for(10.0, 36.0) == pytest.approx(1000.0)
    assert B.seconds_for(10.0, 0.0) == math.inf
    b = B.Budget(usd=5.0, usd_per_hour=18.0, started_at=1000.0, nodes=2)
    assert b.seconds == pytest.approx(1000.0) and b.deadline == pytest.approx(2000.0)
    assert b.spent(1500.0) == pytest.approx(2.5) and b.spent(900.0) == 0.0


def test_the_hourly_price_counts_each_node_at_its_list_price() -> None:
    prices = {"g6.12xlarge": 4.6016}
    assert B.hourly_price("g6.12xlarge", 2, prices) == pytest.approx(9.2032)
    assert B.hourly_price("x9.nope", 2, prices) is None and B.hourly_price(None, 1, prices) is None
    assert B.list_prices()["p5.48xlarge"] == 55.04  # the catalogue's table is the default


def test_the_loop_stops_when_one_more_step_and_the_finish_would_pass_the_deadline() -> None:
    b = B.Budget(usd=100.0, usd_per_hour=3600.0, started_at=0.0, nodes=1)  # 100 s; reserve 5 % = 5 s
    assert b.reserve_s() == pytest.approx(5.0)
    assert not b.must_stop(90.0, step_s=4.0)  # 90 + 4 + 5 = 99 < 100
    assert b.must_stop(91.0, step_s=4.0)  # 91 + 4 + 5 = 100
    assert b.reserve_s(checkpoint_s=10.0) == pytest.approx(20.0)  # a slow checkpoint measured: twice it
    assert b.must_stop(80.0, step_s=1.0, checkpoint_s=10.0)


def test_a_budget_that_buys_n_steps_stops_the_loop_after_n() -> None:
    """The loop's rule over a steady run: 20 s of start-up, 4 s steps, $100 at $1/s (5 s held back)."""
    b = B.Budget(usd=100.0, usd_per_hour=3600.0, started_at=0.0, nodes=1)
    step, now = 0, 20.0
    while True:
        step, now = step + 1, now + 4.0
        if b.must_stop(now, step_s=4.0):
            break
    assert step == 18  # 20 + 18 x 4 = 92 s; a 19th step and the finish would end at 101 s
    assert b.spent(now) == pytest.approx(92.0) and b.spent(now + 5.0) < b.usd


def test_spend_and_the_forecast_to_the_last_step() -> None:
    b = B.Budget(usd=10.0, usd_per_hour=36.0, started_at=0.0, nodes=1)  # 1 cent a second
    s = B.spend(b, 100.0, step=40, steps=100, step_s=2.0)
    assert s.spent_usd == pytest.approx(1.0) and s.forecast_usd == pytest.approx(1.0 + 60 * 2.0 * 0.01)
    assert B.spend(b, 100.0, step=40, steps=100, step_s=None).forecast_usd is None
    assert B.stop_reason(b, step=37, spent_usd=4.1) == "stopped by the budget: $4.10 of $10.00 at step 37"


def test_a_budget_without_a_price_or_below_start_up_and_one_step_is_refused() -> None:
    with pytest.raises(InputError, match="a local run has no hourly price"):
        B.check_budget(5.0, None, step_s=None, where="a local run")
    need = (B.STARTUP_ESTIMATE_S + 20.0) * 9.2032 / 3600
    with pytest.raises(InputError, match=r"less than one step costs: \$0\.51 .* \+ one step \(20\.0 s") as e:
        B.check_budget(need - 0.01, 9.2032, step_s=20.0, where="2 x g6.12xlarge")
    assert "--max-cost 0.52" in (e.value.hint or "")
    B.check_budget(need + 0.01, 9.2032, step_s=20.0, where="2 x g6.12xlarge")


def test_the_rayjob_deadline_is_the_smaller_of_the_budget_and_job_deadline_s() -> None:
    from raydlc.render.raycluster import job_deadline, render_rayjob

    prices = {"g6.12xlarge": 3.6}  # two nodes: $7.20/h, $2 a thousand seconds
    cfg = load_config(env={}, overrides={"MODEL_ID": "tiny", "GPU_NODE_COUNT": 2, "STORAGE_PATH": "s3://b/runs", "JOB_MAX_COST_USD": 2.0, "JOB_DEADLINE_S": 7200})
    assert job_deadline(cfg, prices) == 1000
    assert render_rayjob(cfg, prices=prices)["spec"]["activeDeadlineSeconds"] == 1000
    rich = load_config(env={}, overrides={"MODEL_ID": "tiny", "GPU_NODE_COUNT": 2, "STORAGE_PATH": "s3://b/runs", "JOB_MAX_COST_USD": 100.0, "JOB_DEADLINE_S": 7200})
    assert job_deadline(rich, prices) == 7200
    assert job_deadline(load_config(env={}, overrides={"MODEL_ID": "tiny", "JOB_DEADLINE_S": 600}), prices) == 600
    poor = load_config(env={}, overrides={"MODEL_ID": "tiny", "GPU_NODE_COUNT": 2, "STORAGE_PATH": "s3://b/runs", "JOB_MAX_COST_USD": 0.2})
    with pytest.raises(InputError, match="less than one step costs"):
        render_rayjob(poor, prices=prices)
    with pytest.raises(InputError, match="no hourly price"):
        job_deadline(cfg, {})


@pytest.mark.parametrize(("name", "value", "says"), [
    ("JOB_MAX_COST_USD", "-1", "at least 0.01"), ("JOB_MAX_COST_USD", "nan", "JOB_MAX_COST_USD"), ("JOB_MAX_COST_USD", "0", "at least 0.01"),
    ("STALL_MINUTES", "-5", r"0 \(off\) or at least 1 minute"), ("STALL_MINUTES", "0.0001", "would end a healthy run"), ("STALL_MINUTES", "inf", "STALL_MINUTES"), ("STALL_FIRST_MINUTES", "nan", "STALL_FIRST_MINUTES"),
])
def test_bad_budget_and_stall_settings_are_refused(name: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(env={}, overrides={name: value})


def test_the_new_settings_default_to_a_guard_on_and_no_budget() -> None:
    t = TrainConfig()
    assert (t.stall_minutes, t.stall_first_minutes, t.max_cost_usd) == (20.0, 60.0, None)
    assert TrainConfig(max_cost_usd="").max_cost_usd is None  # empty = no budget


# ---- the stall guard ------------------------------------------------------------------------------


def test_the_guard_waits_longer_for_the_first_step_and_is_off_at_zero() -> None:
    g = S.StallGuard.of(20, 60)
    assert (g.limit_s, g.first_limit_s) == (1200.0, 3600.0)
    assert not g.check(3000.0, 0.0, 0, first=True).stalled
    d = g.check(3601.0, 0.0, 0, first=True)
    assert d.stalled and d.first and d.limit_s == 3600.0
    assert g.check(1201.0, 0.0, 7, first=False).stalled
    assert S.StallGuard.of(20, 5).first_limit_s == 1200.0  # never less than STALL_MINUTES
    off = S.StallGuard.of(0, 60)
    assert not off.on and not off.check(1e9, 0.0, 3, first=False).stalled
    assert S.StallGuard.of(0.1, 1).beat_every_s() == pytest.approx(0.6) and g.beat_every_s() == 30.0


def beat(rank: int, step: int, *, entered: int, completed: int = 1, attempt: str = "a") -> dict[str, object]:
    return {"beat": True, "rank": rank, "step": step, "entered": entered, "completed": completed, "attempt": attempt,
            "node_ip": f"10.0.0.{rank}", "pid": 100 + rank}


def frames(*names: str, file: str = "/x/torch/distributed/distributed_c10d.py") -> list[dict[str, object]]:
    loop = [{"file": "/x/raydlc/train/loop.py", "line": 10, "name": "run_loop"}]
    return loop + [{"file": file if n != "injected_hang" else "/x/raydlc/train/faults.py", "line": 5, "name": n} for n in names]


def answer(rank: int, fr: list[dict[str, object]]) -> dict[str, object]:
    return {"stacks": True, "rank": rank, "pid": 100 + rank, "node_ip": f"10.0.0.{rank}",
            "threads": [{"ident": 1, "name": "MainThread", "frames": [{"file": "/x/ray/worker.py", "line": 1, "name": "main_loop"}]},
                        {"ident": 2, "name": "train", "frames": fr}], "nccl_lines": ["NCCL INFO ring 0"], "log_tail": ["step 2"]}


def test_the_watch_counts_progress_from_steps_and_restarts_the_allowance_on_a_new_attempt() -> None:
    w = S.Watch(since=0.0)
    w.see(beat(0, 0, entered=1, completed=0), 5.0)
    assert (w.step, w.since, w.first) == (0, 0.0, True)
    w.see(beat(0, 1, entered=2), 10.0)
    assert (w.step, w.since, w.first) == (1, 10.0, False)
    w.see({"step": 2, "loss": 3.0}, 12.0)  # rank 0's record
    w.see(beat(0, 2, entered=3, completed=2), 14.0)  # no newer step: the clock stays
    assert (w.step, w.since) == (2, 12.0)
    w.see({**beat(0, 2, entered=3, completed=2), "phase": "checkpoint of step 2"}, 16.0)  # a checkpoint gets its own allowance
    assert w.since == 16.0
    w.see(beat(0, 2, entered=2, completed=0, attempt="b"), 20.0)  # Ray Train restarted the worker group
    assert (w.since, w.first) == (20.0, True)


def test_the_evidence_names_the_rank_outside_the_collective_and_where_it_is() -> None:
    w = S.Watch(since=0.0, step=2, first=False)
    w.see(beat(0, 2, entered=3), 1.0)
    w.see(beat(1, 2, entered=3), 1.0)
    w.see(answer(0, frames("train_step", "target_tokens", "all_reduce")), 2.0)
    w.see(answer(1, frames("injected_hang", "sleep")), 2.0)
    d = S.StallGuard.of(0.1, 1).check(20.0, 1.0, 2, first=False)
    doc = S.evidence(w, d, 20.0)
    assert doc["suspects"] == [1]
    assert doc["reason"].startswith("no step for 0.3 min (limit 0.1 min for an optimizer step); rank 1 last seen at step 2 in sleep")
    assert "on node 10.0.0.1" in doc["reason"]
    r0, r1 = doc["ranks"]
    assert r0["in_collective"] and r0["where"].startswith("all_reduce (") and not r1["in_collective"]
    assert r1["stack_file"] == "rank-1.stack.txt" and r1["nccl_lines"] == ["NCCL INFO ring 0"]
    text = S.stack_text(answer(1, frames("injected_hang")))
    assert "in injected_hang" in text and "Thread train (2)" in text


def test_every_rank_in_a_collective_names_none_and_a_silent_rank_is_named() -> None:
    w = S.Watch(since=0.0, step=2, first=False)
    for r in (0, 1):
        w.see(beat(r, 2, entered=3), 1.0)
        w.see(answer(r, frames("all_gather")), 2.0)
    d = S.StallCheck(True, 1300.0, 1200.0, 2, False)
    assert S.suspects(w) == [] and "every rank waits in a collective (all_gather (" in S.reason(w, d, [])
    w.see(beat(2, 1, entered=2), 1.0)  # behind the others, and no answer to the request
    assert S.suspects(w) == [2]
    assert "rank 2 last seen at step 1 in (no stack: its heartbeat stopped)" in S.reason(w, d, [2])


def test_the_evidence_is_written_under_the_run_folder(tmp_path: object) -> None:
    import json
    from pathlib import Path

    w = S.Watch(since=0.0)
    w.see(beat(1, 2, entered=3), 1.0)
    w.see(answer(1, frames("injected_hang")), 1.0)
    doc = S.evidence(w, S.StallCheck(True, 10.0, 6.0, 2, False), 11.0)
    path = S.write_evidence(doc, w, str(tmp_path))
    assert path == str(Path(str(tmp_path)) / "stall" / "evidence.json")
    assert json.loads(Path(path).read_text())["suspects"] == [1]
    assert "injected_hang" in (Path(str(tmp_path)) / "stall" / "rank-1.stack.txt").read_text()


def test_job_status_reads_back_the_spend_line_the_job_prints() -> None:
    from raydlc.jobs.control import latest_cost
    from raydlc.train.__main__ import cost_note

    line = "step 12: loss 2.1000  1,000 tok/s  0.500 s" + cost_note({"spent_usd": 1.2, "budget_usd": 5.0, "forecast_usd": 4.1})
    assert latest_cost(f"step 1: loss 3.0\n{line}\nsomething else\n") == {"step": 12, "spent_usd": 1.2, "budget_usd": 5.0, "forecast_usd": 4.1}
    assert latest_cost("step 1: loss 3.0  10 tok/s  0.1 s\n") is None


def test_the_summary_table_and_job_status_show_why_and_what_it_cost() -> None:
    from raydlc.views.jobs import print_cost
    from raydlc.views.progress import print_summary
    from raydlc.views.text import rendered

    s = {"model": "tiny", "workers": 2, "sharding": "fsdp", "steps": 37, "first_loss": 5.0, "final_loss": 3.0, "loss_drop": 0.4,
         "eval_loss": None, "tokens_per_s": 100.0, "step_time_s": 0.5, "peak_mem_mb": 10.0, "resumed_from": None, "checkpoint": "c",
         "export": "e", "metrics": "m", "plot": "p", "wall_s": 40.0, "stop_reason": "stopped by the budget: $4.10 of $5.00 at step 37",
         "cost": {"spent_usd": 4.5, "budget_usd": 5.0, "usd_per_hour": 36.0, "forecast_usd": 12.25, "price": "On-Demand list price"}}
    text = rendered(lambda c: print_summary(s, c), width=200)
    assert "stopped by the budget: $4.10 of $5.00 at step 37" in text
    assert "$4.50 of $5.00 at $36.00/h, forecast to the last step $12.25 (On-Demand list price)" in text
    line = rendered(lambda c: print_cost({"step": 12, "spent_usd": 1.2, "budget_usd": 5.0, "forecast_usd": 4.1}, c), width=200)
    assert line.strip() == "spend at step 12: $1.20 of $5.00, forecast to the last step $4.10 (list prices)"
