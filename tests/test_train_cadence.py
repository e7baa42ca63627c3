"""The loop's components, each with its own cadence and state: when a step is read, evaluated,
reported and checkpointed (train.cadence), the budget's clock, Ray's report and the throttled
progress (train.metrics), the faults tests inject as step hooks (train.faults), and the loop that
strings them together, run in one process (gloo, world size 1) without Ray."""

from __future__ import annotations

import contextlib
import itertools
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from tests.test_train_layout import spec
from tests.test_train_step import world_of_one

from raydlc.config import TrainConfig
from raydlc.planner.budget import Budget, BudgetClock
from raydlc.train import faults as F
from raydlc.train import loop as L
from raydlc.train import metrics as M
from raydlc.train.cadence import Cadence
from raydlc.train.heartbeat import Quiet
from raydlc.train.layout import plan_mesh
from raydlc.train.runspec import RunSpec


def old_due(step: int, steps: int, read_every: int, report_every: int, eval_every: int, checkpoint_every: int, stopped: bool) -> tuple[bool, ...]:
    """The loop's expressions before the cadence owned them, kept here as the reference."""
    last = step == steps or stopped
    is_ckpt = last or (checkpoint_every > 0 and step % checkpoint_every == 0)
    is_eval = last or (eval_every > 0 and step % eval_every == 0)
    is_report = is_ckpt or step % report_every == 0
    return last, is_ckpt, is_eval, is_report, is_report or is_eval or step % read_every == 0


