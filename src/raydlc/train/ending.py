"""The run's end, on the driver: one ordered list of steps that run once training has finished and the
run's products (export, metrics, summary) are published, on a laptop and on a cluster alike.

Why one hook: evaluation, the model card and the experiment trackers all end a run and read each
other's results — the card shows the evaluation, the trackers log the evaluation and the card. Each
step is a function of the `RunEnd` (the resolved run and the summary so far) that returns what it adds
to the summary; later steps see what earlier ones added. A step that fails is one warning in the
summary (`end_warnings`), never a failed run: the weights are already safe in the run directory.

Order (a step registers by its place in `STEPS`): the loss plot first (so that the card embeds it and
the trackers log it), then evaluation, then the model card, then the trackers' close.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydlc.evaluate import ending as evaluate_ending
from raydlc.train.model import build_builtin

if TYPE_CHECKING:
    from raydlc.train.runspec import RunSpec


@dataclass(frozen=True)
class RunEnd:
    """What a step of the run's end reads: the run as the workers ran it and its summary so far."""

    spec: RunSpec
    summary: Mapping[str, Any]


EndStep = Callable[[RunEnd], Mapping[str, Any]]


def _trackers(end: RunEnd) -> Mapping[str, Any]:
    from raydlc.train.tracking import close_run

    return close_run(end)


# (name, step) in the order they run; a name is what a warning says failed.
STEPS: tuple[tuple[str, EndStep], ...] = (
    ("loss plot", evaluate_ending.loss_plot),
    ("evaluation", functools.partial(evaluate_ending.evaluation, build=build_builtin)),
    ("model card", evaluate_ending.card),
    ("trackers", _trackers),
)


def finish(spec: RunSpec, summary: Mapping[str, Any], steps: Sequence[tuple[str, EndStep]] | None = None) -> dict[str, Any]:
    """Run every step of the run's end in order; each one's additions join the summary the next one sees."""
    out = dict(summary)
    warnings: list[str] = list(out.get("end_warnings") or [])
    for name, step in STEPS if steps is None else steps:
        try:
            out.update(step(RunEnd(spec, dict(out))))
        except Exception as e:  # the run is done and kept: its end's extras never fail it
            warnings.append(f"{name}: {type(e).__name__}: {e}")
    if warnings:
        out["end_warnings"] = warnings
    return out
