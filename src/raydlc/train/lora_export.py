"""A LoRA run's products without peft: the adapter in peft's saved format and the merged weights.

A minimal stand-in, per the LoRA contract (/work/wt/CONTRACT-lora.md), so that the training side's
tests run; the i36-lora-export branch owns this module and replaces it whole at the merge.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.errors import CheckpointError

if TYPE_CHECKING:
    from torch import Tensor

A_SUFFIX, B_SUFFIX = ".lora_A.weight", ".lora_B.weight"
PEFT_PREFIX = "base_model.model."


def split(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(base, adapters) by key."""
    base: dict[str, Tensor] = {}
    adapters: dict[str, Tensor] = {}
    for k, v in state.items():
        (adapters if k.endswith((A_SUFFIX, B_SUFFIX)) else base)[k] = v
    return base, adapters


def merged(state: Mapping[str, Tensor], *, scaling: float) -> dict[str, Tensor]:
    """Base keys only, each adapted weight W + scaling * (B @ A) in fp32, cast back to W's dtype."""
    import torch

    base, adapters = split(state)
    out = dict(base)
    for key in (k for k in adapters if k.endswith(A_SUFFIX)):
        module = key.removesuffix(A_SUFFIX)
        a, b, w = adapters[key], adapters.get(module + B_SUFFIX), base.get(module + ".weight")
        if b is None or w is None or tuple(w.shape) != (b.shape[0], a.shape[1]) or a.shape[0] != b.shape[1]:
            raise CheckpointError(f"LoRA export: {key} lacks its lora_B or base weight, or their shapes disagree")
        out[module + ".weight"] = torch.addmm(w.float(), b.float(), a.float(), alpha=scaling).to(w.dtype)
    return out


def peft_adapter_state(adapters: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """peft's saved keys: `base_model.model.` + ours, contiguous CPU tensors."""
    return {PEFT_PREFIX + k: v.detach().to("cpu").contiguous() for k, v in adapters.items()}


def adapter_config(*, rank: int, alpha: float, dropout: float, targets: Sequence[str], base_model: str | None) -> dict[str, Any]:
    """peft's LoraConfig as saved."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "lora_dropout": dropout,
            "target_modules": sorted(set(targets)), "bias": "none", "fan_in_fan_out": False,
            "base_model_name_or_path": base_model, "inference_mode": True}


def write(out_dir: Path, state: Mapping[str, Tensor], *, rank: int, alpha: float, dropout: float, targets: Sequence[str],
          base_model: str | None, merge: bool, save_merged: Callable[[dict[str, Tensor], Path], None]) -> None:
    """`out_dir/adapter/` and, with `merge`, the merged model through `save_merged`; staged beside `out_dir`, then renamed."""
    from safetensors.torch import save_file

    _, adapters = split(state)
    weights = merged(state, scaling=alpha / rank) if merge else None
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        (folder / "adapter").mkdir()
        (folder / "adapter" / "adapter_config.json").write_text(
            json.dumps(adapter_config(rank=rank, alpha=alpha, dropout=dropout, targets=targets, base_model=base_model), indent=2))
        save_file(peft_adapter_state(adapters), str(folder / "adapter" / "adapter_model.safetensors"), metadata={"format": "pt"})
        if weights is not None:
            save_merged(weights, folder)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(folder, out_dir)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
