"""A drain notice (a Spot reclaim) during training: asked at the loop's steps, answered with a checkpoint and a hold.

Ray Train 2.58 watches Ray Core's draining nodes (every RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S, 5 s)
and hands every worker the notice; `ray.train.get_preemption_info()` returns it. That call is a
broadcast from rank 0 through Ray's sync actor, a barrier across the workers: every rank must call
it equally often, which is why it is asked at the steps the cadence names (`every`), on every rank,
and never from a clock. It touches no device, so it adds no host sync on the GPU path; its cost is
one actor round trip per ask.

On a notice the loop saves a checkpoint of that step at once, waits for it to be complete and
uploaded, then holds here. The attempt is ended by Ray Train, not by the worker: in 2.58 the
controller enters its preempting state on the notice, waits until every worker has exited or the
reclaim deadline has passed (it tears the workers down itself then), and raises its own
`PreemptionError`, which FailureConfig.max_preemption_failures (MAX_PREEMPTIONS) counts apart from
MAX_FAILURES. An exception raised by the worker would be charged to MAX_FAILURES, and a worker that
returned would end the run as finished, so the worker does neither before the deadline. If Ray Train
has not ended the attempt `HOLD_GRACE_S` after the deadline, the hold raises TrainError.

A notice whose deadline leaves too little time to save (`decide`: passed, or under twice the slowest
save of this attempt plus SAVE_MARGIN_S) starts no save: the loop logs "deadline too short to save at
step N; resuming from step M" and holds the same way; the restart resumes from the last checkpoint
this attempt handed to Ray, and it still counts as a preemption.

Without Ray (torchrun) the session has no notices and this is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

HOLD_GRACE_S = 60.0  # how long after the reclaim deadline the worker still waits for Ray Train to end the attempt
NO_DEADLINE_S = 120.0  # Ray Train's own wait when the drain has no deadline (DEFAULT_PREEMPTION_DEADLINE_S in 2.58)
SAVE_MARGIN_S = 10.0  # beside twice the slowest save: the upload's tail and Ray Train's teardown at the deadline


@dataclass(frozen=True)
class SaveDecision:
    """Whether the notice's step is saved: `left_s` to the deadline (None: none given), `needs_s` what a save needs."""

    save: bool
    left_s: float | None
    needs_s: float

    def why(self) -> str:
        if self.left_s is None:
            return "no deadline given"
        need = f"a save needs {self.needs_s:.0f} s" if self.needs_s else "no save measured yet"
        return f"{max(0.0, self.left_s):.0f} s to the deadline, {need}"


def decide(deadline: float | None, now: float, slowest_save_s: float) -> SaveDecision:
    """Pure: save at the notice unless the deadline has passed or leaves less than 2 x the slowest save of this
    attempt + SAVE_MARGIN_S; with no deadline, or no save measured yet, save (the only way not to lose the steps)."""
    if deadline is None:
        return SaveDecision(True, None, 0.0)
    left = deadline - now
    needs = 2 * slowest_save_s + SAVE_MARGIN_S if slowest_save_s > 0 else 0.0
    return SaveDecision(left > 0 and left >= needs, left, needs)


@dataclass(frozen=True)
class Notice:
    """A drain notice as the loop keeps it: the step it arrived at, the reclaim deadline (epoch s, None = not given), the ranks going."""

    step: int
    deadline_s: float | None
    ranks: tuple[int, ...]
    saved: bool = True  # False: the deadline was too short to save this step (decide)
    resume_from: int | None = None  # then: the step of the checkpoint the restart resumes from (0: none)

    def record(self) -> dict[str, Any]:
        """The progress record the driver shows ("preempted at step N"); jobs.restarts folds it."""
        rec = {"step": self.step, "preempted": True, "deadline": self.deadline_s, "preempted_ranks": list(self.ranks), "saved": self.saved}
        return rec if self.saved else {**rec, "resume_from": self.resume_from}

    def said(self) -> str:
        """What happened at the notice, for the log."""
        if self.saved:
            return f"checkpoint of step {self.step} saved"
        return f"deadline too short to save at step {self.step}; resuming from step {self.resume_from}"


def notice_of(info: Any, step: int) -> Notice | None:
    """Ray's PreemptionInfo (deadline_ms, preempted_ranks) as a Notice, or None."""
    if info is None:
        return None
    deadline_ms = getattr(info, "deadline_ms", None)
    return Notice(step, deadline_ms / 1000.0 if deadline_ms else None, tuple(getattr(info, "preempted_ranks", ())))


class PreemptionWatch:
    """Asks the session for a drain notice every `every` steps before the last (the same steps on every rank); keeps the first one."""

    def __init__(self, session: Any, *, steps: int, every: int = 1) -> None:
        self.session, self.steps, self.every = session, steps, max(1, every)
        self.notice: Notice | None = None
        self.decision: SaveDecision | None = None  # taken on the notice's step (train.loop.settle)

    @property
    def saves(self) -> bool:
        """Whether the notice's step is checkpointed (true until a decision says otherwise)."""
        return self.decision is None or self.decision.save

    def settle(self, decision: SaveDecision, *, resume_from: int) -> None:
        """Keep the decision every rank agreed on; a notice not saved names the step the restart resumes from."""
        assert self.notice is not None
        self.decision = decision
        if not decision.save:
            self.notice = replace(self.notice, saved=False, resume_from=resume_from)

    def noticed(self, step: int, *, stopping: bool = False) -> bool:
        """Collective under Ray (a barrier): whether a notice arrived at `step`. Not asked on the last step
        (STEPS, or the one the budget stops at: `stopping`), which checkpoints and finishes anyway, nor
        once a notice is kept; each of these is the same on every rank, so every rank asks equally often."""
        if self.notice is None and not stopping and step < self.steps and step % self.every == 0:
            self.notice = notice_of(self.session.preemption(), step)
        return self.notice is not None

    def hold(self, beat: Any, *, rank: int, now: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        """Return at once without a notice; else wait for Ray Train to end the attempt (the checkpoint of the
        notice's step is complete and reported by now), and raise if it has not by the deadline plus HOLD_GRACE_S."""
        from raydlc.errors import TrainError

        n = self.notice
        if n is None:
            return
        began = now()
        until = (n.deadline_s if n.deadline_s is not None else began + NO_DEADLINE_S) + HOLD_GRACE_S
        beat.phase = f"preempted at step {n.step}: {n.said()}, waiting for Ray Train to restart the workers"
        if rank == 0:
            self.session.progress([n.record()], wait=True)
            left = "no deadline" if n.deadline_s is None else f"deadline in {max(0.0, n.deadline_s - began):.0f} s"
            print(f"[raydlc] drain notice at step {n.step} (ranks {list(n.ranks)} going, {left}): {n.said()}; waiting for the restart", flush=True)
        while now() < until:
            sleep(min(1.0, max(0.0, until - now())))
        saved = f"the checkpoint of step {n.step} is saved" if n.saved else f"no checkpoint of step {n.step} (the deadline was too short)"
        raise TrainError(
            f"preempted at step {n.step}: {saved}, but Ray Train did not end the attempt "
            f"within {HOLD_GRACE_S:.0f} s of the reclaim deadline",
            hint="the next restart resumes from that checkpoint; check the Ray Train controller's log for its preempting state",
        )
