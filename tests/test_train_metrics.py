"""Metrics: the summary numbers and the PNG plot."""

from __future__ import annotations

from pathlib import Path

from raydlc.evaluate import plot as lossplot
from raydlc.train import metrics as M


def records() -> list[dict]:
    out: list[dict] = []
    for s in range(1, 5):
        out.append({"step": s, "loss": 10.0 - s, "tokens": 100, "step_time_s": 1.0 if s > 1 else 9.0, "peak_mem_mb": 10.0 * s})
    out.append({"step": 4, "eval_loss": 6.5})
    return out


def test_summary_uses_first_and_last_loss_and_skips_the_warm_up_step() -> None:
    s = M.summarize(records())
    assert (s["steps"], s["first_loss"], s["final_loss"], s["eval_loss"]) == (4, 9.0, 6.0, 6.5)
    assert s["tokens_per_s"] == 100.0 and s["step_time_s"] == 1.0 and s["peak_mem_mb"] == 40.0
    assert M.summarize([])["final_loss"] is None


def test_steps_read_together_on_a_gpu_leave_the_whole_first_window_out() -> None:
    """Steps 1-3 read at once share one window's time, warm-up included; so do steps 4-6."""
    recs = [{"step": s, "loss": 1.0, "tokens": 100, "step_time_s": 3.0 if s <= 3 else 1.0, "time": 10.0 if s <= 3 else 13.0} for s in range(1, 7)]
    s = M.summarize(recs)
    assert (s["step_time_s"], s["tokens_per_s"]) == (1.0, 100.0)
    cpu = [{"step": s, "loss": 1.0, "tokens": 100, "step_time_s": 9.0 if s == 1 else 1.0, "time": float(s)} for s in range(1, 4)]
    assert M.summarize(cpu)["step_time_s"] == 1.0  # one step per read: only the first is left out


def test_jsonl_round_trip_and_plot_is_a_png(tmp_path: Path) -> None:
    M.write_jsonl(records(), tmp_path / "m.jsonl")
    assert M.read_jsonl(tmp_path / "m.jsonl") == records()
    lossplot.plot(records(), tmp_path / "loss.png")
    data = (tmp_path / "loss.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_people_summary_names_the_figures_and_paths(capsys) -> None:
    from raydlc.views.progress import print_summary

    s = {
        "steps": 300, "first_loss": 8.36, "final_loss": 5.05, "eval_loss": 5.17, "tokens_per_s": 1920.0, "step_time_s": 1.07,
        "peak_mem_mb": 874.0, "loss_drop": 0.395, "model": "tiny", "workers": 2, "sharding": "fsdp", "resumed_from": None,
        "checkpoint": "/o/r/checkpoint_000300", "export": "/o/r/export", "metrics": "/o/r/metrics.jsonl", "plot": "/o/r/loss.png", "wall_s": 340.0,
    }
    print_summary(s)
    out = capsys.readouterr().out
    assert "8.36 → 5.05" in out and "40% lower" in out and "/o/r/export" in out and "fsdp" in out


def test_eval_loss_rising_over_the_last_evaluations_is_named_beside_the_train_loss() -> None:
    from raydlc.views.progress import print_summary

    train = [{"step": s, "loss": 5.0 / s, "tokens": 100, "step_time_s": 1.0, "peak_mem_mb": 1.0} for s in range(1, 301)]
    evals = [{"step": s, "eval_loss": v} for s, v in ((50, 3.0), (100, 2.1), (150, 2.4), (200, 2.6), (250, 2.9), (300, 3.3))]
    s = M.summarize(train + evals)
    assert s["overfitting"] == "overfitting: eval loss rose over the last 3 evaluations (2.6 → 3.3; lowest 2.1 at step 100)"
    assert M.summarize(train + evals[:3])["overfitting"] is None  # two rises after the lowest: not yet three rising in a row
    assert M.summarize(train + [*evals[:4], {"step": 250, "eval_loss": 2.5}])["overfitting"] is None  # it fell again
    from io import StringIO

    from rich.console import Console

    buf = StringIO()
    print_summary({**s, "loss_drop": 0.99, "model": "tiny", "workers": 2, "sharding": "fsdp", "resumed_from": None, "checkpoint": None,
                   "export": "e", "metrics": "m", "plot": "p", "wall_s": 1.0}, Console(file=buf, width=300))
    row = next(line for line in buf.getvalue().splitlines() if "loss first → final" in line)
    assert "5 → 0.01667  (99% lower); overfitting: eval loss rose over the last 3 evaluations" in row
