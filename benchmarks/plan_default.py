"""Print what a default cluster run plans: the layout `raydlc plan --json` recommends for the default
config (Qwen2.5-1.5B on 2 x g6.12xlarge, the cluster defaults of issue 33), its tokens/s and the
ratio to the seed's reference run (0.5173 steps/s x 8 ranks x 1 x 128 tokens = ~530 tokens/s, EFA), at the MFU
facts.mfu assumes for an L4 (~0.22, scaled from a published L4 matmul ceiling; not the H100's 0.40).

A planner figure, not a timing: the memory of the peak phase by term beside it, and the 7B/8B
plans at seq 2048 with fp32 reduction.
Run: PYTHONPATH=src python benchmarks/plan_default.py
"""

from __future__ import annotations

import raydlc.api as api

REFERENCE_TOKENS_PER_S = 0.5173 * 8 * 128


def main() -> None:
    doc = api.plan().to_dict()
    rec = doc["recommendation"]
    lay = doc["layout"]
    print(f"default config: {doc['model']}, {lay['nodes']} x {lay['instance_type']} ({lay['world']} x {lay['gpu_name']}), seq {doc['seq_len']}, "
          f"compile {'on' if doc['assumptions']['compile'] else 'off'} (MFU {doc['assumptions']['mfu_used']})")
    print(f"planned layout: {rec['strategy']}, micro-batch {rec['micro_batch']} x {rec['grad_accum']} accumulated, sync {rec['sync']}, "
          f"activation checkpointing {'on' if rec['activation_checkpointing'] else 'off'}, reduce {rec['reduce_dtype']}")
    print(f"peak phase {doc['peak_phase']}: " + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in rec["per_gpu_bytes_itemised"].items() if v) + " GB")
    ratio = rec["tokens_per_s"] / REFERENCE_TOKENS_PER_S
    src = doc["assumptions"]["mfu_source"]
    print(f"MFU {doc['assumptions']['mfu_used']} on {lay['gpu_name']}, {src['kind']}: {src['source']}")
    print(f"planned {rec['tokens_per_s']:,.0f} tokens/s ({rec['bound']}-bound) vs reference {REFERENCE_TOKENS_PER_S:,.0f} tokens/s: "
          f"{ratio:.1f}x (the honest ratio: an L4's assumed MFU, not an H100's)")
    for model in ("qwen2.5-7b", "llama-3.1-8b"):
        p = api.plan(model=model, seq_len=2048, reduce_dtype="fp32").to_dict()
        r = p["recommendation"]
        print(f"{model} seq 2048, fp32 reduction: {r['strategy']} micro-batch {r['micro_batch']} x {r['grad_accum']}, checkpointing "
              f"{'on' if r['activation_checkpointing'] else 'off'}, {r['per_gpu_bytes'] / 1e9:.2f} of {p['gpu_memory_bytes'] / 1e9:.2f} GB "
              f"({r['per_gpu_bytes'] / p['gpu_memory_bytes']:.1%}), ~{r['tokens_per_s']:,.0f} tokens/s")


if __name__ == "__main__":
    main()
