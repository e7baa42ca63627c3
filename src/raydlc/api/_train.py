"""The `train` use case: fine-tune on a local Ray (or a cluster's, by address), as `raydlc train` does."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from raydlc import interrupts
from raydlc.api._config import CALLABLE, argument, load
from raydlc.config import TrainConfig, flags
from raydlc.errors import RaydlcError, Stopped

# The settings `train` takes as keyword arguments: every training setting with a flag, named like it.
OPTIONS = flags.options("train")


@dataclass(frozen=True)
class TrainResult:
    """A finished run: its losses, speed, layout and where it wrote; `to_dict()` is `raydlc train --json`."""

    steps: int | None
    first_loss: float | None
    final_loss: float | None
    eval_loss: float | None
    tokens_per_s: float | None
    step_time_s: float | None
    peak_mem_mb: float | None
    loss_drop: float | None
    model: str
    workers: int
    sharding: str
    mesh: dict[str, Any]
    global_batch: int
    micro_batch: int
    grad_accum: int
    grad_sync: str
    layout_note: str | None
    seq_len: int
    train_sequences: int
    dataset: str
    dataset_reused: bool
    eval_sequences: int
    resumed_from: str | None
    run_name: str
    run_dir: str
    checkpoint: str | None
    export: str
    metrics: str
    plot: str | None  # drawn by the run's end on the driver (evaluate.ending.loss_plot); None with `plot_note` saying why
    wall_s: float
    stopped_by: str | None = None  # "budget" when JOB_MAX_COST_USD ended the run before STEPS
    stop_reason: str | None = None  # "stopped by the budget: $X of $Y at step N"
    cost: dict[str, Any] | None = None  # with a budget: budget_usd, usd_per_hour, spent_usd, forecast_usd (to STEPS), elapsed_s, price
    plot_note: str | None = None  # why no loss plot was drawn (no matplotlib here, the metrics unreadable)
    overfitting: str | None = None  # said when eval loss rose over the last evaluations
    peak_reserved_mb: float | None = None  # CUDA: the caching allocator's peak reserved memory (torch.cuda.max_memory_reserved); None on CPU
    skipped_steps: int | None = None  # steps whose loss or gradient norm was not finite: their updates were skipped
    steps_run: str | None = None  # the steps this invocation trained, "201–300" after a resume from step 200 ("none": nothing left)
    resumed_from_run: str | None = None  # the run folder of the checkpoint resumed from (the same run with --resume)
    restarts: list[dict[str, Any]] = field(default_factory=list)  # {cause: preemption|failure, at_step, resumed_from, node} (jobs.restarts)
    epochs: float | None = None  # passes over the training split: steps x global_batch / train_sequences
    lora: dict[str, Any] | None = None  # a LoRA run: rank, alpha, targets, merged (bool), adapter (its folder); None: full fine-tuning
    params: dict[str, int] | None = None  # trainable and total parameters, from the architecture (None when it is not known)
    end_warnings: list[str] = field(default_factory=list)  # a step of the run's end that failed (train.ending): the run is kept
    tracking: dict[str, str] = field(default_factory=dict)  # each tracker (train.tracking): the command that opens it, or its run id
    trackers_stopped: dict[str, str] = field(default_factory=dict)  # a tracker that failed, and why: the run went on without it
    evaluation: dict[str, Any] | None = None  # EVAL_AFTER: the export beside its base, as `raydlc eval --json` gives it
    model_card: str | None = None  # the export's README.md (evaluate.card), written at the run's end
    preflight: dict[str, Any] | None = None  # the collective figures, when PREFLIGHT ran

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> TrainResult:
        return cls(**summary)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.preflight is None:
            del out["preflight"]
        if not self.end_warnings:
            del out["end_warnings"]
        if not self.trackers_stopped:
            del out["trackers_stopped"]
        return out

    def __str__(self) -> str:
        from raydlc.views.progress import print_summary
        from raydlc.views.text import rendered

        return rendered(lambda console: print_summary(self.to_dict(), console))


def train(
    *,
    config: str | os.PathLike[str] | None = None,
    settings: Mapping[str, Any] | None = None,
    address: str | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    log_to_driver: bool = True,
    **named: Any,
) -> TrainResult:
    """Fine-tune with FSDP2 under Ray Train: checkpoints, a Hugging Face export and a loss plot.

    The keyword arguments are `raydlc train`'s flags (`model`, `data`, `steps`, `workers`, `out`,
    `seq_len`, `batch_size`, `grad_accum`, `lr`, …; see `inspect.signature(train)`); settings
    left at their default take the local-run values, as on the command line. `address` joins a
    running Ray cluster (its head's host:port) instead of starting a local one. `on_progress`
    receives the driver's stages (`{"stage": "preparing"}`, with the data preparation's
    `{"stage": "preparing", "records", "tokens", "elapsed_s"}`, what the driver is doing before the first step (`{"stage": "phase", "text":
    "starting Ray"}`, `"preparing data"`), then `{"stage": "training", "steps": N, "workers", "global_batch", "train_sequences"}` as the workers start, and `{"stage": "stalled",
    "reason", "evidence"}` when the stall guard ends the run) and rank 0's records (`{"step", "loss", "tokens_per_s", …}` (with
    `"cost"` under a budget), `{"step", "eval_loss"}`, `{"step", "resumed": True, "node"}`, a drain notice `{"step", "preempted": True, "saved", …}`); `log_to_driver=False` keeps the workers' own
    output off this process's stdout. Bad input raises before Ray starts.

    Example:
        >>> import tempfile
        >>> import raydlc.api as api
        >>> result = api.train(steps=3, seq_len=32, batch_size=2, workers=1, checkpoint_every=0,
        ...                    out=tempfile.mkdtemp(), log_to_driver=False)
        >>> result.model, result.steps, result.workers, result.to_dict()["grad_accum"]
        ('tiny', 3, 1, 1)
    """
    from raydlc import storage
    from raydlc.train import launch
    from raydlc.train.prepare import DEFAULT_OUT, new_run_name

    argument("address", address, (str,), "a Ray head's host:port as text")
    argument("on_progress", on_progress, CALLABLE, "a function taking each progress record (a dict)")
    cfg = load(config, settings, **flags.named_settings(OPTIONS, named, caller="train"))
    request = launch.settings(cfg, local=True)
    where = replace(launch.target(cfg, local=True, address=address), log_to_driver=log_to_driver)
    if address:  # Ray reads the token from the same places: a token no header can carry fails here, unshown
        from raydlc.jobs.targets import address_token

        address_token()
    out = request.storage_path or DEFAULT_OUT
    if not storage.is_uri(out):  # fail now, not after data preparation and Ray's start
        from raydlc.edges.files import check_output_dir

        check_output_dir(out, "--out" if named.get("out") is not None else "STORAGE_PATH")
    from raydlc.train import runfolder
    from raydlc.train.checkpoint import newest_run

    root = runfolder.resolved(out)
    runfolder.check_modes(resume=request.resume, resume_from=request.resume_from, overwrite=request.overwrite)
    name = request.run_name or (newest_run(root) if request.resume else None) or new_run_name()
    request = request.model_copy(update={"run_name": name})  # named now: Ctrl-C can say what it kept
    claim = runfolder.claim(root, name, resume=request.resume, overwrite=request.overwrite)  # nothing of another run is lost
    emit = on_progress or (lambda record: None)
    checked = None
    with interrupts.watch() as sigint, interrupts.terminating():
        try:
            if request.num_workers > 0:  # with 0 (one per GPU) the checks wait for the cluster's size
                checked = launch.check(request, where)  # bad input fails here, before Ray, a progress bar or a worker
            with runfolder.held(claim, overwrite=request.overwrite):  # one writer per run folder, from here to the end
                if (note := _lora_base_note(request)) is not None:  # after the checks: a refused run gets its error alone
                    emit({"stage": "notice", "text": note})
                emit({"stage": "preparing"})
                summary = launch.run(request, where, on_progress=emit, checked=checked)
        except BaseException as e:  # Ray Train's own SIGINT handler aborts the run and may sys.exit(0)
            if isinstance(e, KeyboardInterrupt) or sigint.interrupted:
                raise _stopped(request.run_name, out) from None
            if isinstance(e, interrupts.Terminated) or sigint.terminated:  # ours, or ray.init's sys.exit(15)
                raise _stopped(request.run_name, out, by="SIGTERM") from None
            raise
        if sigint.interrupted or sigint.terminated:  # an aborted run can return as if it had ended
            raise _stopped(request.run_name, out, by="Ctrl-C" if sigint.interrupted else "SIGTERM")
    return TrainResult.from_summary(summary)  # the loss plot is the run's end's first step (evaluate.ending.loss_plot)


def _stopped(name: str, out: str, by: str = "Ctrl-C") -> Stopped:
    """What Ctrl-C (or SIGTERM) stopped and what is kept: the run's checkpoints, which `--resume` continues from.
    A save the signal cut short is not named (checked by sizes: hashing every shard would hold the exit).
    SIGTERM exits 143 (128 + 15, as a shell reports a process SIGTERM ended), Ctrl-C 130."""
    stopped = _stopped_by(name, out, by)
    if by == "SIGTERM":
        stopped.exit_code = 143
    return stopped


def _stopped_by(name: str, out: str, by: str) -> Stopped:
    from raydlc.train.checkpoint import newest_intact

    try:
        found = newest_intact(out, hashes=False, run=name)  # what --resume would pick: the run's newest whole checkpoint
    except (OSError, RaydlcError):
        found = None
    if found is None:
        return Stopped(f"training run {name} stopped by {by} before its first checkpoint; nothing to resume from")
    return Stopped(f"training run {name} stopped by {by}; its last checkpoint {found.path} is kept and --resume continues from it",
                   hint=f"raydlc train --resume --out {out} --run-name {name}")


# Introspection shows every flag as a keyword argument, though the function takes them as **named.
train.__signature__ = inspect.signature(train).replace(  # type: ignore[attr-defined]
    parameters=[p for p in inspect.signature(train).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    + flags.signature(OPTIONS)
)


def _lora_base_note(request: TrainConfig) -> str | None:
    """LoRA freezes the base: on a built-in spec at random init its embedding, head and norms stay
    random, so the adapters can lower the loss only a little. Said before the run, not after it."""
    from raydlc.facts.models import SPECS

    if request.lora_rank <= 0 or request.model_id.lower() not in SPECS:
        return None
    return (f"LoRA on {request.model_id} at random init: the frozen random base limits what the adapters can learn "
            "(expect a fall of a few percent); train a base first (raydlc train) and pass its export with --model DIR")
