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
One way to run a step, with its memory, traffic and speed, is a `Candidate`; the search over
them is `raydlc.planner.search`.
"""


from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from raydlc.errors import InputError
from raydlc.facts import instances
from raydlc.facts.mfu import MFU, MfuFact
from raydlc.facts.models import LORA_DEFAULT_TARGETS, ModelSpec

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
# No recommendation may plan more than this fraction of the GPU's memory: the rest is what the
# model does not see (allocator rounding, NCCL's buffers growing, a longer sequence in a batch).
MAX_MEMORY_FRACTION = 0.92
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

    mfu: float = 0.40  # compiled MFU of a GPU family facts.mfu has no row for (torchtitan's H100 figure)
    # Compiled over eager: torchtitan's published Llama-3-8B table on H100 (+15.7 % tokens/s with
    # per-block torch.compile); an eager run's MFU is `mfu / compile_speedup`.
    compile_speedup: float = 1.157
    # Per GPU (key of facts.instances.GPUS): a measured compiled MFU replaces facts.mfu's figure for that GPU.
    # Empty: every family takes facts.mfu's (assumed, each with its source: the L4 ~0.22, H100 0.40).
    mfu_by_gpu: dict[str, float] = field(default_factory=dict)
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


    def mfu_for(self, gpu: str, compiled: bool = True) -> float:
        """The MFU assumed on `gpu`, compiled or eager."""
        base = self.mfu_by_gpu.get(gpu, self.family_mfu(gpu).compiled)
        return base if compiled else base / self.compile_speedup

    def family_mfu(self, gpu: str) -> MfuFact:
        """facts.mfu's figure for `gpu` (its kind and source); a family without one takes `mfu`."""
        return MFU.get(gpu) or MfuFact(self.mfu, "assumed", "the planner's default MFU (torchtitan's H100 figure), not scaled for this GPU")

    def mfu_source(self, gpu: str) -> dict[str, str]:
        """Whether `gpu`'s MFU is measured or assumed, and from what."""
        if gpu in self.mfu_by_gpu:
            return {"kind": "measured", "source": "a measurement passed to the planner (Assumptions.mfu_by_gpu)"}
        fact = self.family_mfu(gpu)
        return {"kind": fact.kind, "source": fact.source}

    def stated(self, gpu: str, compiled: bool) -> dict[str, Any]:
        """What a plan says it assumed: the MFU per GPU family with and without compile, which one
        it used and why, and the links' efficiencies, so a GPU measurement can correct them."""
        return {
            "mfu_used": round(self.mfu_for(gpu, compiled), 4),
            "mfu_depends_on": f"compile={'on' if compiled else 'off'} (an eager run is assumed {self.compile_speedup:g}x slower in compute) and the GPU ({gpu})",
            "mfu_source": self.mfu_source(gpu),
            "mfu_by_gpu": {g: {"compiled": round(self.mfu_for(g, True), 4), "eager": round(self.mfu_for(g, False), 4),
                               "source": self.mfu_source(g)["kind"], "from": self.mfu_source(g)["source"]} for g in instances.GPUS},
            "link_efficiency": {"efa": self.efa_efficiency, "tcp": self.tcp_efficiency,
                                "pcie_gbytes_s": self.pcie_gbytes_s, "nvlink_gbytes_s": self.nvlink_gbytes_s},
        }


DEFAULT_ASSUMPTIONS = Assumptions()


