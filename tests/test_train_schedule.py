"""The learning-rate schedule (issue 46): warm-up, then cosine (default), linear or constant decay to
LEARNING_RATE x MIN_LR_RATIO at STEPS; a resumed run continues the uninterrupted run's sequence exactly."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from tests.test_train_cadence import Session, one_worker
from tests.test_train_checkpoint_loop import Storing, run_to_end

from raydlc.config import TrainConfig, load_config
from raydlc.evaluate.plot import series
from raydlc.train import checkpoint as C
from raydlc.train.schedule import lr_at, warmup_steps


def test_cosine_is_the_default_and_decays_from_the_end_of_warm_up_to_the_floor() -> None:
    s = TrainConfig(steps=10, warmup_steps=2, learning_rate=1.0, min_lr_ratio=0.1)
    assert s.lr_schedule == "cosine" and TrainConfig().min_lr_ratio == 0.0
    lrs = [lr_at(i, s) for i in range(1, 11)]
    assert lrs[:2] == [0.5, 1.0]  # linear warm-up reaches the base rate at step 2
    assert all(a > b for a, b in zip(lrs[1:], lrs[2:]))  # then strictly falls
    assert lrs[-1] == pytest.approx(0.1)  # to LEARNING_RATE x MIN_LR_RATIO at STEPS
    assert lr_at(6, s) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))


def test_linear_and_constant_and_the_warm_up_ratio() -> None:
    lin = TrainConfig(steps=10, warmup_steps=0, learning_rate=2.0, lr_schedule="linear")
    assert [lr_at(i, lin) for i in (0, 5, 10)] == pytest.approx([2.0, 1.0, 0.0])
    const = TrainConfig(steps=10, warmup_steps=4, learning_rate=2.0, lr_schedule="constant")
    assert [lr_at(i, const) for i in (1, 4, 10)] == [0.5, 2.0, 2.0]
    ratio = TrainConfig(steps=300, warmup_steps=20, warmup_ratio=0.05)
    assert warmup_steps(ratio) == 15 and warmup_steps(ratio.updated(warmup_ratio=None)) == 20


def test_the_schedule_is_set_by_env_and_a_bad_value_is_one_clear_line() -> None:
    cfg = load_config(env={"RAYDLC_LR_SCHEDULE": "linear", "RAYDLC_WARMUP_RATIO": "0.1", "RAYDLC_MIN_LR_RATIO": "0.2"})
    assert (cfg.train.lr_schedule, cfg.train.warmup_ratio, cfg.train.min_lr_ratio) == ("linear", 0.1, 0.2)
    with pytest.raises(Exception, match="LR_SCHEDULE"):
        load_config(env={"RAYDLC_LR_SCHEDULE": "step"})


def test_a_resumed_run_continues_the_uninterrupted_runs_learning_rates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = one_worker(steps=4, report_every=1, checkpoint_every=2, checkpoint_keep=2, learning_rate=2e-3, min_lr_ratio=0.1)
    run = run.model_copy(update={"train": run.train.updated(warmup_steps=2)})
    store = tmp_path / "run"
    store.mkdir()
    whole = run_to_end(run, Storing(store, keep=2), monkeypatch)
    resumed = run_to_end(run.model_copy(update={"resume_from": str(store / C.dir_name(2))}), Session(), monkeypatch)

    def lrs(history: list[dict]) -> list[tuple[int, float]]:
        return [(r["step"], r["lr"]) for r in history if "loss" in r]

    assert lrs(resumed["history"]) == lrs(whole["history"]) == [(i, lr_at(i, run.train)) for i in range(1, 5)]
    steps, values = series(whole["history"])["learning rate"]  # the loss plot draws the schedule beside the loss
    assert steps == [1, 2, 3, 4] and values[1] > values[-1] == pytest.approx(2e-4)
