"""The experiment trackers (TRACKING: TensorBoard, MLflow, W&B): one `Tracking` component that rank 0's loop
feeds, and the driver's close at the run's end (`close_run`, a step of train.ending).

Why this shape:
- Off the hot path: the loop hands over the records it has already read (at its read cadence, train.cadence),
  so no host sync is added to a step; a thread of its own writes them, so the loop never waits on a file or a
  server. On a GPU that means one batch of records every REPORT_EVERY steps, as `metrics.jsonl` gets them.
- One run per job: the tracker run's identity (`TrackingRun`: an id, the TensorBoard directory) is decided once
  by the driver, sent in the RunSpec and written into every checkpoint's manifest meta, so a restart (Ray's, or a
  drain notice's) and a `--resume` continue the same run. Each tracker says the last step it already holds when
  it opens; records up to it are not logged again, and the restored history fills the steps it lacks: no step
  twice, none missing. TensorBoard does this its own way: the writer opens with `purge_step`, and readers drop
  what an earlier attempt wrote from that step on.
- A failing tracker (no server, bad credentials, a full disk) is one warning naming it; it is dropped and the
  run goes on; the summary's `trackers_stopped` says which stopped and why.
Credentials are never values here: MLflow reads MLFLOW_TRACKING_TOKEN and W&B reads WANDB_API_KEY from the
environment (on a cluster, a Kubernetes Secret reference: raydlc.render.raycluster).
"""

from __future__ import annotations

import importlib.util
import math
import os
import queue
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc import storage
from raydlc.errors import RaydlcError
from raydlc.facts.trackers import chosen

if TYPE_CHECKING:
    from raydlc.config import TrainConfig
    from raydlc.train.runspec import RunSpec

CLOSE_S = 60.0  # the end of a worker's run waits at most this long for its trackers to finish writing
UPLOAD_EVERY_S = 30.0  # TensorBoard events on s3:// are written locally and copied up this often, and at the end
TAG = "raydlc.tracking_id"  # the MLflow run's tag that finds it again on a restart or a resume
# MLflow's client retries a failing server 7 times with backoff (minutes); a tracker that is down should be
# found down quickly: these are defaults only, the environment's own values win.
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


@dataclass(frozen=True)
class TrackingRun:
    """The one tracker run of a job: decided by the driver, carried by the RunSpec and the checkpoints' meta."""

    id: str  # MLflow's tag, W&B's run id
    name: str  # the run's name where a tracker shows one
    tb_dir: str  # TensorBoard's event files: <out>/<run>/tb of the run where tracking began
    wandb_dir: str  # W&B's local files (its offline runs): <out>/<run>/wandb, or a temporary directory for a URI

    @classmethod
    def of(cls, run: RunSpec) -> TrackingRun:
        tid = run.tracking_id or run.run_name
        root = run.tracking_dir or run.run_dir
        wandb_dir = storage.join(root, "wandb") if not storage.is_uri(root) else str(Path(tempfile.gettempdir()) / f"raydlc-wandb-{tid}")
        return cls(id=tid, name=run.run_name, tb_dir=storage.join(root, "tb"), wandb_dir=wandb_dir)


def new_id() -> str:
    """A tracker run id: W&B takes letters and digits (at most 64), MLflow any tag value."""
    return uuid.uuid4().hex


def identity(resume_meta: Mapping[str, Any] | None, run_dir: str) -> tuple[str, str]:
    """(tracking_id, tracking_dir) of a run: those of the checkpoint it continues, else new ones here."""
    meta = resume_meta or {}
    return str(meta.get("tracking_id") or new_id()), str(meta.get("tracking_dir") or run_dir)


# ---- what gets logged: pure ---------------------------------------------------------------------


def flat(params: Mapping[str, Any], prefix: str = "") -> dict[str, str | int | float | bool]:
    """Nested settings as one level of `a/b` keys with scalar values (lists and None as text)."""
    out: dict[str, str | int | float | bool] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat(v, f"{key}/"))
        elif isinstance(v, bool | int | float | str):
            out[key] = v
        else:
            out[key] = "" if v is None else str(v)
    return out


