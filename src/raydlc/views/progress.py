"""What a person sees while `raydlc train` runs: a spinner, one rich progress bar and a summary table."""

from __future__ import annotations

from typing import Any

from raydlc.views.output import console, err_console


class TrainView:
    """The progress callback of `raydlc.api.train` for a terminal, on stderr (stdout stays clean for --json).

    A spinner while the driver prepares the data, then one bar over the steps as rank 0 posts
    them; with `quiet` (--json) the bar is transient, and off the terminal there is none.
    """

    def __init__(self, *, quiet: bool, debug: bool) -> None:
        self.quiet, self.debug = quiet, debug
        self._status: Any = None
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> TrainView:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_status()
        if self._bar is not None:
            self._bar.stop()

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __call__(self, rec: dict[str, Any]) -> None:
        stage = rec.get("stage")
        if stage == "notice":
            err_console.print(f"note: {rec['text']}")
        elif stage == "preparing" and self._status is not None and "records" in rec:
            self._status.update(preparing_line(rec))
        elif stage == "preparing" and self._status is None:
            self._status = err_console.status("preparing data and tokenizer", spinner="dots")
            self._status.start()
        elif stage == "training":
            self._stop_status()
            if not self.quiet or err_console.is_terminal:
                self._start_bar(rec["steps"])
        elif self._bar is not None:
            self._update(rec)

    def _start_bar(self, steps: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress(
            TextColumn("[bold]train[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  eval {task.fields[eval]}  {task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=self.quiet,
        )
        self._bar.start()
        self._task = self._bar.add_task("train", total=steps, loss="-", eval="-", tps="-")

    def _update(self, rec: dict[str, Any]) -> None:
        bar, task = self._bar, self._task
        if "eval_loss" in rec:
            bar.update(task, eval=f"{rec['eval_loss']:.3f}")
        elif "loss" in rec:
            bar.update(task, completed=rec["step"], loss=f"{rec['loss']:.3f}", tps=f"{rec['tokens_per_s']:,.0f}")
        elif rec.get("preempted") and rec.get("saved") is False:
            bar.console.print(f"preempted: deadline too short to save at step {rec['step']}; resuming from step {rec.get('resume_from', 0)}")
        elif rec.get("preempted"):
            bar.console.print(f"preempted at step {rec['step']}: its checkpoint is saved; Ray Train restarts from it when the nodes are back")
        elif rec.get("resumed"):
            bar.update(task, completed=rec["step"])
            bar.console.print(f"resumed from the checkpoint of step {rec['step']}" + (f" on {rec['node']}" if rec.get("node") else ""))


def preparing_line(rec: dict[str, Any]) -> str:
    """`preparing data: 12,000 records (3,100/s), 1,200,000 tokens (310,000/s)`: the data preparation's rates."""
    t = max(float(rec.get("elapsed_s") or 0.0), 1e-9)
    return (f"preparing data: {rec['records']:,} records ({rec['records'] / t:,.0f}/s), "
            f"{rec['tokens']:,} tokens ({rec['tokens'] / t:,.0f}/s)")


def print_summary(s: dict[str, Any], out: Any = console) -> None:
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
        ("loss first → final", f"{fmt(s['first_loss'])} → {fmt(s['final_loss'])}" + (f"  ({drop:.0%} lower)" if drop is not None else "")
         + (f"; {s['overfitting']}" if s.get("overfitting") else "")),
        ("eval loss", s["eval_loss"]),
        ("tokens/s", s["tokens_per_s"]),
        ("step time (s)", s["step_time_s"]),
        ("peak memory per worker (MiB)", s["peak_mem_mb"]),
        ("peak reserved per worker (MiB)", s.get("peak_reserved_mb")),
        ("resumed from", s["resumed_from"]),
        ("checkpoint", s["checkpoint"]),
        ("export (from_pretrained)", s["export"]),
        ("metrics", s["metrics"]),
        ("loss plot", s.get("plot") or s.get("plot_note")),
        ("wall time (s)", s["wall_s"]),
    ]
    if s.get("stop_reason"):
        rows.insert(1, ("stopped", s["stop_reason"]))
    if s.get("cost"):
        c = s["cost"]
        forecast = f", forecast to the last step ${c['forecast_usd']:.2f}" if c.get("forecast_usd") is not None else ""
        rows.append(("cost", f"${c['spent_usd']:.2f} of ${c['budget_usd']:.2f} at ${c['usd_per_hour']:.2f}/h{forecast} ({c['price']})"))
    if s.get("restarts"):
        rows.append(("restarts", restarts_text(s["restarts"])))
    for name, where in (s.get("tracking") or {}).items():  # train.tracking: the command or the run id of each tracker
        rows.append((name, where))
    for name, why in (s.get("trackers_stopped") or {}).items():
        rows.append((f"{name} (stopped)", why))
    for k, v in rows:
        table.add_row(k, fmt(v))
    out.print(table)


def restarts_text(restarts: list[dict[str, Any]]) -> str:
    """`preempted at step 12, resumed from 12 on 10.0.1.5 (ab12…)`, one restart a line (jobs.restarts)."""
    from raydlc.jobs.restarts import describe

    return "\n".join(describe(r) for r in restarts)
