"""Per-GPU memory, per-step traffic and step time of an FSDP2 fine-tune, before paying for GPUs.

The hand arithmetic everyone does (bytes per parameter over the number of GPUs) misses
what actually decides whether a job fits and how fast it runs: FSDP2 keeps the sharded
parameters in their original dtype (fp32 under a bf16 MixedPrecisionPolicy, so that shard
*is* the master copy and there is no second one), all-gathers whole units in bf16 (the root
unit, with the embeddings, stays gathered through all of forward and again all of backward),
and moves every parameter across the node boundary three times per step. Everything here is arithmetic on
a `ModelSpec`; the assumptions that are not arithmetic are fields of `Assumptions`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from raydlc import catalog
from raydlc.errors import InputError
from raydlc.models import ModelSpec

Policy = Literal["bf16-mixed", "pure-bf16"]
Strategy = Literal["fsdp", "hsdp"]
POLICIES: tuple[str, ...] = ("bf16-mixed", "pure-bf16")
STRATEGIES: tuple[str, ...] = ("fsdp", "hsdp")
GB = 1e9


@dataclass(frozen=True)
class PrecisionBytes:
    """Bytes per element of what FSDP2 stores and moves under a policy."""

    param: int  # the sharded parameter as stored (the module's dtype)
    grad: int  # the sharded gradient: FSDP2 casts the reduced gradient to the parameter's dtype
    optimizer: int  # AdamW exp_avg + exp_avg_sq, created like the parameter
    master: int  # a separate fp32 master copy; FSDP2 keeps none
    compute: int  # the all-gathered (unsharded) parameter and the local gradient
    reduce: int  # what reduce-scatter / all-reduce moves


PRECISION: dict[str, PrecisionBytes] = {
    # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on an fp32 model.
    "bf16-mixed": PrecisionBytes(param=4, grad=4, optimizer=8, master=0, compute=2, reduce=4),
    # The model itself in bf16, no MixedPrecisionPolicy: 2 + 2 + 4 bytes per parameter.
    "pure-bf16": PrecisionBytes(param=2, grad=2, optimizer=4, master=0, compute=2, reduce=2),
}


@dataclass(frozen=True)
class Assumptions:
    """The figures that are judgement, not arithmetic; every plan reports the ones it used."""

    mfu: float = 0.40  # achieved fraction of the GPU's dense bf16 peak
    efa_efficiency: float = 0.85  # NCCL over EFA (aws-ofi-nccl), fraction of the node's line rate
    tcp_efficiency: float = 0.40  # NCCL's socket transport over the same ENA link
    pcie_gbytes_s: float = 16.0  # GPU<->GPU inside a node without NVLink (g5/g6/g6e), GB/s per direction
    nvlink_gbytes_s: float = 200.0  # inside p4d/p5 nodes, GB/s per direction
    overhead_fixed_bytes: int = 1 << 30  # CUDA context, NCCL buffers, cuBLAS workspace
    overhead_fraction: float = 0.05  # caching-allocator fragmentation on top of everything else
    overlap: bool = True  # FSDP2 prefetch overlaps communication with compute


DEFAULT_ASSUMPTIONS = Assumptions()


@dataclass(frozen=True)
class Layout:
    nodes: int
    gpus_per_node: int
    gpu: str  # key into catalog.GPUS
    network_gbps: float
    efa: bool = True
    nvlink: bool = False

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass
class StrategyPlan:
    strategy: str
    shard_size: int
    replicate_size: int
    per_gpu_bytes: dict[str, int]
    fits: bool
    max_micro_batch: int
    traffic_bytes_per_step: dict[str, Any]
    step_time_s: dict[str, Any]


@dataclass
class Plan:
    model: str
    params: int
    policy: str
    seq_len: int
    micro_batch: int
    activation_checkpointing: bool
    layout: dict[str, Any]
    gpu_memory_bytes: int
    strategy: str
    per_gpu_bytes: dict[str, int]
    activations_bytes: dict[str, int]
    traffic_bytes_per_step: dict[str, Any]
    step_time_s: dict[str, Any]
    max_micro_batch: int
    fits: bool
    strategies: dict[str, StrategyPlan]
    recommendation: dict[str, Any]
    assumptions: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def root_unit_params(spec: ModelSpec) -> int:
    """The root FSDP unit: embeddings, the final norm and an untied head."""
    head = 0 if spec.tie_embeddings else spec.embedding_params()
    return spec.embedding_params() + spec.hidden_size + head


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def activation_parts(spec: ModelSpec, seq_len: int, micro_batch: int, checkpointing: bool) -> dict[str, int]:
    """Activation bytes of one micro-batch at its peak (the start of backward), in three parts.

    `saved` is what autograd keeps after forward (measured on CPU with saved_tensors_hooks:
    tests/test_plan.py). Per token and Qwen2 block with SDPA (no s x s matrix): each of the two
    RMSNorms keeps its fp32 input (4h), its bf16 output and the weighted copy fed to the linear
    (2h + 2h); attention keeps q (2h), k and v (2kv each) and its output (2h); the MLP keeps
    gate, up, silu(gate) and their product (4 x 2i): 20h + 4kv + 8i bytes. The final norm
    keeps 8h, and the loss the fp32 log-softmax of the logits (4 B per vocab entry).
    With per-block checkpointing only each block's bf16 input (2h) is kept, and one block is
    rebuilt during backward (`recompute`). `loss_backward` is the transient fp32 and bf16
    gradient of the logits (6 B per vocab entry) while everything saved is still held.
    """
    h, i, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    kv = spec.num_kv_heads * spec.head_dim
    block = 20 * h + 4 * kv + 8 * i
    tokens = seq_len * micro_batch
    per_token = (spec.num_layers * 2 * h if checkpointing else spec.num_layers * block) + 8 * h + 4 * v
    return {
        "saved": per_token * tokens,
        "recompute": block * tokens if checkpointing else 0,
        "loss_backward": 6 * v * tokens,
    }


def activation_bytes(spec: ModelSpec, seq_len: int, micro_batch: int, checkpointing: bool) -> int:
    return sum(activation_parts(spec, seq_len, micro_batch, checkpointing).values())


def memory_bytes(
    spec: ModelSpec,
    shard_size: int,
    policy: str,
    seq_len: int,
    micro_batch: int,
    checkpointing: bool,
    a: Assumptions = DEFAULT_ASSUMPTIONS,
) -> dict[str, int]:
    """Per-GPU bytes by component; `total` is what must fit in the GPU's memory."""
    pb = PRECISION[policy]
    p = spec.param_count()
    local = math.ceil(p / shard_size)
    root, block = root_unit_params(spec), spec.layer_params()
    out = {
        "params": local * pb.param,
        "grads": local * pb.grad,
        "optimizer": local * pb.optimizer,
        "fp32_master": local * pb.master,
        # The root unit (embeddings) is unsharded around all of forward and again all of backward;
        # one block is in use and the next prefetched.
        "unsharded_params": (root + 2 * block) * pb.compute,
        # A unit's full gradient before reduce-scatter, plus its reduce_dtype copy when that differs.
        "unsharded_grads": max(root, block) * (pb.compute + (pb.reduce if pb.reduce != pb.compute else 0)),
        "activations": activation_bytes(spec, seq_len, micro_batch, checkpointing),
    }
    subtotal = sum(out.values())
    out["overhead"] = a.overhead_fixed_bytes + int(subtotal * a.overhead_fraction)
    out["total"] = subtotal + out["overhead"]
    return out


