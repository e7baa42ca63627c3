"""From settings to a finished run: prepare data in the driver, then run TorchTrainer.

`TrainSpec` is a plain record of settings and `run` returns a plain summary dict, so callers
(the CLI, `python -m raydlc.train` on the cluster, benchmarks, the preflight) only build one
and read the other. Everything that can be wrong with the input is found
in `prepare`, before Ray starts a worker.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.errors import CheckpointError, InputError, TrainError

if TYPE_CHECKING:
    from raydlc.train.model import ModelSpec

Sharding = str  # "fsdp" | "hsdp" | "auto"


@dataclass(frozen=True)
class TrainSpec:
    model: str = "tiny"
    data: str | None = None
    steps: int = 300
    seq_len: int = 128
    batch_size: int = 8
    learning_rate: float = 2e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    num_workers: int = 2  # 0: one per GPU of the Ray cluster
    use_gpu: bool | None = None  # None: when the Ray cluster has GPUs
    gpus_per_node: int = 1
    instance_type: str | None = None  # the GPU nodes' type: the planner's network and GPU facts
    sharding: Sharding = "auto"
    hsdp_replicas: int | None = None
    bf16: bool | None = None  # None: bf16 on GPUs, fp32 on CPUs
    activation_checkpointing: bool = False
    storage_path: str = "raydlc-out"
    run_name: str | None = None
    checkpoint_every: int = 100
    report_every: int = 10
    eval_every: int = 0  # 0: at each checkpoint
    max_failures: int = 1
    resume: bool = False
    resume_from: str | None = None
    seed: int = 0
    eval_fraction: float = 0.05
    address: str | None = None
    log_to_driver: bool = True
    preflight: bool = False  # measure the collectives on the same workers first; fail before training
    crash: dict[str, int] | None = None  # {"rank": r, "step": s}: fault-injection for tests and drills
    env: dict[str, str] = field(default_factory=dict)


# ---- pure decisions ------------------------------------------------------------------------


def resolve_sharding(
    requested: Sharding,
    num_nodes: int,
    gpus_per_node: int,
    *,
    model: ModelSpec | None = None,
    seq_len: int = 128,
    micro_batch: int = 1,
    instance_type: str | None = None,
) -> str:
    """The concrete layout for `auto`: the planner's choice (raydlc.plan) on a multi-node cluster.

    On one node HSDP would have a single replica, which is FSDP; without a known architecture
    (a hub id raydlc has no spec for) or GPU node type (a local run) there is nothing to plan
    with, so FSDP it is.
    """
    if requested not in ("fsdp", "hsdp", "auto"):
        raise InputError(f"--sharding {requested!r} is not one of fsdp, hsdp, auto")
    if requested != "auto":
        return requested
    if num_nodes <= 1 or model is None or instance_type is None:
        return "fsdp"
    from raydlc.plan import recommend_sharding

    return recommend_sharding(model, num_nodes, gpus_per_node, None, seq_len, micro_batch, instance_type=instance_type)


def mesh_shape(sharding: str, world_size: int, local_world_size: int, hsdp_replicas: int | None = None) -> tuple[int, ...]:
    """(world,) for FSDP; (replicas, shard) for HSDP: replicate across nodes, shard within one."""
    if sharding == "fsdp":
        return (world_size,)
    replicas = hsdp_replicas or max(1, world_size // max(1, local_world_size))
    if world_size % replicas:
        raise InputError(f"HSDP: {world_size} workers do not split into {replicas} replicas")
    return (replicas, world_size // replicas)


def new_run_name() -> str:
    t = time.time()
    return time.strftime("run-%Y%m%d-%H%M%S", time.gmtime(t)) + f"-{int(t * 1e6) % 1_000_000:06d}"


def storage_uri(path: str) -> str:
    """Ray workers do not start in the driver's directory: local paths must be absolute."""
    return path if "://" in path else str(Path(path).expanduser().resolve())


# Where `raydlc train` on a laptop differs from the cluster job: a model and a run size that
# show the loss falling within minutes on 2 CPU cores. Applied only to values whose source
# is `default`; env, file and flags win.
LOCAL_DEFAULTS: dict[str, Any] = {
    "MODEL_ID": "tiny",
    "STEPS": 300,
    "SEQ_LEN": 128,
    "BATCH_SIZE": 8,
    "LEARNING_RATE": 2e-3,
    "NUM_WORKERS": 2,
    "CHECKPOINT_EVERY": 100,
}
DEFAULT_OUT = "raydlc-out"


