"""Metrics of a run: one JSON record per step (JSONL), a loss plot (PNG), and their summary.

Records travel inside checkpoints, so a restarted or resumed run carries its history on
instead of writing duplicate steps, and the files are written once at the end.
"""

from __future__ import annotations

import json
import resource
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
        return {"steps": 0, "first_loss": None, "final_loss": None, "eval_loss": None, "tokens_per_s": None, "step_time_s": None}
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
    }


def plot(records: Sequence[dict[str, Any]], path: Path, *, title: str = "raydlc training loss") -> None:
    """Train loss per step and eval loss where measured; Agg, so no display is needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], label="train loss", linewidth=1)
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
