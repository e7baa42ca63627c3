"""When the loop reads its device values, evaluates, reports and checkpoints: one frozen value per run.

In torchtitan's spirit (`should_validate(step)`, `_should_save(step)`), each cadence is a named
question with its answer here, and the loop asks `due(step)` once per step instead of carrying
the expressions. The last step (STEPS, or the one the budget ends on) does everything. A read
copies device values to the host and waits for the GPU: on a GPU only when the loop has to
report anyway, on a CPU (nothing to wait for) every step. A drain notice (train.preempt) makes its
step the attempt's last, with a checkpoint. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raydlc.config import TrainConfig


EVALS_PER_RUN = 10  # EVAL_EVERY 0: evaluations spread over a run, beside those at its checkpoints


@dataclass(frozen=True)
class Due:
    """What the loop does after one step."""

    last: bool  # STEPS, or the budget stops here
    save: bool  # a checkpoint (it reports with it)
    validate: bool  # the eval loss
    report: bool  # Ray's report, a barrier
    read: bool  # the unread steps' values to the host: whenever any of the above, or at the read cadence


@dataclass(frozen=True)
class Cadence:
    steps: int
    read_every: int
    report_every: int
    eval_every: int  # 0: never between the last step's
    checkpoint_every: int  # 0: never between the last step's
    eval_at_saves: bool = False  # EVAL_EVERY 0: each checkpoint is evaluated too

    @classmethod
    def of(cls, s: TrainConfig, *, gpu: bool) -> Cadence:
        """EVAL_EVERY 0 evaluates at each checkpoint and EVALS_PER_RUN times over the run (a run of
        at least that many steps): the overfitting note needs three evaluations rising in a row, and
        a run with one checkpoint would have one. Reads wait for the reports on a GPU only."""
        eval_every = s.eval_every or s.steps // EVALS_PER_RUN
        return cls(s.steps, s.report_every if gpu else 1, s.report_every, eval_every, s.checkpoint_every, eval_at_saves=s.eval_every == 0)

    def is_last(self, step: int, *, stopping: bool = False) -> bool:
        return step == self.steps or stopping

    def should_save(self, step: int, *, last: bool) -> bool:
        return last or (self.checkpoint_every > 0 and step % self.checkpoint_every == 0)

    def should_validate(self, step: int, *, last: bool) -> bool:
        return last or (self.eval_every > 0 and step % self.eval_every == 0) or (self.eval_at_saves and self.should_save(step, last=last))

    def should_report(self, step: int, *, last: bool) -> bool:
        """Every checkpoint goes up with its metrics, so a save is a report too."""
        return self.should_save(step, last=last) or step % self.report_every == 0

    def should_read(self, step: int) -> bool:
        return step % self.read_every == 0

    def asks_budget(self, step: int) -> bool:
        """The budget is asked where the loop reads anyway (its agreement across ranks is a host sync), never on the last step."""
        return step < self.steps and self.should_read(step)

    def due(self, step: int, *, stopping: bool = False, preempted: bool = False, save_on_notice: bool = True) -> Due:
        """`preempted`: a drain notice arrived (train.preempt): the attempt ends here with this step's
        checkpoint, taken at once and without an eval (the reclaim window is short); without one when
        the window is too short to save (`save_on_notice` False: train.preempt.decide)."""
        if preempted:
            return Due(last=True, save=save_on_notice, validate=False, report=save_on_notice, read=True)
        last = self.is_last(step, stopping=stopping)
        save, validate = self.should_save(step, last=last), self.should_validate(step, last=last)
        report = self.should_report(step, last=last)
        return Due(last, save, validate, report, read=report or validate or self.should_read(step))