def _layout_groups(strategy: str, layout: Layout) -> tuple[int, int]:
    if strategy == "hsdp":
        return layout.gpus_per_node, layout.nodes
    return layout.world, 1


def max_micro_batch(
    spec: ModelSpec, shard_size: int, policy: str, seq_len: int, checkpointing: bool, capacity: int,
    a: Assumptions = DEFAULT_ASSUMPTIONS, limit: int = 1 << 16,
) -> int:
    """The largest micro-batch whose total fits `capacity`; 0 when not even one sequence fits."""

    def fits(b: int) -> bool:
        return memory_bytes(spec, shard_size, policy, seq_len, b, checkpointing, a)["total"] <= capacity

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def traffic_bytes(spec: ModelSpec, strategy: str, layout: Layout, policy: str) -> dict[str, Any]:
    """Bytes each GPU receives per step (ring collectives), and what crosses each node's NIC.

    FSDP: every unit is all-gathered in forward and again in backward, except the root unit
    and the last block, which apply_fsdp keeps unsharded from forward into backward (measured:
    one all-gather each per step); every gradient is reduce-scattered, all over one ring of N x G ranks. A ring's cross-node link carries as
    much as each intra-node link, so a node's NIC moves one GPU's full share.
    HSDP: the same three collectives inside the node, then an all-reduce of each GPU's
    gradient shard with its peers on the other nodes; G such all-reduces share the node's NIC.
    """
    pb = PRECISION[policy]
    p = spec.param_count()
    resharded = p - spec.layer_params() - root_unit_params(spec)
    shard, replicate = _layout_groups(strategy, layout)
    f = _ring(shard)
    ag = f * (p + resharded) * pb.compute
    rs = f * p * pb.reduce
    ar = 2 * _ring(replicate) * math.ceil(p / shard) * pb.reduce
    if strategy == "hsdp":
        intra, cross_node = ag + rs, layout.gpus_per_node * ar
    else:
        intra, cross_node = ag + rs, (ag + rs if layout.nodes > 1 else 0.0)
    per_gpu = ag + rs + ar
    return {
        "all_gather": int(ag),
        "reduce_scatter": int(rs),
        "all_reduce": int(ar),
        "per_gpu": int(per_gpu),
        "intra_node_per_gpu": int(intra),
        "cross_node_per_node": int(cross_node),
        "cross_node_per_gpu": int(cross_node / layout.gpus_per_node),
        "cross_node_share": round(cross_node / layout.gpus_per_node / per_gpu, 4) if per_gpu else 0.0,
    }


