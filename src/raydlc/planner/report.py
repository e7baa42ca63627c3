"""The plan `raydlc plan` prints: both shardings' figures for one workload's step, the recommended layout, and what it needs.

`plan` is where the model, the search and the remedies meet: it resolves `grad_accum="auto"`
from the recommendation, turns on what `free` allows when nothing fits, and reports the
assumptions it used. `TrainingPlan.to_dict()` is `raydlc plan --json`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from raydlc.errors import InputError
from raydlc.facts import instances
from raydlc.planner import model
from raydlc.planner.model import DEFAULT_ASSUMPTIONS, DEFAULT_LOSS_CHUNK, STRATEGIES, SYNCS, Assumptions, Layout, Workload
from raydlc.planner.remedies import REMEDIES, fitting


@dataclass(frozen=True)
class StrategyPlan:
    """One sharding's figures for the workload's step: its groups, memory, traffic and time."""

    strategy: str
    shard_size: int
    replicate_size: int
    sync: str
    per_gpu_bytes: dict[str, int]
    fits: bool
    max_micro_batch: int
    traffic_bytes_per_step: dict[str, Any]
    step_time_s: dict[str, Any]
    peak_phase: str = ""  # the phase of the step whose bytes are `per_gpu_bytes`
    per_gpu_bytes_by_phase: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingPlan:
    """What one training step costs on a layout under both shardings, and the layout the planner recommends.

    Named for what it plans (a training step), beside the lifecycle's `StepPlan` (what a step of `up` would do).
    """

    model: str
    params: int
    policy: str
    seq_len: int
    micro_batch: int
    grad_accum: int
    activation_checkpointing: bool | str
    layout: dict[str, Any]
    gpu_memory_bytes: int
    strategy: str
    sync: str
    per_gpu_bytes: dict[str, int]
    activations_bytes: dict[str, int]
    traffic_bytes_per_step: dict[str, Any]
    step_time_s: dict[str, Any]
    max_micro_batch: int
    fits: bool
    strategies: dict[str, StrategyPlan]
    recommendation: dict[str, Any]
    loss_chunk: int = DEFAULT_LOSS_CHUNK
    reduce_dtype: str = "fp32"
    logits_bytes: dict[str, int] = field(default_factory=dict)
    fsdp_units: dict[str, int] = field(default_factory=dict)  # parameters per unit (fsdp_units)
    assumptions: dict[str, Any] = field(default_factory=dict)
    peak_phase: str = ""
    per_gpu_bytes_by_phase: dict[str, dict[str, int]] = field(default_factory=dict)
    # LoRA's rank, targets and adapter parameters ({"rank": 0} for full fine-tuning)
    lora: dict[str, Any] = field(default_factory=lambda: {"rank": 0})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _lora(w: Workload) -> dict[str, Any]:
    """The plan's `lora`: what trains and what it costs beside the frozen base."""
    if not w.lora:
        return {"rank": 0}
    n = w.adapter_params()
    return {"rank": w.lora_rank, "targets": list(w.targets), "adapter_params": n,
            "trained_fraction": round(n / w.spec.param_count(), 6), "base_dtype_bytes": w.precision.compute}


def _sync_for(strategy: str, sync: str, grad_accum: int) -> str:
    if sync == "auto" or sync not in SYNCS[strategy]:
        return model.default_sync(strategy, grad_accum)
    return sync


def _strategy_plan(w: Workload, strategy: str, layout: Layout, a: Assumptions) -> StrategyPlan:
    shard, replicate = model.layout_groups(strategy, layout)
    w = w.at(sync=_sync_for(strategy, w.sync, w.accum))
    capacity = model.gpu_capacity(layout)
    mem = model.memory_bytes(w, shard, a)
    return StrategyPlan(
        strategy=strategy,
        shard_size=shard,
        replicate_size=replicate,
        sync=w.sync,
        per_gpu_bytes=mem,
        fits=mem["total"] <= capacity,
        max_micro_batch=model.max_micro_batch(w, shard, capacity, a),
        traffic_bytes_per_step=model.traffic_bytes(w, strategy, layout),
        step_time_s=model.step_time(w, strategy, layout, a),
        peak_phase=model.peak_phase(w, shard, a),
        per_gpu_bytes_by_phase=model.memory_phases(w, shard, a),
    )


