"""Causal LMs (Qwen2, Llama) built from a spec (raydlc.models), FSDP2 sharding per decoder block,
and pretrained weights loaded shard by shard (raydlc.train.weights)."""

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
    """FSDP2: one `fully_shard` per decoder block, then the root (torchtitan's layout).

    Per-block units let all-gathers of block i+1 overlap compute of block i; the root unit
    holds the embeddings, final norm and (tied) head. A 2-D mesh (replicate, shard) is HSDP.
    `compile` compiles each block's forward on its own (static shapes), so FSDP's hooks and
    the checkpoint wrapper stay outside the compiled graphs.
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
    for i, layer in enumerate(layers):
        # The last block is resharded by the root's backward anyway; keeping it saves one all-gather.
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and i < len(layers) - 1)
    # The root unit (embeddings, final norm, tied head) is needed again as soon as backward
    # starts; resharding it would only buy one more all-gather of the embeddings per step.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return model