@dataclass(frozen=True)
class Layout:
    nodes: int
    gpus_per_node: int
    gpu: str  # key into instances.GPUS
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
    the searches (`recommend`, `raydlc.planner.scan.scan`) vary the dimensions they search.
    A new term of the model is a field here, read where it counts.
    """

    spec: ModelSpec
    seq_len: int = 128
    micro_batch: int = 1
    grad_accum: int | str = 1
    sync: str = "every"
    policy: str = "bf16-mixed"
    activation_checkpointing: bool | str = False  # False (none), True (full) or "selective" (`AC_MODES`)
    max_global_batch: int = DEFAULT_MAX_GLOBAL_BATCH
    loss_chunk: int = DEFAULT_LOSS_CHUNK  # tokens per chunk of the cross-entropy; 0 = the full logits at once
    reduce_dtype: str | None = None  # "fp32" or "bf16"; None = the policy's own (bf16 only under pure-bf16)
    compile: bool = True  # each block torch.compile'd (the GPU default); the assumed MFU depends on it
    lora_rank: int = 0  # 0 = full fine-tuning; else LoRA adapters of this rank on a frozen base
    lora_targets: tuple[str, ...] = ()  # the projections LoRA adapts; () = the family's (facts.models.LORA_DEFAULT_TARGETS)
    lora_saved_params: int = 0  # LORA_MODULES_TO_SAVE's parameters, trained in full beside the adapters (facts.models.saved_params)
    lora_dropout: float = 0.0  # LoRA's dropout on the adapters' input; above 0 it saves masks (`lora_dropout_bytes`)

    def __post_init__(self) -> None:
        object.__setattr__(self, "activation_checkpointing", ac_value(self.activation_checkpointing))
        if self.lora_rank < 0:
            raise InputError(f"the LoRA rank must be 0 (full fine-tuning) or more, got {self.lora_rank}", hint="pass --lora-rank 16 (or 0)")
        if self.lora_rank:
            self.spec.lora_params(self.lora_rank, self.lora_targets or None)  # an unknown target fails here
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

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def compiled_blocks(self) -> bool:
        """Whether the blocks run compiled: as COMPILE says, except under selective checkpointing, whose op policy
        must see each op (train.sac: under torch.compile inductor's fused and out= kernels bypass it), so eager."""
        return self.compile and self.ac != "selective"

    @property
    def ac(self) -> str:
        """The checkpointing as a word: none, selective or full."""
        return ac_mode(self.activation_checkpointing)

    @property
    def targets(self) -> tuple[str, ...]:
        """The projections LoRA adapts: as given, else the family's."""
        return self.lora_targets or LORA_DEFAULT_TARGETS[self.spec.architecture]

    def adapter_params(self) -> int:
        """LoRA's adapter parameters (0 for full fine-tuning): rank x (in + out) per targeted projection per block."""
        return self.spec.lora_params(self.lora_rank, self.targets) if self.lora else 0

    def trained_params(self) -> int:
        """Parameters that carry gradients and optimizer state: every one, or with LoRA the adapters and the modules saved
        whole (LORA_MODULES_TO_SAVE; their frozen compute copy stays counted in the base: a small overcount)."""
        return self.adapter_params() + self.lora_saved_params if self.lora else self.spec.param_count()


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
    activation_checkpointing: bool | str = False

    @property
    def mode(self) -> tuple[str, str]:
        """Sharding and sync mode; with one micro-batch every sync mode is the same step."""
        return self.strategy, self.sync if self.grad_accum > 1 else "every"

    def describe(self) -> str:
        accum = f" x {self.grad_accum} accumulated, sync {self.sync}" if self.grad_accum > 1 else ""
        ac = {"none": "", "full": ", activation checkpointing"}.get(ac_mode(self.activation_checkpointing), ", selective activation checkpointing")
        return f"{self.strategy}, micro-batch {self.micro_batch}{accum}{ac}"


AC_MODES: tuple[str, ...] = ("none", "selective", "full")  # cheapest compute first
AC_SEARCH: tuple[bool | str, ...] = (False, "selective", True)  # what a search with checkpointing free tries
_AC_VALUES: dict[Any, bool | str] = {False: False, "none": False, True: True, "full": True, "selective": "selective"}


def ac_value(value: Any) -> bool | str:
    """ACTIVATION_CHECKPOINTING as the planner and the loop carry it: False (none), True (full) or "selective"."""
    try:
        return _AC_VALUES[value]
    except (KeyError, TypeError):
        raise InputError(f"unknown activation checkpointing {value!r}", hint="use none, selective or full (or leave it empty: the planner's choice)") from None


def ac_mode(value: Any) -> str:
    """The checkpointing as a word, none, selective or full; its position in `AC_MODES` orders them by compute."""
    return {False: "none", True: "full"}.get(ac_value(value), "selective")  # type: ignore[call-overload]


def ac_rank(value: Any) -> int:
    """Order of the checkpointing modes by compute (none, selective, full): a search's tie goes to the cheaper."""
    return AC_MODES.index(ac_mode(value))


def planned_compile(setting: bool | None) -> bool:
    """Whether a run with COMPILE=`setting` compiles its blocks on a GPU: as set, and empty (None) is the GPU default, compiled.
    The run's planner (train.layout) and `raydlc plan` both read the setting through this, so they assume the same MFU."""
    return True if setting is None else bool(setting)


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


def unit_params(w: Workload) -> tuple[dict[str, int], dict[str, int]]:
    """Per FSDP unit (`fsdp_units`): the parameters it gathers and those it trains.

    Full fine-tuning trains what it gathers. LoRA's adapters live in the decoder blocks, so a
    block gathers its frozen base and its adapters and trains the adapters only; the
    embeddings, the head and the root train nothing (no gradient, no reduce-scatter)."""
    u = fsdp_units(w.spec)
    if not w.lora:
        return u, u
    per_block = w.adapter_params() // w.spec.num_layers
    return u | {"block": u["block"] + per_block}, dict.fromkeys(u, 0) | {"block": per_block}


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
    spec, tokens = w.spec, w.tokens
    h, i = spec.hidden_size, spec.intermediate_size
    kv = spec.num_kv_heads * spec.head_dim
    # LoRA keeps what full fine-tuning keeps (a projection's input is saved for A's gradient instead of
    # the base weight's), plus each adapter's rank-wide bf16 intermediate x @ A, saved for B's gradient.
    block = 20 * h + 4 * kv + 8 * i + (2 * w.lora_rank * len(w.targets) + lora_dropout_bytes(w) if w.lora else 0)
    kept = {"none": block, "full": 2 * h, "selective": 2 * h + sac_kept_bytes(w)}[w.ac]
    rebuilt = {"none": 0, "full": block, "selective": max(block - sac_kept_bytes(w), 0)}[w.ac]
    return {"saved": (spec.num_layers * kept + 8 * h) * tokens, "recompute": rebuilt * tokens}


def sac_matmuls(w: Workload) -> list[tuple[int, int]]:
    """(in, out) features of each matmul of one decoder block's forward, in the order they run: q, k, v, o, gate,
    up, down, each followed by its LoRA adapter's A (in -> rank) and B (rank -> out) when it is a target."""
    spec = w.spec
    h, i, q, kv = spec.hidden_size, spec.intermediate_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    out: list[tuple[int, int]] = []
    for name, (fan_in, fan_out) in shapes.items():
        out.append((fan_in, fan_out))
        if w.lora and name in w.targets:
            out += [(fan_in, w.lora_rank), (w.lora_rank, fan_out)]
    return out


def sac_kept_bytes(w: Workload) -> int:
    """Per token and block, what selective checkpointing (train.sac) keeps beside the block's input: the bf16 output
    of every odd matmul (1st, 3rd, ...; torchtitan's op_sac keeps every other one) and the attention kernel's output
    (2 B per query feature) with its fp32 log-sum-exp (4 B per head). Measured on CPU (bf16, LiveBytes): exact."""
    spec = w.spec
    odd = sum(fan_out for fan_in, fan_out in sac_matmuls(w)[::2])
    return 2 * odd + 2 * spec.num_heads * spec.head_dim + 4 * spec.num_heads


def sac_recomputed_flops(w: Workload) -> int:
    """Per token, the forward FLOPs selective checkpointing runs again in backward: every even matmul of every
    block (2 x in x out each); the elementwise ops it also recomputes are not counted, as nowhere here."""
    return w.spec.num_layers * sum(2 * fan_in * fan_out for fan_in, fan_out in sac_matmuls(w)[1::2])


def lora_dropout_bytes(w: Workload) -> int:
    """Per token and block, what LoRA's dropout (p > 0) saves beside the adapters: each adapted projection's dropout
    keeps its mask over that projection's input, and down_proj's one more byte per element. Measured on CPU with
    saved_tensors_hooks (bf16 base, fp32 adapters, all seven targets): 6h + 2i bytes more than p = 0."""
    if not w.lora or w.lora_dropout <= 0:
        return 0
    h, i = w.spec.hidden_size, w.spec.intermediate_size
    return sum(2 * i if t == "down_proj" else h for t in w.targets)


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
    """Unsharded (all-gathered) parameters, one unit's full gradient and its reduce-scatter buffer, at their peaks.

    Parameters, in the compute dtype: the largest of the head unit (from the end of forward
    through the head's backward) and the embeddings, with a block kept and the next one
    prefetched beside it; a tied model's root (the shared weight) is held all step.
    Gradients: one unit's full gradient in the compute dtype. `reduce_buffer`: FSDP2's
    `foreach_reduce` copies every unit's gradient into a fresh buffer in the reduce dtype
    before the reduce-scatter, whatever the dtypes (torch `_fsdp_collectives.py`); the
    gradient is freed after the copy, the buffer once the collective is done.
    """
    phases = memory_phases(w, 1)
    return {k: max(ph[k] for ph in phases.values()) for k in ("unsharded_params", "unsharded_grads", "reduce_buffer")}


def default_sync(strategy: str, grad_accum: int = 2) -> str:
    """The sync mode a run uses when nothing chose one: the issue's FSDP2 switch for each sharding."""
    if grad_accum <= 1:
        return "every"
    return "all-reduce-once" if strategy == "hsdp" else "once"


PHASES: tuple[str, ...] = ("forward", "head_backward", "block_backward", "embeddings_backward", "embeddings_reduce", "optimizer_step")


def memory_phases(w: Workload, shard_size: int, a: Assumptions = DEFAULT_ASSUMPTIONS) -> dict[str, dict[str, int]]:
    """Per-GPU bytes alive in each phase of an optimizer step, itemised, each with its `overhead` and `total`.

    The phases (`PHASES`): the forward (a unit gathered and the next prefetched, the
    activations growing to all of them at its end, the loss's chunk); the head's backward
    (the head unit and the last block gathered, the head's gradient and its reduce buffer,
    every activation still saved); a block's backward (that block and the next prefetched,
    its gradient, the previous unit's reduce buffer still in flight, the activations and
    one rebuilt block with checkpointing); the embeddings' backward (no activations left, the
    last block's buffer in flight) and their reduction (FSDP2 reshards a unit before it
    copies the unit's gradient into its buffer);
    the optimizer step (fused AdamW on CUDA updates in place: no temporaries). A tied
    model's root (the shared weight) gathers its gradient from the head's backward to the
    end, where it is reduced last. The sharded
    gradients exist from each unit's reduction until `zero_grad(set_to_none=True)`: in
    backward, those of the units reduced so far; with accumulation that syncs every
    micro-batch, all of them all step. `accumulated_grads` is what accumulation keeps
    between micro-batches: with sync `once` every unit's unsharded gradient in the reduce
    dtype, with `all-reduce-once` the reduce-scattered shard waiting for the all-reduce.

    With LoRA (`w.lora_rank` > 0) the frozen base is sharded in the compute dtype (bf16: no fp32
    copy, no gradient, no optimizer state) and the adapters as trained parameters are (fp32
    under bf16-mixed, with their gradients and AdamW state); a gathered block holds its base
    and its adapters; every gradient term, buffer and accumulation counts the adapters only
    (`unit_params`). The phases are the same.
    """
    pb, spec = w.precision, w.spec
    g, t = unit_params(w)
    p = w.trained_params()
    shard = lambda n: math.ceil(n / shard_size)
    local = shard(p)
    accumulated = 0
    if w.accum > 1 and w.sync == "once":
        accumulated = p * pb.reduce
    elif w.accum > 1 and w.sync == "all-reduce-once":
        accumulated = local * pb.reduce
    kept_grads = w.accum > 1 and w.sync == "every"
    grads = lambda n: local * pb.grad if kept_grads else shard(n) * pb.grad
    c, r = pb.compute, pb.reduce
    act, logit = activation_parts(w), logits_parts(w)
    frozen = shard(spec.param_count()) * pb.compute if w.lora else 0
    static = {"params": frozen + local * pb.param, "optimizer": local * pb.optimizer, "fp32_master": local * pb.master}

    def phase(gathered: int, grads_now: int, unit_grad: int, buffer: int, activations: int, logits: int,
              accumulated_now: int = accumulated) -> dict[str, int]:
        out = static | {
            "grads": grads_now, "unsharded_params": gathered * c, "unsharded_grads": unit_grad * c, "reduce_buffer": buffer * r,
            "accumulated_grads": accumulated_now, "activations": activations, "logits": logits,
        }
        subtotal = sum(out.values())
        return out | {"overhead": a.overhead_fixed_bytes + int(subtotal * a.overhead_fraction),
                      "total": subtotal + a.overhead_fixed_bytes + int(subtotal * a.overhead_fraction)}

    saved = act["saved"]
    return {
        "forward": phase(g["root"] + max(g["head"], g["embeddings"]) + 2 * g["block"], grads(0), 0, 0, saved, logit["peak"]),
        "head_backward": phase(g["root"] + g["head"] + 2 * g["block"], grads(t["head"]), t["root"] + t["head"], t["head"], saved, logit["peak"]),
        "block_backward": phase(g["root"] + 2 * g["block"], grads(t["head"] + t["block"]), t["root"] + t["block"], max(t["head"], t["block"]),
                                saved + act["recompute"], 0),
        "embeddings_backward": phase(g["root"] + g["embeddings"], grads(p - t["embeddings"] - t["root"]), t["root"] + t["embeddings"], t["block"], 0, 0),
        "embeddings_reduce": phase(g["root"], grads(p - t["embeddings"] - t["root"]), t["root"] + t["embeddings"], t["root"] + t["embeddings"], 0, 0),
        "optimizer_step": phase(0, local * pb.grad, 0, 0, 0, 0, 0),
    }


def peak_phase(w: Workload, shard_size: int, a: Assumptions = DEFAULT_ASSUMPTIONS) -> str:
    """The phase whose total is the step's peak."""
    phases = memory_phases(w, shard_size, a)
    return max(phases, key=lambda k: phases[k]["total"])


def memory_bytes(w: Workload, shard_size: int, a: Assumptions = DEFAULT_ASSUMPTIONS) -> dict[str, int]:
    """Per-GPU bytes by component in the step's peak phase (`memory_phases`); `total` is what must fit.

    The terms are those alive together at the peak, not each term's own peak: a sum of every
    term's peak counts the logits beside the embeddings' gradient, which never coexist.
    """
    return memory_phases(w, shard_size, a)[peak_phase(w, shard_size, a)]


def layout_groups(strategy: str, layout: Layout) -> tuple[int, int]:
    """(shard size, replicate size) of a sharding on a layout: FSDP shards over every GPU, HSDP inside each node."""
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
    pb = w.precision
    g, _ = unit_params(w)
    gathered = w.spec.param_count() + w.adapter_params()  # LoRA: the frozen base and the adapters, both in the compute dtype
    resharded = gathered - (g["root"] + g["head"] + g["block"])
    trained = w.trained_params()  # LoRA: only the adapters' gradients are reduced
    shard, replicate = layout_groups(strategy, layout)
    f = _ring(shard)
    ag = f * (gathered + resharded) * pb.compute
    rs = f * trained * pb.reduce
    ar = 2 * _ring(replicate) * math.ceil(trained / shard) * pb.reduce
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


LORA_FLOPS = ("LoRA: the frozen base costs its forward (2N per token) and its backward through the activations (2N; no "
              "weight-gradient matmuls), 4N instead of 6N (6N instead of 8N with checkpointing); the adapters cost 6 per "
              "parameter and token; attention's score matmuls as in full fine-tuning")


def flops_per_step(w: Workload) -> float:
    """Per GPU and micro-batch: 6 x params per token (8 with the forward recomputed) plus attention scores
    (and the head's matmul once more with the chunked loss). With LoRA the frozen base skips its
    weight gradients, 4 x params (6 recomputed), and the adapters add 6 x theirs (`LORA_FLOPS`).
    Selective checkpointing (train.sac) recomputes the even matmuls of each block and no attention:
    6N plus `sac_recomputed_flops` (for Qwen2/Llama k, o and up: about a third of a block's
    matmuls, so ~6.7N; torchtitan's op_sac, the same policy, is the source of the split)."""
    spec = w.spec
    passes = 8 if w.ac == "full" else 6
    attention = (passes * 2) * spec.num_layers * spec.hidden_size * w.seq_len
    # The chunked loss computes the head's logits again in backward (train.loss).
    rehead = 2 * spec.vocab_size * spec.hidden_size if w.loss_chunk > 0 else 0
    weights = (passes - 2) * spec.param_count() + 6 * w.adapter_params() if w.lora else passes * spec.param_count()
    recomputed = sac_recomputed_flops(w) if w.ac == "selective" else 0
    return float(w.tokens * (weights + attention + rehead + recomputed))


def step_time(w: Workload, strategy: str, layout: Layout, a: Assumptions = DEFAULT_ASSUMPTIONS) -> dict[str, Any]:
    """Compute vs communication per optimizer step, and the tokens per second that makes.

    With overlap (FSDP2's prefetch) a micro-batch takes the larger of its compute and its
    collectives; the reductions paid once per step belong to the last micro-batch, whose
    backward is the only compute they can hide behind. Without overlap everything adds up.
    """
    gpu = instances.GPUS[layout.gpu]
    n, sync = w.accum, w.sync
    compute_one = flops_per_step(w) / (gpu.bf16_tflops * 1e12 * a.mfu_for(layout.gpu, w.compiled_blocks))
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


def gpu_capacity(layout: Layout) -> int:
    return int(instances.GPUS[layout.gpu].memory_gib * (1 << 30))


def usable_capacity(layout: Layout) -> int:
    """The bytes a recommendation may plan per GPU: `MAX_MEMORY_FRACTION` of its memory."""
    return int(gpu_capacity(layout) * MAX_MEMORY_FRACTION)


def candidate(w: Workload, strategy: str, layout: Layout, a: Assumptions = DEFAULT_ASSUMPTIONS) -> Candidate:
    """One layout's memory, traffic and speed, in the form `recommend` compares."""
    shard, _ = layout_groups(strategy, layout)
    mem = memory_bytes(w, shard, a)["total"]
    traffic = traffic_bytes(w, strategy, layout)
    st = step_time(w, strategy, layout, a)
    return Candidate(
        strategy=strategy, micro_batch=w.micro_batch, grad_accum=w.accum, sync=w.sync,
        global_batch=w.micro_batch * w.accum * layout.world, tokens_per_step=st["tokens_per_step"],
        per_gpu_bytes=mem, fits=mem <= usable_capacity(layout), step_time_s=st["estimate"], tokens_per_s=st["tokens_per_s"],
        bound=st["bound"], cross_node_bytes_per_node=traffic["cross_node_per_node"], intra_node_bytes_per_gpu=traffic["intra_node_per_gpu"],
        activation_checkpointing=w.activation_checkpointing,
    )