def flops_per_step(spec: ModelSpec, seq_len: int, micro_batch: int, checkpointing: bool) -> float:
    """Per GPU: 6 x params per token (8 with the forward recomputed) plus attention scores."""
    tokens = seq_len * micro_batch
    passes = 8 if checkpointing else 6
    attention = (passes * 2) * spec.num_layers * spec.hidden_size * seq_len
    return float(tokens * (passes * spec.param_count() + attention))


def step_time(
    spec: ModelSpec, strategy: str, layout: Layout, policy: str, seq_len: int, micro_batch: int,
    checkpointing: bool, a: Assumptions = DEFAULT_ASSUMPTIONS,
) -> dict[str, Any]:
    """Compute vs communication per step; the larger bounds it when FSDP2's prefetch overlaps them."""
    gpu = catalog.GPUS[layout.gpu]
    t = traffic_bytes(spec, strategy, layout, policy)
    compute = flops_per_step(spec, seq_len, micro_batch, checkpointing) / (gpu.bf16_tflops * 1e12 * a.mfu)
    intra_rate = (a.nvlink_gbytes_s if layout.nvlink else a.pcie_gbytes_s) * GB
    intra = t["intra_node_per_gpu"] / intra_rate

    def estimate(efficiency: float) -> dict[str, Any]:
        rate = layout.network_gbps / 8 * GB * efficiency
        network = t["cross_node_per_node"] / rate if rate else math.inf
        # One FSDP ring runs at its slowest link; HSDP's intra-node and cross-node phases follow each other.
        comm = max(intra, network) if strategy == "fsdp" else intra + network
        parts = {"compute": compute, "network": network, "intra-node": intra}
        bound = max(parts, key=lambda k: parts[k])
        total = max(compute, comm) if a.overlap else compute + comm
        return {
            "estimate": round(total, 4),
            "bound": bound,
            "compute": round(compute, 4),
            "communication": round(comm, 4),
            "network": round(network, 4),
            "intra_node": round(intra, 4),
            "no_overlap": round(compute + comm, 4),
            "network_gbytes_s": round(rate / GB, 3),
        }

    efa, tcp = estimate(a.efa_efficiency), estimate(a.tcp_efficiency)
    chosen = efa if layout.efa else tcp
    return chosen | {"transport": "efa" if layout.efa else "tcp", "efa": efa, "tcp": tcp}


