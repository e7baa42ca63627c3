"""Print the planner's figures for the seed's published run next to the published ones.

The seed: Qwen2.5-1.5B in bf16, 2 x g6.12xlarge (8 x L4, 40 Gb/s, 1 EFA interface), batch
1 x 128 tokens per rank; EFA 0.5173 steps/s vs TCP 0.2513 steps/s (2.06x).
Run: PYTHONPATH=src python benchmarks/plan_vs_published.py
"""

from __future__ import annotations

from raydlc import plan as planner
from raydlc.models import get_spec

PUBLISHED = {"efa": 0.5173, "tcp": 0.2513}


def main() -> None:
    spec = get_spec("qwen2.5-1.5b")
    layout = planner.layout_for(2, 4, instance_type="g6.12xlarge")
    for policy in planner.POLICIES:
        p = planner.plan(spec, layout, seq_len=128, micro_batch=1, policy=policy)
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


if __name__ == "__main__":
    main()
