"""The same FSDP2 training loop under Ray Train and under torchrun, one after the other.

Prints, for each launcher, the time from launch to the end of the first step and the
steady-state step time (mean wall time between step ends after a warm-up, so Ray's report
barrier every N steps is included; the median gap too; and the best 10 consecutive steps,
which a burst of other work on a shared machine spares more often than a whole run), then as
the last line `ray/torchrun steady-step ratio` of the means (best round of each). Rounds
rotate which launcher goes first, so a change in machine load falls on all of them.

`ray-before` starts the local Ray as raydlc did before it switched off the background work a
local run does not use (ray_runtime.LOCAL_ENV, LOCAL_SYSTEM_CONFIG): an A/B in one sitting on a
shared machine. With `--cpu` every process of each run is sampled (/proc, once a second) and
the CPU each kind of process used over the steady window is printed, as a share of one core:
where the time that is not training goes.

    PYTHONPATH=src python benchmarks/ray_vs_torchrun.py [--steps 60] [--workers 2] [--launchers torchrun,ray,ray-before] [--cpu]
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
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

LAUNCHERS = ("torchrun", "ray", "ray-before")
TICKS = os.sysconf("SC_CLK_TCK")


BEST_OF = 10  # consecutive steps of the best stretch


def steady_and_first(records: list[dict[str, Any]], t_launch: float, skip: int) -> tuple[float, float, float, float, tuple[float, float]]:
    """(mean step, median step, best stretch of BEST_OF steps, launch to end of step 1, the steady
    window), from the wall-clock end of each step."""
    steps = [r for r in records if "loss" in r]
    # The last step also evaluates, checkpoints and exports: leave it out of the steady window.
    window = steps[skip:-1]
    in_order = [b["time"] - a["time"] for a, b in zip(window, window[1:])]
    gaps = sorted(in_order)
    mean = (window[-1]["time"] - window[0]["time"]) / (len(window) - 1)
    n = min(BEST_OF, len(in_order))
    best = min(sum(in_order[i : i + n]) / n for i in range(len(in_order) - n + 1))
    return mean, gaps[len(gaps) // 2], best, steps[0]["time"] - t_launch, (window[0]["time"], window[-1]["time"])


# Ray starts its worker processes at niceness 15; torchrun's would run at 0. On a machine
# shared with other work that alone decides the comparison, so torchrun gets the same.
RAY_WORKER_NICENESS = 15


def worker(cfg_path: str) -> None:
    from raydlc.train.loop import TorchrunSession, run_loop
    from raydlc.train.runspec import RunSpec

    payload = pickle.loads(Path(cfg_path).read_bytes())
    spec = RunSpec.from_wire(payload["run"])
    run_loop(spec, TorchrunSession(spec.run_dir, keep=spec.train.checkpoint_keep), payload["data"])


# ---- where the CPU goes ------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def _descendants(root: int) -> list[int]:
    seen, stack = [], [root]
    while stack:
        pid = stack.pop()
        seen.append(pid)
        stack += _children(pid)
    return seen


def kind(cmdline: str, own_pid: int, pid: int) -> str:
    """What a process is, in the terms of the comparison."""
    if pid == own_pid:
        return "raydlc driver (this process)"
    if cmdline.startswith("ray::"):
        name = cmdline.split()[0].removeprefix("ray::").split(".")[0]
        return {"RayTrainWorker": "training workers", "_Mailbox": "raydlc progress mailbox"}.get(name, f"Ray: {name}")
    if "--worker" in cmdline and "ray_vs_torchrun" in cmdline:
        return "training workers"
    if "torch.distributed.run" in cmdline:
        return "torchrun agent"
    exe = cmdline.split()[0].rsplit("/", 1)[-1] if cmdline else "?"
    if exe in ("raylet", "gcs_server"):
        return f"Ray: {exe}"
    script = next((a.rsplit("/", 1)[-1] for a in cmdline.split() if a.endswith(".py")), exe)
    return f"Ray: {script}"


@dataclass
class CpuSampler:
    """Per-process CPU seconds of this process's tree, once a second (children files: no /proc scan)."""

    every_s: float = 1.0
    samples: list[tuple[float, dict[int, tuple[str, float]]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _snap(self) -> dict[int, tuple[str, float]]:
        own = os.getpid()
        out: dict[int, tuple[str, float]] = {}
        for pid in _descendants(own):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            f = stat.rsplit(")", 1)[1].split()
            out[pid] = (kind(cmd, own, pid), (int(f[11]) + int(f[12])) / TICKS)
        return out

    def __enter__(self) -> CpuSampler:
        def loop() -> None:
            while not self._stop.is_set():
                self.samples.append((time.time(), self._snap()))
                self._stop.wait(self.every_s)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def between(self, t0: float, t1: float) -> tuple[float, Counter[str]]:
        """(seconds, CPU seconds by kind) between the samples nearest t0 and t1."""
        (a_t, a), (b_t, b) = (min(self.samples, key=lambda s: abs(s[0] - t)) for t in (t0, t1))
        use: Counter[str] = Counter()
        for pid, (k, cpu) in b.items():
            use[k] += cpu - a.get(pid, (k, cpu))[1]  # a process born inside the window: counted from its first sample
        return b_t - a_t, use


# ---- the run -----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--report-every", type=int, default=10)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the steady state")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every launcher, rotating which goes first")
    ap.add_argument("--launchers", default="torchrun,ray", help=f"comma list of {', '.join(LAUNCHERS)}")
    ap.add_argument("--cpu", action="store_true", help="sample every process's CPU and print where it goes")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    launchers = [x.strip() for x in args.launchers.split(",") if x.strip()]
    if not launchers or any(x not in LAUNCHERS for x in launchers):
        ap.error(f"--launchers takes a comma list of {', '.join(LAUNCHERS)}")

    from raydlc.config import TrainConfig
    from raydlc.edges import ray_runtime
    from raydlc.train.launch import run
    from raydlc.train.metrics import read_jsonl
    from raydlc.train.prepare import new_run_name, prepare
    from raydlc.train.resolve import Granted, resolve
    from raydlc.train.runspec import RunTarget

    tmp = Path(tempfile.mkdtemp(prefix="raydlc-bench-"))
    train = TrainConfig(
        model_id="tiny", steps=args.steps, seq_len=args.seq_len, batch_size=args.batch_size, num_workers=args.workers,
        learning_rate=2e-3, checkpoint_every=0, report_every=args.report_every, storage_path=str(tmp / "ray"),
    )
    where = RunTarget(log_to_driver=False)
    p = prepare(train, where)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def torchrun() -> tuple[list[dict[str, Any]], float]:
        name = new_run_name()
        run_dir = tmp / "torchrun" / name
        spec = resolve(train, where, replace(p, run_name=name), Granted.local(train))  # what the local Ray run resolves
        spec = spec.model_validate({**spec.model_dump(), "run_dir": str(run_dir)})
        cfg_path = tmp / "cfg.pkl"
        cfg_path.write_bytes(pickle.dumps({"run": spec.to_wire(), "data": p.data.to_dict()}))
        t0 = time.time()
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.workers}", __file__, "--worker", str(cfg_path)],
            check=True, env=env, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.nice(RAY_WORKER_NICENESS),
        )
        return read_jsonl(run_dir / "metrics.jsonl"), t0

    def ray(before: bool) -> tuple[list[dict[str, Any]], float]:
        import logging

        import ray as ray_mod

        t0 = time.time()
        if before:  # the local start as it was: Ray's defaults for everything but the dashboard
            ray_mod.init(address="local", num_cpus=max(os.cpu_count() or 1, args.workers), include_dashboard=False,
                         runtime_env={"env_vars": ray_runtime.worker_env()}, log_to_driver=False, logging_level=logging.WARNING)
        try:
            summary = run(train, where, prepared=replace(p, run_name=new_run_name()))  # a new name: Ray would resume an old one
        finally:
            if before:
                ray_mod.shutdown()
        return read_jsonl(Path(summary["metrics"])), t0

    results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in launchers}
    cpu: dict[str, list[tuple[float, Counter[str], int]]] = {name: [] for name in launchers}
    for i in range(args.rounds):  # rotate the order, so drift in machine load falls on each
        for name in launchers[i % len(launchers):] + launchers[: i % len(launchers)]:
            with CpuSampler() if args.cpu else _null() as sampler:
                records, t0 = torchrun() if name == "torchrun" else ray(before=name == "ray-before")
            mean, median, best_stretch, first, (w0, w1) = steady_and_first(records, t0, args.skip)
            results[name].append((mean, median, best_stretch, first))
            if sampler is not None:
                seconds, use = sampler.between(w0, w1)
                cpu[name].append((seconds, use, args.steps - args.skip - 2))

    print(f"model tiny, {args.workers} workers (gloo, CPU), global batch {args.batch_size * args.workers} x {args.seq_len} tokens, "
          f"{args.steps} steps, Ray reports every {args.report_every} steps, steady window steps {args.skip + 1}..{args.steps - 1}, {args.rounds} round(s), "
          f"all at niceness {RAY_WORKER_NICENESS}")
    print(f"{'launcher':10} {'first step (s)':>15} {'steady mean (s)':>16} {'steady median (s)':>18} {f'best {BEST_OF} steps (s)':>19}")
    best: dict[str, dict[str, float]] = {}
    for name, rs in results.items():
        for mean, median, stretch, first in rs:
            print(f"{name:10} {first:15.2f} {mean:16.4f} {median:18.4f} {stretch:19.4f}")
        # Other work on the machine only ever adds time: the best round is the launcher's own cost.
        best[name] = {
            "steady_step_s": min(r[0] for r in rs),
            "steady_median_s": min(r[1] for r in rs),
            "best_stretch_s": min(r[2] for r in rs),
            "first_step_s": min(r[3] for r in rs),
            "steady_step_s_median_of_rounds": statistics.median(r[0] for r in rs),
        }
    if args.cpu:
        print_cpu(cpu)
    print(json.dumps(best))
    if "torchrun" in best:
        for name in (n for n in launchers if n != "torchrun"):
            print(f"{name}/torchrun best-{BEST_OF}-steps ratio: {best[name]['best_stretch_s'] / best['torchrun']['best_stretch_s']:.2f}")
        for name in (n for n in launchers if n not in ("torchrun", "ray")):
            print(f"{name}/torchrun steady-step ratio: {best[name]['steady_step_s'] / best['torchrun']['steady_step_s']:.2f}")
        if "ray" in best:
            print(f"ray/torchrun steady-step ratio: {best['ray']['steady_step_s'] / best['torchrun']['steady_step_s']:.2f}")


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        pass


