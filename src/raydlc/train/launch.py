"""From settings to a finished run: prepare the inputs in the driver, resolve the run on what Ray
grants, run TorchTrainer, and summarise from what Ray hands back.

The request is one `TrainConfig` and `RunTarget` (train.runspec) says where the run goes; neither is rebound.
Everything that can be wrong with the input is found in `prepare` (train.prepare), before Ray
starts a worker; the run is resolved once, here, from the workers Ray can place, into the
RunSpec every worker receives (train.resolve). Progress and metrics come back through Ray (an
actor, Ray Train's result), so a driver that joined a multi-node cluster by address sees them
like a local one.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc import interrupts, storage
from raydlc.config import TrainConfig, with_local_defaults
from raydlc.edges import poll, ray_runtime
from raydlc.errors import InputError, TrainError
from raydlc.jobs.restarts import Fold, fold
from raydlc.train import ending
from raydlc.train.prepare import Checked, check, prepare
from raydlc.train.resolve import Granted, resolve, resolve_resources
from raydlc.train.runspec import Prepared, RunSpec, RunTarget

if TYPE_CHECKING:
    from raydlc.config import Config

NODE_WAIT_S = 600.0  # on a cluster, how long to wait for worker nodes still joining before refusing the run
# GPU workers scaling up from zero: as long as `submit` follows them (coldstart.NODE_PROVISION_S + POD_START_S)
COLD_WAIT_S = 30 * 60.0
PROGRESS_EVERY_S = 1.0  # how often the driver drains rank 0's progress (rank 0 posts at most this often too)


def settings(cfg: Config, *, local: bool) -> TrainConfig:
    """The run's settings: the config's train section, with the local-run table where untouched,
    its paths made absolute here (Ray's workers do not start in the driver's directory)."""
    return absolute_paths(with_local_defaults(cfg).train if local else cfg.train)


def absolute_paths(train: TrainConfig, cwd: Path | None = None) -> TrainConfig:
    """MODEL_ID (a local directory), DATA (a local file or directory), RESUME_FROM and STORAGE_PATH
    as absolute paths against `cwd`, so a worker finds what the driver checked; ids and URIs stay."""
    base = cwd or Path.cwd()

    def local(value: str | None, *, must_exist: bool) -> str | None:
        if not value or storage.is_uri(value):
            return value
        p = base / Path(value).expanduser()
        try:
            return str(p.resolve()) if p.exists() or not must_exist else value
        except RuntimeError:  # pathlib's "Symlink loop" (Python < 3.13; later ones raise OSError ELOOP)
            raise InputError(f"{value}: is a symlink loop (too many levels of symbolic links)", hint="pass a real path") from None
        except OSError as e:
            from raydlc.edges.files import os_error

            raise os_error(e, value) from None

    changes = {
        "model_id": local(train.model_id, must_exist=True), "data": local(train.data, must_exist=True),
        "resume_from": local(train.resume_from, must_exist=False), "storage_path": local(train.storage_path, must_exist=False),
    }
    changed = {k: v for k, v in changes.items() if v != getattr(train, k)}
    return train.updated(**changed) if changed else train


def target(cfg: Config, *, local: bool, address: str | None = None) -> RunTarget:
    """Where the run goes; a run that joins a cluster (not local, or given an address) plans with
    the config's GPU node type, which a local Ray does not have."""
    where = RunTarget(address=address)
    g = cfg.gpu_nodes
    return where if local and where.local else replace(where, instance_type=g.instance_type, gpu_usd_per_node_hour=g.usd_per_node_hour)


# ---- the edge: Ray ------------------------------------------------------------------------


ProgressFn = Callable[[dict[str, Any]], None]