def spec_from_config(cfg: Any, *, local: bool, **settings: Any) -> TrainSpec:
    """A TrainSpec from a Config; `settings` are TrainSpec fields the caller sets directly."""

    def pick(name: str) -> Any:
        if local and cfg.source(name) == "default" and name in LOCAL_DEFAULTS:
            return LOCAL_DEFAULTS[name]
        return cfg.value(name)

    t = cfg.train
    base = TrainSpec(
        model=pick("MODEL_ID"),
        data=t.data,
        steps=pick("STEPS"),
        seq_len=pick("SEQ_LEN"),
        batch_size=pick("BATCH_SIZE"),
        learning_rate=pick("LEARNING_RATE"),
        num_workers=pick("NUM_WORKERS"),
        checkpoint_every=pick("CHECKPOINT_EVERY"),
        storage_path=t.storage_path or DEFAULT_OUT,
        max_failures=t.max_failures,
        sharding=t.sharding,
        gpus_per_node=1 if local else cfg.gpu_nodes.gpus_per_node,
        instance_type=None if local else cfg.gpu_nodes.instance_type,
    )
    return replace(base, **{k: v for k, v in settings.items() if v is not None})


# ---- driver-side preparation ------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    spec: TrainSpec
    builtin: str | None
    arrays: dict[str, Any]
    tokenizer: dict[str, Any]
    sharding: str
    storage: str
    run_name: str
    resume_from: str | None
    n_train: int
    n_eval: int
    data_digest: str


