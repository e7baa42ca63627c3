"""Settings resolved once: what the user asked for, what the driver prepared and what Ray grants,
made into the one RunSpec every worker receives.

The request (a `TrainConfig`) is never rebound: `resolve` reads it with the cluster's facts
(`RunTarget`), the driver's preparation (`Prepared`: the model, the packed data, the checkpoint to
continue) and the grant (`Granted`: Ray's resources and the slots on each node), and returns the
RunSpec whose `train` is the request with everything `auto` or empty made concrete. Every rule a
run enforces beyond the config's own is a function here, each with its error, so the driver
checks the same rules before Ray starts (`prepare`) and once Ray has answered (`resolve`).
Pure: no torch, no Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raydlc import storage
from raydlc.config import shared_storage_problem
from raydlc.errors import CheckpointError, ConfigError, InputError
from raydlc.train.layout import Mesh, StepLayout, decide, placement, plan_mesh
from raydlc.train.runspec import Prepared, RunSpec, RunTarget

if TYPE_CHECKING:
    from raydlc.config import TrainConfig
    from raydlc.data.tokenizer import TokenizerInfo
    from raydlc.facts.models import ModelSpec
    from raydlc.planner.budget import Budget


@dataclass(frozen=True)
class Granted:
    """What the Ray cluster grants the run: its resources, and each node's worker slots of the
    resource the workers use (GPUs, or CPUs), as Ray reported them."""

    resources: Mapping[str, float]
    slots: tuple[int, ...]

    @classmethod
    def local(cls, train: TrainConfig) -> Granted:
        """What a local Ray will grant: one node with the workers asked for (GPUs only if asked for)."""
        return cls({"GPU": float(train.num_workers)} if train.use_gpu else {}, (train.num_workers,))


@dataclass(frozen=True)
class Workers:
    """USE_GPU and NUM_WORKERS made concrete from the cluster's GPUs."""

    use_gpu: bool
    num_workers: int


# ---- the rules ------------------------------------------------------------------------------------


def check_request(train: TrainConfig, workers: int) -> None:
    """What training needs beyond the config's own bounds (a planner accepts one-token sequences)."""
    if workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    check_seq_len(train.seq_len)


def check_seq_len(seq_len: int) -> None:
    """A block trains each token on the next one: a one-token block has nothing to learn from (`plan` takes it)."""
    if seq_len < 2:
        raise InputError(f"--seq-len must be at least 2 (each token is trained on the next one), got {seq_len}")


def model_source(train: TrainConfig) -> tuple[str | None, ModelSpec | None]:
    """The built-in spec MODEL_ID names (random init), and the architecture when it is known.

    A local directory's config.json is read and checked here, and its safetensors listed: the
    workers load them shard by shard.
    """
    from raydlc.facts.models import SPECS, model_dir, spec_for
    from raydlc.train.weights import check_against_config, safetensors_files

    builtin = train.model_id.lower() if train.model_id.lower() in SPECS else None
    spec = SPECS[builtin] if builtin else spec_for(train.model_id)
    if builtin is None and spec is None and "/" not in train.model_id:
        raise InputError(f"--model {train.model_id!r}: not a built-in spec, a local directory or a hub id", hint=f"built-in specs: {', '.join(SPECS)}")
    local = model_dir(train.model_id) if builtin is None else None
    if local is not None:
        if spec is not None:  # the weights must be the tensors the config.json describes
            check_against_config(local, spec)
        else:
            safetensors_files(local)
    if spec is not None and train.seq_len > spec.max_position_embeddings:
        raise InputError(f"--seq-len {train.seq_len} exceeds the model's {spec.max_position_embeddings} positions")
    return builtin, spec


def check_tokenizer(info: TokenizerInfo, spec: ModelSpec | None) -> None:
    if spec is not None and info.vocab_size > spec.vocab_size:
        raise InputError(f"tokenizer has {info.vocab_size} tokens, the model only {spec.vocab_size}")


def global_sequences(train: TrainConfig) -> int:
    """Sequences per optimizer step; an accumulation still `auto` counts as 1 until it is decided."""
    accum = train.grad_accum if isinstance(train.grad_accum, int) else 1
    return train.batch_size * accum * train.num_workers


def check_data(train: TrainConfig, p: Prepared) -> None:
    """The data holds one global batch of this step, and a checkpoint to continue was written by the same run.

    Called with the step as requested (before Ray) and as decided (`resolve`).
    """
    from raydlc.data.order import check_count

    global_size = global_sequences(train)
    check_count(n_train=p.n_train, n_eval=p.n_eval, global_batch=global_size, seq_len=train.seq_len, world_size=train.num_workers)
    if p.resume_meta is None or p.resume_from is None:
        return
    # The data order is a function of (data, seq_len, global batch, seed): all must match to continue it.
    want = {"model": train.model_id, "seq_len": train.seq_len, "global_batch": global_size, "seed": train.seed, "data": p.data_digest}
    diff = [f"{k}: checkpoint {p.resume_meta.get(k)!r}, now {v!r}" for k, v in want.items() if k in p.resume_meta and p.resume_meta[k] != v]
    from raydlc.train.checkpoint import lora_differences

    diff += lora_differences(p.resume_meta, train.lora_meta())
    if diff:
        raise CheckpointError(f"checkpoint {p.resume_from} was written by a different run ({'; '.join(diff)})",
                              hint="resume with the same model, data, seq len, batch x workers, seed and LoRA settings")


