"""How far the LoRA export's logits are from base+adapter: peft's load of the adapter, and the merged HF model.

    PYTHONPATH=src:. python benchmarks/lora_export_logits.py

The tiny Qwen2 (tied) and Llama (untied) models and hand-made adapters of tests/test_lora_export.py, in fp32 and
with a bf16 base (adapters fp32, as a LoRA run keeps them). Per case: max |Δlogits| of peft against the fp32
hand-computed forward, of the merged model against peft, and of the merged model against the fp32 forward.
Needs peft (the dev extra). One JSON object per case.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import peft
import torch
from tests import test_lora_export as T
from transformers import AutoModelForCausalLM

from raydlc.train import lora_export as X


def measure(arch: str, dtype: torch.dtype) -> dict[str, object]:
    """One export written and read back both ways."""
    model = T.base(arch).to(dtype)
    state = {**model.state_dict(), **T.adapters_for(model)}
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "export"

        def save(weights: dict[str, torch.Tensor], folder: Path) -> None:
            m = AutoModelForCausalLM.from_config(model.config, dtype=dtype)
            m.load_state_dict(weights)
            m.save_pretrained(str(folder))

        X.write(out, state, rank=T.RANK, alpha=T.ALPHA, dropout=0.0, targets=T.TARGETS, base_model=None, merge=True, save_merged=save)
        tuned = peft.PeftModel.from_pretrained(T.base(arch).to(dtype), str(out / "adapter"), autocast_adapter_dtype=False).eval()
        merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=dtype).eval()
        with torch.no_grad():
            ref = T.hand_logits(T.base(arch), X.split(state)[1], T.ids(), T.ALPHA / T.RANK)
            p, m = tuned(T.ids()).logits.float(), merged(T.ids()).logits.float()
    return {"arch": arch, "base": str(dtype).removeprefix("torch."), "peft_vs_fp32": float((p - ref).abs().max()),
            "merged_vs_peft": float((m - p).abs().max()), "merged_vs_fp32": float((m - ref).abs().max()), "logit_max": float(ref.abs().max())}


if __name__ == "__main__":
    for arch in ("qwen2", "llama"):
        for dtype in (torch.float32, torch.bfloat16):
            print(json.dumps(measure(arch, dtype)))