def prepare(spec: TrainSpec) -> Prepared:
    """Check and build everything the workers need; raises `InputError`/`CheckpointError`."""
    from raydlc.train import data as D
    from raydlc.train import tokenizer as T
    from raydlc.train.model import SPECS, resolve_spec

    if spec.num_workers < 1:
        raise InputError(f"--workers must be at least 1, got {spec.num_workers}")
    if spec.batch_size < 1 or spec.seq_len < 2 or spec.steps < 1:
        raise InputError("steps, batch size must be at least 1 and seq len at least 2")
    builtin = spec.model.lower() if spec.model.lower() in SPECS else None
    if builtin is None and not Path(spec.model).expanduser().is_dir() and "/" not in spec.model:
        raise InputError(f"--model {spec.model!r}: not a built-in spec, a local directory or a hub id", hint=f"built-in specs: {', '.join(SPECS)}")
    model_spec = SPECS[builtin] if builtin else resolve_spec(spec.model)
    if model_spec is not None and spec.seq_len > model_spec.max_position_embeddings:
        raise InputError(f"--seq-len {spec.seq_len} exceeds the model's {model_spec.max_position_embeddings} positions")
    sharding = resolve_sharding(
        spec.sharding,
        max(1, spec.num_workers // max(1, spec.gpus_per_node)),
        spec.gpus_per_node,
        model=model_spec,
        seq_len=spec.seq_len,
        micro_batch=spec.batch_size,
        instance_type=spec.instance_type,
    )
    if sharding == "hsdp":
        mesh_shape("hsdp", spec.num_workers, spec.gpus_per_node, spec.hsdp_replicas)

    storage = storage_uri(spec.storage_path)
    resume_from = _resume_checkpoint(spec, storage)

    docs = D.load_documents(spec.data)
    vocab = min(model_spec.vocab_size, 4096) if builtin and model_spec else 0
    info, tok = T.for_model(spec.model, [d.text for d in docs], vocab, has_own=builtin is None)
    if model_spec is not None and info.vocab_size > model_spec.vocab_size:
        raise InputError(f"tokenizer has {info.vocab_size} tokens, the model only {model_spec.vocab_size}")
    packed = D.pack(docs, T.encoder(tok), info.eos_id, spec.seq_len)
    global_size = spec.batch_size * spec.num_workers
    if len(packed) == 0:
        raise InputError(f"--data gives fewer than {spec.seq_len} tokens: not one sequence", hint="add text or lower --seq-len")
    s = D.split(packed, eval_fraction=spec.eval_fraction, world_size=spec.num_workers, seed=spec.seed)
    D.check_size(s, global_batch=global_size, seq_len=spec.seq_len, world_size=spec.num_workers)
    arrays = {
        "train_input_ids": s.train.input_ids,
        "train_labels": s.train.labels,
        "eval_input_ids": s.eval.input_ids,
        "eval_labels": s.eval.labels,
    }
    digest = _digest(arrays)
    if resume_from is not None:
        _check_compatible(resume_from, spec, global_size, digest)
    return Prepared(spec, builtin, arrays, asdict(info), sharding, storage, spec.run_name or new_run_name(), resume_from, len(s.train), len(s.eval), digest)


def _digest(arrays: dict[str, Any]) -> str:
    import hashlib

    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(arrays[k].tobytes())
    return h.hexdigest()[:16]


def _resume_checkpoint(spec: TrainSpec, storage: str) -> str | None:
    from raydlc.train import checkpoint as C

    if spec.resume_from:
        C.verify(spec.resume_from)
        return str(Path(spec.resume_from).expanduser().resolve())
    if not spec.resume:
        return None
    if "://" in storage:
        raise InputError("--resume searches local storage only", hint="pass --resume-from with the checkpoint path")
    found = C.latest(storage)
    if found is None:
        raise CheckpointError(f"--resume: no checkpoint under {storage}", hint="run once without --resume, or pass --out where the earlier run wrote")
    C.verify(found)
    return str(found)


def _check_compatible(path: str, spec: TrainSpec, global_size: int, data_digest: str) -> None:
    """The data order is a function of (data, seq_len, global batch, seed): all must match to continue it."""
    from raydlc.train import checkpoint as C

    meta = C.verify(path).meta
    want = {"model": spec.model, "seq_len": spec.seq_len, "global_batch": global_size, "seed": spec.seed, "data": data_digest}
    diff = [f"{k}: checkpoint {meta.get(k)!r}, now {v!r}" for k, v in want.items() if k in meta and meta[k] != v]
    if diff:
        raise CheckpointError(f"checkpoint {path} was written by a different run ({'; '.join(diff)})", hint="resume with the same model, data, seq len, batch x workers and seed")


def loop_config(p: Prepared, data: Any, progress_path: str | None) -> dict[str, Any]:
    s = p.spec
    return {
        "model": s.model,
        "spec": p.builtin,
        "steps": s.steps,
        "seq_len": s.seq_len,
        "batch_size": s.batch_size,
        "learning_rate": s.learning_rate,
        "warmup_steps": s.warmup_steps,
        "weight_decay": s.weight_decay,
        "max_grad_norm": s.max_grad_norm,
        "seed": s.seed,
        "report_every": s.report_every,
        "checkpoint_every": s.checkpoint_every,
        "eval_every": s.eval_every,
        "sharding": p.sharding,
        "hsdp_replicas": s.hsdp_replicas,
        "bf16": bool(s.use_gpu) if s.bf16 is None else s.bf16,
        "use_gpu": bool(s.use_gpu),
        "activation_checkpointing": s.activation_checkpointing,
        "data": data,
        "tokenizer": p.tokenizer,
        "run_dir": f"{p.storage.rstrip('/')}/{p.run_name}",
        "progress_path": progress_path,
        "resume_from": p.resume_from,
        "crash": s.crash,
        "data_digest": p.data_digest,
    }


# ---- the edge: Ray ------------------------------------------------------------------------


ProgressFn = Callable[[dict[str, Any]], None]


def resolve_resources(spec: TrainSpec, cluster_resources: dict[str, float]) -> TrainSpec:
    """Fill `use_gpu` and `num_workers=0` (one per GPU) from what the Ray cluster has."""
    gpus = int(cluster_resources.get("GPU", 0))
    use_gpu = gpus > 0 if spec.use_gpu is None else spec.use_gpu
    if use_gpu and gpus == 0:
        raise InputError("GPUs were requested but the Ray cluster has none", hint="run without use_gpu, or join a cluster with GPU workers")
    workers = spec.num_workers
    if workers == 0:
        if gpus == 0:
            raise InputError("NUM_WORKERS=0 means one worker per GPU, and the Ray cluster has no GPUs", hint="pass --workers N")
        workers = gpus
    return replace(spec, use_gpu=use_gpu, num_workers=workers)


def run(spec: TrainSpec, *, on_progress: ProgressFn | None = None, prepared: Prepared | None = None) -> dict[str, Any]:
    """Prepare, start (or join) Ray, train, and summarise. A Ray started here is shut down here.

    With a known worker count the data is checked before Ray starts at all; with `0` (one
    per GPU) it has to wait for the cluster's resources, still before any worker.
    """
    p = prepared or (prepare(spec) if spec.num_workers > 0 else None)
    import ray

    # The controller polls workers at this interval and a report can wait for the poll: at the
    # default 2 s a report costs ~1.3 s. 1 s keeps reports every N steps from waiting without
    # polling a 2-core machine four times a second. An interval set in the environment wins.
    env = {
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "1.0"),
        "TOKENIZERS_PARALLELISM": "false",
        **spec.env,
    }
    started = False
    if not ray.is_initialized():
        for k, v in env.items():
            os.environ.setdefault(k, v)
        kw: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": spec.log_to_driver}
        if not spec.log_to_driver:
            kw["logging_level"] = logging.WARNING
        if spec.address:
            ray.init(address=spec.address, **kw)
        else:
            ray.init(num_cpus=max(os.cpu_count() or 1, spec.num_workers), include_dashboard=False, **kw)
        started = True
    try:
        spec = resolve_resources(spec, ray.cluster_resources())
        p = replace(p, spec=spec) if p is not None else prepare(spec)
        checked = _preflight(p) if spec.preflight else None
        summary = _fit(p, env, on_progress)
        return summary if checked is None else {**summary, "preflight": checked}
    finally:
        if started:
            ray.shutdown()


