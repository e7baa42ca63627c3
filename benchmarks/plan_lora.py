"""Print the LoRA planning table of docs/plan.md: for each registry model, the smallest cluster of each GPU type
that holds it with LoRA rank 16 at seq 2048, its per-GPU memory and planned tokens/s, beside the smallest
cluster that holds a full fine-tune.

Planner figures, not timings (`raydlc plan --lora-rank 16 --seq-len 2048 --instance-type T --nodes N`): the
recommendation may turn on activation checkpointing, the chunked loss and bf16 reduction, as `raydlc plan`
does when nothing fits. Training with LoRA is not implemented yet (issue 36); this is what the planner expects.
Run: PYTHONPATH=src python benchmarks/plan_lora.py [--max-nodes 16] [--models qwen2.5-7b,qwen2.5-32b]
"""

from __future__ import annotations

import argparse
from typing import Any

import raydlc.api as api
from raydlc.facts.models import SPECS

# One node type per GPU family: the 4-GPU size of the PCIe families, the 8-GPU p4d/p5.
NODE_TYPES = ("g5.12xlarge", "g6.12xlarge", "g6e.12xlarge", "p4d.24xlarge", "p5.48xlarge")
RANK, SEQ_LEN = 16, 2048


def smallest(model: str, instance_type: str, lora_rank: int, max_nodes: int) -> tuple[int, dict[str, Any]] | None:
    """The fewest nodes of `instance_type` on which the plan fits, and the plan; None within `max_nodes`."""
    for nodes in range(1, max_nodes + 1):
        p = api.plan(model=model, nodes=nodes, instance_type=instance_type, seq_len=SEQ_LEN, lora_rank=lora_rank).to_dict()
        if p["recommendation"]["per_gpu_bytes"] is not None:
            return nodes, p
    return None


def cell(found: tuple[int, dict[str, Any]] | None, max_nodes: int) -> str:
    if found is None:
        return f"> {max_nodes} nodes"
    nodes, p = found
    r = p["recommendation"]
    ac = ", AC" if r["activation_checkpointing"] else ""
    return f"{nodes} ({r['per_gpu_bytes'] / 1e9:.1f} GB/GPU{ac}, ~{r['tokens_per_s']:,.0f} tok/s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-nodes", type=int, default=16)
    ap.add_argument("--models", default=",".join(n for n in SPECS if n != "tiny" and n != "llama-3.3-70b"))
    args = ap.parse_args()
    print(f"LoRA rank {RANK} (all seven projections) vs full fine-tuning, seq {SEQ_LEN}: nodes of each type, "
          f"peak GB per GPU, planned tokens/s (AC = activation checkpointing)")
    print("| model | adapters | " + " | ".join(NODE_TYPES) + " |")
    print("|---|---|" + "---|" * len(NODE_TYPES))
    for model in args.models.split(","):
        lora = [smallest(model, t, RANK, args.max_nodes) for t in NODE_TYPES]
        full = [smallest(model, t, 0, args.max_nodes) for t in NODE_TYPES]
        adapters = next((p["lora"]["adapter_params"] for f in lora if f for p in [f[1]]), 0)
        print(f"| {model} LoRA | {adapters / 1e6:.1f} M | " + " | ".join(cell(f, args.max_nodes) for f in lora) + " |")
        print(f"| {model} full | — | " + " | ".join(cell(f, args.max_nodes) for f in full) + " |")


if __name__ == "__main__":
    main()
