"""The training step with the experiment trackers on and off: TRACKING=none against tensorboard (the default)
and tensorboard,mlflow (an sqlite database here: no server to wait on, the client's writes are real).

    flock /tmp/raydlc-heavy.lock python benchmarks/tracking_overhead.py [--steps 60] [--rounds 3]

The loop itself under torchrun (train.loop.TorchrunSession: no Ray in the timing), the `tiny` built-in spec on
CPUs, the dataset prepared once (Ray Data, before any timing). Rounds rotate which setting goes first; each
round's figure is the mean step time over the steady steps (after --skip) from the run's metrics.jsonl. Prints
each setting's per-round figures, their median, and the difference from `none`; one JSON object on the last line.
A CPU's loop reads every step (train.cadence), so the trackers get a record each step here: more often than on
a GPU, where they get REPORT_EVERY steps at once.
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


def steady_step_s(records: list[dict[str, Any]], skip: int) -> float:
    steps = [r for r in records if "loss" in r][skip:]
    return sum(r["step_time_s"] for r in steps) / len(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--steps", 60), ("--workers", 2), ("--seq-len", 128), ("--batch-size", 8), ("--skip", 5), ("--rounds", 3)):
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--settings", default="none,tensorboard,tensorboard+mlflow", help="TRACKING values, + for a comma")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:  # one torchrun rank: the same worker as ray_vs_torchrun's
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from ray_vs_torchrun import worker

        worker(args.worker)
        return

    from raydlc.config import TrainConfig
    from raydlc.train.metrics import read_jsonl
    from raydlc.train.prepare import new_run_name, prepare
    from raydlc.train.resolve import Granted, resolve
    from raydlc.train.runspec import RunTarget

    tmp = Path(tempfile.mkdtemp(prefix="raydlc-bench-tracking-"))
    settings = [s.replace("+", ",") for s in args.settings.split(",") if s]
    base = TrainConfig(model_id="tiny", steps=args.steps, seq_len=args.seq_len, batch_size=args.batch_size, num_workers=args.workers,
                       learning_rate=2e-3, checkpoint_every=0, storage_path=str(tmp / "runs"), stall_minutes=0,
                       mlflow_tracking_uri=f"sqlite:///{tmp}/mlflow.db")
    where = RunTarget(log_to_driver=False)
    p = prepare(base, where)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def once(tracking: str) -> float:
        train = base.updated(tracking=tracking)
        name = new_run_name()
        spec = resolve(train, where, replace(p, run_name=name), Granted.local(train))
        cfg_path = tmp / "cfg.pkl"
        cfg_path.write_bytes(pickle.dumps({"run": spec.to_wire(), "data": p.data.to_dict()}))
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.workers}", __file__,
                        "--worker", str(cfg_path)], check=True, env=env, stdout=subprocess.DEVNULL)
        return steady_step_s(read_jsonl(Path(spec.run_dir) / "metrics.jsonl"), args.skip)

    figures: dict[str, list[float]] = {s: [] for s in settings}
    began = time.time()
    for r in range(args.rounds):
        for s in settings[r % len(settings):] + settings[:r % len(settings)]:
            figures[s].append(once(s))
    med = {s: statistics.median(v) for s, v in figures.items()}
    print(f"tiny, {args.workers} CPU workers under torchrun, {args.steps} steps (steady after {args.skip}), "
          f"{args.rounds} rounds, {time.time() - began:.0f} s:")
    for s, v in figures.items():
        diff = (med[s] / med[settings[0]] - 1) * 100
        print(f"  TRACKING={s:<20} step {med[s] * 1e3:7.1f} ms median  ({', '.join(f'{x * 1e3:.1f}' for x in v)})  {diff:+.1f}% vs {settings[0]}")
    print(json.dumps({"step_s": figures, "median_step_s": med}))


if __name__ == "__main__":
    main()
