"""Causal LMs (Qwen2, Llama) built from a spec (raydlc.facts.models), FSDP2 in torchtitan's units
(embeddings, blocks, [norm, head], root), and pretrained weights loaded shard by shard (raydlc.train.weights)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raydlc.facts.models import ModelSpec

if TYPE_CHECKING:
    import torch
    from torch import nn


def hf_config(spec: ModelSpec, **overrides: Any) -> Any:
    """The transformers config of a spec: Qwen2Config or LlamaConfig, by its architecture."""
    from transformers import LlamaConfig, Qwen2Config

    kw: dict[str, Any] = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        tie_word_embeddings=spec.tie_embeddings,
        rope_parameters=spec.rope_parameters(),
        use_cache=False,
        attn_implementation="sdpa",
    )
    if spec.architecture == "llama":
        kw.update(attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias)
    kw.update(overrides)
    return (LlamaConfig if spec.architecture == "llama" else Qwen2Config)(**kw)



def build_model(spec: ModelSpec, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, seed: int | None = 0) -> nn.Module:
    """A randomly initialised causal LM of the spec's architecture; `device="meta"` builds shapes only (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    if seed is not None and str(device) != "meta":
        torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(spec), dtype=dtype or torch.float32)
    return model


def build_builtin(name: str, seed: int) -> nn.Module:
    """A built-in spec's seeded random init, by name, whole on the CPU: the very values the run started from
    (`init_weights`, as `build_random_sharded` draws them over the shards), which evaluate compares with."""
    import torch

    from raydlc.facts.models import get_spec

    model = build_model(get_spec(name), seed=None)
    with torch.no_grad():
        init_weights(model, seed=seed)
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    return list(model.model.layers)  # type: ignore[attr-defined]


