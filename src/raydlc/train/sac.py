"""Selective activation checkpointing (ACTIVATION_CHECKPOINTING=selective): op level, as torchtitan's `op_sac`.

Full checkpointing keeps each block's input and runs its whole forward again in backward
(8N FLOPs per token instead of 6N). Selective checkpointing keeps the outputs of the expensive
ops and recomputes only the cheap ones and every other matmul: the attention kernel's outputs
(no attention recomputed), the odd matmuls of the block (for Qwen2/Llama q, v, gate and down;
k, o and up are recomputed), and nothing elementwise (norms, RoPE, SiLU, casts: cheap to
recompute, as many bytes to keep as a matmul's output). What that keeps and costs is
`raydlc.planner.model.sac_matmuls` and `activation_parts`.

Op level rather than every k-th block: torch 2.13's `create_selective_checkpoint_contexts` runs
on CPU and GPU inside the same non-reentrant `checkpoint_wrapper` full checkpointing uses, so
FSDP2's units and the state-dict names are the same in both modes; and it keeps the matmul
outputs that are most of the forward's FLOPs, which every-k-blocks cannot.

The blocks run eagerly under it (COMPILE still compiles the chunked loss), measured on CPU with
torch 2.13: with each block's forward compiled inside the wrapper (raydlc's order for full
checkpointing) the policy sees only inductor's extern kernels, matmuls as `aten.mm.out` into
buffers inductor reuses (keeping one is refused: "Tensor cached during selective activation
checkpoint has been mutated"), and its fused kernels not at all, so nothing but attention would
be kept; compiling the wrapped block instead (torchtitan's order) fails in dynamo on
transformers' kernel-hub attention wrapper ("HOP: Unsafe side effect", a ContextVar set inside
the checkpoint). The planner counts the eager MFU for it (`Workload.compiled_blocks`). In torch 2.13 the policy is called in forward only (in
backward the cached outputs are read back by position), so one counter per block call decides
which matmuls are odd. Recomputation replays the same ops on the same inputs, so the loss and
gradients are those without checkpointing (tests/test_train_sac.py); the RNG state is kept as
full checkpointing keeps it, for LoRA's dropout.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}  # a linear on a 3-D input, with or without bias
# Attention kernels: their outputs (and log-sum-exp) are kept, so attention runs once in forward only.
ATTENTION = {
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def policy() -> Any:
    """A fresh policy for one block call: keep the attention outputs and the 1st, 3rd, 5th... matmul, recompute the rest."""
    count = 0

    def decide(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        nonlocal count
        if func in ATTENTION:
            return CheckpointPolicy.MUST_SAVE
        if func in MATMULS:
            count += 1
            return CheckpointPolicy.MUST_SAVE if count % 2 == 1 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return decide


def context_fn() -> Any:
    """`checkpoint`'s context_fn: the two contexts (forward caching, backward replay) of one block call."""
    return create_selective_checkpoint_contexts(policy())


def wrap(layer: torch.nn.Module, mode: str) -> torch.nn.Module:
    """The block under checkpointing: `full` recomputes all of it, `selective` what `policy` does not keep."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if mode == "selective":
        return checkpoint_wrapper(layer, context_fn=context_fn)
    return checkpoint_wrapper(layer)
