"""The same FSDP2 training loop under Ray Train and under torchrun, one after the other.

Prints, for each launcher, the time from launch to the end of the first step and the
steady-state step time (mean wall time between step ends after a warm-up, so Ray's report
barrier every N steps is included; the median gap too), then as the last line
`ray/torchrun steady-step ratio` of the means (best round of each). Rounds alternate which
launcher goes first, so a change in machine load falls on both.

    PYTHONPATH=src python benchmarks/ray_vs_torchrun.py [--steps 60] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any


def steady_and_first(records: list[dict[str, Any]], t_launch: float, skip: int) -> tuple[float, float, float]:
    """(mean step, median step, launch to end of step 1), from the wall-clock end of each step."""
    steps = [r for r in records if "loss" in r]
    # The last step also evaluates, checkpoints and exports: leave it out of the steady window.
    window = steps[skip:-1]
    gaps = sorted(b["time"] - a["time"] for a, b in zip(window, window[1:]))
    mean = (window[-1]["time"] - window[0]["time"]) / (len(window) - 1)
    return mean, gaps[len(gaps) // 2], steps[0]["time"] - t_launch


# Ray starts its worker processes at niceness 15; torchrun's would run at 0. On a machine
# shared with other work that alone decides the comparison, so torchrun gets the same.
RAY_WORKER_NICENESS = 15


def worker(cfg_path: str) -> None:
    from raydlc.train.loop import TorchrunSession, run_loop
    from raydlc.train.runspec import RunSpec

    payload = pickle.loads(Path(cfg_path).read_bytes())
    spec = RunSpec.from_wire(payload["run"])
    run_loop(spec, TorchrunSession(spec.run_dir), payload["data"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--report-every", type=int, default=10)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the steady state")
    ap.add_argument("--rounds", type=int, default=3, help="launch pairs, alternating which goes first")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return

    from raydlc.config import TrainConfig
    from raydlc.train.launch import Target, new_run_name, plan_layout, prepare, run, run_spec
    from raydlc.train.metrics import read_jsonl

    tmp = Path(tempfile.mkdtemp(prefix="raydlc-bench-"))
    train = TrainConfig(
        model_id="tiny", steps=args.steps, seq_len=args.seq_len, batch_size=args.batch_size, num_workers=args.workers,
        learning_rate=2e-3, checkpoint_every=0, report_every=args.report_every, storage_path=str(tmp / "ray"),
    )
    where = Target(log_to_driver=False)
    p = prepare(train, where)
    mesh = plan_layout(train, [args.workers], model=p.model, instance_type=None)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def torchrun() -> tuple[float, float, float]:
        name = new_run_name()
        run_dir = tmp / "torchrun" / name
        spec = run_spec(replace(p, run_name=name), mesh, where)
        spec = spec.model_validate({**spec.model_dump(), "run_dir": str(run_dir)})
        cfg_path = tmp / "cfg.pkl"
        cfg_path.write_bytes(pickle.dumps({"run": spec.to_wire(), "data": p.arrays}))
        t0 = time.time()
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.workers}", __file__, "--worker", str(cfg_path)],
            check=True, env=env, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.nice(RAY_WORKER_NICENESS),
        )
        return steady_and_first(read_jsonl(run_dir / "metrics.jsonl"), t0, args.skip)

    def ray() -> tuple[float, float, float]:
        t0 = time.time()
        summary = run(train, where, prepared=replace(p, run_name=new_run_name()))  # a new name: Ray would resume an old one
        return steady_and_first(read_jsonl(Path(summary["metrics"])), t0, args.skip)

    results: dict[str, list[tuple[float, float, float]]] = {"torchrun": [], "ray": []}
    for i in range(args.rounds):  # ABBA order, so drift in machine load falls on both
        for name in (("torchrun", "ray") if i % 2 == 0 else ("ray", "torchrun")):
            results[name].append(torchrun() if name == "torchrun" else ray())

    print(f"model tiny, {args.workers} workers (gloo, CPU), global batch {args.batch_size * args.workers} x {args.seq_len} tokens, "
          f"{args.steps} steps, Ray reports every {args.report_every} steps, steady window steps {args.skip + 1}..{args.steps - 1}, {args.rounds} round(s), "
          f"both at niceness {RAY_WORKER_NICENESS}")
    print(f"{'launcher':10} {'first step (s)':>15} {'steady mean (s)':>16} {'steady median (s)':>18}")
    best: dict[str, dict[str, float]] = {}
    for name, rs in results.items():
        for mean, median, first in rs:
            print(f"{name:10} {first:15.2f} {mean:16.4f} {median:18.4f}")
        # Other work on the machine only ever adds time: the best round is the launcher's own cost.
        best[name] = {
            "steady_step_s": min(r[0] for r in rs),
            "steady_median_s": min(r[1] for r in rs),
            "first_step_s": min(r[2] for r in rs),
            "steady_step_s_median_of_rounds": statistics.median(r[0] for r in rs),
        }
    print(json.dumps(best))
    print(f"ray/torchrun steady-step ratio: {best['ray']['steady_step_s'] / best['torchrun']['steady_step_s']:.2f}")


if __name__ == "__main__":
    main()
