"""From settings to a finished run: prepare the data in the driver, plan the layout on what Ray
grants, run TorchTrainer, and summarise from what Ray hands back.

The settings are one `TrainConfig`; `Target` says where the run goes. Everything that can be
wrong with the input is found in `prepare`, before Ray starts a worker; the parallel layout is
decided once, here, from the workers Ray can place, and travels to every worker inside the
RunSpec. Progress and metrics come back through Ray (an actor, Ray Train's result), so a
driver that joined a multi-node cluster by address sees them like a local one.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc import rayedge, storage
from raydlc.config import TrainConfig, shared_storage_problem, with_local_defaults
from raydlc.errors import CheckpointError, ConfigError, InputError, TrainError
from raydlc.train.layout import Decision, Mesh, decide, placement, plan_mesh
from raydlc.train.runspec import Crash, RunSpec

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.models import ModelSpec
    from raydlc.train.checkpoint import Manifest
    from raydlc.train.tokenizer import TokenizerInfo

DEFAULT_OUT = "raydlc-out"
NODE_WAIT_S = 600.0  # on a cluster, how long to wait for worker nodes still joining before refusing the run
PROGRESS_EVERY_S = 1.0  # how often the driver drains rank 0's progress (rank 0 posts at most this often too)


@dataclass(frozen=True)
class Target:
    """Where a run goes, beside what it trains."""

    address: str | None = None  # a Ray head to join; None: RAY_ADDRESS, else a local Ray started here
    instance_type: str | None = None  # the GPU nodes' type: what `SHARDING=auto` plans with
    log_to_driver: bool = True
    env: dict[str, str] = field(default_factory=dict)  # extra worker environment
    crash: Crash | None = None  # fault injection for tests and drills

    @property
    def local(self) -> bool:
        return self.address is None and rayedge.address_from_env() is None


def settings(cfg: Config, *, local: bool) -> TrainConfig:
    """The run's settings: the config's train section, with the local-run table where untouched."""
    return with_local_defaults(cfg).train if local else cfg.train


def target(cfg: Config, *, local: bool, address: str | None = None) -> Target:
    """Where the run goes; a run that joins a cluster (not local, or given an address) plans with
    the config's GPU node type, which a local Ray does not have."""
    where = Target(address=address)
    return where if local and where.local else replace(where, instance_type=cfg.gpu_nodes.instance_type)


def new_run_name() -> str:
    t = time.time()
    return time.strftime("run-%Y%m%d-%H%M%S", time.gmtime(t)) + f"-{int(t * 1e6) % 1_000_000:06d}"


# ---- driver-side preparation ------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    train: TrainConfig
    builtin: str | None
    model: ModelSpec | None
    arrays: dict[str, Any]
    tokenizer: TokenizerInfo
    storage: str
    run_name: str
    resume_from: str | None
    n_train: int
    n_eval: int
    data_digest: str
    resume_meta: dict[str, Any] | None = None
    decision: Decision | None = None  # known here for a local run; on a cluster once Ray says what it grants


