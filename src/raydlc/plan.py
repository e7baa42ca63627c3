"""Per-GPU memory, per-step traffic and step time of an FSDP2 fine-tune, before paying for GPUs.

The hand arithmetic everyone does (bytes per parameter over the number of GPUs) misses
what actually decides whether a job fits and how fast it runs: FSDP2 keeps the sharded
parameters in their original dtype (fp32 under a bf16 MixedPrecisionPolicy, so that shard
*is* the master copy and there is no second one), all-gathers whole units in bf16 (the root
unit, with the embeddings, stays gathered through all of forward and again all of backward),
and moves every parameter across the node boundary three times per step. Everything here is arithmetic on
a `ModelSpec`; the assumptions that are not arithmetic are fields of `Assumptions`.

Gradient accumulation changes all three: N micro-batches per optimizer step pay the
all-gathers N times but, with FSDP2's switches, the gradient reductions once
(`set_requires_gradient_sync(False)`, which keeps every unit's unsharded gradient until the
last micro-batch) or, for HSDP, only the cross-node all-reduce once
(`set_requires_all_reduce(False)`, reduce-scatter inside the node every micro-batch).
`recommend` weighs every sharding × micro-batch × accumulation × sync mode that fits and
returns the fastest by tokens/s, with the runner-up and the candidates it compared.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from raydlc import catalog
from raydlc.errors import InputError
from raydlc.models import ModelSpec

Policy = Literal["bf16-mixed", "pure-bf16", "fp32"]
Strategy = Literal["fsdp", "hsdp"]
Sync = Literal["every", "once", "all-reduce-once"]
POLICIES: tuple[str, ...] = ("bf16-mixed", "pure-bf16", "fp32")
STRATEGIES: tuple[str, ...] = ("fsdp", "hsdp")
SYNCS: dict[str, tuple[str, ...]] = {"fsdp": ("every", "once"), "hsdp": ("every", "once", "all-reduce-once")}
GB = 1e9
# The global-batch ceiling of the search, in tokens per optimizer step. Supervised fine-tuning
# recipes use ~64k (Alpaca: 128 x 512) to ~256k tokens per step (Llama 2's SFT: 64 x 4096);
# 128 Ki tokens sits between, so accumulation can amortise the gradient traffic without the
# planner winning by a batch no fine-tune would use.
DEFAULT_MAX_GLOBAL_BATCH = 131072
# Tokens per chunk of the chunked cross-entropy (train.loss), as TrainConfig.loss_chunk defaults.
DEFAULT_LOSS_CHUNK = 1024
REDUCE_DTYPES: tuple[str, ...] = ("fp32", "bf16")
REDUCE_BYTES = {"fp32": 4, "bf16": 2}


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
    # No policy on an fp32 model (BF16=false, the CPU runs): everything in fp32.
    "fp32": PrecisionBytes(param=4, grad=4, optimizer=8, master=0, compute=4, reduce=4),
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
    # FSDP2's prefetch overlaps each micro-batch's collectives with that micro-batch's compute;
    # the reductions paid once per step run in the last micro-batch's backward and overlap only it.
    overlap: bool = True
    tie_fraction: float = 0.02  # layouts this close to the fastest count as as fast: the smaller global batch wins


DEFAULT_ASSUMPTIONS = Assumptions()


@dataclass(frozen=True)
class Layout:
    nodes: int
    gpus_per_node: int
    gpu: str  # key into catalog.GPUS
    network_gbps: float
    efa: bool = True
    nvlink: bool = False
    instance_type: str | None = None  # whose catalogue facts (network, EFA, NVLink) these are

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Workload:
    """What one optimizer step trains and how: every planner function reads this one value.

    The model, the step's shape (sequence length, micro-batch, accumulation, when gradients
    sync), how it is computed (precision policy, activation checkpointing) and the ceiling of
    the global batch a search may choose, in tokens per step. `grad_accum="auto"` and
    `sync="auto"` are requests only `plan` resolves; the arithmetic reads concrete values, and
    the searches (`recommend`, `raydlc.scaleout.scan`) vary the dimensions they search.
    A new term of the model is a field here, read where it counts.
    """

    spec: ModelSpec
    seq_len: int = 128
    micro_batch: int = 1
    grad_accum: int | str = 1
    sync: str = "every"
    policy: str = "bf16-mixed"
    activation_checkpointing: bool = False
    max_global_batch: int = DEFAULT_MAX_GLOBAL_BATCH
    loss_chunk: int = DEFAULT_LOSS_CHUNK  # tokens per chunk of the cross-entropy; 0 = the full logits at once
    reduce_dtype: str | None = None  # "fp32" or "bf16"; None = the policy's own (bf16 only under pure-bf16)

    def __post_init__(self) -> None:
        if self.reduce_dtype is not None and self.reduce_dtype not in REDUCE_DTYPES:
            raise InputError(f"unknown reduction dtype {self.reduce_dtype!r}", hint=f"use one of: {', '.join(REDUCE_DTYPES)}")
        if self.loss_chunk < 0:
            raise InputError(f"the loss chunk must be 0 (off) or a number of tokens, got {self.loss_chunk}", hint="pass --loss-chunk 1024 (or 0)")
        if self.policy not in PRECISION:
            raise InputError(f"unknown precision policy {self.policy!r}", hint=f"use one of: {', '.join(POLICIES)}")
        if self.sync != "auto" and self.sync not in SYNCS["hsdp"]:
            raise InputError(f"unknown sync mode {self.sync!r}", hint=f"use auto or one of: {', '.join(SYNCS['hsdp'])}")
        if self.seq_len < 1 or self.micro_batch < 1:
            raise InputError(f"sequence length and micro-batch must be at least 1, got {self.seq_len} and {self.micro_batch}",
                             hint="pass --seq-len L --micro-batch B with L, B >= 1")
        if self.grad_accum != "auto" and (not isinstance(self.grad_accum, int) or self.grad_accum < 1):
            raise InputError(f"gradient accumulation must be at least 1 or auto, got {self.grad_accum!r}",
                             hint="pass --grad-accum 4 or --grad-accum auto")
        if self.max_global_batch < 1:
            raise InputError(f"the global-batch ceiling must be at least 1 token, got {self.max_global_batch}",
                             hint="pass --max-global-batch 131072")
        if self.seq_len > self.spec.max_position_embeddings:
            raise InputError(f"--seq-len {self.seq_len} exceeds {self.spec.name}'s {self.spec.max_position_embeddings} positions",
                             hint=f"pass --seq-len {self.spec.max_position_embeddings} or less")

    def at(self, **changes: Any) -> Workload:
        """The same workload with some fields changed (and checked again)."""
        return replace(self, **changes)

    @property
    def precision(self) -> PrecisionBytes:
        """The policy's bytes, with the gradient reduction in `reduce_dtype` when one is chosen."""
        pb = PRECISION[self.policy]
        return pb if self.reduce_dtype is None else replace(pb, reduce=REDUCE_BYTES[self.reduce_dtype])

    @property
    def accum(self) -> int:
        """The accumulation as a number: the arithmetic needs one ("auto" is resolved by `plan`)."""
        assert isinstance(self.grad_accum, int), "resolve grad_accum='auto' first (plan does)"
        return self.grad_accum

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one GPU."""
        return self.seq_len * self.micro_batch


@dataclass(frozen=True)
class StrategyPlan:
    strategy: str
    shard_size: int
    replicate_size: int
    sync: str
    per_gpu_bytes: dict[str, int]
    fits: bool
    max_micro_batch: int
    traffic_bytes_per_step: dict[str, Any]
    step_time_s: dict[str, Any]


@dataclass(frozen=True)
class Candidate:
    """One way to run an optimizer step: what `recommend` compares."""

    strategy: str
    micro_batch: int
    grad_accum: int
    sync: str
    global_batch: int  # sequences per optimizer step, all ranks and micro-batches
    tokens_per_step: int
    per_gpu_bytes: int  # the total that must fit
    fits: bool
    step_time_s: float
    tokens_per_s: float
    bound: str
    cross_node_bytes_per_node: int
    intra_node_bytes_per_gpu: int

    @property
    def mode(self) -> tuple[str, str]:
        """Sharding and sync mode; with one micro-batch every sync mode is the same step."""
        return self.strategy, self.sync if self.grad_accum > 1 else "every"

    def describe(self) -> str:
        accum = f" x {self.grad_accum} accumulated, sync {self.sync}" if self.grad_accum > 1 else ""
        return f"{self.strategy}, micro-batch {self.micro_batch}{accum}"


@dataclass(frozen=True)
class Recommendation:
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
            "reason": self.reason,
            "micro_batch_reason": self.micro_batch_reason,
            "max_global_batch": self.max_global_batch,
            "runner_up": asdict(self.runner_up) if self.runner_up else None,
            "candidates_considered": len(self.candidates),
            "top": [asdict(c) for c in self.candidates[:top]],
        }


@dataclass(frozen=True)
class Plan:
    model: str
    params: int
    policy: str
    seq_len: int
    micro_batch: int
    grad_accum: int
    activation_checkpointing: bool
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fsdp_units(spec: ModelSpec) -> dict[str, int]:
    """Parameters of each FSDP unit as `train.model.apply_fsdp` builds them (torchtitan's units).

    Untied: the embeddings (resharded after forward, gathered again for their backward, the
    last one), each decoder block, `[final norm, head]` (kept from the end of forward through
    its backward, the first) and a root that holds nothing else. Tied, the one weight is
    both embedding and head: it stays in the root unit with the final norm, gathered all step.
    """
    emb, h = spec.embedding_params(), spec.hidden_size
    if spec.tie_embeddings:
        return {"embeddings": 0, "head": 0, "root": emb + h, "block": spec.layer_params()}
    return {"embeddings": emb, "head": emb + h, "root": 0, "block": spec.layer_params()}


def kept_params(spec: ModelSpec) -> int:
    """Parameters gathered once per micro-batch (kept unsharded from forward into backward): the
    root, the head unit and the last block; every other unit is gathered in forward and again in backward."""
    u = fsdp_units(spec)
    return u["root"] + u["head"] + u["block"]


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def activation_parts(w: Workload) -> dict[str, int]:
    """Activation bytes of the decoder of one micro-batch at its peak (the start of backward).

    `saved` is what autograd keeps after forward (measured on CPU with saved_tensors_hooks:
    tests/test_plan.py). Per token and Qwen2 block with SDPA (no s x s matrix): each of the two
    RMSNorms keeps its fp32 input (4h), its bf16 output and the weighted copy fed to the linear
    (2h + 2h); attention keeps q (2h), k and v (2kv each) and its output (2h); the MLP keeps
    gate, up, silu(gate) and their product (4 x 2i): 20h + 4kv + 8i bytes. The final norm
    keeps 8h. With per-block checkpointing only each block's bf16 input (2h) is kept, and one
    block is rebuilt during backward (`recompute`). The logits are `logits_bytes`.
    """
    spec, checkpointing, tokens = w.spec, w.activation_checkpointing, w.tokens
    h, i = spec.hidden_size, spec.intermediate_size
    kv = spec.num_kv_heads * spec.head_dim
    block = 20 * h + 4 * kv + 8 * i
    per_token = (spec.num_layers * 2 * h if checkpointing else spec.num_layers * block) + 8 * h
    return {"saved": per_token * tokens, "recompute": block * tokens if checkpointing else 0}


def activation_bytes(w: Workload) -> int:
    return sum(activation_parts(w).values())


def logits_parts(w: Workload) -> dict[str, int]:
    """The loss's own bytes over the vocabulary, at their peak (measured: tests/test_train_loss.py).

    Unchunked (`loss_chunk=0`): the fp32 log-softmax (4 B per token and vocabulary entry) is
    kept from forward into backward, where the gradient of the loss and of the log-softmax
    input (4 + 4 B) join it: 12 B per entry at the peak; the forward's bf16 logits and fp32
    copy (2 + 4 + 4) stay below that. Chunked (train.loss): nothing is kept, and one chunk's
    fp32 logits and softmax or log-softmax (4 + 4 B per entry) are alive at a time.
    """
    v, tokens = w.spec.vocab_size, w.tokens
    if w.loss_chunk <= 0:
        return {"saved": 4 * v * tokens, "peak": 12 * v * tokens}
    return {"saved": 0, "peak": 8 * v * min(w.loss_chunk, tokens)}


def logits_bytes(w: Workload) -> int:
    return logits_parts(w)["peak"]


def unsharded_parts(w: Workload) -> dict[str, int]:
    """Unsharded (all-gathered) parameters and their full gradients, at their peaks.

    Parameters, in the compute dtype: the largest of the head unit (from the end of forward
    through the head's backward) and the embeddings (forward, and their backward at the end),
    with the last block kept and the next one prefetched beside it; a tied model's root (the
    shared weight) is held all step. Gradients: one unit's full gradient in the compute dtype
    and, while FSDP2 copies it into the reduce-scatter buffer, in the reduce dtype when that
    differs (`reduce_dtype=bf16` under bf16 compute removes that copy).
    """
    pb, u = w.precision, fsdp_units(w.spec)
    largest = max(u["root"], u["head"], u["embeddings"])
    copy = pb.reduce if pb.reduce != pb.compute else 0
    return {
        "unsharded_params": (largest + 2 * u["block"]) * pb.compute,
        "unsharded_grads": max(largest, u["block"]) * (pb.compute + copy),
    }


def default_sync(strategy: str, grad_accum: int = 2) -> str:
    """The sync mode a run uses when nothing chose one: the issue's FSDP2 switch for each sharding."""
    if grad_accum <= 1:
        return "every"
    return "all-reduce-once" if strategy == "hsdp" else "once"


def _sync_for(strategy: str, sync: str, grad_accum: int) -> str:
    if sync == "auto" or sync not in SYNCS[strategy]:
        return default_sync(strategy, grad_accum)
    return sync


def memory_bytes(w: Workload, shard_size: int, a: Assumptions = DEFAULT_ASSUMPTIONS) -> dict[str, int]:
    """Per-GPU bytes by component; `total` is what must fit in the GPU's memory.

    `accumulated_grads` is what accumulation keeps between micro-batches: with sync `once`
    every unit's unsharded gradient in the reduce dtype (FSDP2 upcasts it after each
    backward), with `all-reduce-once` the reduce-scattered shard waiting for the all-reduce.
    """
    pb, spec = w.precision, w.spec
    p = spec.param_count()
    local = math.ceil(p / shard_size)
    accumulated = 0
    if w.accum > 1 and w.sync == "once":
        accumulated = p * pb.reduce
    elif w.accum > 1 and w.sync == "all-reduce-once":
        accumulated = local * pb.reduce
    out = {
        "params": local * pb.param,
        "grads": local * pb.grad,
        "optimizer": local * pb.optimizer,
        "fp32_master": local * pb.master,
        **unsharded_parts(w),
        "accumulated_grads": accumulated,
        "activations": activation_bytes(w),
        "logits": logits_bytes(w),
    }
    subtotal = sum(out.values())
    out["overhead"] = a.overhead_fixed_bytes + int(subtotal * a.overhead_fraction)
    out["total"] = subtotal + out["overhead"]
    return out


def _layout_groups(strategy: str, layout: Layout) -> tuple[int, int]:
    if strategy == "hsdp":
        return layout.gpus_per_node, layout.nodes
    return layout.world, 1


def max_micro_batch(w: Workload, shard_size: int, capacity: int, a: Assumptions = DEFAULT_ASSUMPTIONS, limit: int = 1 << 16) -> int:
    """The largest micro-batch (at `w`'s accumulation and sync) whose total fits `capacity`; 0 when not even one sequence fits."""

    def fits(b: int) -> bool:
        return memory_bytes(w.at(micro_batch=b), shard_size, a)["total"] <= capacity

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


def _micro_batch_bytes(w: Workload, strategy: str, layout: Layout) -> tuple[float, float, float]:
    """(all-gather, reduce-scatter, all-reduce) bytes each GPU receives for one micro-batch that reduces."""
    pb, spec = w.precision, w.spec
    p = spec.param_count()
    resharded = p - kept_params(spec)
    shard, replicate = _layout_groups(strategy, layout)
    f = _ring(shard)
    ag = f * (p + resharded) * pb.compute
    rs = f * p * pb.reduce
    ar = 2 * _ring(replicate) * math.ceil(p / shard) * pb.reduce
    return ag, rs, ar


def _reductions(grad_accum: int, sync: str) -> tuple[int, int]:
    """How many reduce-scatters and all-reduces one optimizer step of `grad_accum` micro-batches runs."""
    rs = 1 if sync == "once" else grad_accum
    ar = grad_accum if sync == "every" else 1
    return rs, ar


def traffic_bytes(w: Workload, strategy: str, layout: Layout) -> dict[str, Any]:
    """Bytes each GPU receives per optimizer step (ring collectives), and what crosses each node's NIC.

    FSDP: every unit is all-gathered in forward and again in backward, except the root, the
    head unit and the last block, which apply_fsdp keeps unsharded from forward into backward
    (`kept_params`; measured: one all-gather each per micro-batch); every gradient is reduce-scattered, all over one ring of N x G ranks. A ring's cross-node link carries as
    much as each intra-node link, so a node's NIC moves one GPU's full share.
    HSDP: the same three collectives inside the node, then an all-reduce of each GPU's
    gradient shard with its peers on the other nodes; G such all-reduces share the node's NIC.
    With `grad_accum` micro-batches the all-gathers run for each; the reductions for each
    (`every`), once (`once`), or the reduce-scatter for each and the all-reduce once
    (`all-reduce-once`).
    """
    grad_accum, sync = w.accum, w.sync
    ag1, rs1, ar1 = _micro_batch_bytes(w, strategy, layout)
    n_rs, n_ar = _reductions(grad_accum, sync)
    ag, rs, ar = grad_accum * ag1, n_rs * rs1, n_ar * ar1
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
        "micro_batches": grad_accum,
        "sync": sync,
    }


