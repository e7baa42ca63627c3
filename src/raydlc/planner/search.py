"""The fastest layout that fits: `recommend` weighs every sharding x micro-batch x accumulation x sync mode.

It returns the fastest by tokens/s, with the runner-up, the candidates it compared and why, in
sentences a person can check against the tables; `layout_for` builds the `Layout` it searches
from flags and the catalogue.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from raydlc.errors import InputError
from raydlc.facts import instances
from raydlc.planner.model import (
    DEFAULT_ASSUMPTIONS,
    GB,
    STRATEGIES,
    SYNCS,
    Assumptions,
    Candidate,
    Layout,
    Workload,
    ac_rank,
    candidate,
    gpu_capacity,
    layout_groups,
    max_micro_batch,
    usable_capacity,
)


@dataclass(frozen=True)
class Recommendation:
    """What `recommend` found: the fastest layout that fits, the runner-up of another mode, everything compared, and why."""

    best: Candidate | None
    runner_up: Candidate | None
    candidates: list[Candidate]  # every layout compared, fastest first (those that fit before those that do not)
    max_global_batch: int  # tokens per step the search allowed
    reason: str
    micro_batch_reason: str

    def to_dict(self, top: int = 8) -> dict[str, Any]:
        b = self.best
        return {
            "strategy": b.strategy if b else "fsdp",
            "micro_batch": b.micro_batch if b else 0,
            "grad_accum": b.grad_accum if b else 1,
            "sync": b.sync if b else "every",
            "global_batch": b.global_batch if b else 0,
            "tokens_per_step": b.tokens_per_step if b else 0,
            "tokens_per_s": b.tokens_per_s if b else 0.0,
            "step_time_s": b.step_time_s if b else None,
            "per_gpu_bytes": b.per_gpu_bytes if b else None,
            "bound": b.bound if b else None,
            "activation_checkpointing": b.activation_checkpointing if b else False,
            "reason": self.reason,
            "micro_batch_reason": self.micro_batch_reason,
            "max_global_batch": self.max_global_batch,
            "runner_up": asdict(self.runner_up) if self.runner_up else None,
            "candidates_considered": len(self.candidates),
            "top": [asdict(c) for c in self.candidates[:top]],
        }


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def recommend(
    w: Workload,
    layout: Layout,
    *,
    strategies: tuple[str, ...] | None = None,
    micro_batches: tuple[int, ...] | None = None,
    grad_accums: tuple[int, ...] | None = None,
    syncs: tuple[str, ...] | None = None,
    checkpointing: tuple[bool | str, ...] | None = None,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
) -> Recommendation:
    """The fastest layout that fits, by tokens/s, among sharding x micro-batch x accumulation x sync.

    The workload gives the model, sequence length, precision, checkpointing and the ceiling; its
    micro-batch, accumulation and sync are what this searches. Unconstrained, micro-batches and
    accumulations are powers of two whose global batch stays within `w.max_global_batch` tokens (one micro-batch of one sequence per GPU always counts).
    Each of `strategies`, `micro_batches`, `grad_accums`, `syncs` pins that dimension (what a
    run fixed in its config). Layouts within `tie_fraction` of the fastest are as fast: the
    largest micro-batch wins (the assumed MFU does not fall for small matmuls, a real GPU's
    does), then the fewest micro-batches (accumulation only where it buys speed), then the
    least memory. The runner-up is the fastest layout of another sharding or sync mode.
    `checkpointing` searches activation checkpointing too (False: none, "selective", True: full per block); unset, the
    workload's setting stays. A layout fits within `MAX_MEMORY_FRACTION` of the GPU's memory.
    """
    if checkpointing is not None and len(set(checkpointing)) > 1:
        recs = [recommend(w.at(activation_checkpointing=ac), layout, strategies=strategies, micro_batches=micro_batches,
                          grad_accums=grad_accums, syncs=syncs, assumptions=assumptions) for ac in sorted(set(checkpointing), key=ac_rank)]
        return _merged(w, layout, recs, strategies, assumptions)
    if checkpointing is not None:
        w = w.at(activation_checkpointing=checkpointing[0])
    a = assumptions
    capacity = usable_capacity(layout)
    world, ceiling = layout.world, w.max_global_batch
    one = w.at(grad_accum=1, sync="every")
    if strategies is None:
        strategies = STRATEGIES if layout.nodes > 1 else ("fsdp",)
    within = lambda mb, n: mb * n * world * w.seq_len <= ceiling
    seen: set[tuple[str, int, int, str]] = set()
    out: list[Candidate] = []
    for strategy in strategies:
        shard, _ = layout_groups(strategy, layout)
        modes = [m for m in SYNCS[strategy] if syncs is None or m in syncs]
        for sync in modes:
            if micro_batches is not None:
                mbs = list(micro_batches)
            else:
                top = max_micro_batch(one, shard, capacity, a)
                mbs = [mb for mb in _pow2_upto(max(top, 1)) if mb == 1 or within(mb, 1)]
            for mb in mbs:
                ns = list(grad_accums) if grad_accums is not None else [n for n in _pow2_upto(ceiling) if n == 1 or within(mb, n)]
                for n in ns:
                    label = sync if n > 1 else ("every" if "every" in modes else sync)
                    key = (strategy, mb, n, label)
                    if key in seen:
                        continue
                    seen.add(key)
                    out.append(candidate(w.at(micro_batch=mb, grad_accum=n, sync=label), strategy, layout, a))
    out.sort(key=lambda c: (not c.fits, -c.tokens_per_s, c.tokens_per_step))
    fitting = [c for c in out if c.fits]
    best: Candidate | None = None
    runner: Candidate | None = None
    if fitting:
        best = _pick(fitting, a.tie_fraction)
        runner = _pick([c for c in fitting if c.mode != best.mode], a.tie_fraction)
    reason, mb_reason = _reasons(w, layout, best, runner, out, strategies, a)
    return Recommendation(best, runner, out, ceiling, reason, mb_reason)


def _merged(w: Workload, layout: Layout, recs: list[Recommendation], strategies: tuple[str, ...] | None, a: Assumptions) -> Recommendation:
    """One recommendation over the searches with and without checkpointing: the fastest fitting layout of all."""
    out = sorted((c for r in recs for c in r.candidates), key=lambda c: (not c.fits, -c.tokens_per_s, c.tokens_per_step))
    fitting = [c for c in out if c.fits]
    best = _pick(fitting, a.tie_fraction)
    runner = _pick([c for c in fitting if best is not None and (c.mode, c.activation_checkpointing) != (best.mode, best.activation_checkpointing)], a.tie_fraction)
    chosen = w.at(activation_checkpointing=best.activation_checkpointing) if best is not None else w
    strategies = strategies if strategies is not None else (("fsdp", "hsdp") if layout.nodes > 1 else ("fsdp",))
    reason, mb_reason = _reasons(chosen, layout, best, runner, [c for c in out if c.activation_checkpointing == chosen.activation_checkpointing], strategies, a)
    return Recommendation(best, runner, out, w.max_global_batch, reason, mb_reason)


def _pick(fastest_first: list[Candidate], tie: float) -> Candidate | None:
    if not fastest_first:
        return None
    top = fastest_first[0].tokens_per_s
    near = [c for c in fastest_first if c.tokens_per_s >= top * (1 - tie)]
    return min(near, key=lambda c: (ac_rank(c.activation_checkpointing), -c.micro_batch, c.grad_accum, c.per_gpu_bytes))


def _reasons(
    w: Workload, layout: Layout, best: Candidate | None, runner: Candidate | None, cands: list[Candidate],
    strategies: tuple[str, ...], a: Assumptions,
) -> tuple[str, str]:
    """Why this layout, in a sentence a person can check against the tables."""
    gb = lambda n: f"{n / GB:.2f} GB"
    ceiling = w.max_global_batch
    capacity = gpu_capacity(layout)
    usable = usable_capacity(layout)
    if best is None:
        smallest = min(cands, key=lambda c: c.per_gpu_bytes) if cands else None
        need = f" (the smallest layout needs {gb(smallest.per_gpu_bytes)} per GPU of {gb(capacity)})" if smallest else ""
        return (f"nothing fits{need}", "not even one sequence fits: enable activation checkpointing, shorten sequences or add GPUs")
    parts = [
        f"{best.describe()}: {best.global_batch:,} sequences ({best.tokens_per_step:,} tokens) per step in ~{best.step_time_s:.3g} s "
        f"= ~{best.tokens_per_s:,.0f} tokens/s, {best.bound}-bound, {gb(best.per_gpu_bytes)} of {gb(capacity)} per GPU "
        f"(at most {gb(usable)} planned)"
    ]
    if layout.nodes == 1 and "hsdp" not in strategies:
        parts.append("one node: HSDP's replicate group would have a single member, so it is FSDP")
    fit_by = {s: [c for c in cands if c.strategy == s and c.fits] for s in strategies}
    for s in strategies:
        if s != best.strategy and not fit_by[s]:
            least = min((c for c in cands if c.strategy == s), key=lambda c: c.per_gpu_bytes, default=None)
            if least is not None:
                parts.append(f"{s.upper()} needs {gb(least.per_gpu_bytes)} per GPU even at micro-batch {least.micro_batch}, more than the GPU has")
    other = next((s for s in strategies if s != best.strategy and fit_by[s]), None)
    if other is not None:
        same = [c for c in fit_by[other] if (c.micro_batch, c.grad_accum) == (best.micro_batch, best.grad_accum)]
        rival = same[0] if same else fit_by[other][0]
        if best.bound == rival.bound == "compute" and rival.tokens_per_s >= best.tokens_per_s * (1 - a.tie_fraction):
            why = (f"{best.strategy.upper()} leaves more memory ({gb(best.per_gpu_bytes)} vs {gb(rival.per_gpu_bytes)} per GPU)"
                   if best.per_gpu_bytes <= rival.per_gpu_bytes else f"{best.strategy.upper()} takes the larger micro-batch")
            parts.append(f"the step is compute-bound either way, and {why}")
    if best.tokens_per_step * 2 > ceiling and best.bound != "compute":
        parts.append(f"the global batch stops at {ceiling:,} tokens per step (--max-global-batch)")
    if runner is not None:
        ratio = runner.tokens_per_s / best.tokens_per_s if best.tokens_per_s else 1.0
        gap = f"{1 - ratio:.0%} slower" if ratio <= 1 else f"{ratio - 1:.0%} faster, within the tie margin"
        parts.append(f"runner-up: {runner.describe()}, ~{runner.tokens_per_s:,.0f} tokens/s ({gap}, {gb(runner.per_gpu_bytes)} per GPU)")
    shard, _ = layout_groups(best.strategy, layout)
    top = max_micro_batch(w.at(grad_accum=best.grad_accum, sync=best.sync), shard, usable, a)
    if best.micro_batch == _pow2_floor(top):
        mb = f"largest power of two within the largest micro-batch that fits ({top})"
    elif best.micro_batch * 2 * layout.world * w.seq_len > ceiling:
        mb = f"the largest power of two within the global-batch ceiling ({top} would fit)"
    else:
        mb = f"a larger micro-batch is slower here ({top} would fit)"
    return "; ".join(parts), mb


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0


def layout_for(
    nodes: int, gpus_per_node: int, *, gpu: str | None = None, instance_type: str | None = None,
    network_gbps: float | None = None,
) -> Layout:
    """A Layout from flags and the catalog; the GPU defaults to the instance type's.

    A `gpu` other than the instance type's takes its network, EFA and NVLink facts from the
    catalogue's type with that GPU (that many per node if one exists): an H100 what-if on a
    g6 config would otherwise be planned over a g6's 40 Gb/s and PCIe.
    """
    it = instances.instance_type(instance_type) if instance_type else None
    gpu_key = (gpu or (it.gpu if it else None) or "").lower()
    if gpu_key not in instances.GPUS:
        raise InputError(
            f"unknown GPU {gpu or gpu_key!r}" if gpu else f"instance type {instance_type!r} has no known GPU",
            hint=f"pass --gpu with one of: {', '.join(instances.GPUS)}",
        )
    if nodes < 1 or gpus_per_node < 1:
        raise InputError(f"nodes and GPUs per node must be at least 1, got {nodes} x {gpus_per_node}",
                         hint="pass --nodes N --gpus-per-node G with N, G >= 1")
    if it is not None and it.gpu != gpu_key:
        it = instances.type_with_gpu(gpu_key, gpus_per_node)
    gbps = network_gbps if network_gbps is not None else (it.network_gbps if it else None)
    if gbps is None:
        raise InputError(f"no instance type in the catalogue has {instances.GPUS[gpu_key].name} GPUs: the network between nodes is unknown"
                         if gpu else "no network bandwidth known for this layout",
                         hint="pass --network-gbps (e.g. 3200 for 32 x 100 Gb/s EFA) or a known instance type (GPU_NODE_TYPE)")
    if not (math.isfinite(gbps) and gbps > 0):
        raise InputError(f"network bandwidth must be positive and finite, got {gbps:g} Gb/s", hint="pass --network-gbps 40 for 40 Gb/s")
    return Layout(
        nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu_key, network_gbps=float(gbps),
        efa=bool(it.efa_interfaces) if it else True, nvlink=bool(it and it.nvlink), instance_type=it.name if it else None,
    )


def recommend_sharding(w: Workload, layout: Layout) -> str:
    """The faster sharding that fits at the workload's micro-batch without accumulation, "fsdp" or
    "hsdp"; FSDP (the smaller footprint) when neither fits."""
    rec = recommend(w, layout, micro_batches=(w.micro_batch,), grad_accums=(1,))
    return rec.best.strategy if rec.best is not None else "fsdp"
