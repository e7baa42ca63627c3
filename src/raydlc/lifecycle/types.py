"""The values every part of the lifecycle passes around: what a check saw, what a plan would do, how a step
ended, where progress goes, and the outcome of a whole run.

Everything here is data (or the Reporter protocol); nothing imports the Context, a resource or the
scheduler, so each of those can import this module and none of them imports another back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from raydlc.errors import RaydlcError, Stopped

Goal = Literal["up", "down"]  # the command a step serves: make the resource, or remove it
StateName = Literal["absent", "creating", "ready", "degraded", "deleting", "unknown"]
Outcome = Literal["done", "failed", "skipped", "interrupted", "planned"]


class StepFailed(RaydlcError):
    """A step could not keep its promise; the message names what is wrong and where."""


@dataclass(frozen=True)
class Observation:
    """What `check` saw: the state, why, and facts `act` may need (a stale stack's name, …)."""

    state: StateName
    reason: str
    facts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepPlan:
    """What a step would do about an observation, and the exact commands or API calls."""

    action: str  # none | create | wait | replace | repair | delete | refuse | blocked
    reason: str
    commands: tuple[str, ...] = ()

    @property
    def acts(self) -> bool:
        return self.action != "none"


@dataclass(frozen=True)
class StepResult:
    """How one step ended: its outcome, what it did and why, the commands, what `check` saw first."""

    step: str
    outcome: Outcome
    action: str
    reason: str
    commands: list[str] = field(default_factory=list)
    state_before: str = ""
    elapsed_s: float = 0.0
    found: str = ""  # what `check` saw, before any action
    error: BaseException | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "outcome": self.outcome, "action": self.action, "reason": self.reason,
            "state_before": self.state_before, "found": self.found, "elapsed_s": round(self.elapsed_s, 3),
            "commands": list(self.commands),
        }


class Reporter:
    """Where progress goes (the live display, plain lines, or nowhere); called from step threads."""

    def started(self, step: str) -> None: ...

    def acting(self, step: str, plan: StepPlan) -> None: ...

    def line(self, step: str, text: str) -> None: ...

    def finished(self, result: StepResult) -> None: ...

    def confirm(self, step: str, question: str) -> bool:
        """Ask the person at the terminal; False where there is none to ask (plain lines, JSON, the API)."""
        return False


class Interrupted(Stopped):
    """Ctrl-C: the run stopped; `up` or `down` resumes from what exists."""

    exit_code = 130

    def __init__(self, message: str, results: list[StepResult]) -> None:
        super().__init__(message)
        self.results = results


@dataclass(frozen=True)
class Run:
    """The outcome of one `up` or `down`: each step's result, and what `down` removed or found absent.

    `to_dict()` is what `raydlc up|down [--dry-run] --json` prints.
    """

    command: str
    dry_run: bool
    results: list[StepResult]
    notes: Mapping[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.outcome in ("done", "planned") for r in self.results)

    @property
    def failed(self) -> list[StepResult]:
        return [r for r in self.results if r.outcome == "failed"]

    def to_dict(self) -> dict[str, Any]:
        if self.dry_run:
            return {"steps": [{"step": r.step, "action": r.action, "reason": r.reason, "command": "; ".join(r.commands)}
                              for r in self.results]}
        doc: dict[str, Any] = {"steps": [r.to_dict() for r in self.results], "ok": self.ok}
        if self.command == "down":
            notes = [n.split(" ", 1) for step in self.notes.values() for n in step]
            doc["removed"] = [what for verb, what in notes if verb in ("removed", "released", "cancelled")]
            # the bucket outlives the cluster on purpose: kept, not absent
            doc["kept"] = [what for verb, what in notes if verb == "kept"]
            keeping = {step for step, ns in self.notes.items() if any(n.startswith("kept ") for n in ns)}
            doc["absent"] = [r.found for r in self.results if r.action == "none" and r.outcome == "done"
                             and r.step not in keeping]
            doc["absent"] += [what for verb, what in notes if verb == "absent"]
        return doc