def run(
    train: TrainConfig, where: RunTarget | None = None, *, on_progress: ProgressFn | None = None, prepared: Prepared | None = None,
    checked: Checked | None = None,
) -> dict[str, Any]:
    """Check, start (or join) Ray, prepare the dataset on it, resolve the run on what it grants, train, and summarise.

    With a known worker count the inputs are checked before Ray starts at all; with `0` (one
    per GPU) they wait for the cluster's resources. The dataset is prepared (Ray Data) or found
    before any worker starts.
    """
    where = where or RunTarget()
    started = time.time()  # a budget's clock: the run occupies its nodes from here
    if prepared is None and checked is None and train.num_workers > 0:
        checked = check(train, where)  # before Ray starts
    say = on_progress or (lambda record: None)
    say({"stage": "phase", "text": "starting Ray" if where.local else "joining the Ray cluster"})
    with _swept(where), ray_runtime.connected(where.address, workers=train.num_workers, log_to_driver=where.log_to_driver, env=where.env):
        if not where.local and train.use_gpu and train.num_workers > 0:  # GPU workers that may be at zero come when asked for
            ray_runtime.await_resources("GPU", train.num_workers, wait_s=COLD_WAIT_S)
        interrupts.reassert()  # Ctrl-C still reaches this process once Ray has started (raydlc.interrupts)
        resources = ray_runtime.cluster_resources()
        workers = resolve_resources(train, resources)
        say({"stage": "phase", "text": "preparing data"})
        p = prepared or prepare(train, where, workers=workers.num_workers, checked=checked, on_progress=on_progress)
        interrupts.reassert()
        slots = ray_runtime.node_capacities(
            "GPU" if workers.use_gpu else "CPU", at_least=workers.num_workers, wait_s=0.0 if where.local else NODE_WAIT_S
        )
        spec = resolve(train, where, p, Granted(resources, tuple(slots)), started_at=started, now=time.time())
        checked = _preflight(spec, where, p.storage) if spec.train.preflight else None
        say({"stage": "training", "steps": train.steps, "workers": spec.mesh.world_size, "global_batch": spec.global_batch,
             "train_sequences": p.n_train})
        summary = _fit(spec, p, where, on_progress)
        summary = summary if checked is None else {**summary, "preflight": checked}
        return ending.finish(spec, summary)  # loss plot, evaluation, model card, trackers: the run's end (train.ending)


@contextlib.contextmanager
def _swept(where: RunTarget) -> Any:
    """A local run's workers share this machine's temp directory: once its Ray is down, the staging
    folders its workers left (a save or export cut by Ctrl-C or a failure) go (train.checkpoint.sweep_staging)."""
    try:
        yield
    finally:
        if where.local:
            from raydlc.train.checkpoint import sweep_staging

            sweep_staging(wait_s=1.0)


def _preflight(spec: RunSpec, where: RunTarget, storage_path: str) -> dict[str, Any]:
    """The collective bandwidth check on the workers the job will use; a failure stops the run here.

    A network verdict needs several GPU nodes of a known type; on CPUs (gloo) the figures are
    reported without one.
    """
    from raydlc.checks import preflight

    mesh = spec.mesh
    per_node = mesh.ranks_per_node[0] if len(set(mesh.ranks_per_node)) == 1 else None
    expectation = preflight.expectation_for(where.instance_type, per_node) if spec.use_gpu and mesh.nodes > 1 else None
    report = preflight.run_preflight(num_workers=mesh.world_size, use_gpu=spec.use_gpu, expectation=expectation, storage_path=storage_path)
    if not report.ok:
        failed = "; ".join(f.message for f in report.findings if f.level == "fail")
        raise TrainError(f"preflight failed before training: {failed}", hint="see `raydlc preflight --json` for the figures")
    return report.to_dict()


