"""The stall guard and the budget against a real local Ray run (the tiny model, two workers, gloo).

A hung rank (train.faults.Hang, a test-only step hook) ends the run with evidence naming it and its stack;
a budget priced so it runs out mid-run stops the loop cleanly with a checkpoint and says why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raydlc.config import TrainConfig
from raydlc.data.corpus import bundled_corpus
from raydlc.train.faults import Hang
from raydlc.train.launch import run
from raydlc.train.runspec import RunTarget
from raydlc.train.stall import Stalled

pytestmark = pytest.mark.slow

BASE = TrainConfig(model_id="tiny", seq_len=32, batch_size=2, num_workers=2, learning_rate=2e-3, max_failures=0)


@pytest.fixture(scope="module")
def local_ray(ray_local: Any) -> Iterator[None]:
    yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("data") / "docstrings.txt"
    path.write_text("\n\n".join(d.text for d in bundled_corpus(max_chars=60_000)))
    return str(path)


def test_a_hung_rank_ends_the_run_with_evidence_naming_it(local_ray: None, corpus: str, tmp_path: Path) -> None:
    train = BASE.updated(data=corpus, steps=1000, checkpoint_every=2, storage_path=str(tmp_path), run_name="hung",
                         stall_minutes=1, stall_first_minutes=5)  # a minute without a step after the first (the least one may ask)
    began = time.monotonic()
    with pytest.raises(Stalled) as e:
        run(train, RunTarget(log_to_driver=False, faults=Hang(rank=1, step=5)))
    print(f"stalled run ended after {time.monotonic() - began:.1f} s: {e.value.message}")
    assert "rank 1 last seen at step 4 in " in e.value.message and "no step for " in e.value.message
    run_dir = tmp_path / "hung"
    doc = json.loads((run_dir / "stall" / "evidence.json").read_text())
    assert doc["suspects"] == [1] and doc["last_step"] == 4
    ranks = {r["rank"]: r for r in doc["ranks"]}
    assert ranks[0]["in_collective"] is True and ranks[1]["in_collective"] is False
    assert ranks[1]["where"].startswith("injected_hang (") and ranks[1]["entered"] == 5
    stack = (run_dir / "stall" / "rank-1.stack.txt").read_text()
    assert "in injected_hang" in stack and "in run_loop" in stack
    assert "in all_reduce" in (run_dir / "stall" / "rank-0.stack.txt").read_text()
    assert any("injected hang: rank 1 stops at step 5" in ln for ln in ranks[1]["log_tail"])  # its own log, read by its heartbeat
    # The last whole checkpoint is kept: step 2's, sealed by step 4's save at the latest (saves are
    # asynchronous: step 4's, in flight when rank 1 hung, is lost with the run).
    assert (run_dir / "checkpoint_000002" / "raydlc_checkpoint.json").exists()


def test_a_budget_stops_the_run_cleanly_with_its_checkpoint_and_says_why(local_ray: None, corpus: str, tmp_path: Path) -> None:
    # $1 a second: a $40 budget lasts 40 s from the driver's start, start-up included.
    train = BASE.updated(data=corpus, steps=100_000, storage_path=str(tmp_path), run_name="paid", max_cost_usd=40.0, stall_minutes=0)
    began = time.monotonic()
    s = run(train, RunTarget(log_to_driver=False, usd_per_hour=3600.0))
    print(f"budget run: {s['steps']} steps in {time.monotonic() - began:.1f} s; {s['stop_reason']}; cost {s['cost']}")
    assert s["stopped_by"] == "budget" and 1 <= s["steps"] < 100_000
    assert s["stop_reason"].startswith("stopped by the budget: $") and s["stop_reason"].endswith(f"of $40.00 at step {s['steps']}")
    assert s["checkpoint"] is not None and s["checkpoint"].endswith(f"checkpoint_{s['steps']:06d}")
    run_dir = Path(s["run_dir"])
    assert (run_dir / f"checkpoint_{s['steps']:06d}" / "raydlc_checkpoint.json").exists()
    assert (run_dir / "export" / "config.json").exists()
    written = json.loads((run_dir / "summary.json").read_text())
    assert written["stopped_by"] == "budget" and written["steps"] == s["steps"]
    c = s["cost"]
    assert c["budget_usd"] == 40.0 and c["usd_per_hour"] == 3600.0 and c["price"] == "given by the caller"
    assert c["forecast_usd"] > c["spent_usd"] > 0  # the rest of the 100,000 steps would cost more


def test_a_budget_on_a_local_run_is_refused_before_ray_starts(corpus: str, tmp_path: Path) -> None:
    import ray

    from raydlc.errors import InputError

    started = ray.is_initialized()
    with pytest.raises(InputError, match="a local run has no hourly price"):
        run(BASE.updated(data=corpus, steps=2, storage_path=str(tmp_path), max_cost_usd=5.0), RunTarget(log_to_driver=False))
    assert ray.is_initialized() == started
