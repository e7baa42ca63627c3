"""Metrics of a run: one JSON record per step (JSONL) and their summary; what the loop reports to
Ray and posts to the driver as it goes. The loss plot is drawn from the JSONL by the run's end on the
driver, where matplotlib is (raydlc.evaluate.plot): the Ray Train image has none.

Records travel inside checkpoints, so a restarted or resumed run carries its history on
instead of writing duplicate steps, and the files are written once at the end.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def peak_memory_mb() -> float:
    """Peak accelerator memory when there is one, else the process's peak RSS."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 2**20
    except ImportError:  # pragma: no cover
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_reserved_mb() -> float | None:
    """Peak memory the CUDA caching allocator reserved from the device (allocated plus its cache
    and fragments: what an OOM is judged against); None without CUDA, where there is no such pool."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.max_memory_reserved() / 2**20
    except ImportError:  # pragma: no cover
        pass
    return None


def write_jsonl(records: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(records: Sequence[dict[str, Any]], *, skip_first: int = 1) -> dict[str, Any]:
    """First/final loss, the last eval loss, and throughput over steady-state steps."""
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    if not steps:
        return {"steps": 0, "first_loss": None, "final_loss": None, "eval_loss": None, "tokens_per_s": None, "step_time_s": None, "skipped_steps": 0, "peak_reserved_mb": None}
    # On a GPU the loop reads several steps at once and shares the window's time among them:
    # the warm-up hides in the whole first window, so skipping extends to its end.
    cut = min(skip_first, len(steps))
    if cut and steps[cut - 1].get("time") is not None:
        while cut < len(steps) and steps[cut].get("time") == steps[cut - 1]["time"]:
            cut += 1
    steady = steps[cut:] or steps
    time_s = sum(r["step_time_s"] for r in steady)
    tokens = sum(r["tokens"] for r in steady)
    return {
        "steps": steps[-1]["step"],
        "first_loss": steps[0]["loss"],
        "final_loss": steps[-1]["loss"],
        "eval_loss": evals[-1]["eval_loss"] if evals else None,
        "tokens_per_s": tokens / time_s if time_s > 0 else None,
        "step_time_s": time_s / len(steady),
        "peak_mem_mb": max(r.get("peak_mem_mb", 0.0) for r in steps),
        "peak_reserved_mb": max((r["peak_reserved_mb"] for r in steps if r.get("peak_reserved_mb") is not None), default=None),
        "skipped_steps": sum(1 for r in steps if r.get("skipped")),
        "overfitting": overfitting(evals),
    }


RISING_EVALS = 3  # evaluations in a row, each higher than the one before: the model learns the training set, not the task


def overfitting(evals: Sequence[dict[str, Any]]) -> str | None:
    """What the summary says beside the train loss when eval loss rose over the last RISING_EVALS evaluations."""
    last = [r["eval_loss"] for r in evals[-RISING_EVALS:]]
    if len(last) < RISING_EVALS or not all(a < b for a, b in zip(last, last[1:])):
        return None
    best = min(evals, key=lambda r: r["eval_loss"])
    return (f"overfitting: eval loss rose over the last {RISING_EVALS} evaluations ({last[0]:.4g} → {last[-1]:.4g}; "
            f"lowest {best['eval_loss']:.4g} at step {best['step']})")


def skipped_in_a_row(records: Sequence[dict[str, Any]]) -> list[int]:
    """The steps at the end of `records` that were skipped one after another (a non-finite loss or
    gradient norm); eval records in between do not break the run."""
    run: list[int] = []
    for r in reversed([r for r in records if "loss" in r]):
        if not r.get("skipped"):
            break
        run.append(r["step"])
    return run[::-1]


def report(
    history: Sequence[dict[str, Any]], *, step: int, every: int, mesh_shape: list[int], last: bool = False, stopped: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What goes up with Ray's report at `step`: the step's loss, throughput and step time over the
    last `every` steps, the mesh the workers built; the last report adds the run's summary and why it stopped early."""
    window = [r for r in history if "loss" in r][-every:]
    rec = window[-1]
    metrics = {
        "step": step,
        "loss": rec["loss"],
        "tokens_per_s": sum(r["tokens"] for r in window) / sum(r["step_time_s"] for r in window),
        "step_time_s": sum(r["step_time_s"] for r in window) / len(window),
        "peak_mem_mb": rec["peak_mem_mb"],
        "mesh_shape": mesh_shape,
    }
    if rec.get("peak_reserved_mb") is not None:  # CUDA only
        metrics["peak_reserved_mb"] = rec["peak_reserved_mb"]
    if last:
        metrics.update({f"summary_{k}": v for k, v in {**summarize(history), **(stopped or {})}.items() if v is not None})
    return metrics


class Progress:
    """Rank 0's records on their way to the driver (a mailbox actor, not a barrier): at most one
    post every `every_s`, and at once when the loop reports or evaluates. Other ranks post nothing."""

    def __init__(self, session: Any, *, on: bool, every_s: float) -> None:
        self.session, self.on, self.every_s = session, on, every_s
        self.unposted: list[dict[str, Any]] = []
        self.posted = time.monotonic()

    def add(self, records: list[dict[str, Any]], *, now: bool) -> None:
        if not self.on:
            return
        self.unposted += records
        if now or time.monotonic() - self.posted >= self.every_s:
            self.session.progress(self.unposted)
            self.unposted, self.posted = [], time.monotonic()

    def flush(self) -> None:
        """The rest, waiting until everything posted so far has arrived."""
        if self.on:
            self.session.progress(self.unposted, wait=True)