def print_cpu(cpu: dict[str, list[tuple[float, Counter[str], int]]]) -> None:
    """Each kind of process's CPU over the steady window, as % of one core (median of rounds), and
    the training workers' CPU seconds per step."""
    kinds = sorted({k for rs in cpu.values() for _, use, _ in rs for k in use})
    print("\nCPU over the steady window, % of one core (median of rounds); the machine has", os.cpu_count(), "cores")
    print(f"{'process':36}" + "".join(f"{n:>12}" for n in cpu))
    share = {n: {k: statistics.median(100 * use[k] / s for s, use, _ in rs) for k in kinds} for n, rs in cpu.items() if rs}
    for k in sorted(kinds, key=lambda k: -max(share[n][k] for n in share)):
        print(f"{k:36}" + "".join(f"{share[n][k]:11.1f}%" for n in share))
    others = {n: sum(v for k, v in share[n].items() if k != "training workers") for n in share}
    print(f"{'all but the training workers':36}" + "".join(f"{others[n]:11.1f}%" for n in share))
    per_step = {n: statistics.median(use["training workers"] / steps for _, use, steps in rs) for n, rs in cpu.items() if rs}
    print(f"{'training workers, CPU s per step':36}" + "".join(f"{per_step[n]:12.3f}" for n in per_step))


if __name__ == "__main__":
    main()
