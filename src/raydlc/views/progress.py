"""What a person sees while `raydlc train` runs: a spinner, one rich progress bar and a summary table."""

from __future__ import annotations

from typing import Any

from raydlc.views.output import console, err_console


class TrainView:
    """The progress callback of `raydlc.api.train` for a terminal, on stderr (stdout stays clean for --json).

    A spinner naming each phase before the first step (Ray's start, the data, the workers' start),
    then one bar over the steps as rank 0 posts them; with
    `quiet` (--json) the bar is transient, and off the terminal there is none.
    """

    def __init__(self, *, quiet: bool, debug: bool) -> None:
        self.quiet, self.debug = quiet, debug
        self._status: Any = None
        self._bar: Any = None
        self._task: Any = None
        self._epoch_every: float | None = None  # epochs per step: global batch / training sequences

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
        elif stage == "preparing" and "records" in rec:
            if self._status is not None:
                self._status.update(preparing_line(rec))
        elif stage == "preparing":
            self._phase("preparing data and tokenizer")
        elif stage == "phase":
            self._phase(rec["text"])
        elif stage == "training":
            self._stop_status()
            self._epoch_every = rec.get("global_batch", 0) / rec["train_sequences"] if rec.get("train_sequences") else None
            if not self.quiet or err_console.is_terminal:
                self._start_bar(rec["steps"], workers_line(rec))
        elif self._bar is not None:
            self._update(rec)

    def _phase(self, text: str) -> None:
        """What the driver does before the first step (`starting Ray…`, `preparing data…`): a spinner
        in a terminal, so a long start is never silence; off a terminal nothing (a failure stays one line)."""
        if not err_console.is_terminal:
            return
        if self._status is None:
            self._status = err_console.status(f"{text}…", spinner="dots")
            self._status.start()
        else:
            self._status.update(f"{text}…")

    def _start_bar(self, steps: int, phase: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._bar = Progress(
            TextColumn("[bold]{task.description}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[epoch]}loss {task.fields[loss]}  eval {task.fields[eval]}  last step {task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=self.quiet,
        )
        self._bar.start()
        self._task = self._bar.add_task(f"{phase}…", total=steps, loss="-", eval="-", tps="-", epoch="")

    def _update(self, rec: dict[str, Any]) -> None:
        bar, task = self._bar, self._task
        if "eval_loss" in rec:
            bar.update(task, eval=f"{rec['eval_loss']:.3f}")
        elif "loss" in rec:
            epoch = f"epoch {rec['step'] * self._epoch_every:.1f}  " if self._epoch_every else ""
            bar.update(task, description="train", completed=rec["step"], loss=f"{rec['loss']:.3f}", tps=f"{rec['tokens_per_s']:,.0f}", epoch=epoch)
        elif rec.get("preempted") and rec.get("saved") is False:
            bar.console.print(f"preempted: deadline too short to save at step {rec['step']}; resuming from step {rec.get('resume_from', 0)}")
        elif rec.get("preempted"):
            bar.console.print(f"preempted at step {rec['step']}: its checkpoint is saved; Ray Train restarts from it when the nodes are back")
        elif rec.get("resumed"):
            bar.update(task, completed=rec["step"])
            bar.console.print(f"resumed from the checkpoint of step {rec['step']}" + (f" on {rec['node']}" if rec.get("node") else ""))


def workers_line(rec: dict[str, Any]) -> str:
    """`starting 2 workers`: the bar's text from the training stage until the first step arrives."""
    n = rec.get("workers")
    return f"starting {n} worker{'s' if n != 1 else ''}" if n else "starting the workers"


def preparing_line(rec: dict[str, Any]) -> str:
    """`preparing data: 12,000 records (3,100/s), 1,200,000 tokens (310,000/s)`: the data preparation's rates."""
    t = max(float(rec.get("elapsed_s") or 0.0), 1e-9)
    return (f"preparing data: {rec['records']:,} records ({rec['records'] / t:,.0f}/s), "
            f"{rec['tokens']:,} tokens ({rec['tokens'] / t:,.0f}/s)")


PATH_ROWS = (  # (label, key): printed whole, each on its own line below the table, so a terminal or a pipe never splits one
    ("checkpoint", "checkpoint"),
    ("export (from_pretrained)", "export"),
    ("LoRA adapter (peft)", "adapter"),
    ("metrics", "metrics"),
    ("loss plot", "plot"),
    ("resumed from", "resumed_from"),
    ("continued run", "resumed_from_run"),
)
EPOCHS_WARN = 3.0  # passes over the training split past which the summary warns of memorising it


def epochs_text(s: dict[str, Any]) -> str | None:
    """`9.1 (300 steps x 16 sequences / 528 training sequences)`, with a warning past EPOCHS_WARN."""
    e = s.get("epochs")
    if e is not None and not {"steps", "global_batch", "train_sequences"} <= s.keys():
        return f"{e:.2g}"
    if e is None:
        return None
    text = f"{e:.2g}" if e < 10 else f"{e:,.0f}"
    text += f" ({s['steps']} steps x {s['global_batch']} sequences / {s['train_sequences']:,} training sequences)"
    if e > EPOCHS_WARN:
        text += f"; WARNING: each training sequence was seen ~{e:.0f} times: the model may learn them by heart (more data, or fewer steps)"
    return text


def lora_text(s: dict[str, Any]) -> str | None:
    """`rank 8, alpha 16 on q_proj, …: 0.4M of 2.1M parameters trained (19%)`: what a LoRA run trained."""
    lora, params = s.get("lora"), s.get("params") or {}
    trained = ""
    if params.get("total"):
        trained = f": {_count(params['trainable'])} of {_count(params['total'])} parameters trained ({params['trainable'] / params['total']:.1%})"
    if not lora:
        return f"off (full fine-tuning){trained}" if params else None
    merged = "; the export holds the merged weights" if lora.get("merged") else "; no merged weights (LORA_MERGE=false)"
    whole = f" (and {', '.join(lora['modules_to_save'])} in full)" if lora.get("modules_to_save") else ""
    return f"rank {lora['rank']}, alpha {lora['alpha']:g} on {', '.join(lora['targets'])}{whole}{trained}{merged}"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}K" if n >= 1e3 else str(n)


def layout_text(s: dict[str, Any]) -> str | None:
    """The step's shape in words: sequences per step, and how the model is spread over the workers."""
    if "grad_accum" not in s:
        return None
    w = s["workers"]
    spread = {"fsdp": "each worker holds a shard of the model (FSDP)", "hsdp": "the model is sharded within a node and replicated across nodes (HSDP)"}
    text = f"{s['global_batch']} sequences a step: {s['micro_batch']} per worker x {w} worker(s)"
    if s["grad_accum"] > 1:
        from raydlc.train.layout import SYNC_WORDS

        text += f" x {s['grad_accum']} accumulated micro-batches (gradients synchronised {SYNC_WORDS.get(s['grad_sync'], s['grad_sync'])})"
    how = spread.get(str(s.get("sharding")))
    return f"{text}; {how}" if how else text


def print_summary(s: dict[str, Any], out: Any = console) -> None:
    """The run's figures as a two-column table that folds words, never paths: the paths follow the
    table, each whole on its own line (a path split across cells cannot be copied). 80 columns fit."""
    from rich.markup import escape
    from rich.table import Table

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    table = Table(show_header=False)
    table.add_column("what", overflow="fold")
    table.add_column("value", overflow="fold")
    drop = s.get("loss_drop")
    rows = [
        ("steps", s.get("steps")),
        ("epochs", epochs_text(s)),
        ("global batch", layout_text(s)),
        ("layout", s.get("layout_note")),
        ("LoRA", lora_text(s)),
        ("loss first → final", f"{fmt(s.get('first_loss'))} → {fmt(s.get('final_loss'))}" + (f"  ({drop:.0%} lower)" if drop is not None else "")
         + (f"; {s['overfitting']}" if s.get("overfitting") else "")),
        ("eval loss", s.get("eval_loss")),
        ("tokens/s (mean)", s.get("tokens_per_s")),
        ("step time (s, mean)", s.get("step_time_s")),
        ("peak memory per worker (MiB)", s.get("peak_mem_mb")),
        ("peak reserved per worker (MiB)", s.get("peak_reserved_mb")),
        ("steps this run", s["steps_run"] if s.get("resumed_from") and s.get("steps_run") else None),
        ("loss plot", None if s.get("plot") else s.get("plot_note")),
        ("wall time (s)", s.get("wall_s")),
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
        if v is not None or k in ("eval loss", "steps"):
            table.add_row(k, escape(fmt(v)))
    out.print(escape(f"raydlc train: {s['model']} on {s['workers']} worker(s), {s['sharding']}"), highlight=False)
    out.print(table)
    paths = {"adapter": (s.get("lora") or {}).get("adapter"), **s}
    for label, key in PATH_ROWS:
        if paths.get(key):
            out.print(f"{label}:", highlight=False)
            out.print(f"  {paths[key]}", soft_wrap=True, markup=False, highlight=False)


def restarts_text(restarts: list[dict[str, Any]]) -> str:
    """`preempted at step 12, resumed from 12 on 10.0.1.5 (ab12…)`, one restart a line (jobs.restarts)."""
    from raydlc.jobs.restarts import describe

    return "\n".join(describe(r) for r in restarts)
