"""How long Ray's autoscaler (v2) takes to bring two GPU nodes for a job, and to remove them once idle.

Against Ray's fake multi-node provider on this machine (tests/doubles/fakenodes.py): a head with no
GPUs, raydlc's rendered GPU worker group (min 0, max GPU_NODE_COUNT) as the only worker type, a
placement group of GPU_NODE_COUNT bundles of GPUS_PER_NODE GPUs on distinct nodes. The nodes are
raylets on this machine, so the figures are the autoscaler's own reaction times (its 1 s loop, the
idle timeout), not an EC2 launch or an image pull: on EKS add the node start-up
(raydlc.facts.instances.SCALE_UP_ESTIMATE_MIN) and the Cluster Autoscaler's scale-down timing.

    PYTHONPATH=src python benchmarks/autoscale_fake_nodes.py [--idle-s 3] [--rounds 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "doubles"))

from fakenodes import fake_gpu_cluster, run_cycle, worker_type  # noqa: E402

from raydlc.config import load_config  # noqa: E402
from raydlc.render.raycluster import WORKER_GROUP, render_raycluster  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--idle-s", type=float, default=3.0, help="the worker type's idle timeout, seconds")
    p.add_argument("--rounds", type=int, default=1, help="jobs one after another on the same head")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(env={}, cwd=tmp)
        (group,) = render_raycluster(cfg)["spec"]["workerGroupSpecs"]
        node_type = worker_type(group)
        nodes, gpus = cfg.gpu_nodes.count, cfg.gpu_nodes.gpus_per_node
        t0 = time.monotonic()
        with fake_gpu_cluster(WORKER_GROUP, node_type, idle_timeout_s=args.idle_s, log_dir=Path(tmp)) as head:
            print(f"head up in {time.monotonic() - t0:.1f} s; worker type {node_type}")
            for i in range(args.rounds):
                c = run_cycle(head, nodes=nodes, gpus=gpus)
                print(f"round {i + 1}: nodes before {c.nodes_at_start}, job on {len(set(c.job_nodes))} nodes, "
                      f"after {c.nodes_at_end}")
                print(f"scale-up (placement group asked -> {nodes} nodes ready): {c.scale_up_s:.1f} s")
                print(f"scale-down (group removed -> 0 GPU nodes, idle timeout {args.idle_s:g} s): {c.scale_down_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