def _preflight(p: Prepared) -> dict[str, Any]:
    """The collective bandwidth check on the workers the job will use; a failure stops the run here.

    A network verdict needs several GPU nodes of a known type; on CPUs (gloo) the figures are
    reported without one.
    """
    from raydlc import preflight

    spec = p.spec
    nodes = spec.num_workers // max(1, spec.gpus_per_node)
    expectation = preflight.expectation_for(spec.instance_type, spec.gpus_per_node) if spec.use_gpu and nodes > 1 else None
    report = preflight.run_preflight(
        num_workers=spec.num_workers, use_gpu=bool(spec.use_gpu), expectation=expectation, storage_path=p.storage
    )
    if not report.ok:
        failed = "; ".join(f.message for f in report.findings if f.level == "fail")
        raise TrainError(f"preflight failed before training: {failed}", hint="see `raydlc preflight --json` for the figures")
    return report.to_dict()


def _fit(p: Prepared, env: dict[str, str], on_progress: ProgressFn | None) -> dict[str, Any]:
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raydlc.train.loop import train_func

    spec = p.spec
    run_dir = f"{p.storage.rstrip('/')}/{p.run_name}"
    progress_path = None if "://" in run_dir else str(Path(run_dir) / "progress.jsonl")
    if progress_path:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(progress_path, on_progress, stop), daemon=True) if progress_path and on_progress else None
    t0 = time.perf_counter()
    trainer = TorchTrainer(
        train_func,
        train_loop_config=loop_config(p, ray.put(p.arrays), progress_path),
        scaling_config=ScalingConfig(num_workers=spec.num_workers, use_gpu=bool(spec.use_gpu)),
        run_config=RunConfig(
            name=p.run_name,
            storage_path=p.storage,
            failure_config=FailureConfig(max_failures=spec.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=None),
            worker_runtime_env={"env_vars": env},
        ),
    )
    if watcher:
        watcher.start()
    try:
        result = trainer.fit()
    except Exception as e:  # Ray wraps worker errors in its own types
        raise TrainError(f"training run {p.run_name} failed: {_root_cause(e)}", hint=f"worker logs are in Ray's session dir; checkpoints under {run_dir}") from e
    finally:
        stop.set()
        if watcher:
            watcher.join(timeout=2)
    return _summary(p, run_dir, result, time.perf_counter() - t0)


def _root_cause(e: BaseException) -> str:
    seen = e
    while seen.__cause__ is not None:
        seen = seen.__cause__
    text = str(seen).strip().splitlines()
    return text[-1] if text else type(seen).__name__


def _watch(path: str, on_progress: ProgressFn, stop: threading.Event) -> None:
    """Follow rank 0's progress file; restarts rewrite earlier steps, which is fine to re-show."""
    pos = 0
    f = Path(path)
    while True:
        last = stop.wait(0.3)
        if not f.exists():
            if last:
                return
            continue
        with f.open() as fh:
            fh.seek(pos)
            chunk = fh.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        pos += len(complete.encode())
        for line in complete.splitlines():
            try:
                on_progress(json.loads(line))
            except (ValueError, TypeError):
                continue
        if last:
            return


def _summary(p: Prepared, run_dir: str, result: Any, wall: float) -> dict[str, Any]:
    from raydlc.train import metrics as mx

    local = "://" not in run_dir
    metrics_path = f"{run_dir}/metrics.jsonl"
    if local and Path(metrics_path).exists():
        s = mx.summarize(mx.read_jsonl(Path(metrics_path)))
    else:
        last = dict(result.metrics or {})
        s = {k.removeprefix("summary_"): v for k, v in last.items() if k.startswith("summary_")}
    ckpt = result.checkpoint.path if result.checkpoint is not None else None
    return {
        **{k: s.get(k) for k in ("steps", "first_loss", "final_loss", "eval_loss", "tokens_per_s", "step_time_s", "peak_mem_mb")},
        "loss_drop": (1 - s["final_loss"] / s["first_loss"]) if s.get("first_loss") and s.get("final_loss") is not None else None,
        "model": p.spec.model,
        "workers": p.spec.num_workers,
        "sharding": p.sharding,
        "global_batch": p.spec.batch_size * p.spec.num_workers,
        "seq_len": p.spec.seq_len,
        "train_sequences": p.n_train,
        "eval_sequences": p.n_eval,
        "resumed_from": p.resume_from,
        "run_name": p.run_name,
        "run_dir": run_dir,
        "checkpoint": ckpt,
        "export": f"{run_dir}/export",
        "metrics": metrics_path,
        "plot": f"{run_dir}/loss.png",
        "wall_s": wall,
    }


def with_overrides(spec: TrainSpec, **kw: Any) -> TrainSpec:
    return replace(spec, **kw)
