"""The same FSDP2 training loop under Ray Train and under torchrun, one after the other.

Prints, for each launcher, the time from launch to the end of the first step and the
steady-state step time (wall time between step ends, after a warm-up, so Ray's report
barrier every N steps is included), then as the last line `ray/torchrun steady-step ratio`.

    PYTHONPATH=src python benchmarks/ray_vs_torchrun.py [--steps 60] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def steady_and_first(records: list[dict[str, Any]], t_launch: float, skip: int) -> tuple[float, float]:
    steps = [r for r in records if "loss" in r]
    # The last step also evaluates, checkpoints and exports: leave it out of the steady window.
    window = steps[skip:-1]
    steady = (window[-1]["time"] - window[0]["time"]) / (len(window) - 1)
    return steady, steps[0]["time"] - t_launch


def worker(cfg_path: str) -> None:
    from raydlc.train.loop import TorchrunSession, run_loop

    cfg = pickle.loads(Path(cfg_path).read_bytes())
    run_loop(cfg, TorchrunSession(cfg["run_dir"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--report-every", type=int, default=10)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the steady state")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return

    from raydlc.train.launch import TrainSpec, loop_config, prepare, run
    from raydlc.train.metrics import read_jsonl

    tmp = Path(tempfile.mkdtemp(prefix="raydlc-bench-"))
    spec = TrainSpec(
        model="tiny", steps=args.steps, seq_len=args.seq_len, batch_size=args.batch_size, num_workers=args.workers,
        checkpoint_every=0, report_every=args.report_every, storage_path=str(tmp / "ray"), log_to_driver=False,
    )
    p = prepare(spec)

    run_dir = tmp / "torchrun" / p.run_name
    cfg = loop_config(p, p.arrays, None) | {"run_dir": str(run_dir)}
    cfg_path = tmp / "cfg.pkl"
    cfg_path.write_bytes(pickle.dumps(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.workers}", __file__, "--worker", str(cfg_path)],
        check=True, env=env, stdout=subprocess.DEVNULL,
    )
    torchrun = steady_and_first(read_jsonl(run_dir / "metrics.jsonl"), t0, args.skip)

    t0 = time.time()
    summary = run(spec, prepared=p)
    ray = steady_and_first(read_jsonl(Path(summary["metrics"])), t0, args.skip)

    print(f"model tiny, {args.workers} workers (gloo, CPU), global batch {args.batch_size * args.workers} x {args.seq_len} tokens, "
          f"{args.steps} steps, Ray reports every {args.report_every} steps, steady window steps {args.skip + 1}..{args.steps - 1}")
    print(f"{'launcher':10} {'first step (s)':>15} {'steady step (s)':>16}")
    for name, (steady, first) in (("torchrun", torchrun), ("ray", ray)):
        print(f"{name:10} {first:15.2f} {steady:16.4f}")
    print(json.dumps({"torchrun": {"steady_step_s": torchrun[0], "first_step_s": torchrun[1]}, "ray": {"steady_step_s": ray[0], "first_step_s": ray[1]}}))
    print(f"ray/torchrun steady-step ratio: {ray[0] / torchrun[0]:.2f}")


if __name__ == "__main__":
    main()