def prepare(train: TrainConfig, where: Target | None = None) -> Prepared:
    """Check and build everything the workers need; raises `InputError`/`CheckpointError`."""
    from raydlc.models import SPECS, model_dir, spec_for
    from raydlc.train import data as D
    from raydlc.train import tokenizer as T
    from raydlc.train.weights import safetensors_files

    if train.num_workers < 1:
        raise InputError(f"--workers must be at least 1, got {train.num_workers}")
    if train.seq_len < 2:
        raise InputError("seq len must be at least 2")
    builtin = train.model_id.lower() if train.model_id.lower() in SPECS else None
    model_spec = SPECS[builtin] if builtin else spec_for(train.model_id)  # a local config.json is read (and checked) here
    if builtin is None and model_spec is None and "/" not in train.model_id:
        raise InputError(f"--model {train.model_id!r}: not a built-in spec, a local directory or a hub id", hint=f"built-in specs: {', '.join(SPECS)}")
    local = model_dir(train.model_id) if builtin is None else None
    if local is not None:
        safetensors_files(local)  # the workers load shard by shard from these
    if model_spec is not None and train.seq_len > model_spec.max_position_embeddings:
        raise InputError(f"--seq-len {train.seq_len} exceeds the model's {model_spec.max_position_embeddings} positions")
    decision = None
    if where is not None and where.local:  # a local Ray is one node: the layout is known now
        _, decision = plan_layout(train, [train.num_workers], model=model_spec, instance_type=None)
        train = decision.apply(train)

    root = storage.resolve(train.storage_path or DEFAULT_OUT)
    resume_from, manifest = _resume_checkpoint(train, root)

    docs = D.load_documents(train.data)
    vocab = min(model_spec.vocab_size, 4096) if builtin and model_spec else 0
    info, tok = T.for_model(train.model_id, [d.text for d in docs], vocab, has_own=builtin is None)
    if model_spec is not None and info.vocab_size > model_spec.vocab_size:
        raise InputError(f"tokenizer has {info.vocab_size} tokens, the model only {model_spec.vocab_size}")
    packed = D.pack(docs, T.encoder(tok), info.eos_id, train.seq_len)
    global_size = global_sequences(train)
    if len(packed) == 0:
        raise InputError(f"--data gives fewer than {train.seq_len} tokens: not one sequence", hint="add text or lower --seq-len")
    s = D.split(packed, eval_fraction=train.eval_fraction, world_size=train.num_workers, seed=train.seed)
    D.check_size(s, global_batch=global_size, seq_len=train.seq_len, world_size=train.num_workers)
    arrays = {
        "train_input_ids": s.train.input_ids,
        "train_labels": s.train.labels,
        "eval_input_ids": s.eval.input_ids,
        "eval_labels": s.eval.labels,
    }
    digest = _digest(arrays)
    meta = manifest.meta if manifest is not None and resume_from is not None else None
    if meta is not None and resume_from is not None:
        _check_compatible(resume_from, meta, train, global_size, digest)
    return Prepared(
        train, builtin, model_spec, arrays, info, root, train.run_name or new_run_name(), resume_from, len(s.train), len(s.eval), digest,
        meta, decision,
    )


def global_sequences(train: TrainConfig) -> int:
    """Sequences per optimizer step; an accumulation still `auto` counts as 1 until it is decided."""
    accum = train.grad_accum if isinstance(train.grad_accum, int) else 1
    return train.batch_size * accum * train.num_workers


def check_batch(p: Prepared) -> None:
    """Once the step is decided: the data holds one global batch, and a checkpoint to continue has the same one."""
    from raydlc.train import data as D

    global_size = global_sequences(p.train)
    D.check_count(n_train=p.n_train, n_eval=p.n_eval, global_batch=global_size, seq_len=p.train.seq_len, world_size=p.train.num_workers)
    if p.resume_meta is not None and p.resume_from is not None:
        _check_compatible(p.resume_from, p.resume_meta, p.train, global_size, p.data_digest)


