"""The finite guard: a step whose loss or gradient norm is NaN/inf skips its AdamW update on the
device (no host read), is counted, and MAX_NONFINITE_STEPS of them in a row stop the run naming
the step. One process (gloo, world size 1), NaN injected by train.faults.NonFinite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from tests.test_train_cadence import Hooks, Session, loop, one_worker
from tests.test_train_step import counting_host_reads, trainer, world_of_one

from raydlc.errors import TrainError
from raydlc.train import faults as F
from raydlc.train import loop as L
from raydlc.train import metrics as M
from raydlc.train.runspec import RunSpec


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    """A window still open when a run raised leaves its global hook: removed after each test."""
    yield
    while F._POISON:
        F._POISON.pop().remove()


class FaultHooks(Hooks):
    """The test loop's hooks with a fault acting too, as the RunSpec's faults would on a worker."""

    def __init__(self, session: Session, fault: F.NonFinite) -> None:
        super().__init__(session)
        self.fault = fault

    def before_step(self, step: int, *, rank: int, resumed: bool) -> None:
        super().before_step(step, rank=rank, resumed=resumed)
        self.fault.before_step(step, rank=rank, resumed=resumed)


def weights(t: L.Trainer) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() for k, v in t.model.state_dict().items()}


def test_a_nan_step_leaves_weights_and_optimizer_state_alone_without_a_host_read(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = np.random.default_rng(0).integers(0, 4096, size=(4, 16), dtype=np.int32)
    with world_of_one():
        t = trainer(2, "once")
        batches = L.micro_batches(ids, ids, np.arange(4), 2, torch.device("cpu"))
        L.train_step(t, batches, 1e-3)
        before = weights(t)
        moments = {k: v.clone() for k, v in t.optimizer.state[next(iter(t.model.parameters()))].items()}
        nan = F.NonFinite(rank=0, step=2)
        nan.before_step(2, rank=0, resumed=False)
        with counting_host_reads(monkeypatch) as calls:
            out = L.train_step(t, batches, 1e-3)
            during = dict(calls)
        nan.before_step(3, rank=0, resumed=False)
        assert during == dict.fromkeys(during, 0), during
        assert bool(out.skipped) and not torch.isfinite(out.loss)
        after = weights(t)
        assert all(torch.equal(before[k], after[k]) for k in before)
        state = t.optimizer.state[next(iter(t.model.parameters()))]
        assert all(torch.equal(moments[k], state[k]) for k in moments)  # the step count too: AdamW's bias correction is unmoved
        assert all(p.grad is None for p in t.model.parameters())
        out = L.train_step(t, batches, 1e-3)  # the hook is gone: the next step is finite and updates
        assert not bool(out.skipped) and torch.isfinite(out.loss)
        assert not all(torch.equal(after[k], v) for k, v in weights(t).items())
        assert int(state["step"]) == 2


def finished_loop(run: RunSpec, fault: F.NonFinite, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], Session]:
    """The loop's history, and the trainer it built (`done["trainer"]`)."""
    session, built = Session(), []
    real = L.build
    monkeypatch.setattr(L, "build", lambda *a, **kw: built.append(real(*a, **kw)) or built[-1])
    with world_of_one():
        done = loop(run, FaultHooks(session, fault), monkeypatch)
    return {**done, "trainer": built[-1]}, session


def test_a_nan_at_step_k_skips_that_update_and_the_run_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    done, session = finished_loop(one_worker(steps=5, report_every=5, checkpoint_every=0), F.NonFinite(rank=0, step=3), monkeypatch)
    steps = [r for r in done["history"] if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert [r["skipped"] for r in steps] == [False, False, True, False, False]
    assert np.isnan(steps[2]["loss"]) and all(np.isfinite(r["loss"]) for i, r in enumerate(steps) if i != 2)
    t = done["trainer"]
    assert all(int(t.optimizer.state[p]["step"]) == 4 for p in t.model.parameters())  # four updates of five steps
    assert all(bool(torch.isfinite(v.full_tensor()).all()) for v in t.model.state_dict().values())
    assert session.last["summary_skipped_steps"] == 1 and M.summarize(done["history"])["skipped_steps"] == 1


def test_max_nonfinite_steps_in_a_row_stop_the_run_naming_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    run = one_worker(steps=8, report_every=2, checkpoint_every=0, max_nonfinite_steps=3)
    with pytest.raises(TrainError, match=r"3 steps in a row .* \(steps 2 to 4\): the run stops at step 4") as e:
        finished_loop(run, F.NonFinite(rank=0, step=2, steps=5), monkeypatch)
    assert "LEARNING_RATE" in (e.value.hint or "")
    done, _ = finished_loop(run, F.NonFinite(rank=0, step=2, steps=2), monkeypatch)  # two in a row, below the limit
    assert [r["skipped"] for r in done["history"] if "loss" in r] == [False, True, True, False, False, False, False, False]


def test_the_stop_names_the_checkpoint_to_resume_from() -> None:
    from raydlc.train.loop import check_finite, resume_advice

    bad = [{"step": i, "loss": 1.0, "skipped": False} for i in range(1, 12)] + [{"step": i, "loss": float("nan"), "skipped": True} for i in (12, 13)]
    with pytest.raises(TrainError) as e:
        check_finite(bad, 2, checkpoint_every=5)
    # step 11's update made step 12's weights: checkpoint_000010 holds step 10's, the newest one before it
    assert "RESUME_FROM=<run dir>/checkpoint_000010 (step 10)" in (e.value.hint or "") and "not a later one" in (e.value.hint or "")
    assert "RESUME_FROM" not in resume_advice(12, 0) and "start again" in resume_advice(12, 0)  # no checkpoints taken
    assert "checkpoint_000005" in resume_advice(11, 5) and "start again" in resume_advice(6, 5)  # step 5 made step 6's weights


def test_skipped_in_a_row_counts_the_tail_across_eval_records() -> None:
    recs = [{"step": 1, "loss": 1.0, "skipped": False}, {"step": 2, "loss": float("nan"), "skipped": True}, {"step": 2, "eval_loss": 1.0},
            {"step": 3, "loss": float("nan"), "skipped": True}]
    assert M.skipped_in_a_row(recs) == [2, 3]
    assert M.skipped_in_a_row([*recs, {"step": 4, "loss": 1.0, "skipped": False}]) == []
    assert M.skipped_in_a_row([{"step": 1, "loss": 1.0}]) == []  # records from before the guard carry no flag


def test_the_nonfinite_fault_travels_in_the_runspec() -> None:
    from tests.test_train_layout import spec

    fault = F.NonFinite(rank=1, step=4, steps=2)
    back = RunSpec.from_wire(spec(faults=fault).to_wire())
    assert back.faults == fault and type(back.faults) is F.NonFinite