def flops_per_step(w: Workload) -> float:
    """Per GPU and micro-batch: 6 x params per token (8 with the forward recomputed) plus attention scores
    (and the head's matmul once more with the chunked loss)."""
    spec = w.spec
    passes = 8 if w.activation_checkpointing else 6
    attention = (passes * 2) * spec.num_layers * spec.hidden_size * w.seq_len
    # The chunked loss computes the head's logits again in backward (train.loss).
    rehead = 2 * spec.vocab_size * spec.hidden_size if w.loss_chunk > 0 else 0
    return float(w.tokens * (passes * spec.param_count() + attention + rehead))


def step_time(w: Workload, strategy: str, layout: Layout, a: Assumptions = DEFAULT_ASSUMPTIONS) -> dict[str, Any]:
    """Compute vs communication per optimizer step, and the tokens per second that makes.

    With overlap (FSDP2's prefetch) a micro-batch takes the larger of its compute and its
    collectives; the reductions paid once per step belong to the last micro-batch, whose
    backward is the only compute they can hide behind. Without overlap everything adds up.
    """
    gpu = catalog.GPUS[layout.gpu]
    n, sync = w.accum, w.sync
    compute_one = flops_per_step(w) / (gpu.bf16_tflops * 1e12 * a.mfu)
    ag, rs, ar = _micro_batch_bytes(w, strategy, layout)
    # A micro-batch before the last reduces what the sync mode reduces every time; the last reduces all.
    rs_each = rs if sync != "once" else 0.0
    ar_each = ar if sync == "every" else 0.0
    intra_rate = (a.nvlink_gbytes_s if layout.nvlink else a.pcie_gbytes_s) * GB
    tokens = w.tokens * n * layout.world

    def phases(ag_b: float, rs_b: float, ar_b: float, rate: float) -> tuple[float, float, float]:
        intra = (ag_b + rs_b) / intra_rate
        cross = layout.gpus_per_node * ar_b if strategy == "hsdp" else ((ag_b + rs_b) if layout.nodes > 1 else 0.0)
        network = cross / rate if rate else (math.inf if cross else 0.0)
        # One FSDP ring runs at its slowest link; HSDP's intra-node and cross-node phases follow each other.
        return (max(intra, network) if strategy == "fsdp" else intra + network), intra, network

    def estimate(efficiency: float) -> dict[str, Any]:
        rate = layout.network_gbps / 8 * GB * efficiency
        each, each_intra, each_net = phases(ag, rs_each, ar_each, rate)
        last, last_intra, last_net = phases(ag, rs, ar, rate)
        compute = n * compute_one
        comm = (n - 1) * each + last
        network = (n - 1) * each_net + last_net
        intra = (n - 1) * each_intra + last_intra
        parts = {"compute": compute, "network": network, "intra-node": intra}
        bound = max(parts, key=lambda k: parts[k])
        total = (n - 1) * max(compute_one, each) + max(compute_one, last) if a.overlap else compute + comm
        return {
            "estimate": round(total, 4),
            "bound": bound,
            "compute": round(compute, 4),
            "communication": round(comm, 4),
            "network": round(network, 4),
            "intra_node": round(intra, 4),
            "no_overlap": round(compute + comm, 4),
            "network_gbytes_s": round(rate / GB, 3),
            "tokens_per_step": tokens,
            "tokens_per_s": round(tokens / total, 1) if total > 0 else 0.0,
        }

    efa, tcp = estimate(a.efa_efficiency), estimate(a.tcp_efficiency)
    chosen = efa if layout.efa else tcp
    return chosen | {"transport": "efa" if layout.efa else "tcp", "micro_batches": n, "sync": sync, "efa": efa, "tcp": tcp}