def _strategy_plan(
    spec: ModelSpec, strategy: str, layout: Layout, policy: str, seq_len: int, micro_batch: int,
    checkpointing: bool, capacity: int, a: Assumptions,
) -> StrategyPlan:
    shard, replicate = _layout_groups(strategy, layout)
    mem = memory_bytes(spec, shard, policy, seq_len, micro_batch, checkpointing, a)
    return StrategyPlan(
        strategy=strategy,
        shard_size=shard,
        replicate_size=replicate,
        per_gpu_bytes=mem,
        fits=mem["total"] <= capacity,
        max_micro_batch=max_micro_batch(spec, shard, policy, seq_len, checkpointing, capacity, a),
        traffic_bytes_per_step=traffic_bytes(spec, strategy, layout, policy),
        step_time_s=step_time(spec, strategy, layout, policy, seq_len, micro_batch, checkpointing, a),
    )


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0


def recommend(plans: dict[str, StrategyPlan], layout: Layout, micro_batch: int) -> dict[str, Any]:
    """HSDP when it fits and is faster (it crosses the node boundary less); FSDP otherwise."""
    f, h = plans["fsdp"], plans["hsdp"]
    gb = lambda n: f"{n / GB:.2f} GB"
    if layout.nodes == 1:
        choice, reason = "fsdp", "one node: HSDP's replicate group would have a single member, so it is FSDP"
    elif not h.fits:
        choice = "fsdp"
        reason = (
            f"HSDP needs {gb(h.per_gpu_bytes['total'])} per GPU at micro-batch {micro_batch}, more than the GPU has; "
            f"FSDP over all {layout.world} GPUs needs {gb(f.per_gpu_bytes['total'])}"
        )
    elif h.step_time_s["estimate"] < f.step_time_s["estimate"]:
        choice = "hsdp"
        reason = (
            f"HSDP fits ({gb(h.per_gpu_bytes['total'])} per GPU) and moves "
            f"{gb(h.traffic_bytes_per_step['cross_node_per_node'])} per node across the network per step "
            f"instead of FSDP's {gb(f.traffic_bytes_per_step['cross_node_per_node'])}: "
            f"~{h.step_time_s['estimate']:.3g} s vs ~{f.step_time_s['estimate']:.3g} s per step"
        )
    else:
        choice = "fsdp"
        reason = (
            f"the step is {f.step_time_s['bound']}-bound either way (~{f.step_time_s['estimate']:.3g} s), "
            f"and FSDP leaves more memory ({gb(f.per_gpu_bytes['total'])} vs {gb(h.per_gpu_bytes['total'])} per GPU)"
        )
    best = plans[choice].max_micro_batch
    rec_mb = _pow2_floor(best)
    if best == 0:
        mb_reason = "not even one sequence fits: enable activation checkpointing, shorten sequences or add GPUs"
    else:
        mb_reason = f"largest power of two within the largest micro-batch that fits ({best})"
    return {"strategy": choice, "micro_batch": rec_mb, "reason": reason, "micro_batch_reason": mb_reason}


def layout_for(
    nodes: int, gpus_per_node: int, *, gpu: str | None = None, instance_type: str | None = None,
    network_gbps: float | None = None,
) -> Layout:
    """A Layout from flags and the catalog; the GPU defaults to the instance type's."""
    it = catalog.instance_type(instance_type) if instance_type else None
    gpu_key = (gpu or (it.gpu if it else None) or "").lower()
    if gpu_key not in catalog.GPUS:
        raise InputError(
            f"unknown GPU {gpu or gpu_key!r}" if gpu else f"instance type {instance_type!r} has no known GPU",
            hint=f"pass --gpu with one of: {', '.join(catalog.GPUS)}",
        )
    if nodes < 1 or gpus_per_node < 1:
        raise InputError(f"nodes and GPUs per node must be at least 1, got {nodes} x {gpus_per_node}",
                         hint="pass --nodes N --gpus-per-node G with N, G >= 1")
    gbps = network_gbps if network_gbps is not None else (it.network_gbps if it else None)
    if gbps is None:
        raise InputError("no network bandwidth known for this layout",
                         hint="pass --network-gbps or a known instance type (GPU_NODE_TYPE)")
    if not (math.isfinite(gbps) and gbps > 0):
        raise InputError(f"network bandwidth must be positive and finite, got {gbps:g} Gb/s", hint="pass --network-gbps 40 for 40 Gb/s")
    return Layout(
        nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu_key, network_gbps=float(gbps),
        efa=bool(it.efa_interfaces) if it else True, nvlink=bool(it and it.family.startswith("p")),
    )


