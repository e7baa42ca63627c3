"""Causal LMs (Qwen2, Llama) built from a spec (raydlc.models), FSDP2 in torchtitan's units
(embeddings, blocks, [norm, head], root), and pretrained weights loaded shard by shard (raydlc.train.weights)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raydlc.models import ModelSpec

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


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    return list(model.model.layers)  # type: ignore[attr-defined]


def apply_fsdp(
    model: nn.Module,
    *,
    mesh: Any = None,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    reshard_after_forward: bool = True,
    activation_checkpointing: bool = False,
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
    `compile` compiles each block's forward on its own (static shapes), so FSDP's hooks and
    the checkpoint wrapper stay outside the compiled graphs. Parameter names do not change
    (`fully_shard` wraps no module), so state dicts, DCP checkpoints and the HF export read the
    same keys whatever the units.
    """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    layers = decoder_layers(model)
    if compile:
        for layer in layers:
            layer.forward = torch.compile(layer.forward, dynamic=False)  # type: ignore[method-assign]
    if activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, layer in enumerate(layers):
            wrapped = checkpoint_wrapper(layer)
            model.model.layers[i] = wrapped  # type: ignore[attr-defined, index]
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
