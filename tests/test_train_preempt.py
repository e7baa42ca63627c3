"""A drain notice (Spot reclaim) during training, without Ray: the loop asks at every step but the
last, on a notice at step k it takes step k's checkpoint at once, complete and uploaded before it
goes on, runs no step after k and holds until Ray Train ends the attempt; a run resumed from that
checkpoint takes the steps the uninterrupted run takes. No notice: nothing changes."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.test_train_cadence import Hooks, Session, loop, one_worker
from tests.test_train_checkpoint_loop import Storing, losses, run_to_end
from tests.test_train_step import world_of_one

from raydlc.errors import TrainError
from raydlc.train import checkpoint as C
from raydlc.train import preempt as P
from raydlc.train.cadence import Cadence, Due


class Noticing(Storing):
    """Ray Train's view of a drained node: `get_preemption_info()` is None until step `at`, then the notice.
    Records the step of each ask (a barrier under Ray: every rank asks at the same steps) and whether each report waited for its upload."""

    def __init__(self, root: Path, at: int | None, deadline_ms: int | None = None) -> None:
        super().__init__(root, keep=0)
        self.at, self.deadline_ms = at, deadline_ms
        self.step = 0  # the step being run (set by the hooks)
        self.asked: list[int] = []
        self.waited: list[tuple[int, bool]] = []

    def preemption(self) -> Any:
        self.asked.append(self.step)
        if self.at is None or self.step < self.at:
            return None
        return SimpleNamespace(deadline_ms=self.deadline_ms, preempted_ranks=[0], preempted_node_to_ranks={"n1": [0]})

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None, name: str | None = None, *, wait: bool = False) -> None:
        if checkpoint_dir is not None:
            self.waited.append((metrics["step"], wait))
        super().report(metrics, checkpoint_dir, name, wait=wait)


class StepHooks(Hooks):
    def before_step(self, step: int, *, rank: int, resumed: bool) -> None:
        self.session.step = step  # type: ignore[attr-defined]
        super().before_step(step, rank=rank, resumed=resumed)


def test_a_notice_at_step_k_saves_step_k_complete_runs_no_step_after_it_and_holds_until_the_attempt_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray Train would end the attempt at the deadline; here nothing does, so the hold gives up at once (a minute of
    # window leaves time to save: train.preempt.decide)
    monkeypatch.setattr(P, "HOLD_GRACE_S", -60.0)
    store = tmp_path / "run"
    store.mkdir()
    session = Noticing(store, at=3, deadline_ms=int(time.time() * 1000) + 60_000)
    hooks = StepHooks(session)
    run = one_worker(steps=6, report_every=2, checkpoint_every=4, learning_rate=2e-3)
    with world_of_one(), pytest.raises(TrainError, match="preempted at step 3: the checkpoint of step 3 is saved"):
        loop(run, hooks, monkeypatch)
    assert [s for s, *_ in hooks.calls] == [1, 2, 3]  # no step after the notice
    assert session.asked == [1, 2, 3]
    assert session.reports == [(2, None, False), (3, C.dir_name(3), True)]  # step 3's checkpoint, whole, reported at once (no eval first)
    assert session.waited == [(3, True)]  # uploaded before the report returned (Ray's SYNC mode), not in the background
    assert C.verify(store / C.dir_name(3)).step == 3
    assert {"step": 3, "preempted": True, "deadline": session.deadline_ms / 1000, "preempted_ranks": [0], "saved": True} in session.posted
    assert not any("eval_loss" in r for r in session.posted)

    # The restart (Ray Train's, from the checkpoint it registered) takes steps 4-6 as the run that was never drained does.
    resumed = run_to_end(run.model_copy(update={"resume_from": str(store / C.dir_name(3))}), Session(), monkeypatch)
    whole = run_to_end(run, Session(), monkeypatch)
    a, b = losses(whole["history"]), losses(resumed["history"])
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-6, (a, b)


def test_without_a_notice_nothing_changes_and_the_last_step_is_not_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "run"
    store.mkdir()
    session = Noticing(store, at=None)
    hooks = StepHooks(session)
    with world_of_one():
        done = loop(one_worker(steps=5, report_every=2, checkpoint_every=0), hooks, monkeypatch)
    assert session.asked == [1, 2, 3, 4]  # every step but the last, which checkpoints and finishes anyway
    assert session.reports == [(2, None, False), (4, None, False), (5, C.dir_name(5), True)]
    assert session.waited == [(5, False)]  # uploaded in the background as before
    assert done["stopped"] is None and [r["step"] for r in done["history"] if "loss" in r] == [1, 2, 3, 4, 5]
    assert not any(r.get("preempted") for r in session.posted)


def test_a_notice_on_the_last_step_is_not_asked_for_and_the_run_finishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "run"
    store.mkdir()
    session = Noticing(store, at=4)  # the drain would be seen from step 4 on; step 4 is the last
    with world_of_one():
        done = loop(one_worker(steps=4, report_every=2, checkpoint_every=0), StepHooks(session), monkeypatch)
    assert session.asked == [1, 2, 3] and done["stopped"] is None  # Ray Train ends a run that returned as finished
    assert session.reports[-1] == (4, C.dir_name(4), True)


def test_the_notice_makes_its_step_the_attempts_last_with_a_checkpoint_and_no_eval() -> None:
    c = Cadence(steps=100, read_every=10, report_every=10, eval_every=5, checkpoint_every=50)
    assert c.due(7, preempted=True) == Due(last=True, save=True, validate=False, report=True, read=True)
    assert c.due(7) == Due(last=False, save=False, validate=False, report=False, read=False)


def test_the_watch_asks_at_its_steps_only_and_keeps_the_first_notice() -> None:
    asked: list[int] = []
    notice = SimpleNamespace(deadline_ms=None, preempted_ranks=[1, 0])
    session = SimpleNamespace(preemption=lambda: asked.append(len(asked)) or (notice if len(asked) >= 2 else None))
    w = P.PreemptionWatch(session, steps=10, every=2)
    assert [w.noticed(s) for s in (1, 2, 3)] == [False, False, False] and len(asked) == 1
    assert w.noticed(4) and w.notice == P.Notice(step=4, deadline_s=None, ranks=(1, 0))
    assert w.noticed(6) and len(asked) == 2 and w.notice.step == 4  # not asked again once noticed
    quiet = P.PreemptionWatch(SimpleNamespace(preemption=lambda: pytest.fail("asked while stopping")), steps=10)
    assert not quiet.noticed(3, stopping=True)  # the budget's last step: no ask (the same on every rank)


def test_the_hold_waits_to_the_deadline_plus_the_grace_then_says_the_checkpoint_is_saved() -> None:
    clock = [1000.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    posted: list[Any] = []
    session = SimpleNamespace(progress=lambda records, wait=False: posted.append((records, wait)))
    w = P.PreemptionWatch(session, steps=10)
    w.notice = P.Notice(step=7, deadline_s=1030.0, ranks=(1,))
    beat = SimpleNamespace(phase="")
    with pytest.raises(TrainError, match="preempted at step 7"):
        w.hold(beat, rank=0, now=lambda: clock[0], sleep=sleep)
    assert clock[0] == pytest.approx(1030.0 + P.HOLD_GRACE_S) and max(slept) <= 1.0
    assert beat.phase.startswith("preempted at step 7")
    assert posted == [([{"step": 7, "preempted": True, "deadline": 1030.0, "preempted_ranks": [1], "saved": True}], True)]
    P.PreemptionWatch(session, steps=10).hold(beat, rank=0, now=lambda: pytest.fail("held without a notice"))


def test_notices_read_ray_train_2_58s_preemption_info() -> None:
    from ray.train import PreemptionInfo

    info = PreemptionInfo(deadline_ms=1_700_000_000_500, preempted_node_to_ranks={"b": [3, 2], "a": [0]})
    assert P.notice_of(info, 9) == P.Notice(step=9, deadline_s=1_700_000_000.5, ranks=(0, 2, 3))
    assert P.notice_of(PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"a": [1]}), 2) == P.Notice(2, None, (1,))
    assert P.notice_of(None, 3) is None


def test_max_preemptions_is_ray_trains_max_preemption_failures_unlimited_by_default() -> None:
    import inspect

    from ray.train import FailureConfig

    from raydlc.config import TrainConfig
    from raydlc.errors import ConfigError

    assert TrainConfig(model_id="tiny").max_preemptions == -1 == inspect.signature(FailureConfig).parameters["max_preemption_failures"].default
    assert TrainConfig(model_id="tiny", max_preemptions=3).max_preemptions == 3
    with pytest.raises((ConfigError, ValueError), match="at least -1"):
        TrainConfig(model_id="tiny", max_preemptions=-2)
    launch = Path(__file__).parents[1] / "src/raydlc/train/launch.py"
    assert "max_preemption_failures=spec.train.max_preemptions" in launch.read_text()


def test_the_driver_log_says_preempted_at_step_n_then_resumed_from_n(capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.train.__main__ import _print_progress

    _print_progress(P.Notice(step=7, deadline_s=1.0, ranks=(1,)).record())
    _print_progress({"step": 7, "resumed": True, "node": "10.0.1.5 (ab12cd34ef56)"})
    _print_progress(P.Notice(step=9, deadline_s=1.0, ranks=(0,), saved=False, resume_from=6).record())
    _print_progress({"step": 6, "resumed": True})
    assert capsys.readouterr().out.splitlines() == [
        "step 7: preempted (a drain notice for ranks [1]): the checkpoint of step 7 is saved; Ray Train restarts from it when the nodes are back",
        "step 7: resumed from its checkpoint on 10.0.1.5 (ab12cd34ef56)",
        "step 9: preempted: deadline too short to save at step 9; resuming from step 6",
        "step 6: resumed from its checkpoint",
    ]


@pytest.mark.parametrize(("deadline", "now", "slowest", "save", "needs"), [
    (None, 100.0, 50.0, True, 0.0),      # no deadline: Ray Train waits its own 120 s; save
    (100.0, 100.0, 0.0, False, 0.0),     # the deadline is now: passed, whatever was measured
    (90.0, 100.0, 0.0, False, 0.0),      # passed
    (104.0, 100.0, 0.0, True, 0.0),      # no save measured yet in this attempt: save (the only way to keep the steps)
    (104.0, 100.0, 0.5, False, 11.0),    # 4 s left, a save needs 2 x 0.5 + 10 s
    (111.0, 100.0, 0.5, True, 11.0),     # exactly enough
    (110.9, 100.0, 0.5, False, 11.0),    # just short
    (220.0, 100.0, 30.0, True, 70.0),    # a slow save (30 s) in a two-minute notice
    (150.0, 100.0, 30.0, False, 70.0),
])
def test_decide_saves_unless_the_deadline_passed_or_leaves_under_twice_the_slowest_save_plus_ten_seconds(
    deadline: float | None, now: float, slowest: float, save: bool, needs: float
) -> None:
    d = P.decide(deadline, now, slowest)
    assert (d.save, d.needs_s) == (save, needs)
    assert d.left_s == (None if deadline is None else deadline - now)
    with pytest.raises(AttributeError):
        d.save = not save  # type: ignore[misc]  # frozen: every rank holds the decision it agreed on


def test_a_notice_too_short_to_save_starts_no_save_and_names_the_checkpoint_the_restart_resumes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(P, "HOLD_GRACE_S", 0.0)
    store = tmp_path / "run"
    store.mkdir()
    session = Noticing(store, at=5, deadline_ms=int(time.time() * 1000) + 4_000)  # 4 s: under 2 x any save + 10 s
    hooks = StepHooks(session)
    run = one_worker(steps=8, report_every=2, checkpoint_every=2, learning_rate=2e-3)
    with world_of_one(), pytest.raises(TrainError, match="preempted at step 5: no checkpoint of step 5"):
        loop(run, hooks, monkeypatch)
    assert [s for s, *_ in hooks.calls] == [1, 2, 3, 4, 5]  # no step after the notice
    saved = [r[0] for r in session.reports if r[1] is not None]
    assert saved in ([2], [2, 4])  # step 4's save goes to Ray only if its write was done at the notice; none of step 5
    assert not (store / C.dir_name(5)).exists()
    rec = next(r for r in session.posted if r.get("preempted"))
    assert rec["saved"] is False and rec["resume_from"] == saved[-1] and rec["step"] == 5
    assert f"deadline too short to save at step 5; resuming from step {saved[-1]}" in capsys.readouterr().out


def test_every_rank_takes_the_decision_of_the_most_hurried_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """One all-reduce on the notice step: a rank whose clock says too short makes every rank skip the save."""
    from raydlc.train import loop as L

    said: list[bool] = []
    monkeypatch.setattr(L, "agreed", lambda flag, device: said.append(flag) or True)  # another rank said too short
    w = P.PreemptionWatch(SimpleNamespace(preemption=lambda: SimpleNamespace(deadline_ms=10**15, preempted_ranks=[0])), steps=10)
    assert w.noticed(3)
    saver = SimpleNamespace(slowest_s=0.0, last_step=None, abandon=lambda: said.append(True), poll=lambda t, beat: None)
    L.settle(w, saver, SimpleNamespace(device=None), None, 2)  # type: ignore[arg-type]
    assert said == [False, True]  # this rank would save; the agreement said no, and the pending save was dropped
    assert not w.saves and w.notice == P.Notice(3, 10**12, (0,), saved=False, resume_from=2)