def _digest(arrays: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(arrays[k].tobytes())
    return h.hexdigest()[:16]


def _resume_checkpoint(train: TrainConfig, root: str) -> tuple[str | None, Manifest | None]:
    """The checkpoint to continue from and its manifest, checked before any worker starts.

    Local checkpoints are verified in full; remote ones (s3://…) by manifest and sizes here,
    and by SHA-256 on each worker after its download.
    """
    from raydlc.train import checkpoint as C

    def checked(path: str) -> tuple[str, Manifest]:
        if storage.is_uri(path):
            return path, C.verify_remote(path)
        local = str(Path(path).expanduser().resolve())
        return local, C.verify(local)

    if train.resume_from:
        return checked(train.resume_from)
    if not train.resume:
        return None, None
    found = C.latest(root)
    if found is None:
        raise CheckpointError(f"--resume: no checkpoint under {root}", hint="run once without --resume, or pass --out where the earlier run wrote")
    return checked(found)


def _check_compatible(path: str, meta: dict[str, Any], train: TrainConfig, global_size: int, data_digest: str) -> None:
    """The data order is a function of (data, seq_len, global batch, seed): all must match to continue it."""
    want = {"model": train.model_id, "seq_len": train.seq_len, "global_batch": global_size, "seed": train.seed, "data": data_digest}
    diff = [f"{k}: checkpoint {meta.get(k)!r}, now {v!r}" for k, v in want.items() if k in meta and meta[k] != v]
    if diff:
        raise CheckpointError(f"checkpoint {path} was written by a different run ({'; '.join(diff)})", hint="resume with the same model, data, seq len, batch x workers and seed")


# ---- decisions on what Ray grants ----------------------------------------------------------------


def resolve_resources(train: TrainConfig, cluster_resources: dict[str, float]) -> TrainConfig:
    """Fill USE_GPU and NUM_WORKERS=0 (one per GPU) from what the Ray cluster has."""
    gpus = int(cluster_resources.get("GPU", 0))
    use_gpu = gpus > 0 if train.use_gpu is None else train.use_gpu
    if use_gpu and gpus == 0:
        raise InputError("GPUs were requested but the Ray cluster has none", hint="set USE_GPU=false, or join a cluster with GPU workers")
    workers = train.num_workers
    if workers == 0:
        if gpus == 0:
            raise InputError("NUM_WORKERS=0 means one worker per GPU, and the Ray cluster has no GPUs", hint="pass --workers N")
        workers = gpus
    return train.updated(use_gpu=use_gpu, num_workers=workers)


def plan_layout(
    train: TrainConfig, capacities: list[int], *, model: ModelSpec | None, instance_type: str | None, max_sequences: int | None = None
) -> tuple[Mesh, Decision]:
    """The mesh and the step for the workers Ray will place on nodes of these capacities (GPUs, or CPUs)."""
    counts = placement(capacities, train.num_workers)
    decision = decide(train, counts, model=model, instance_type=instance_type, max_sequences=max_sequences)
    return plan_mesh(decision.sharding, counts, train.hsdp_replicas), decision


def check_storage(train: TrainConfig, mesh: Mesh) -> None:
    """Workers on several nodes all write into STORAGE_PATH: it must be the same storage for each."""
    problem = shared_storage_problem(train, mesh.nodes)
    if problem:
        raise ConfigError([f"STORAGE_PATH: {problem}"])


def run_spec(p: Prepared, mesh: Mesh, where: Target) -> RunSpec:
    t = p.train
    return RunSpec(
        train=t,
        spec=p.builtin,
        mesh=mesh,
        use_gpu=bool(t.use_gpu),
        bf16=bool(t.use_gpu) if t.bf16 is None else t.bf16,
        run_name=p.run_name,
        run_dir=storage.join(p.storage, p.run_name),
        tokenizer=p.tokenizer,
        data_digest=p.data_digest,
        resume_from=p.resume_from,
        crash=where.crash,
    )


# ---- the edge: Ray ------------------------------------------------------------------------


ProgressFn = Callable[[dict[str, Any]], None]


def run(train: TrainConfig, where: Target | None = None, *, on_progress: ProgressFn | None = None, prepared: Prepared | None = None) -> dict[str, Any]:
    """Prepare, start (or join) Ray, plan the layout, train, and summarise.

    With a known worker count the data is checked before Ray starts at all; with `0` (one
    per GPU) it has to wait for the cluster's resources, still before any worker.
    """
    where = where or Target()
    p = prepared or (prepare(train, where) if train.num_workers > 0 else None)
    with rayedge.connected(where.address, workers=train.num_workers, log_to_driver=where.log_to_driver, env=where.env):
        train = resolve_resources(train, rayedge.cluster_resources())
        p = replace(p, train=train) if p is not None else prepare(train, where)
        capacities = rayedge.node_capacities(
            "GPU" if train.use_gpu else "CPU", at_least=train.num_workers, wait_s=0.0 if where.local else NODE_WAIT_S
        )
        mesh, decision = plan_layout(
            train, capacities, model=p.model, instance_type=where.instance_type if train.use_gpu else None, max_sequences=p.n_train
        )
        train = decision.apply(train)
        p = replace(p, train=train, decision=decision)
        check_batch(p)
        check_storage(train, mesh)
        spec = run_spec(p, mesh, where)
        checked = _preflight(spec, where, p.storage) if train.preflight else None
        summary = _fit(spec, p, where, on_progress)
        return summary if checked is None else {**summary, "preflight": checked}


def _preflight(spec: RunSpec, where: Target, storage_path: str) -> dict[str, Any]:
    """The collective bandwidth check on the workers the job will use; a failure stops the run here.

    A network verdict needs several GPU nodes of a known type; on CPUs (gloo) the figures are
    reported without one.
    """
    from raydlc import preflight

    mesh = spec.mesh
    per_node = mesh.ranks_per_node[0] if len(set(mesh.ranks_per_node)) == 1 else None
    expectation = preflight.expectation_for(where.instance_type, per_node) if spec.use_gpu and mesh.nodes > 1 else None
    report = preflight.run_preflight(num_workers=mesh.world_size, use_gpu=spec.use_gpu, expectation=expectation, storage_path=storage_path)
    if not report.ok:
        failed = "; ".join(f.message for f in report.findings if f.level == "fail")
        raise TrainError(f"preflight failed before training: {failed}", hint="see `raydlc preflight --json` for the figures")
    return report.to_dict()


def _fit(spec: RunSpec, p: Prepared, where: Target, on_progress: ProgressFn | None) -> dict[str, Any]:
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raydlc.train.loop import train_func

    box = rayedge.mailbox()
    progress_file = None if storage.is_uri(spec.run_dir) else Path(spec.run_dir) / "progress.jsonl"
    stop = threading.Event()
    watcher = threading.Thread(target=_follow, args=(box, on_progress, progress_file, stop), daemon=True)
    t0 = time.perf_counter()
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"run": spec.to_wire(), "data": ray.put(p.arrays), "progress": box},
        scaling_config=ScalingConfig(num_workers=spec.mesh.world_size, use_gpu=spec.use_gpu),
        run_config=RunConfig(
            name=spec.run_name,
            storage_path=p.storage,
            failure_config=FailureConfig(max_failures=spec.train.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=None),
            worker_runtime_env={"env_vars": rayedge.worker_env(where.env)},
        ),
    )
    watcher.start()
    try:
        result = trainer.fit()
    except Exception as e:  # Ray wraps worker errors in its own types
        hint = f"worker logs are in Ray's session dir; checkpoints under {spec.run_dir}"
        raise rayedge.run_error(e, f"training run {spec.run_name}", hint) from e
    finally:
        stop.set()
        watcher.join(timeout=5)
    return _summary(spec, p, result, time.perf_counter() - t0)