# The CUDA caching allocator maps memory in growable segments instead of fixed blocks: FSDP2's
# all-gather and reduce-scatter buffers of different sizes come and go every unit, and without it
# the freed blocks fragment the pool (reserved far above allocated, OOM with memory free).
GPU_WORKER_ENV: dict[str, str] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def worker_env(spec: RunSpec, extra: dict[str, str] | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The training workers' environment: Ray's (edges.ray_runtime), and on GPU workers
    GPU_WORKER_ENV, where a value in the driver's environment (`environ`) or `extra` wins."""
    env = os.environ if environ is None else environ
    gpu = {k: env.get(k, v) for k, v in GPU_WORKER_ENV.items()} if spec.use_gpu else {}
    return {**ray_runtime.worker_env(), **gpu, **(extra or {})}


def _fit(spec: RunSpec, p: Prepared, where: RunTarget, on_progress: ProgressFn | None) -> dict[str, Any]:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from raydlc.train.loop import train_func
    from raydlc.train.stall import StallGuard, Watch

    box = ray_runtime.mailbox()
    progress_file = None if storage.is_uri(spec.run_dir) else Path(spec.run_dir) / "progress.jsonl"
    stop = threading.Event()
    guard = StallGuard.of(spec.train.stall_minutes, spec.train.stall_first_minutes)
    trainer = _trainer_class()(
        train_func,
        train_loop_config={"run": spec.to_wire(), "data": p.data.to_dict(), "progress": box},
        scaling_config=ScalingConfig(num_workers=spec.mesh.world_size, use_gpu=spec.use_gpu),
        run_config=RunConfig(
            name=spec.run_name,
            storage_path=p.storage,
            failure_config=FailureConfig(max_failures=spec.train.max_failures, max_preemption_failures=spec.train.max_preemptions),
            checkpoint_config=CheckpointConfig(num_to_keep=spec.train.checkpoint_keep or None),
            worker_runtime_env={"env_vars": worker_env(spec, where.env)},
        ),
    )
    t0 = time.perf_counter()
    follower = _Follower(box, on_progress, progress_file, stop, guard, Watch(since=time.monotonic()), spec, trainer, deadline_at=where.deadline_at)
    watcher = threading.Thread(target=follower.run, daemon=True)
    watcher.start()
    try:
        result = trainer.fit()
    except Exception as e:  # Ray wraps worker errors in its own types
        if follower.stalled is not None:
            from raydlc.train.tracking import failed

            failed(spec, follower.stalled, step=follower.watch.step)  # the run ends here, never in train.ending
            raise follower.stalled from None
        hint = f"worker logs are in Ray's session dir; checkpoints under {spec.run_dir}"
        raise ray_runtime.run_error(e, f"training run {spec.run_name}", hint) from e
    finally:
        stop.set()
        watcher.join(timeout=5)
    if follower.stalled is not None:
        raise follower.stalled
    return {**_summary(spec, p, result, time.perf_counter() - t0), "restarts": list(follower.restarts.restarts)}


class DeadlinePassed(TrainError):
    """The job's deadline passed before the run ended; the driver stopped it (exit 1), its checkpoints kept."""


def _trainer_class() -> type:
    """TorchTrainer that keeps its controller's handle, so the stall guard can abort the run
    (`controller.abort` stops the workers and ends the controller, and `fit()` raises), and whose
    Ctrl-C does not wait.

    Ray 2.58's own SIGINT handler (`_register_sigint_handler`) waits in the handler for the abort
    (`ray.get(controller.abort.remote())`: the workers stopped gracefully, seconds to tens of
    seconds on a loaded machine) and may `sys.exit(0)`. Here the abort is asked for and not waited
    on, and the handler raises KeyboardInterrupt at once: the driver's way out (a local Ray is shut
    down, which ends its workers) takes over."""
    from ray.train.torch import TorchTrainer

    class Trainer(TorchTrainer):  # type: ignore[misc]
        controller: Any = None

        def _register_sigint_handler(self, controller: Any) -> None:
            import signal

            self.controller = controller

            def interrupted(signum: int, frame: Any) -> None:
                with contextlib.suppress(Exception):
                    controller.abort.remote()  # a cluster's workers stop too; not waited on
                raise KeyboardInterrupt

            signal.signal(signal.SIGINT, interrupted)

    return Trainer


@dataclass
class _Follower:
    """The driver's second thread: drains the mailbox, keeps `progress.jsonl`, and runs the stall guard.

    Rank 0's records go to the progress callback (restarts re-post earlier steps, which is fine
    to re-show); every rank's heartbeats feed the guard's `Watch`. Progress is a display aid: a
    failure here never fails the run. A stall sets `stalled` and aborts the run.
    """

    box: Any
    on_progress: ProgressFn | None
    path: Path | None
    stop: threading.Event
    guard: Any  # train.stall.StallGuard
    watch: Any  # train.stall.Watch
    spec: RunSpec
    trainer: Any
    stalled: Exception | None = None  # why the run was aborted: a stall, or its deadline
    deadline_at: float | None = None  # RunTarget.deadline_at
    restarts: Fold = field(default_factory=Fold)  # rank 0's records folded (jobs.restarts): the summary's `restarts`

    def run(self) -> None:
        while True:
            last = self.stop.wait(PROGRESS_EVERY_S)
            self.take(self.drain())
            if last:
                return
            if self.deadline_at is not None and time.time() >= self.deadline_at:
                self.end_deadline()
                return
            decision = self.guard.check(time.monotonic(), self.watch.since, self.watch.step, first=self.watch.first)
            if decision.stalled:
                self.end_stalled(decision)
                return

    def end_deadline(self) -> None:
        """Past the job's deadline: set the error the run ends with and abort it (KubeRay would leave it running)."""
        self.stalled = DeadlinePassed(
            f"training run {self.spec.run_name} stopped: past its deadline (JOB_DEADLINE_S, or what JOB_MAX_COST_USD buys; "
            "the RayJob's activeDeadlineSeconds)", hint=f"its checkpoints under {self.spec.run_dir} are kept: --resume continues from the last")
        if self.on_progress is not None:
            self.on_progress({"stage": "deadline", "reason": str(self.stalled)})
        self._abort()

    def drain(self) -> list[dict[str, Any]]:
        try:
            records = ray_runtime.drain(self.box)
        except Exception:
            return []
        now = time.monotonic()
        for r in records:
            self.watch.see(r, now)
        return records

    def take(self, records: list[dict[str, Any]]) -> None:
        shown = [self.costed(r) for r in records if "beat" not in r and "stacks" not in r]
        self.restarts = fold(shown, self.restarts)
        if self.path is not None and shown:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:
                    f.write("".join(json.dumps(r) + "\n" for r in shown))
            except OSError:
                self.path = None
        if self.on_progress is not None:
            for r in shown:
                self.on_progress(r)

    def costed(self, rec: dict[str, Any]) -> dict[str, Any]:
        """A step's record with the spend so far and the forecast to the last step, when the run has a budget."""
        b = self.spec.budget
        if b is None or "loss" not in rec:
            return rec
        from raydlc.planner.budget import spend

        return {**rec, "cost": spend(b, time.time(), step=rec["step"], steps=self.spec.train.steps, step_s=rec.get("step_time_s")).to_dict()}

    def end_stalled(self, decision: Any) -> None:
        """Ask every rank for its stacks, write the evidence, set the error the run ends with, abort the run."""
        from raydlc.train import stall

        def stacks_in() -> bool:
            """Whether every rank's stacks came; if not, what the mailbox holds is taken in."""
            if set(self.watch.ranks) <= set(self.watch.stacks):
                return True
            self.take(self.drain())
            return False

        try:
            self.box.ask.remote("stacks")
            poll.until(stacks_in, bool, what="every rank's stacks", timeout=3 * self.guard.beat_every_s() + 5.0, interval=0.5,
                       or_last=True)
        except Exception:
            pass
        doc = stall.evidence(self.watch, decision, time.monotonic())
        try:
            path = stall.write_evidence(doc, self.watch, self.spec.run_dir)
        except Exception as e:  # the reason still reaches the person
            path = f"(not written: {ray_runtime.root_cause(e)})"
        if self.on_progress is not None:
            self.on_progress({"stage": "stalled", "reason": doc["reason"], "evidence": path})
        self.stalled = stall.Stalled(f"training run {self.spec.run_name} stopped: {doc['reason']}",
                                     hint=f"evidence: {path}; its checkpoints under {self.spec.run_dir} are kept (--resume continues from the last)")
        self._abort()  # fit() raises in the main thread, which finds `stalled` set

    def _abort(self) -> None:
        import ray

        controller = getattr(self.trainer, "controller", None)
        if controller is None:
            return
        with contextlib.suppress(Exception):  # the controller ends itself (exit_actor): its call fails by design
            ray.get(controller.abort.remote(), timeout=120)


def _resumed(p: Prepared, steps: Any) -> dict[str, Any]:
    """Which steps this invocation trained (`201–300`), and the run it continued (the checkpoint's run folder):
    a resumed run's first loss is from before the resume, so the summary says where this part began."""
    first = (p.resume_step or 0) + 1
    ran = f"{first}–{int(steps)}" if isinstance(steps, (int, float)) and int(steps) >= first else "none"
    run = p.resume_from.rstrip("/").rsplit("/", 2)[-2] if p.resume_from and "/" in p.resume_from.rstrip("/") else None
    return {"steps_run": ran, "resumed_from_run": run}


def _summary(spec: RunSpec, p: Prepared, result: Any, wall: float) -> dict[str, Any]:
    """From Ray Train's result (the metrics reported with the last checkpoint), not from a file."""
    last = dict(result.metrics or {})
    s = {k.removeprefix("summary_"): v for k, v in last.items() if k.startswith("summary_")}
    ckpt = result.checkpoint.path if result.checkpoint is not None else None
    run_dir = spec.run_dir
    mesh = spec.mesh
    cost = None
    if spec.budget is not None:
        from raydlc.planner import budget

        spent = budget.spend(spec.budget, time.time(), step=int(s.get("steps") or 0), steps=spec.train.steps, step_s=s.get("step_time_s"))
        label = spec.budget.price_label or (budget.price_note() if spec.budget.instance_type else "given by the caller")
        cost = {**spent.to_dict(), "price": label}
    return {
        **{k: s.get(k) for k in ("steps", "first_loss", "final_loss", "eval_loss", "tokens_per_s", "step_time_s", "peak_mem_mb", "peak_reserved_mb", "overfitting")},
        "loss_drop": (1 - s["final_loss"] / s["first_loss"]) if s.get("first_loss") and s.get("final_loss") is not None else None,
        "model": spec.train.model_id,
        "workers": mesh.world_size,
        "sharding": mesh.sharding,
        "mesh": {
            "shape": list(mesh.shape),
            "replicas": mesh.replicas,
            "shard": mesh.shard,
            "ranks_per_node": mesh.ranks_per_node,
            "built": last.get("mesh_shape"),
        },
        "global_batch": spec.global_batch,
        "micro_batch": spec.train.batch_size,
        "grad_accum": spec.train.grad_accum,
        "grad_sync": spec.train.grad_sync,
        "layout_note": spec.layout_note,
        "seq_len": spec.train.seq_len,
        "train_sequences": p.n_train,
        "epochs": epochs(s.get("steps"), spec.global_batch, p.n_train),
        **trained_params(spec, p),
        "dataset": p.data.dest,
        "dataset_reused": p.dataset_reused,
        "eval_sequences": p.n_eval,
        "resumed_from": p.resume_from,
        **_resumed(p, s.get("steps")),
        "run_name": spec.run_name,
        "run_dir": run_dir,
        "checkpoint": ckpt,
        "export": f"{run_dir}/export",
        "metrics": f"{run_dir}/metrics.jsonl",
        "plot": None,  # drawn by the run's end, where matplotlib is (raydlc.evaluate.plot)
        "wall_s": wall,
        "stopped_by": s.get("stopped_by"),
        "stop_reason": s.get("stop_reason"),
        "cost": cost,
        "skipped_steps": s.get("skipped_steps"),
        **({"trackers_stopped": s["trackers_stopped"]} if s.get("trackers_stopped") else {}),
    }


def epochs(steps: int | None, global_batch: int, train_sequences: int) -> float | None:
    """Passes over the training split: steps x sequences a step / training sequences (the loader
    cycles through them in a fresh order each pass)."""
    return steps * global_batch / train_sequences if steps and train_sequences else None


def trained_params(spec: RunSpec, p: Prepared) -> dict[str, Any]:
    """`params` (trainable and total, from the architecture) and, on a LoRA run, `lora`: its rank,
    alpha, targets and where the adapter went; what the summary says was trained."""
    s, model = spec.train, p.model
    out: dict[str, Any] = {"lora": None, "params": None}
    if s.lora_rank > 0:
        meta = s.lora_meta()  # the alpha and targets the workers use (blank: 2 x rank, the family's seven projections)
        targets = meta["lora_targets"].split(",") if "lora_targets" in meta else [meta["lora_target_regex"]]  # names, or the one pattern
        out["lora"] = {"rank": s.lora_rank, "alpha": meta["lora_alpha"], "targets": targets,
                       "merged": s.lora_merge, "adapter": f"{spec.run_dir}/export/adapter"}
        if s.lora_modules_to_save:
            out["lora"]["modules_to_save"] = list(s.lora_modules_to_save_list)
    if model is not None:
        from raydlc.facts.models import lora_params_of, saved_params

        base = model.param_count()
        adapters = lora_params_of(model, s.lora_rank, s.lora_targets_list, s.lora_target_regex) if out["lora"] else 0
        trained = adapters + saved_params(model, s.lora_modules_to_save_list) if out["lora"] else base
        out["params"] = {"trainable": trained, "total": base + adapters}
    return out
