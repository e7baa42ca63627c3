"""Qwen2 models built from a spec (raydlc.models) or loaded, and FSDP2 sharding per decoder block."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.errors import InputError
from raydlc.models import ModelSpec

if TYPE_CHECKING:
    import torch
    from torch import nn


def qwen2_config(spec: ModelSpec, **overrides: Any) -> Any:
    from transformers import Qwen2Config

    kw: dict[str, Any] = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        tie_word_embeddings=spec.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        use_cache=False,
        attn_implementation="sdpa",
    )
    kw.update(overrides)
    return Qwen2Config(**kw)


def build_model(spec: ModelSpec, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, seed: int | None = 0) -> nn.Module:
    """A randomly initialised Qwen2 causal LM; `device="meta"` builds shapes only (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    if seed is not None and str(device) != "meta":
        torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(qwen2_config(spec), dtype=dtype or torch.float32)
    return model


def load_pretrained(model_id: str, *, dtype: torch.dtype | None = None) -> nn.Module:
    """Real weights from a hub id or a local directory; offline hub ids fail at once."""
    import os

    from transformers import AutoModelForCausalLM

    local = Path(model_id).expanduser()
    if not local.is_dir() and os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        raise InputError(
            f"model {model_id!r} is a hub id and HF_HUB_OFFLINE is set",
            hint="use a built-in spec (tiny, qwen2.5-0.5b, qwen2.5-1.5b) or a local directory",
        )
    try:
        return AutoModelForCausalLM.from_pretrained(
            str(local) if local.is_dir() else model_id, dtype=dtype, attn_implementation="sdpa"
        )
    except OSError as e:
        raise InputError(
            f"cannot load model {model_id!r}: {e}",
            hint="without network, set HF_HUB_OFFLINE=1 and use a built-in spec or a local directory",
        ) from e


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
