"""Print the planner's figures for the seed's published run next to the published ones, then
the layout the planner recommends on the same cluster and its predicted speed-up.

The seed: Qwen2.5-1.5B in bf16, 2 x g6.12xlarge (8 x L4, 40 Gb/s, 1 EFA interface), batch
1 x 128 tokens per rank; EFA 0.5173 steps/s vs TCP 0.2513 steps/s (2.06x), i.e.
0.5173 x 8 x 128 = ~530 tokens/s over EFA.
Run: PYTHONPATH=src python benchmarks/plan_vs_published.py [--max-global-batch TOKENS]
"""

from __future__ import annotations

import argparse

from raydlc import planner
from raydlc.facts.models import get_spec

PUBLISHED = {"efa": 0.5173, "tcp": 0.2513}
PUBLISHED_TOKENS_PER_STEP = 8 * 1 * 128  # 8 ranks x batch 1 x 128 tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-global-batch", type=int, default=planner.DEFAULT_MAX_GLOBAL_BATCH, help="tokens per optimizer step the recommendation may use")
    args = ap.parse_args()
    spec = get_spec("qwen2.5-1.5b")
    layout = planner.layout_for(2, 4, instance_type="g6.12xlarge")
    for policy in ("bf16-mixed", "pure-bf16"):
        p = planner.plan(planner.Workload(spec, seq_len=128, micro_batch=1, policy=policy, compile=False), layout)  # the seed ran eager
        for strategy, s in p.strategies.items():
            st = s.step_time_s
            b = s.per_gpu_bytes
            state = (b["params"] + b["grads"] + b["optimizer"]) / 1e9
            print(
                f"{policy:10s} {strategy}: state {state:.2f} GB/GPU, total {b['total'] / 1e9:.2f} GB, "
                f"cross-node {s.traffic_bytes_per_step['cross_node_per_node'] / 1e9:.2f} GB/node/step, "
                f"EFA {1 / st['efa']['estimate']:.3f} steps/s, TCP {1 / st['tcp']['estimate']:.3f} steps/s, "
                f"ratio {st['tcp']['estimate'] / st['efa']['estimate']:.2f}x, max micro-batch {s.max_micro_batch}"
            )
    print(f"published (bf16, FSDP): EFA {PUBLISHED['efa']} steps/s, TCP {PUBLISHED['tcp']} steps/s, "
          f"ratio {PUBLISHED['efa'] / PUBLISHED['tcp']:.2f}x")
    published_tps = PUBLISHED["efa"] * PUBLISHED_TOKENS_PER_STEP
    rec = planner.recommend(planner.Workload(spec, seq_len=128, policy="bf16-mixed", max_global_batch=args.max_global_batch), layout)
    if rec.best is None:
        print(f"recommended: nothing fits ({rec.reason})")
        return
    b = rec.best
    print(f"recommended (bf16-mixed, global batch at most {args.max_global_batch:,} tokens): {b.describe()}, "
          f"{b.global_batch} x 128 tokens per step, {b.step_time_s:.2f} s/step ({b.bound}-bound), {b.per_gpu_bytes / 1e9:.2f} GB/GPU")
    if rec.runner_up is not None:
        print(f"runner-up: {rec.runner_up.describe()}, {rec.runner_up.tokens_per_s:,.0f} tokens/s")
    print(f"predicted {b.tokens_per_s:,.0f} tokens/s vs published {published_tps:,.0f} tokens/s (EFA): speed-up {b.tokens_per_s / published_tps:.1f}x")


if __name__ == "__main__":
    main()
