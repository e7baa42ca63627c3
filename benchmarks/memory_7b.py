"""A 7B-shaped memory check on one GPU: the planner's per-term figures beside the measured peaks.

    python benchmarks/memory_7b.py [--model qwen2.5-7b] [--layers 4] [--seq-len 2048] [--out FILE] [--plan-only]

Builds the model at its real width and vocabulary with only `--layers` decoder blocks (what
decides the unsharded, gradient and logits terms at 7B is the width and the vocabulary, not
the depth), shards it with raydlc's own `apply_fsdp` over a world of one (NCCL), bf16 compute,
and runs optimizer steps of one sequence with the settings the planner recommends for 7B on
2 x 4 L4 (activation checkpointing, the chunked loss, bf16 reduction), then again unchunked.
Per phase it records `torch.cuda.max_memory_allocated` and prints, per variant, the measured
peak beside the planner's sum of terms for the same workload (shard size 1, so the whole
few-layer model is "local"; its overhead term is left out: the allocator's peak has no CUDA
context). One JSON object on the last line. `--plan-only` needs no GPU: the planner's side only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from raydlc import planner
from raydlc.facts.models import get_spec

VARIANTS = {"recommended": 1024, "unchunked": 0}  # LOSS_CHUNK of each run


def planned(model: str, layers: int, seq_len: int, loss_chunk: int) -> dict[str, int]:
    spec = replace(get_spec(model), num_layers=layers)
    w = planner.Workload(spec, seq_len=seq_len, activation_checkpointing=True, loss_chunk=loss_chunk, reduce_dtype="bf16")
    terms = planner.memory_bytes(w, 1)
    terms["without_overhead"] = terms["total"] - terms["overhead"]
    return terms


def measure(model: str, layers: int, seq_len: int, loss_chunk: int, steps: int = 3) -> dict[str, int]:
    import torch
    import torch.distributed as dist

    from raydlc.train.loop import loss_sum
    from raydlc.train.loss import use_chunked_loss
    from raydlc.train.model import apply_fsdp, build_model

    spec = replace(get_spec(model), num_layers=layers)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=0, world_size=1)
    net = build_model(spec, device=device)
    if loss_chunk:
        use_chunked_loss(net, loss_chunk)
    apply_fsdp(net, param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, activation_checkpointing=True)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, spec.vocab_size, (1, seq_len), device=device)
    peaks: dict[str, int] = {}
    for _ in range(steps):
        for phase in ("forward", "backward", "optimizer"):
            torch.cuda.reset_peak_memory_stats(device)
            if phase == "forward":
                total, _ = loss_sum(net, ids, ids)
            elif phase == "backward":
                total.backward()
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize(device)
            peaks[phase] = max(peaks.get(phase, 0), torch.cuda.max_memory_allocated(device))
    del net, opt
    torch.cuda.empty_cache()
    peaks["step"] = max(peaks.values())
    return peaks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-7b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plan-only", action="store_true")
    a = ap.parse_args(argv)
    doc: dict[str, Any] = {"model": a.model, "layers": a.layers, "seq_len": a.seq_len, "variants": {}}
    for name, chunk in VARIANTS.items():
        want = planned(a.model, a.layers, a.seq_len, chunk)
        row: dict[str, Any] = {"loss_chunk": chunk, "planned": want, "measured": None, "ratio": None}
        if not a.plan_only:
            got = measure(a.model, a.layers, a.seq_len, chunk)
            row |= {"measured": got, "ratio": round(got["step"] / want["without_overhead"], 3)}
        doc["variants"][name] = row
        gb = lambda n: f"{n / 1e9:.2f} GB"
        seen = gb(row["measured"]["step"]) if row["measured"] else "- (plan only)"
        print(f"{name:12s} loss_chunk {chunk:5d}: planned {gb(want['without_overhead'])} "
              f"(unsharded {gb(want['unsharded_params'] + want['unsharded_grads'])}, logits {gb(want['logits'])}), measured peak {seen}")
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