def plan(
    spec: ModelSpec,
    layout: Layout,
    *,
    seq_len: int = 128,
    micro_batch: int = 1,
    policy: str = "bf16-mixed",
    activation_checkpointing: bool = False,
    strategy: str = "fsdp",
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
) -> Plan:
    if policy not in PRECISION:
        raise InputError(f"unknown precision policy {policy!r}", hint=f"use one of: {', '.join(POLICIES)}")
    if strategy not in STRATEGIES:
        raise InputError(f"unknown sharding strategy {strategy!r}", hint=f"use one of: {', '.join(STRATEGIES)}")
    if seq_len < 1 or micro_batch < 1:
        raise InputError(f"sequence length and micro-batch must be at least 1, got {seq_len} and {micro_batch}",
                         hint="pass --seq-len L --micro-batch B with L, B >= 1")
    if seq_len > spec.max_position_embeddings:
        raise InputError(f"--seq-len {seq_len} exceeds {spec.name}'s {spec.max_position_embeddings} positions",
                         hint=f"pass --seq-len {spec.max_position_embeddings} or less")
    capacity = int(catalog.GPUS[layout.gpu].memory_gib * (1 << 30))
    plans = {
        s: _strategy_plan(spec, s, layout, policy, seq_len, micro_batch, activation_checkpointing, capacity, assumptions)
        for s in STRATEGIES
    }
    sel = plans[strategy]
    shard = sel.shard_size
    return Plan(
        model=spec.name,
        params=spec.param_count(),
        policy=policy,
        seq_len=seq_len,
        micro_batch=micro_batch,
        activation_checkpointing=activation_checkpointing,
        layout=asdict(layout) | {"world": layout.world, "gpu_name": catalog.GPUS[layout.gpu].name},
        gpu_memory_bytes=capacity,
        strategy=strategy,
        per_gpu_bytes=sel.per_gpu_bytes,
        activations_bytes={
            "without_checkpointing": activation_bytes(spec, seq_len, micro_batch, False),
            "with_checkpointing": activation_bytes(spec, seq_len, micro_batch, True),
        } | activation_parts(spec, seq_len, micro_batch, activation_checkpointing),
        traffic_bytes_per_step=sel.traffic_bytes_per_step,
        step_time_s=sel.step_time_s,
        max_micro_batch=sel.max_micro_batch,
        fits=sel.fits,
        strategies=plans,
        recommendation=recommend(plans, layout, micro_batch),
        assumptions=asdict(assumptions) | {"precision_bytes": asdict(PRECISION[policy]), "shard_size": shard},
    )


def recommend_sharding(
    spec: ModelSpec, nodes: int, gpus_per_node: int, gpu: str | None, seq_len: int, micro_batch: int,
    *, policy: str = "bf16-mixed", instance_type: str | None = None, network_gbps: float | None = None,
) -> str:
    """For `--sharding auto`: the planner's choice, "fsdp" or "hsdp".

    The network comes from `instance_type` when given (g6.12xlarge: 40 Gb/s, EFA), else
    `network_gbps`, else 40 Gb/s over EFA; `gpu=None` takes the instance type's GPU.
    """
    if instance_type is None and network_gbps is None:
        network_gbps = 40.0
    layout = layout_for(nodes, gpus_per_node, gpu=gpu, instance_type=instance_type, network_gbps=network_gbps)
    return plan(spec, layout, seq_len=seq_len, micro_batch=micro_batch, policy=policy).recommendation["strategy"]