def _follow(box: Any, on_progress: ProgressFn | None, path: Path | None, stop: threading.Event) -> None:
    """Drain rank 0's progress from the mailbox; keep a copy in `progress.jsonl` where the driver can.

    Restarts re-post earlier steps, which is fine to re-show. Progress is a display aid: a
    failure here never fails the run.
    """
    while True:
        last = stop.wait(PROGRESS_EVERY_S)
        try:
            records = rayedge.drain(box)
        except Exception:
            records = []
        if path is not None and records:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as f:
                    f.write("".join(json.dumps(r) + "\n" for r in records))
            except OSError:
                path = None
        if on_progress is not None:
            for r in records:
                on_progress(r)
        if last:
            return


def _summary(spec: RunSpec, p: Prepared, result: Any, wall: float) -> dict[str, Any]:
    """From Ray Train's result (the metrics reported with the last checkpoint), not from a file."""
    last = dict(result.metrics or {})
    s = {k.removeprefix("summary_"): v for k, v in last.items() if k.startswith("summary_")}
    ckpt = result.checkpoint.path if result.checkpoint is not None else None
    run_dir = spec.run_dir
    mesh = spec.mesh
    return {
        **{k: s.get(k) for k in ("steps", "first_loss", "final_loss", "eval_loss", "tokens_per_s", "step_time_s", "peak_mem_mb")},
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
        "layout_note": p.decision.note if p.decision is not None else None,
        "seq_len": spec.train.seq_len,
        "train_sequences": p.n_train,
        "eval_sequences": p.n_eval,
        "resumed_from": p.resume_from,
        "run_name": spec.run_name,
        "run_dir": run_dir,
        "checkpoint": ckpt,
        "export": f"{run_dir}/export",
        "metrics": f"{run_dir}/metrics.jsonl",
        "plot": f"{run_dir}/loss.png",
        "wall_s": wall,
    }
