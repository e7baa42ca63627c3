"""Data preparation and reading by index, measured on this machine in one run.

Prints (1) records/s and tokens/s of `data prepare` (Ray Data) with 1 and 2 Ray CPUs against a
single-process `tokenizers` batch-encode of the same records with the same tokenizer; (2) the
driver's peak RSS and each Ray Train worker's peak RSS (VmHWM from /proc, sampled while it
runs) during a short training run on a prepared dataset of SMALL and of LARGE generated chat
documents; and as its last line `driver peak RSS 1M / 10k docs: X.XX` (LARGE / SMALL), with the
workers' ratio beside it. Every measurement runs in a fresh subprocess, so each peak is that
process's own.

    PYTHONPATH=src python benchmarks/data_prepare.py [--small 10000] [--large 1000000] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "this", "are", "from", "at", "or", "an", "which", "not", "have"]


def generate(path: Path, n: int, seed: int = 0) -> None:
    """`n` chat documents (system, user, assistant), written as they are made: nothing held."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
            a = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30)))
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{i}: {q}?"}, {"role": "assistant", "content": a}]}) + "\n")


def child(argv: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *argv], check=False, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if out.returncode != 0:
        raise SystemExit(f"{argv[0]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- the children -------------------------------------------------------------------------------


def prepare_child(source: str, dest: str, cpus: int, seq_len: int) -> dict[str, Any]:
    import ray

    from raydlc.data import dataset, pipeline

    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        plan = dataset.plan(source, out=dest, storage_root=dest, model_id="tiny", vocab=4096, recipe=pipeline.Recipe(seq_len, "assistant", "model", "fail"))
        t0 = time.perf_counter()
        made = dataset.make(plan)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    c = made.manifest.counts
    return {"records_per_s": c.records_read / wall, "tokens_per_s": (c.tokens + c.tail_tokens_dropped) / wall, "wall_s": wall, "rows": made.manifest.rows}


def baseline_child(source: str, dest: str) -> dict[str, Any]:
    """One process: parse and render each record, then one `encode_batch` per 512 records."""
    import json as j

    from tokenizers import Tokenizer

    from raydlc.data import formats

    tok = Tokenizer.from_file(str(Path(dest) / "tokenizer.json"))
    n = tokens = 0
    t0 = time.perf_counter()
    batch: list[str] = []
    with open(source) as f:
        for line in f:
            batch.extend(s.text for s in formats.segments(j.loads(line)))
            n += 1
            if n % 512 == 0:
                tokens += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False)) + 512
                batch = []
    tokens += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False)) + n % 512
    wall = time.perf_counter() - t0
    return {"records_per_s": n / wall, "tokens_per_s": tokens / wall, "wall_s": wall}


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether `pid` is `ancestor`'s descendant: the local Ray this process starts forks its workers,
    so other Ray Train runs on the machine (a test suite beside the benchmark) are not counted."""
    while pid > 1:
        if pid == ancestor:
            return True
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


def _worker_peaks(peaks: dict[int, int], stop: threading.Event) -> None:
    """VmHWM (kB) of every RayTrainWorker process of this run, the last value seen of each."""
    me = os.getpid()
    while not stop.wait(0.2):
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if b"RayTrainWorker" not in Path(f"/proc/{pid}/cmdline").read_bytes() or not _descends_from(int(pid), me):
                    continue
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peaks[int(pid)] = int(line.split()[1])
            except OSError:
                continue


def train_child(dest: str, out: str, steps: int, seq_len: int) -> dict[str, Any]:
    import raydlc.api as api

    peaks: dict[int, int] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_worker_peaks, args=(peaks, stop), daemon=True)
    sampler.start()
    try:
        r = api.train(data=dest, steps=steps, seq_len=seq_len, batch_size=4, workers=2, checkpoint_every=0, out=out, log_to_driver=False)
    finally:
        stop.set()
        sampler.join()
    return {"driver_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "worker_peak_mb": sorted(v / 1024 for v in peaks.values()),
            "train_sequences": r.train_sequences}


# ---- the parent ---------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--large", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=128)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="raydlc-data-bench-"))
    figures: dict[int, dict[str, Any]] = {}
    for n in (args.small, args.large):
        src = tmp / f"chat-{n}.jsonl"
        generate(src, n)
        dest = str(tmp / f"prepared-{n}")
        one = child(["prepare", str(src), dest, "1", str(args.seq_len)])
        two = child(["prepare", str(src), dest + "-2cpu", "2", str(args.seq_len)])
        base = child(["baseline", str(src), dest])
        print(f"{n:>9,} docs  prepare, 1 Ray CPU:  {one['records_per_s']:>9,.0f} records/s  {one['tokens_per_s']:>10,.0f} tokens/s  ({one['wall_s']:.1f} s, {one['rows']:,} blocks)")
        print(f"{n:>9,} docs  prepare, 2 Ray CPUs: {two['records_per_s']:>9,.0f} records/s  {two['tokens_per_s']:>10,.0f} tokens/s  ({two['wall_s']:.1f} s)")
        print(f"{n:>9,} docs  tokenizers, 1 process: {base['records_per_s']:>7,.0f} records/s  {base['tokens_per_s']:>10,.0f} tokens/s  ({base['wall_s']:.1f} s)")
        t = child(["train", dest, str(tmp / f"runs-{n}"), str(args.steps), str(args.seq_len)])
        print(f"{n:>9,} docs  training ({t['train_sequences']:,} blocks): driver peak RSS {t['driver_peak_mb']:.0f} MiB, "
              f"workers {', '.join(f'{w:.0f}' for w in t['worker_peak_mb'])} MiB", flush=True)
        figures[n] = t
    s, big = figures[args.small], figures[args.large]
    worker = max(big["worker_peak_mb"]) / max(s["worker_peak_mb"]) if s["worker_peak_mb"] and big["worker_peak_mb"] else float("nan")
    label = lambda n: f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"
    print(f"driver peak RSS {label(args.large)} / {label(args.small)} docs: {big['driver_peak_mb'] / s['driver_peak_mb']:.2f}  (worker peak RSS: {worker:.2f})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("prepare", "baseline", "train"):
        kind, rest = sys.argv[1], sys.argv[2:]
        if kind == "prepare":
            result = prepare_child(rest[0], rest[1], int(rest[2]), int(rest[3]))
        elif kind == "baseline":
            result = baseline_child(rest[0], rest[1])
        else:
            result = train_child(rest[0], rest[1], int(rest[2]), int(rest[3]))
        print(json.dumps(result))
    else:
        main()
