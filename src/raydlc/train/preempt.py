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

Without Ray (torchrun) the session has no notices and this is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HOLD_GRACE_S = 60.0  # how long after the reclaim deadline the worker still waits for Ray Train to end the attempt
NO_DEADLINE_S = 120.0  # Ray Train's own wait when the drain has no deadline (DEFAULT_PREEMPTION_DEADLINE_S in 2.58)


@dataclass(frozen=True)
class Notice:
    """A drain notice as the loop keeps it: the step it arrived at, the reclaim deadline (epoch s, None = not given), the ranks going."""

    step: int
    deadline_s: float | None
    ranks: tuple[int, ...]

    def record(self) -> dict[str, Any]:
        """The progress record the driver shows ("preempted at step N")."""
        return {"step": self.step, "preempted": True, "deadline": self.deadline_s, "preempted_ranks": list(self.ranks)}


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
        beat.phase = f"preempted at step {n.step}: checkpoint saved, waiting for Ray Train to restart the workers"
        if rank == 0:
            self.session.progress([n.record()], wait=True)
            left = "no deadline" if n.deadline_s is None else f"deadline in {max(0.0, n.deadline_s - began):.0f} s"
            print(f"[raydlc] drain notice at step {n.step} (ranks {list(n.ranks)} going, {left}): checkpoint of step {n.step} saved; waiting for the restart", flush=True)
        while now() < until:
            sleep(min(1.0, max(0.0, until - now())))
        raise TrainError(
            f"preempted at step {n.step}: the checkpoint of step {n.step} is saved, but Ray Train did not end the attempt "
            f"within {HOLD_GRACE_S:.0f} s of the reclaim deadline",
            hint="the next restart resumes from that checkpoint; check the Ray Train controller's log for its preempting state",
        )