def apply_fsdp(
    model: nn.Module,
    *,
    mesh: Any = None,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    reshard_after_forward: bool = True,
    activation_checkpointing: bool | str = False,
    compile: bool = False,
) -> nn.Module:
    """FSDP2 in torchtitan's units: the embeddings, each decoder block, `[final norm, head]`, then the root.

    Per-block units let all-gathers of block i+1 overlap compute of block i. The reshard
    policy per unit trades memory for all-gathers: the embeddings are used first in forward and
    last in backward, so they are resharded after forward (one more all-gather of V x h per
    step, prefetched behind block 0's backward) instead of being held all step; `[norm, head]`
    is used last in forward and first in backward, so it is kept (resharding it would gather it
    again at once); so is the last block. A tied model's one weight is both embedding and head:
    it stays in the root unit with the final norm (one parameter in one unit), held all step.
    The root holds nothing else (rotary buffers). A 2-D mesh (replicate, shard) is HSDP.
    `compile` compiles each block's forward on its own (static shapes, `fullgraph=True`: a graph
    break is an error, not a silent fallback; torchtitan's per-block compile), so FSDP's hooks and
    the checkpoint wrapper stay outside the compiled graphs. `fully_shard` wraps no module, but
    activation checkpointing does: parameter names gain `_checkpoint_wrapped_module.` while the
    state-dict keys do not (the wrapper's hooks strip it), so state dicts, DCP checkpoints and the
    HF export read the same keys whatever the units, and anything keyed by name (the seeded init,
    LoRA's adapters) must use the state-dict name (`lora.state_name`). `activation_checkpointing`
    True is full, "selective" op-level selective checkpointing (train.sac), in the same wrapper, blocks
    not compiled.
    """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    layers = decoder_layers(model)
    if compile and activation_checkpointing != "selective":  # selective runs its blocks eagerly (train.sac says why)
        for layer in layers:
            layer.forward = torch.compile(layer.forward, dynamic=False, fullgraph=True)  # type: ignore[method-assign]
    if activation_checkpointing:
        from raydlc.train import sac

        for i, layer in enumerate(layers):
            model.model.layers[i] = sac.wrap(layer, "selective" if activation_checkpointing == "selective" else "full")  # type: ignore[attr-defined, index]
        layers = decoder_layers(model)
    inner, head = model.model, model.lm_head  # type: ignore[attr-defined]
    if not tied(model):
        fully_shard(inner.embed_tokens, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    for i, layer in enumerate(layers):
        # The last block is resharded by the head's backward anyway; keeping it saves one all-gather.
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and i < len(layers) - 1)
    if not tied(model):
        fully_shard([inner.norm, head], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return model


def tied(model: nn.Module) -> bool:
    """Whether the head's weight is the embedding's (one parameter)."""
    return model.lm_head.weight is model.model.embed_tokens.weight  # type: ignore[attr-defined, union-attr]


# ---- random init on the meta device, shard by shard -------------------------------------------

INIT_CHUNK = 1 << 24  # values drawn at a time (64 MB of fp32): what a rank holds beyond its shard


def build_random_sharded(spec: ModelSpec, *, device: torch.device, shard: Any, seed: int) -> nn.Module:
    """A randomly initialised model that no rank ever holds whole (torchtitan's order): built on the
    meta device, sharded by FSDP2 (`shard`), given storage for its local shards only (`to_empty`),
    then initialised shard by shard (`init_weights`) and its computed buffers (RoPE) rebuilt."""
    import torch

    from raydlc.train.weights import reset_computed_buffers

    model = shard(build_model(spec, device="meta"))
    model.to_empty(device=device)
    reset_computed_buffers(model, device)
    with torch.no_grad():
        init_weights(model, seed=seed)
    return model


def init_weights(model: nn.Module, *, seed: int) -> None:
    """transformers' initialisation of these models (Linear and Embedding weights N(0, initializer_range),
    biases 0, RMSNorm weights 1), written into each rank's shard only.

    Each parameter's values come from its own generator, seeded by `seed` and the parameter's
    name, on the parameter's device, drawn row block by row block (INIT_CHUNK values) over the
    whole tensor: a rank keeps the rows of its shard and discards the rest. So the values depend
    on the seed and the shapes only, never on the number of ranks, the mesh or activation
    checkpointing (the name is the state-dict key, without the checkpoint wrapper's prefix), and a
    rank holds its shard plus one block. They are not the values `from_config` draws for the same
    seed (one stream over the whole model, in module order). Values are drawn in fp32 and rounded
    to the parameter's dtype, so a bf16 base (LoRA) holds the fp32 init rounded. LoRA adapters are
    left to `lora.init_adapters` (A seeded by name, B zeros).
    """
    import zlib

    from raydlc.train.lora import is_adapter_key, state_name

    std = float(getattr(model.config, "initializer_range", 0.02) or 0.02)  # type: ignore[union-attr]
    kinds: dict[int, str] = {}
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if "RMSNorm" in type(module).__name__:
                kinds.setdefault(id(p), "ones")
            elif pname == "bias":
                kinds.setdefault(id(p), "zeros")
            else:
                kinds.setdefault(id(p), "normal")
    for raw, p in model.named_parameters():  # a tied weight once, under its first name
        name = state_name(raw)
        if is_adapter_key(name):
            continue
        local = p.to_local() if hasattr(p, "to_local") else p
        kind = kinds[id(p)]
        if kind == "ones":
            local.fill_(1.0)
        elif kind == "zeros":
            local.zero_()
        else:
            _fill_normal(local, p, std=std, seed=(seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63))


def _fill_normal(local: torch.Tensor, p: Any, *, std: float, seed: int) -> None:
    """The local rows of a full tensor of N(0, std) values drawn row block by row block from `seed`."""
    import math

    import torch

    from raydlc.train.lora import row_offset

    first = row_offset(p)
    rows = p.shape[0]
    per_row = math.prod(p.shape[1:])
    block = max(1, INIT_CHUNK // max(per_row, 1))
    gen = torch.Generator(device=local.device).manual_seed(seed)
    end = first + local.shape[0]
    for r0 in range(0, rows, block):
        if r0 >= end:
            break
        drawn = torch.empty((min(block, rows - r0), *p.shape[1:]), device=local.device, dtype=torch.float32).normal_(0.0, std, generator=gen)
        lo, hi = max(r0, first), min(r0 + len(drawn), end)
        if lo < hi:
            local[lo - first : hi - first] = drawn[lo - r0 : hi - r0].to(local.dtype)