def plan(
    w: Workload, layout: Layout, *, strategy: str | None = None, free: tuple[str, ...] = (), assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
) -> TrainingPlan:
    """Both strategies' figures for the workload's step, and the recommended layout.

    `grad_accum="auto"` fills the figures with the recommendation's strategy (unless
    `strategy` is given), micro-batch, accumulation and sync mode. When nothing fits, the
    recommendation turns on what `free` allows of `REMEDIES` (names of Workload fields) and
    says which and at what price (`needs`); with `grad_accum="auto"` the figures are of that too.
    """
    if strategy is not None and strategy not in STRATEGIES:
        raise InputError(f"unknown sharding strategy {strategy!r}", hint=f"use one of: {', '.join(STRATEGIES)}")
    remedied, rec, needs = fitting(w, layout, free, assumptions)
    b = rec.best
    if w.grad_accum == "auto":
        w = remedied.at(micro_batch=b.micro_batch, grad_accum=b.grad_accum, sync=b.sync) if b is not None else w.at(grad_accum=1)
        strategy = strategy or (b.strategy if b is not None else None)
    strategy = strategy or "fsdp"
    plans = {s: _strategy_plan(w, s, layout, assumptions) for s in STRATEGIES}
    sel = plans[strategy]
    recommendation = rec.to_dict()
    if needs:
        recommendation["reason"] = "needs " + "; and ".join(REMEDIES[n][1] for n in needs) + " -- " + recommendation["reason"]
    best_w = remedied.at(micro_batch=b.micro_batch, grad_accum=b.grad_accum, sync=b.sync) if b is not None else None
    recommendation |= {
        "needs": needs,
        "loss_chunk": remedied.loss_chunk,
        "reduce_dtype": _reduce_name(remedied),
        "activation_checkpointing": remedied.activation_checkpointing,
        "per_gpu_bytes_itemised": model.memory_bytes(best_w, model.layout_groups(b.strategy, layout)[0], assumptions) if best_w and b else None,
    }
    return TrainingPlan(
        model=w.spec.name,
        params=w.spec.param_count(),
        policy=w.policy,
        seq_len=w.seq_len,
        micro_batch=w.micro_batch,
        grad_accum=w.accum,
        activation_checkpointing=w.activation_checkpointing,
        layout=asdict(layout) | {"world": layout.world, "gpu_name": instances.GPUS[layout.gpu].name},
        gpu_memory_bytes=model.gpu_capacity(layout),
        strategy=strategy,
        sync=sel.sync,
        per_gpu_bytes=sel.per_gpu_bytes,
        activations_bytes={
            "without_checkpointing": model.activation_bytes(w.at(activation_checkpointing=False)),
            "with_checkpointing": model.activation_bytes(w.at(activation_checkpointing=True)),
            "with_selective_checkpointing": model.activation_bytes(w.at(activation_checkpointing="selective")),
        } | model.activation_parts(w),
        traffic_bytes_per_step=sel.traffic_bytes_per_step,
        step_time_s=sel.step_time_s,
        max_micro_batch=sel.max_micro_batch,
        fits=sel.fits,
        strategies=plans,
        recommendation=recommendation,
        loss_chunk=w.loss_chunk,
        reduce_dtype=_reduce_name(w),
        logits_bytes={"unchunked": model.logits_bytes(w.at(loss_chunk=0)), "chunked": model.logits_bytes(w.at(loss_chunk=w.loss_chunk or DEFAULT_LOSS_CHUNK))}
        | model.logits_parts(w),
        fsdp_units=model.fsdp_units(w.spec),
        assumptions=asdict(assumptions) | assumptions.stated(layout.gpu, w.compiled_blocks)
        | {"precision_bytes": asdict(w.precision), "shard_size": sel.shard_size, "compile": w.compile}
        | ({"lora_flops": model.LORA_FLOPS} if w.lora else {}),
        peak_phase=sel.peak_phase,
        per_gpu_bytes_by_phase=sel.per_gpu_bytes_by_phase,
        lora=_lora(w),
    )


def _reduce_name(w: Workload) -> str:
    return "bf16" if w.precision.reduce == 2 else "fp32"