def resolve_resources(train: TrainConfig, cluster_resources: Mapping[str, float]) -> Workers:
    """USE_GPU (empty: when the cluster has GPUs) and NUM_WORKERS=0 (one per GPU) from what the Ray cluster has."""
    gpus = int(cluster_resources.get("GPU", 0))
    use_gpu = gpus > 0 if train.use_gpu is None else train.use_gpu
    if use_gpu and gpus == 0:
        raise InputError("GPUs were requested but the Ray cluster has none", hint="set USE_GPU=false, or join a cluster with GPU workers")
    workers = train.num_workers
    if workers == 0:
        if gpus == 0:
            raise InputError("NUM_WORKERS=0 means one worker per GPU, and the Ray cluster has no GPUs", hint="pass --workers N")
        workers = gpus
    return Workers(use_gpu, workers)


def plan_layout(
    train: TrainConfig, capacities: list[int] | tuple[int, ...], *, model: ModelSpec | None, instance_type: str | None,
    max_sequences: int | None = None,
) -> tuple[Mesh, StepLayout]:
    """The mesh and the step for the workers Ray will place on nodes of these capacities (GPUs, or CPUs)."""
    counts = placement(capacities, train.num_workers)
    decision = decide(train, counts, model=model, instance_type=instance_type, max_sequences=max_sequences)
    return plan_mesh(decision.sharding, counts, train.hsdp_replicas), decision


def check_storage(train: TrainConfig, mesh: Mesh) -> None:
    """Workers on several nodes all write into STORAGE_PATH: it must be the same storage for each."""
    problem = shared_storage_problem(train, mesh.nodes)
    if problem:
        raise ConfigError([f"STORAGE_PATH: {problem}"])


# ---- the one resolution -----------------------------------------------------------------------------


def resolve(train: TrainConfig, cluster: RunTarget, p: Prepared, granted: Granted, *, started_at: float = 0.0, now: float = 0.0) -> RunSpec:
    """The run as every worker will run it: resources, layout and step decided, every rule checked.

    The planner plans with the cluster's GPU type only when the workers use GPUs (a local run
    has none to plan with). A budget is priced at the nodes the mesh occupies; its clock
    started at `started_at` (epoch seconds, when the driver began) and `now` is what it reads now.
    """
    w = resolve_resources(train, granted.resources)
    sized = train.updated(use_gpu=w.use_gpu, num_workers=w.num_workers, compile=w.use_gpu if train.compile is None else train.compile)
    instance_type = cluster.instance_type if w.use_gpu else None
    mesh, decision = plan_layout(sized, granted.slots, model=p.model, instance_type=instance_type, max_sequences=p.n_train)
    final = decision.apply(sized)
    check_data(final, p)
    check_storage(final, mesh)
    from raydlc.train.tracking import identity

    tracking_id, tracking_dir = identity(p.resume_meta, storage.join(p.storage, p.run_name))
    return RunSpec(
        train=final,
        spec=p.builtin,
        mesh=mesh,
        use_gpu=w.use_gpu,
        bf16=w.use_gpu if final.bf16 is None else final.bf16,
        run_name=p.run_name,
        run_dir=storage.join(p.storage, p.run_name),
        tokenizer=p.tokenizer,
        data_digest=p.data_digest,
        resume_from=p.resume_from,
        faults=cluster.faults,
        budget=run_budget(final, cluster, mesh.nodes, started_at=started_at, now=now, step_s=decision.step_time_s),
        layout_note=decision.note,
        tracking_id=tracking_id,
        tracking_dir=tracking_dir,
    )


def run_budget(train: TrainConfig, cluster: RunTarget, nodes: int, *, started_at: float, now: float, step_s: float | None = None) -> Budget | None:
    """JOB_MAX_COST_USD priced at the nodes the run occupies (the given price, else the GPU type's
    list price); a budget without a price, or below what the run has spent since `started_at`
    plus one step, is refused."""
    from raydlc.planner.budget import SPOT_LABEL, Budget, check_budget, hourly_price, list_prices, prices_at

    if train.max_cost_usd is None:
        return None
    node_price = cluster.gpu_usd_per_node_hour if cluster.instance_type else None  # GPU_USD_PER_HOUR: Spot, read at submit
    prices = prices_at(cluster.instance_type, node_price) if cluster.instance_type else list_prices()
    price = cluster.usd_per_hour if cluster.usd_per_hour is not None else hourly_price(cluster.instance_type, nodes, prices)
    where = f"{nodes} x {cluster.instance_type}" if cluster.instance_type else "a local run"
    spent_s = max(0.0, now - started_at)
    check_budget(train.max_cost_usd, price, step_s=step_s, where=where if cluster.usd_per_hour is None else "the given price", startup_s=spent_s)
    assert price is not None
    given = cluster.usd_per_hour is not None
    return Budget(usd=train.max_cost_usd, usd_per_hour=price, started_at=started_at, nodes=nodes,
                  instance_type=None if given else cluster.instance_type,
                  price_label=SPOT_LABEL if node_price is not None and not given else None)

