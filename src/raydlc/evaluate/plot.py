"""The loss plot: the first step of the run's end (train.ending), so that the model card embeds it and the
trackers log it; drawn again by `raydlc submit`'s caller where the job's end had no matplotlib.

The Ray Train image has no matplotlib (tests/doubles/dlc_env.py): matplotlib is imported only when drawing,
and where it is absent, or the run's storage cannot be read or written, no plot is drawn and a one-line
`plot_note` says why; the run is not failed. A run directory in object storage gets `loss.png` drawn
locally and published beside its metrics (edges.storage).
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raydlc.storage import is_uri


def plot(records: Sequence[dict[str, Any]], path: Path, *, title: str = "raydlc training loss") -> None:
    """Train loss per step and eval loss where measured; Agg, so no display is needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = series(records)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(*lines["train loss"], label="train loss", linewidth=1)
    if lines["eval loss"][0]:
        ax.plot(*lines["eval loss"], "o-", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if lines["learning rate"][0]:  # the schedule (warm-up, then its decay) on its own axis, so a loss bend can be read against it
        lr_ax = ax.twinx()
        lr_ax.plot(*lines["learning rate"], color="tab:gray", linestyle="--", linewidth=1, label="learning rate")
        lr_ax.set_ylabel("learning rate")
        more_h, more_l = lr_ax.get_legend_handles_labels()
        handles, labels = handles + more_h, labels + more_l
    ax.legend(handles, labels)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def series(records: Sequence[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """What the plot draws, by label: (steps, values) of the train loss, the eval loss and each step's learning rate."""
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    lrs = [r for r in steps if "lr" in r]
    return {
        "train loss": ([r["step"] for r in steps], [r["loss"] for r in steps]),
        "eval loss": ([r["step"] for r in evals], [r["eval_loss"] for r in evals]),
        "learning rate": ([r["step"] for r in lrs], [r["lr"] for r in lrs]),
    }


def _have_matplotlib() -> bool:
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules: refused by an import guard
        return False


def title(summary: Mapping[str, Any]) -> str:
    return f"{summary.get('model')}: {summary.get('workers')} worker(s), global batch {summary.get('global_batch')} x {summary.get('seq_len')}"


def draw(summary: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """Draw `loss.png` into the run directory from its `metrics.jsonl`: (the plot's path, None), or
    (None, why no plot was drawn)."""
    metrics, run_dir = summary.get("metrics"), summary.get("run_dir")
    if not metrics or not run_dir:
        return None, "no loss plot: the run named no metrics file"
    if not _have_matplotlib():
        return None, f"no loss plot: matplotlib is not installed here (the metrics are in {metrics})"
    from raydlc.edges.storage import publish, read_text

    try:
        records = [json.loads(line) for line in read_text(str(metrics)).splitlines() if line.strip()]
    except OSError as e:
        return None, f"no loss plot: {metrics} could not be read ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})"
    dest = f"{str(run_dir).rstrip('/')}/loss.png"
    try:
        if is_uri(str(run_dir)):
            with tempfile.TemporaryDirectory(prefix="raydlc-plot-") as tmp:
                plot(records, Path(tmp) / "loss.png", title=title(summary))
                publish(Path(tmp), str(run_dir))
        else:
            plot(records, Path(dest), title=title(summary))
    except OSError as e:
        return None, f"no loss plot: {dest} could not be written ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})"
    return dest, None


def with_plot(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with `plot` (the PNG drawn, or None) and `plot_note` (why not, or None); a summary whose
    plot is drawn already is returned as it is."""
    if summary.get("plot"):
        return summary
    path, note = draw(summary)
    return {**summary, "plot": path, "plot_note": note}