def _strategy_plan(w: Workload, strategy: str, layout: Layout, a: Assumptions) -> StrategyPlan:
    shard, replicate = _layout_groups(strategy, layout)
    w = w.at(sync=_sync_for(strategy, w.sync, w.accum))
    capacity = gpu_capacity(layout)
    mem = memory_bytes(w, shard, a)
    return StrategyPlan(
        strategy=strategy,
        shard_size=shard,
        replicate_size=replicate,
        sync=w.sync,
        per_gpu_bytes=mem,
        fits=mem["total"] <= capacity,
        max_micro_batch=max_micro_batch(w, shard, capacity, a),
        traffic_bytes_per_step=traffic_bytes(w, strategy, layout),
        step_time_s=step_time(w, strategy, layout, a),
    )


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def gpu_capacity(layout: Layout) -> int:
    return int(catalog.GPUS[layout.gpu].memory_gib * (1 << 30))


def candidate(w: Workload, strategy: str, layout: Layout, a: Assumptions = DEFAULT_ASSUMPTIONS) -> Candidate:
    """One layout's memory, traffic and speed, in the form `recommend` compares."""
    shard, _ = _layout_groups(strategy, layout)
    mem = memory_bytes(w, shard, a)["total"]
    traffic = traffic_bytes(w, strategy, layout)
    st = step_time(w, strategy, layout, a)
    return Candidate(
        strategy=strategy, micro_batch=w.micro_batch, grad_accum=w.accum, sync=w.sync,
        global_batch=w.micro_batch * w.accum * layout.world, tokens_per_step=st["tokens_per_step"],
        per_gpu_bytes=mem, fits=mem <= gpu_capacity(layout), step_time_s=st["estimate"], tokens_per_s=st["tokens_per_s"],
        bound=st["bound"], cross_node_bytes_per_node=traffic["cross_node_per_node"], intra_node_bytes_per_gpu=traffic["intra_node_per_gpu"],
    )