def scalars_of(record: Mapping[str, Any], *, skipped_so_far: int = 0, mfu_per_token_s: float | None = None) -> dict[str, float]:
    """A loop record (train.loop.Unread.read, or an eval record) as the scalars trackers show at its step."""
    if "eval_loss" in record:
        loss = float(record["eval_loss"])
        return {"eval/loss": loss, "eval/perplexity": math.exp(loss) if loss < 700 else math.inf}
    if "loss" not in record:
        return {}
    out = {
        "train/loss": float(record["loss"]), "train/lr": float(record["lr"]), "train/grad_norm": float(record["grad_norm"]),
        "train/tokens_per_s": float(record["tokens_per_s"]), "train/step_time_s": float(record["step_time_s"]),
        "train/peak_mem_mb": float(record["peak_mem_mb"]), "train/skipped": float(bool(record.get("skipped"))),
        "train/skipped_steps": float(skipped_so_far + bool(record.get("skipped"))),
    }
    if record.get("peak_reserved_mb") is not None:
        out["train/peak_reserved_mb"] = float(record["peak_reserved_mb"])
    if mfu_per_token_s is not None:
        out["train/mfu"] = float(record["tokens_per_s"]) * mfu_per_token_s
    return out


def mfu_factor(run: RunSpec, device_name: str | None) -> float | None:
    """MFU per token/s: model FLOPs per token over the workers' dense bf16 peak, where both are known (a GPU
    raydlc knows and a model whose architecture it knows); None elsewhere (a CPU run has no peak to compare to)."""
    from raydlc.facts.instances import gpu_for_device_name
    from raydlc.facts.models import get_spec, spec_for

    gpu = gpu_for_device_name(device_name) if device_name else None
    if gpu is None:
        return None
    try:
        spec = get_spec(run.spec) if run.spec else spec_for(run.train.model_id)
    except Exception:
        return None
    if spec is None:
        return None
    flops_per_token = 6 * spec.param_count() + 12 * spec.num_layers * spec.hidden_size * run.train.seq_len
    return flops_per_token / (run.mesh.world_size * gpu.bf16_tflops * 1e12)


def run_params(run: RunSpec, extra: Mapping[str, Any] | None = None) -> dict[str, str | int | float | bool]:
    """Logged once: the resolved settings, the plan (mesh, step), the model, the dataset's fingerprint, raydlc's
    version and git revision, the image, the cluster and the GPU nodes' type (what the environment says of them)."""
    from raydlc import __version__
    from raydlc.config import FIELDS

    dumped = run.train.model_dump(mode="json")
    settings = {name: dumped[f.key] for name, f in FIELDS.items() if f.section == "train"}  # by their env.sh names, as people set them
    plan = {"sharding": run.mesh.sharding, "mesh": list(run.mesh.shape), "nodes": run.mesh.nodes, "world_size": run.mesh.world_size,
            "global_batch": run.global_batch, "grad_accum": run.grad_accum, "bf16": run.bf16, "use_gpu": run.use_gpu,
            "note": run.layout_note or ""}
    where = {"image": os.environ.get("RAYDLC_DLC_IMAGE", ""), "cluster": os.environ.get("RAYDLC_CLUSTER_NAME", ""),
             "instance_type": os.environ.get("RAYDLC_GPU_INSTANCE_TYPE", "")}
    return flat({"config": settings, "plan": plan, "model": run.spec or run.train.model_id, "dataset": run.data_digest,
                 "raydlc": {"version": __version__, "git": git_revision()}, "run": {"name": run.run_name, "dir": run.run_dir},
                 **where, **(extra or {})})


def git_revision() -> str:
    """raydlc's git revision where it runs from a checkout (RAYDLC_GIT_REVISION wins: a cluster's copy has no .git)."""
    given = os.environ.get("RAYDLC_GIT_REVISION")
    if given:
        return given
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], check=False, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