@pytest.mark.parametrize("gpu", [False, True])
def test_the_cadence_answers_what_the_loop_computed_inline(gpu: bool) -> None:
    for report_every, eval_every, checkpoint_every, stopped in itertools.product((1, 3, 10), (0, 2, 5), (0, 4), (False, True)):
        s = TrainConfig(steps=23, report_every=report_every, eval_every=eval_every, checkpoint_every=checkpoint_every)
        c = Cadence.of(s, gpu=gpu)
        read_every = report_every if gpu else 1
        for step in range(1, 24):
            due = c.due(step, stopping=stopped)
            want = old_due(step, 23, read_every, report_every, eval_every or 23 // 10, checkpoint_every, stopped)
            if eval_every == 0:  # EVAL_EVERY 0: ten times over the run (every 2 steps of 23) and at each checkpoint
                want = (*want[:2], want[2] or want[1], *want[3:4], want[4] or want[1])
            assert (due.last, due.save, due.validate, due.report, due.read) == want, (s, step)
            assert c.asks_budget(step) == (step < 23 and step % read_every == 0)


def test_the_budget_clock_looks_ahead_at_the_last_read_step_time() -> None:
    b = Budget(usd=10.0, usd_per_hour=3600.0, started_at=0.0, nodes=1)  # 10 s, 0.5 s held back
    clock = BudgetClock(b, ahead=2, start_step=4, began=100.0)
    assert not clock.must_stop(6, [{"step": 5, "step_time_s": 1.0}], now=7.0, perf=0.0, checkpoint_s=0.0)  # 7 + 2 + 0.5 < 10
    assert clock.must_stop(6, [{"step": 5, "step_time_s": 1.0}], now=7.6, perf=0.0, checkpoint_s=0.0)
    assert clock.must_stop(6, [{"step": 5, "step_time_s": 1.0}], now=7.0, perf=0.0, checkpoint_s=0.6)  # twice the slowest save held back
    no_step_time = [{"step": 6, "eval_loss": 1.0}]  # then the attempt's mean: (104 - 100) / 2 s a step, 4 s ahead
    assert not clock.must_stop(6, no_step_time, now=5.4, perf=104.0, checkpoint_s=0.0)
    assert clock.must_stop(6, no_step_time, now=5.6, perf=104.0, checkpoint_s=0.0)
    assert clock.stopped(6, 9.0) == {"stopped_by": "budget", "stop_reason": "stopped by the budget: $9.00 of $10.00 at step 6"}


def test_the_report_is_the_window_of_the_last_steps_and_the_last_one_carries_the_summary() -> None:
    history = [{"step": s, "loss": 5.0 - s, "tokens": 100, "step_time_s": float(s), "peak_mem_mb": 10.0 * s} for s in (1, 2, 3)]
    history.append({"step": 3, "eval_loss": 2.5})
    m = M.report(history, step=3, every=2, mesh_shape=[2])
    assert m == {"step": 3, "loss": 2.0, "tokens_per_s": 200 / 5.0, "step_time_s": 2.5, "peak_mem_mb": 30.0, "mesh_shape": [2]}
    last = M.report(history, step=3, every=2, mesh_shape=[2], last=True, stopped={"stopped_by": "budget"})
    assert {k: v for k, v in last.items() if k in m} == m
    assert last["summary_steps"] == 3 and last["summary_eval_loss"] == 2.5 and last["summary_stopped_by"] == "budget"
    assert not any(v is None for v in last.values())


def test_progress_posts_at_most_once_a_period_unless_asked_and_only_on_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.chain([0.0, 0.5, 1.2, 1.3, 1.4], itertools.repeat(9.0))
    monkeypatch.setattr(M, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    posts: list[tuple[list[int], bool]] = []
    session = SimpleNamespace(progress=lambda records, wait=False: posts.append(([r["step"] for r in records], wait)))
    p = M.Progress(session, on=True, every_s=1.0)  # posted at 0.0
    p.add([{"step": 1}], now=False)  # 0.5: held
    p.add([{"step": 2}], now=False)  # 1.2: a second has passed, posted (1.3)
    p.add([{"step": 3}], now=True)  # posted at once (1.4)
    p.flush()
    assert posts == [([1, 2], False), ([3], False), ([], True)]
    quiet = M.Progress(session, on=False, every_s=0.0)
    quiet.add([{"step": 9}], now=True)
    quiet.flush()
    assert len(posts) == 3


def test_a_fault_acts_on_its_rank_at_its_step_in_the_first_attempt_only(monkeypatch: pytest.MonkeyPatch) -> None:
    acted: list[tuple[str, int, int]] = []

    def exit_(code: int) -> None:
        acted.append(("exit", code, 0))

    monkeypatch.setattr(F.os, "_exit", exit_)
    monkeypatch.setattr(F, "injected_hang", lambda rank, step: acted.append(("hang", rank, step)))
    crash, hang = F.Crash(rank=1, step=5), F.Hang(rank=0, step=3)
    for fault in (crash, hang):
        for step, rank, resumed in itertools.product(range(1, 7), (0, 1), (False, True)):
            fault.before_step(step, rank=rank, resumed=resumed)
    assert acted == [("exit", 1, 0), ("hang", 0, 3)]


def test_a_fault_travels_in_the_runspec_as_its_own_kind() -> None:
    for fault in (F.Crash(rank=1, step=5), F.Hang(rank=1, step=3), None):
        back = RunSpec.from_wire(spec(faults=fault).to_wire())
        assert back.faults == fault and type(back.faults) is type(fault)


# ---- the loop in one process ------------------------------------------------------------------


class Rows:
    """Rows by index as the prepared dataset gives them: a sequence a pure function of its row."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = (np.asarray(rows, dtype=np.int64)[:, None] * 31 + np.arange(self.seq_len)) % 4000 + 10
        return ids, ids.copy()

    def take_documents(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
        return (*self.take(rows), None)  # a dataset of the older format: no documents recorded


class Session:
    """What Ray Train would give a worker of one: its reports, with the checkpoint each registered, and rank 0's progress."""

    rank, world, local_world = 0, 1, 1

    def __init__(self) -> None:
        self.reports: list[tuple[int, str | None, bool]] = []
        self.posted: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}

    def restored(self) -> Any:
        return contextlib.nullcontext(None)

    def preemption(self) -> Any:
        """Ray Train's drain notice: none here (tests/test_train_preempt.py sends one)."""
        return None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None, name: str | None = None, *, wait: bool = False) -> None:
        manifest = checkpoint_dir is not None and (Path(checkpoint_dir) / "raydlc_checkpoint.json").exists()
        self.reports.append((metrics["step"], name, manifest))
        self.last = metrics
        if checkpoint_dir is not None:  # the directory is the session's once reported (Ray uploads, then deletes it)
            shutil.rmtree(checkpoint_dir)

    def progress(self, records: list[dict[str, Any]], *, wait: bool = False) -> None:
        self.posted += records


class Stop(Exception):
    pass


class Hooks:
    """Records each call; raises at `stop_at`, before that step runs (as an injected crash would end the process)."""

    def __init__(self, session: Session, stop_at: int = 0) -> None:
        self.session, self.stop_at = session, stop_at
        self.calls: list[tuple[int, int, bool, int]] = []

    def before_step(self, step: int, *, rank: int, resumed: bool) -> None:
        self.calls.append((step, rank, resumed, len(self.session.reports)))
        if step == self.stop_at:
            raise Stop


