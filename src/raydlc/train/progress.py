"""What a person sees while `raydlc train` runs: one rich progress bar and a summary table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from raydlc.output import console, err_console

if TYPE_CHECKING:
    from raydlc.config import TrainConfig
    from raydlc.train.launch import Target


def run_with_progress(run: Callable[..., dict[str, Any]], settings: TrainConfig, where: Target, *, quiet: bool, debug: bool) -> dict[str, Any]:
    """Run with a live bar on stderr (stdout stays clean for --json); Ray's worker logs only with --debug."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    where = replace(where, log_to_driver=debug)
    if quiet and not err_console.is_terminal:
        return run(settings, where)
    bar = Progress(
        TextColumn("[bold]train[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}  eval {task.fields[eval]}  {task.fields[tps]} tok/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=quiet,
    )
    with bar:
        task = bar.add_task("train", total=settings.steps, loss="-", eval="-", tps="-")

        def on_progress(rec: dict[str, Any]) -> None:
            if "eval_loss" in rec:
                bar.update(task, eval=f"{rec['eval_loss']:.3f}")
            elif "loss" in rec:
                bar.update(task, completed=rec["step"], loss=f"{rec['loss']:.3f}", tps=f"{rec['tokens_per_s']:,.0f}")
            elif rec.get("resumed"):
                bar.update(task, completed=rec["step"])
                bar.console.print(f"resumed from the checkpoint of step {rec['step']}")

        return run(settings, where, on_progress=on_progress)


def print_summary(s: dict[str, Any]) -> None:
    from rich.table import Table

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    table = Table(title=f"raydlc train: {s['model']} on {s['workers']} worker(s), {s['sharding']}", show_header=False)
    table.add_column("what")
    table.add_column("value", overflow="fold")
    drop = s.get("loss_drop")
    rows = [
        ("steps", s["steps"]),
        ("global batch", f"{s['global_batch']} sequences: micro-batch {s['micro_batch']} x {s['grad_accum']} accumulated x {s['workers']} worker(s)"
         + (f", sync {s['grad_sync']}" if s["grad_accum"] > 1 else "") if "grad_accum" in s else None),
        ("layout", s.get("layout_note")),
        ("loss first → final", f"{fmt(s['first_loss'])} → {fmt(s['final_loss'])}" + (f"  ({drop:.0%} lower)" if drop is not None else "")),
        ("eval loss", s["eval_loss"]),
        ("tokens/s", s["tokens_per_s"]),
        ("step time (s)", s["step_time_s"]),
        ("peak memory per worker (MiB)", s["peak_mem_mb"]),
        ("resumed from", s["resumed_from"]),
        ("checkpoint", s["checkpoint"]),
        ("export (from_pretrained)", s["export"]),
        ("metrics", s["metrics"]),
        ("loss plot", s["plot"]),
        ("wall time (s)", s["wall_s"]),
    ]
    for k, v in rows:
        table.add_row(k, fmt(v))
    console.print(table)