# ---- the trackers: one class each, all behind the same five calls ---------------------------------


class Backend:
    """One tracker. `open` returns the last step the tracker already holds (0: none)."""

    name = "tracker"

    def open(self, *, start_step: int) -> int:
        return start_step

    def params(self, params: Mapping[str, Any]) -> None: ...

    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...

    def text(self, step: int, tag: str, text: str) -> None: ...

    def artifact(self, path: Path) -> None: ...

    def flush(self) -> None: ...

    def close(self, *, finished: bool | None) -> None: ...


class TensorBoard(Backend):
    """tensorboardX's event files in <run>/tb; on s3:// written locally and copied up (pyarrow) every
    UPLOAD_EVERY_S and at the end. A restart opens with `purge_step`: what an earlier attempt wrote from
    that step on is dropped by TensorBoard's readers."""

    name = "tensorboard"

    def __init__(self, where: TrackingRun) -> None:
        self.where, self.writer, self.uploaded = where, None, 0.0
        self.local = where.tb_dir if not storage.is_uri(where.tb_dir) else tempfile.mkdtemp(prefix="raydlc-tb-")

    def open(self, *, start_step: int) -> int:
        from tensorboardX import SummaryWriter

        Path(self.local).mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(logdir=self.local, purge_step=start_step + 1 if start_step > 0 else None, flush_secs=10)
        return start_step

    def params(self, params: Mapping[str, Any]) -> None:
        from tensorboardX.summary import hparams

        for summary in hparams(dict(params), {"train/loss": math.nan}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("config", "\n".join(f"    {k} = {v}" for k, v in params.items()), 0)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def text(self, step: int, tag: str, text: str) -> None:
        self.writer.add_text(tag, text, step)

    def artifact(self, path: Path) -> None:
        if path.suffix == ".png":
            if importlib.util.find_spec("matplotlib") is None:  # the DLC image has none: the scalars are the plot there
                return
            import matplotlib.image

            self.writer.add_image(path.stem, matplotlib.image.imread(str(path))[..., :3], dataformats="HWC")
        elif path.suffix in (".json", ".md"):  # the summary, the model card; the metrics are the scalars already
            self.writer.add_text(path.name, path.read_text()[:100_000])

    def flush(self) -> None:
        self.writer.flush()
        if self.local != self.where.tb_dir and time.monotonic() - self.uploaded >= UPLOAD_EVERY_S:
            self._upload()

    def _upload(self) -> None:
        from raydlc.edges.storage import publish

        publish(Path(self.local), self.where.tb_dir)
        self.uploaded = time.monotonic()

    def close(self, *, finished: bool | None) -> None:
        if self.writer is not None:
            self.writer.close()
            if self.local != self.where.tb_dir:
                self._upload()


class MLflow(Backend):
    """MlflowClient against MLFLOW_TRACKING_URI (a server, a file store, a SageMaker managed MLflow ARN): the
    run tagged with the job's tracking id is found again, else created; the token is MLflow's own
    MLFLOW_TRACKING_TOKEN from the environment."""

    name = "mlflow"

    def __init__(self, where: TrackingRun, uri: str | None, experiment: str | None) -> None:
        self.where, self.uri, self.experiment = where, uri, experiment or "raydlc"
        self.client: Any = None
        self.run_id: str | None = None

    def open(self, *, start_step: int) -> int:
        for k, v in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(k, v)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        exp = self.client.get_experiment_by_name(self.experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.experiment)
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{TAG}` = '{self.where.id}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            if found[0].info.status != "RUNNING":
                self.client.update_run(self.run_id, status="RUNNING")
            history = self.client.get_metric_history(self.run_id, "train/loss")
            return max((m.step for m in history), default=0)
        self.run_id = self.client.create_run(exp_id, run_name=self.where.name, tags={TAG: self.where.id}).info.run_id
        return 0

    def params(self, params: Mapping[str, Any]) -> None:
        """Params are immutable in MLflow: a resumed run logs only the ones it lacks."""
        from mlflow.entities import Param

        have = self.client.get_run(self.run_id).data.params
        new = [Param(k[:250], str(v)[:6000]) for k, v in params.items() if k[:250] not in have]
        for i in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[i:i + 100])

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def text(self, step: int, tag: str, text: str) -> None:
        self.client.log_text(self.run_id, text, f"{tag}/step-{step:08d}.txt")

    def artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self, *, finished: bool | None) -> None:
        """A worker's attempt leaves the run RUNNING (a restart continues it); the driver ends it."""
        if self.run_id is not None and finished is not None:
            self.client.set_terminated(self.run_id, "FINISHED" if finished else "FAILED")


class WandB(Backend):
    """wandb with the job's tracking id as the run id (`resume="allow"`); WANDB_MODE offline writes a run
    directory under <run>/wandb that `wandb sync` uploads later; WANDB_API_KEY comes from the environment."""

    name = "wandb"

    def __init__(self, where: TrackingRun, project: str | None, entity: str | None, mode: str) -> None:
        self.where, self.project, self.entity, self.mode = where, project or "raydlc", entity, mode
        self.run: Any = None

    def open(self, *, start_step: int) -> int:
        import wandb

        Path(self.where.wandb_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=self.project, entity=self.entity, id=self.where.id, name=self.where.name, resume="allow",
                              mode=self.mode, dir=self.where.wandb_dir, reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True))
        held = int(getattr(self.run, "starting_step", 0) or 0)  # online: the steps the server holds; offline: 0
        return max(held - 1, 0)

    def params(self, params: Mapping[str, Any]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """W&B's steps only go up within a run: an event of an earlier step (a checkpoint sealed after later steps
        were read) goes at the current one; its text says its step."""
        self.last = max(step, getattr(self, "last", 0))
        self.run.log(dict(values), step=self.last)

    def text(self, step: int, tag: str, text: str) -> None:
        self.run.log({tag: f"step {step}: {text}"}, step=max(step, getattr(self, "last", 0)))

    def artifact(self, path: Path) -> None:
        self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self, *, finished: bool | None) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if finished is False else 0)


def backends(train: TrainConfig, where: TrackingRun) -> list[Backend]:
    made: dict[str, Callable[[], Backend]] = {
        "tensorboard": lambda: TensorBoard(where),
        "mlflow": lambda: MLflow(where, train.mlflow_tracking_uri, train.mlflow_experiment_name),
        "wandb": lambda: WandB(where, train.wandb_project, train.wandb_entity, train.wandb_mode),
    }
    return [made[k]() for k in chosen(train.tracking)]


# ---- the component --------------------------------------------------------------------------------


def warn(line: str) -> None:
    print(f"[raydlc] warning: {line}", file=sys.stderr, flush=True)


def reason(e: BaseException) -> str:
    """One short line: a tracker's error can be long (an HTML page from a proxy)."""
    text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class Tracking:
    """Rank 0's trackers behind one queue and one thread: the loop's calls only enqueue. A tracker whose call
    raises is dropped with one warning naming it (`stopped`); the others go on, and so does training."""

    def __init__(self, trackers: Sequence[Backend], *, mfu: float | None = None, on_warning: Callable[[str], None] = warn) -> None:
        self.trackers = list(trackers)
        self.mfu, self.on_warning = mfu, on_warning
        self.stopped: dict[str, str] = {}
        self.held: dict[str, int] = {}  # per tracker: the last step it holds
        self.skipped = 0
        self.jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.thread: threading.Thread | None = None
        if self.trackers:
            self.thread = threading.Thread(target=self._work, name="raydlc-tracking", daemon=True)
            self.thread.start()

    @property
    def on(self) -> bool:
        return bool(self.trackers)

    # -- the loop's calls (enqueue only) --

    def start(self, *, start_step: int, history: Sequence[dict[str, Any]], params: Mapping[str, Any], restarted: bool = False) -> None:
        """Open each tracker, log the run's parameters once, fill the steps before `start_step` it lacks, and say
        why this attempt started where it did (a restart, a resume)."""
        if not self.on:
            return
        past = list(history)
        self._submit(lambda: self._open(start_step, past, params))
        if start_step > 0:
            self.event(start_step, "restart" if restarted else "resume", f"continued after step {start_step}")

    def records(self, records: Sequence[dict[str, Any]]) -> None:
        """The records the loop just read (steps and evals), in order."""
        if self.on and records:
            batch = list(records)
            self._submit(lambda: self._log(batch))

    def event(self, step: int, kind: str, text: str = "") -> None:
        """A moment of the run: checkpoint_saved, preemption_notice, restart, resume, stall."""
        if self.on:
            self._submit(lambda: self._each(lambda b: (b.scalars(step, {f"events/{kind}": 1.0}), b.text(step, "events", f"{kind}: {text}"))))

    def checkpoint(self, step: int) -> None:
        """A checkpoint handed to Ray (train.loop.Saver's `on_sealed`): a `checkpoint_saved` event."""
        self.event(step, "checkpoint_saved", f"checkpoint of step {step}")

    def summary(self) -> dict[str, Any]:
        """What the run's summary says of its trackers: the ones that stopped, and why."""
        return {"trackers_stopped": dict(self.stopped)} if self.stopped else {}

    def close(self, *, finished: bool | None = None, timeout: float = CLOSE_S) -> dict[str, Any]:
        """Let the thread write what is queued and close each tracker, waiting at most `timeout`; `finished`: the
        run ended (True), failed (False), or only this attempt's writing ends (None: a worker's, the run goes on)."""
        if self.thread is None:
            return self.summary()
        self._submit(lambda: self._each(lambda b: b.close(finished=finished)))
        self.jobs.put(None)
        self.thread.join(timeout)
        if self.thread.is_alive():
            for b in self.trackers:
                self._stop(b, f"did not finish writing within {timeout:g} s")
        self.thread = None
        return self.summary()

    # -- the thread --

    def _submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()

    def _stop(self, b: Backend, why: str) -> None:
        if b.name not in self.stopped:
            self.stopped[b.name] = why
            self.on_warning(f"tracker {b.name} stopped ({why}); training goes on without it")
        if b in self.trackers:
            self.trackers.remove(b)

    def _each(self, call: Callable[[Backend], Any], trackers: Sequence[Backend] | None = None) -> None:
        for b in list(self.trackers if trackers is None else trackers):
            try:
                call(b)
            except Exception as e:  # a tracker never fails the run
                self._stop(b, reason(e))

    def _open(self, start_step: int, history: list[dict[str, Any]], params: Mapping[str, Any]) -> None:
        def one(b: Backend) -> None:
            self.held[b.name] = b.open(start_step=start_step)
            b.params(params)

        self._each(one)
        self._log(history)

    def _log(self, records: Sequence[dict[str, Any]]) -> None:
        rows: list[tuple[int, dict[str, float]]] = []
        for r in records:
            values = scalars_of(r, skipped_so_far=self.skipped, mfu_per_token_s=self.mfu)
            self.skipped += bool("loss" in r and r.get("skipped"))
            if values:
                rows.append((int(r["step"]), values))

        def one(b: Backend) -> None:
            held = self.held.get(b.name, 0)
            for step, values in rows:
                if step > held:
                    b.scalars(step, values)
            self.held[b.name] = max([held, *(s for s, v in rows if "train/loss" in v)])
            b.flush()

        self._each(one)


def start(run: RunSpec, rank: int, *, start_step: int, history: Sequence[dict[str, Any]], restarted: bool, device_name: str | None) -> Tracking:
    """Rank 0's trackers for this attempt, opened (in their thread); other ranks, and TRACKING=none, get none."""
    if rank != 0 or not chosen(run.train.tracking):
        return Tracking([])
    t = Tracking(backends(run.train, TrackingRun.of(run)), mfu=mfu_factor(run, device_name))
    t.start(start_step=start_step, history=history, params=run_params(run), restarted=restarted)
    return t


# ---- the run's end, on the driver ------------------------------------------------------------------


def close_run(end: Any) -> dict[str, Any]:
    """train.ending's step: the summary, the evaluation, the loss plot and the model card into the job's tracker
    run, which ends there; and how to open it (`tracking`)."""
    run: RunSpec = end.spec
    summary = dict(end.summary)
    where = TrackingRun.of(run)
    kinds = chosen(run.train.tracking)
    if not kinds:
        return {}
    opened = {"tensorboard": f"tensorboard --logdir {where.tb_dir}"} if "tensorboard" in kinds else {}
    ending = Tracking(backends(run.train, where))
    step = int(summary.get("steps") or run.train.steps)
    with tempfile.TemporaryDirectory(prefix="raydlc-tracking-end-") as tmp:
        files = end_files(summary, Path(tmp))

        def log(b: Backend) -> None:
            b.open(start_step=step)
            numbers = {f"summary/{k}": float(v) for k, v in flat(summary).items() if isinstance(v, int | float) and not isinstance(v, bool)}
            b.scalars(step, numbers)
            for f in files:
                b.artifact(f)

        ending._submit(lambda: ending._each(log))
        stopped = ending.close(finished=True)
    out: dict[str, Any] = {"tracking": opened | {k: where.id for k in kinds if k != "tensorboard"}}
    failed = {**(summary.get("trackers_stopped") or {}), **(stopped.get("trackers_stopped") or {})}
    if failed:
        out["trackers_stopped"] = failed
    return out


def failed(run: RunSpec, why: BaseException, *, step: int | None, timeout: float = 30.0) -> None:
    """The driver stopped the run (a stall, its deadline): the event into the job's tracker run, which ends FAILED
    in MLflow; a stalled run never reaches train.ending, and a failing tracker is a warning here too."""
    kinds = chosen(run.train.tracking)
    if not kinds:
        return
    t = Tracking(backends(run.train, TrackingRun.of(run)))
    at = int(step or 0)
    kind = "stall" if type(why).__name__ == "Stalled" else "stopped"
    t._submit(lambda: t._each(lambda b: (b.open(start_step=at), b.scalars(at, {f"events/{kind}": 1.0}), b.text(at, "events", f"{kind}: {why}"))))
    t.close(finished=False, timeout=timeout)


def end_files(summary: Mapping[str, Any], tmp: Path) -> list[Path]:
    """The run's end as files: summary.json, metrics.jsonl, and what earlier steps of the run's end left as local
    files (the loss plot `plot`, the evaluation `eval`, the model card `model_card`; `<run>/loss.png` when drawn).
    The loss plot is the run's end's first step (evaluate.ending.loss_plot); one drawn into object storage is
    fetched into `tmp` to be logged. Where none was drawn (no matplotlib), the trackers chart the per-step
    metrics themselves."""
    import json

    out = [tmp / "summary.json"]
    out[0].write_text(json.dumps(dict(summary), indent=1, default=str))
    plot = summary.get("plot")
    if isinstance(plot, str) and storage.is_uri(plot):
        from raydlc.edges.storage import read_bytes

        try:
            (tmp / "loss.png").write_bytes(read_bytes(plot))
            out.append(tmp / "loss.png")
        except (OSError, RaydlcError):
            pass  # the plot is in the run's storage still; the trackers have its numbers
    run_dir = summary.get("run_dir")
    candidates: list[Any] = [summary.get("metrics"), f"{run_dir}/loss.png" if run_dir else None]
    for key in ("plot", "eval", "model_card"):
        v = summary.get(key)
        candidates.append(v.get("path") if isinstance(v, Mapping) else v)
    for path in dict.fromkeys(c for c in candidates if isinstance(c, str)):
        if not storage.is_uri(path) and Path(path).is_file():
            out.append(Path(path))
    return out