def recommend(
    w: Workload,
    layout: Layout,
    *,
    strategies: tuple[str, ...] | None = None,
    micro_batches: tuple[int, ...] | None = None,
    grad_accums: tuple[int, ...] | None = None,
    syncs: tuple[str, ...] | None = None,
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
    """
    a = assumptions
    capacity = gpu_capacity(layout)
    world, ceiling = layout.world, w.max_global_batch
    one = w.at(grad_accum=1, sync="every")
    if strategies is None:
        strategies = STRATEGIES if layout.nodes > 1 else ("fsdp",)
    within = lambda mb, n: mb * n * world * w.seq_len <= ceiling
    seen: set[tuple[str, int, int, str]] = set()
    out: list[Candidate] = []
    for strategy in strategies:
        shard, _ = _layout_groups(strategy, layout)
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


def _pick(fastest_first: list[Candidate], tie: float) -> Candidate | None:
    if not fastest_first:
        return None
    top = fastest_first[0].tokens_per_s
    near = [c for c in fastest_first if c.tokens_per_s >= top * (1 - tie)]
    return min(near, key=lambda c: (-c.micro_batch, c.grad_accum, c.per_gpu_bytes))


def _reasons(
    w: Workload, layout: Layout, best: Candidate | None, runner: Candidate | None, cands: list[Candidate],
    strategies: tuple[str, ...], a: Assumptions,
) -> tuple[str, str]:
    """Why this layout, in a sentence a person can check against the tables."""
    gb = lambda n: f"{n / GB:.2f} GB"
    ceiling = w.max_global_batch
    capacity = gpu_capacity(layout)
    if best is None:
        smallest = min(cands, key=lambda c: c.per_gpu_bytes) if cands else None
        need = f" (the smallest layout needs {gb(smallest.per_gpu_bytes)} per GPU of {gb(capacity)})" if smallest else ""
        return (f"nothing fits{need}", "not even one sequence fits: enable activation checkpointing, shorten sequences or add GPUs")
    parts = [
        f"{best.describe()}: {best.global_batch:,} sequences ({best.tokens_per_step:,} tokens) per step in ~{best.step_time_s:.3g} s "
        f"= ~{best.tokens_per_s:,.0f} tokens/s, {best.bound}-bound, {gb(best.per_gpu_bytes)} of {gb(capacity)} per GPU"
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
    shard, _ = _layout_groups(best.strategy, layout)
    top = max_micro_batch(w.at(grad_accum=best.grad_accum, sync=best.sync), shard, capacity, a)
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
    if it is not None and it.gpu != gpu_key:
        it = catalog.type_with_gpu(gpu_key, gpus_per_node)
    gbps = network_gbps if network_gbps is not None else (it.network_gbps if it else None)
    if gbps is None:
        raise InputError(f"no instance type in the catalogue has {catalog.GPUS[gpu_key].name} GPUs: the network between nodes is unknown"
                         if gpu else "no network bandwidth known for this layout",
                         hint="pass --network-gbps (e.g. 3200 for 32 x 100 Gb/s EFA) or a known instance type (GPU_NODE_TYPE)")
    if not (math.isfinite(gbps) and gbps > 0):
        raise InputError(f"network bandwidth must be positive and finite, got {gbps:g} Gb/s", hint="pass --network-gbps 40 for 40 Gb/s")
    return Layout(
        nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu_key, network_gbps=float(gbps),
        efa=bool(it.efa_interfaces) if it else True, nvlink=bool(it and it.nvlink), instance_type=it.name if it else None,
    )


# What `plan` may turn on when the workload as given fits nowhere, cheapest first, with its price.
REMEDIES: dict[str, tuple[Any, str]] = {
    "loss_chunk": (DEFAULT_LOSS_CHUNK, f"the chunked cross-entropy (LOSS_CHUNK={DEFAULT_LOSS_CHUNK}): one more head matmul per step for one chunk's logits instead of the sequence's"),
    "activation_checkpointing": (True, "activation checkpointing (ACTIVATION_CHECKPOINTING=true): each block's forward runs again in backward, ~1/3 more compute"),
    "reduce_dtype": ("bf16", "gradient reduction in bf16 (REDUCE_DTYPE=bf16): no fp32 copy of each unit's gradient and half the reduce-scatter bytes, "
                             "but every cross-rank sum is rounded to bf16's 8-bit mantissa (fp32 is exact to 24 bits)"),
}


def _remedy_sets(w: Workload, free: tuple[str, ...]) -> list[dict[str, Any]]:
    """Changes to try, in order: none, then the chunked loss and checkpointing, and bf16 reduction only after both."""
    def needed(name: str) -> bool:
        value = REMEDIES[name][0]
        if name == "reduce_dtype":
            return name in free and w.precision.reduce != REDUCE_BYTES[value]
        return name in free and getattr(w, name) != value

    out: list[dict[str, Any]] = []
    for reduce in (False, True):
        for ac in (False, True):
            for chunk in (False, True):
                names = [n for n, on in (("loss_chunk", chunk), ("activation_checkpointing", ac), ("reduce_dtype", reduce)) if on]
                if all(needed(n) for n in names):
                    out.append({n: REMEDIES[n][0] for n in names})
    return out


def fitting(w: Workload, layout: Layout, free: tuple[str, ...] = (), a: Assumptions = DEFAULT_ASSUMPTIONS) -> tuple[Workload, Recommendation, dict[str, Any]]:
    """The workload with the first of `REMEDIES` (among those `free` to change) that makes a layout fit,
    its recommendation, and the changes made ({} when it fits as given or nothing helps)."""
    first: tuple[Workload, Recommendation] | None = None
    for changes in _remedy_sets(w, free):
        tried = w.at(**changes)
        rec = recommend(tried, layout, assumptions=a)
        first = first or (tried, rec)
        if rec.best is not None:
            return tried, rec, changes
    assert first is not None
    return first[0], first[1], {}


def plan(
    w: Workload, layout: Layout, *, strategy: str | None = None, free: tuple[str, ...] = (), assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
) -> Plan:
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
        "per_gpu_bytes_itemised": memory_bytes(best_w, _layout_groups(b.strategy, layout)[0], assumptions) if best_w and b else None,
    }
    return Plan(
        model=w.spec.name,
        params=w.spec.param_count(),
        policy=w.policy,
        seq_len=w.seq_len,
        micro_batch=w.micro_batch,
        grad_accum=w.accum,
        activation_checkpointing=w.activation_checkpointing,
        layout=asdict(layout) | {"world": layout.world, "gpu_name": catalog.GPUS[layout.gpu].name},
        gpu_memory_bytes=gpu_capacity(layout),
        strategy=strategy,
        sync=sel.sync,
        per_gpu_bytes=sel.per_gpu_bytes,
        activations_bytes={
            "without_checkpointing": activation_bytes(w.at(activation_checkpointing=False)),
            "with_checkpointing": activation_bytes(w.at(activation_checkpointing=True)),
        } | activation_parts(w),
        traffic_bytes_per_step=sel.traffic_bytes_per_step,
        step_time_s=sel.step_time_s,
        max_micro_batch=sel.max_micro_batch,
        fits=sel.fits,
        strategies=plans,
        recommendation=recommendation,
        loss_chunk=w.loss_chunk,
        reduce_dtype=_reduce_name(w),
        logits_bytes={"unchunked": logits_bytes(w.at(loss_chunk=0)), "chunked": logits_bytes(w.at(loss_chunk=w.loss_chunk or DEFAULT_LOSS_CHUNK))}
        | logits_parts(w),
        fsdp_units=fsdp_units(w.spec),
        assumptions=asdict(assumptions) | {"precision_bytes": asdict(w.precision), "shard_size": sel.shard_size},
    )


def _reduce_name(w: Workload) -> str:
    return "bf16" if w.precision.reduce == 2 else "fp32"


def recommend_sharding(w: Workload, layout: Layout) -> str:
    """The faster sharding that fits at the workload's micro-batch without accumulation, "fsdp" or
    "hsdp"; FSDP (the smaller footprint) when neither fits."""
    rec = recommend(w, layout, micro_batches=(w.micro_batch,), grad_accums=(1,))
    return rec.best.strategy if rec.best is not None else "fsdp"
