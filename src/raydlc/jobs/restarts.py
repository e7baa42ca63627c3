"""A run's restarts as recorded facts: "preempted at step N, resumed from N on <node>", or a failure.

The training loop's rank 0 posts a progress record per event (train.loop, train.preempt): a drain
notice `{"step", "preempted": True, ...}`, each attempt's resume `{"step", "resumed": True, "node"}`
and the steps' losses. The driver folds those into its summary's `restarts` list, and `raydlc job
status` folds the same records read back from the driver's printed lines (train.__main__), so both
say the same. Pure: no Ray, no clock.

A resume is a restart only when an earlier record of the run was seen: the first attempt of a
`--resume` run posts one too, before any step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any


@dataclass(frozen=True)
class Fold:
    """What the fold knows after some records: the restarts so far and the current attempt's last step and notice."""

    restarts: tuple[dict[str, Any], ...] = ()
    seen: bool = False  # a record of the run (a step, a notice, a resume) came before
    last_step: int | None = None  # the latest step the current attempt posted
    notice_step: int | None = None  # the current attempt's drain notice, if one came


def take(state: Fold, rec: dict[str, Any]) -> Fold:
    """One record folded in; records without a step (the driver's stages, heartbeats) change nothing."""
    step = rec.get("step")
    if not isinstance(step, int):
        return state
    if rec.get("resumed"):
        restarts = state.restarts
        if state.seen:
            preempted = state.notice_step is not None
            restarts = (*restarts, {"cause": "preemption" if preempted else "failure",
                                    "at_step": state.notice_step if preempted else state.last_step,
                                    "resumed_from": step, "node": rec.get("node")})
        return Fold(restarts, True, step, None)
    if rec.get("preempted"):
        return replace(state, seen=True, notice_step=step, last_step=max(step, state.last_step or 0))
    return replace(state, seen=True, last_step=step)


def fold(records: Iterable[dict[str, Any]], state: Fold | None = None) -> Fold:
    """Every record folded in, in order."""
    return reduce(take, records, state or Fold())


def restarts(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """`[{cause: preemption|failure, at_step, resumed_from, node}]` in the order they happened."""
    return list(fold(records).restarts)


def describe(r: dict[str, Any]) -> str:
    """One restart for people: `preempted at step 12, resumed from 12 on 10.0.1.5 (ab12…)`."""
    what = "preempted" if r["cause"] == "preemption" else "failed"
    at = f" at step {r['at_step']}" if r.get("at_step") is not None else ""
    on = f" on {r['node']}" if r.get("node") else ""
    return f"{what}{at}, resumed from {r['resumed_from']}{on}"


# The driver's lines (train.__main__._print_progress) that carry these records.
_STEP = re.compile(r"^step (\d+): (loss |preempted|resumed from its checkpoint(?: on (.+))?$)")


def records_of_log(text: str) -> list[dict[str, Any]]:
    """The records behind the driver's printed lines, in order: what `job status` folds when no summary was printed."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _STEP.match(line.strip())
        if m is None:
            continue
        step, kind = int(m[1]), m[2]
        if kind.startswith("loss"):
            out.append({"step": step, "loss": True})
        elif kind == "preempted":
            out.append({"step": step, "preempted": True})
        else:
            out.append({"step": step, "resumed": True, "node": m[3]})
    return out