def one_worker(budget: Budget | None = None, **train: Any) -> RunSpec:
    # no tracker unless asked: spec()'s run directory is a shared /tmp path (tests/test_tracking_loop.py tracks)
    settings = TrainConfig(**{"model_id": "tiny", "num_workers": 1, "seq_len": 16, "batch_size": 2, "warmup_steps": 0, "tracking": "none", **train})
    return spec(train=settings, mesh=plan_mesh("fsdp", [1]), faults=None, budget=budget)


def loop(run: RunSpec, hooks: Hooks, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import torch

    finished: dict[str, Any] = {}
    monkeypatch.setattr(L, "finalize", lambda t, run, history, *, rank, stopped=None: finished.update(history=history, stopped=stopped))
    held = np.arange(100, 104)
    ids, labels = Rows(16).take(held)
    data = L.RankData(SimpleNamespace(n_train=96, documents=False), Rows(16), held, ids, labels)
    L._train(run, hooks.session, data, torch.device("cpu"), Quiet(), hooks)
    return finished


def test_the_loop_calls_its_hooks_before_each_step_and_reports_and_saves_at_the_cadence(monkeypatch: pytest.MonkeyPatch) -> None:
    with world_of_one():
        session = Session()
        hooks = Hooks(session)
        done = loop(one_worker(steps=5, report_every=2, checkpoint_every=3), hooks, monkeypatch)
    assert [(s, r, resumed) for s, r, resumed, _ in hooks.calls] == [(s, 0, False) for s in range(1, 6)]
    # The step-3 checkpoint is written while steps 4 and 5 run: reported at step 4's read if every
    # rank's write is done by then (a race), else at step 5's or before step 5's save starts; each complete.
    ckpt3_at_4 = [(2, None, False), (3, "checkpoint_000003", True), (4, None, False), (5, "checkpoint_000005", True)]
    ckpt3_at_5 = [(2, None, False), (4, None, False), (3, "checkpoint_000003", True), (5, "checkpoint_000005", True)]
    assert session.reports in (ckpt3_at_4, ckpt3_at_5)
    assert [reported for *_, reported in hooks.calls] == [0, 0, 1, 1, 3 if session.reports == ckpt3_at_4 else 2]  # the reports of the steps before
    history = done["history"]
    assert [(r["step"], "eval_loss" in r) for r in history] == [(1, False), (2, False), (3, False), (3, True), (4, False), (5, False), (5, True)]
    assert session.posted == history and done["stopped"] is None
    assert session.last["summary_steps"] == 5 and session.last["mesh_shape"] == [1] and "summary_stopped_by" not in session.last


def test_a_hook_that_fails_a_step_ends_the_loop_before_that_step_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    with world_of_one():
        session = Session()
        with pytest.raises(Stop):
            loop(one_worker(steps=8, report_every=2, checkpoint_every=2), Hooks(session, stop_at=6), monkeypatch)
    # Step 2's checkpoint was finished and reported by step 4's save at the latest; step 4's at step
    # 5's read if its write was done by then (a race), else it was lost with step 6: a failure loses
    # the save in flight only.
    assert session.reports in ([(2, "checkpoint_000002", True)], [(2, "checkpoint_000002", True), (4, "checkpoint_000004", True)])
    posted = [r["step"] for r in session.posted if "loss" in r]
    assert posted[:4] == [1, 2, 3, 4] and max(posted) <= 5  # step 5's record may still wait for its post: step 6 never ran


def test_a_spent_budget_stops_the_loop_at_its_first_question_with_a_checkpoint_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    spent = Budget(usd=1.0, usd_per_hour=3600.0, started_at=time.time() - 10.0, nodes=1)  # its second ran out 9 s ago
    with world_of_one():
        session = Session()
        done = loop(one_worker(spent, steps=5, report_every=2, checkpoint_every=0), Hooks(session), monkeypatch)
    assert session.reports == [(1, "checkpoint_000001", True)]
    assert done["stopped"]["stopped_by"] == "budget" and done["stopped"]["stop_reason"].endswith("of $1.00 at step 1")
    assert session.last["summary_stopped_by"] == "budget" and session.last["summary_steps"] == 1
