"""How fast `raydlc nccl` reads big logs, next to `grep -E` for the same evidence phrases.

Generates ~1 GB of Ray-worker-like output (training steps, Ray core-worker lines, tqdm bars,
Python warnings) with NCCL_DEBUG=INFO init blocks of an 8-rank, 2-node EFA job mixed in,
into a temporary directory that is deleted afterwards. Then times, on the same warm file:

  grep -E -n '<evidence phrases>' FILE > OUT      (to a real file: GNU grep stops at the
                                                   first match when writing to /dev/null)
  python -m raydlc.cli nccl FILE --json > OUT     (the full analysis, process start included)

and prints both; the last line is `raydlc/grep time ratio: X.XX`.

    python benchmarks/nccl_scan.py              # 1 GB
    python benchmarks/nccl_scan.py --size 0.2   # 200 MB, for a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GREP_PATTERN = (
    r"NCCL (WARN|version)|via NET/|via P2P|via SHM|Using network|Selected [Pp]rovider|aws-ofi-nccl"
    r"|NET/Plugin|nRanks|nranks|Assigned NET|libfabric:.*<warn>|nccl(System|Internal|Remote)Error"
)


def noise_lines(rnd: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        k = rnd.randrange(7)
        s, ms, pid = rnd.randrange(60), rnd.randrange(1000), rnd.randrange(1000, 99999)
        h = "%016x%016x" % (rnd.getrandbits(64), rnd.getrandbits(64))
        if k == 0:
            out.append(f"[2026-11-29 10:00:{s:02d},{ms:03d} I {pid} {pid + 7}] core_worker.cc:{rnd.randrange(5000)}: Finished task {h[:24]} in {rnd.random():.3f}s")
        elif k == 1:
            out.append(f"(RayTrainWorker pid={pid}, ip=10.0.{rnd.randrange(255)}.{rnd.randrange(255)}) step {rnd.randrange(10**5)} loss {rnd.random() * 4:.4f} lr 2.0e-05 tokens/s {rnd.randrange(10**5)}")
        elif k == 2:
            out.append(f"[2026-11-29 10:00:{s:02d},{ms:03d} I {pid} {pid}] object_manager.cc:{rnd.randrange(900)}: Pushing object {h[:28]} to node {h[4:32]}, chunk {rnd.randrange(64)}")
        elif k == 3:
            out.append(f"Train epoch 0: {rnd.randrange(100)}%|████▌     | {rnd.randrange(10**4)}/10000 [00:{s:02d}<01:{ms % 60:02d}, {rnd.random() * 9:.2f}it/s]")
        elif k == 4:
            out.append(f"2026-11-29 10:00:{s:02d},{ms:03d}\tINFO train_loop.py:{rnd.randrange(400)} -- epoch 0 step {rnd.randrange(10**5)}: loss={rnd.random():.4f} grad_norm={rnd.random() * 3:.3f}")
        elif k == 5:
            out.append(f"/usr/local/lib/python3.12/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param.py:{rnd.randrange(900)}: UserWarning: resharding parameters after forward for module {h[:8]}")
        else:
            out.append(f"[2026-11-29 10:00:{s:02d},{ms:03d} D {pid} {pid}] gcs_client.cc:{rnd.randrange(900)}: GetAllNodeInfo returned {rnd.randrange(3)} nodes, session {h}")
    return out


def nccl_block(rank: int, run: int = 0, nranks: int = 8, per_node: int = 4) -> list[str]:
    """One rank's NCCL_DEBUG=INFO init, as NCCL 2.29 with aws-ofi-nccl on EFA prints it.

    `run` numbers restarts of the worker group: new pids and communicator addresses.
    """
    node = rank // per_node
    host = f"ray-train-cluster-gpu-group-worker-{node}"
    pid, tid, dev = 2210 + rank + 97 * run, 2291 + rank + 97 * run, rank % per_node
    p = f"{host}:{pid}:{tid} [{dev}] NCCL INFO "
    lines = [
        f"{host}:{pid}:{pid} [{dev}] NCCL INFO Bootstrap: Using eth0:10.0.{node}.17<0>",
        f"{host}:{pid}:{pid} [{dev}] NCCL INFO cudaDriverVersion 13000",
        "NCCL version 2.29.7+cuda13.0",
        p + "NET/Plugin: Loaded net plugin Libfabric (v10)",
        p + "NET/OFI Initializing aws-ofi-nccl 1.17.2",
        p + "NET/OFI Using Libfabric version 2.3",
        p + "NET/OFI Using CUDA driver version 13000 with runtime 13000",
        p + "NET/OFI Configuring AWS-specific options",
        p + "NET/OFI Setting provider_filter to efa",
        p + "NET/OFI Selected provider is efa, fabric is efa-direct (found 1 nics)",
        p + "NET/OFI Creating one domain per process",
        p + "Initialized NET plugin Libfabric",
        p + "Assigned NET plugin Libfabric to comm",
        p + "Using network Libfabric",
        p + "DMA-BUF is available on GPU device %d" % dev,
        p + f"ncclCommInitRankConfig comm 0x55f{run:03x}{rank:04x} rank {rank} nranks {nranks} cudaDev {dev} nvmlDev {dev} busId {38 + dev}000 commId 0x9a41 - Init START",
        p + "Setting affinity for GPU %d to ffff,ffffffff" % dev,
        p + "=== System : maxBw 5.0 totalBw 24.0 ===",
        p + "CPU/0-0 (1/1/1)",
        p + "+ PCI[24.0] - GPU/%d8000 (%d)" % (dev, rank),
        p + "+ PCI[5.0] - NIC/0",
        p + "                 + NET[5.0] - NET/0 (0/0/5.000000)",
        p + f"comm 0x55f{run:03x}{rank:04x} rank {rank} nRanks {nranks} nNodes 2 localRanks {per_node} localRank {dev} MNNVL 0",
        p + "Trees [0] %d/-1/-1->%d->%d [1] %d/-1/-1->%d->%d" % ((rank + 1) % nranks, rank, rank - 1, (rank + 1) % nranks, rank, rank - 1),
        p + "P2P Chunksize set to 131072",
        p + "Channel 00/02 : 0 1 2 3 4 5 6 7",
        p + "Channel 01/02 : 0 1 2 3 4 5 6 7",
    ]
    nxt, prv = (rank + 1) % nranks, (rank - 1) % nranks
    for ch in range(2):
        if nxt // per_node != node:
            lines.append(p + f"Channel {ch:02d}/0 : {rank}[{dev}] -> {nxt}[{nxt % per_node}] [send] via NET/Libfabric/0")
        else:
            lines.append(p + f"Channel {ch:02d}/0 : {rank}[{dev}] -> {nxt}[{nxt % per_node}] via SHM/direct/direct")
        if prv // per_node != node:
            lines.append(p + f"Channel {ch:02d}/0 : {prv}[{prv % per_node}] -> {rank}[{dev}] [receive] via NET/Libfabric/0")
    lines += [
        p + "Connected all rings, use ring PXN 0 GDR 0",
        p + "Connected all trees",
        p + "threadThresholds 8/8/64 | 64/8/64 | 512 | 512",
        p + "2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer",
        p + f"ncclCommInitRankConfig comm 0x55f{run:03x}{rank:04x} rank {rank} nranks {nranks} cudaDev {dev} nvmlDev {dev} busId {38 + dev}000 commId 0x9a41 - Init COMPLETE",
        p + f"Init timings - ncclCommInitRankConfig: rank {rank} nranks {nranks} total 0.61 (kernels 0.12, alloc 0.02, bootstrap 0.30)",
    ]
    return lines


def generate(path: Path, size_bytes: int, nccl_share: float, seed: int = 7) -> tuple[int, int]:
    """Write ~size_bytes of mixed lines; returns (lines, nccl lines)."""
    rnd = random.Random(seed)
    pool = noise_lines(rnd, 20_000)
    run = 0
    blocks = [nccl_block(r, run) for r in range(8)]
    block_len = sum(len(b) for b in blocks) / len(blocks)
    noise_per_block = max(1, int(block_len * (1 - nccl_share) / nccl_share))
    written = lines = nccl = 0
    with open(path, "w", buffering=1 << 22) as f:
        while written < size_bytes:
            if written > (run + 1) * 50_000_000:  # the worker group restarts every ~50 MB
                run += 1
                blocks = [nccl_block(r, run) for r in range(8)]
            for b in blocks:
                chunk = rnd.choices(pool, k=noise_per_block) + b
                s = "\n".join(chunk) + "\n"
                f.write(s)
                written += len(s)
                lines += len(chunk)
                nccl += len(b)
    return lines, nccl


def best_of(cmd: list[str], out: Path, runs: int, env: dict[str, str] | None = None) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        with open(out, "wb") as o:
            subprocess.run(cmd, stdout=o, check=False, env=env)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=float, default=1.0, help="GB of log to generate (default 1.0)")
    ap.add_argument("--nccl-share", type=float, default=0.05, help="share of lines that are NCCL output (default 0.05)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per tool, interleaved; the best is kept (default 5)")
    ap.add_argument("--tmp", default=None, help="directory for the generated file (default: system temp)")
    args = ap.parse_args()

    grep = shutil.which("grep")
    if grep is None:
        print("grep not found on PATH", file=sys.stderr)
        return 2
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryDirectory(prefix="nccl_scan_", dir=args.tmp) as d:
        log = Path(d) / "worker-01000000-2210.out"
        t = time.perf_counter()
        nlines, nnccl = generate(log, int(args.size * 1e9), args.nccl_share)
        size = log.stat().st_size
        print(f"generated {size / 1e9:.2f} GB, {nlines:,} lines ({nnccl / nlines:.1%} NCCL) in {time.perf_counter() - t:.1f} s")
        with open(log, "rb") as f:  # warm the page cache for both tools alike
            while f.read(1 << 24):
                pass

        # Interleaved, best of N each: on a shared machine, load swings hit both tools alike.
        grep_cmd = [grep, "-E", "-n", GREP_PATTERN, str(log)]
        raydlc_cmd = [sys.executable, "-m", "raydlc.cli", "nccl", str(log), "--json"]
        g = r = float("inf")
        for _ in range(args.runs):
            g = min(g, best_of(grep_cmd, Path(d) / "grep.out", 1))
            r = min(r, best_of(raydlc_cmd, Path(d) / "raydlc.out", 1, env))
        with open(Path(d) / "grep.out", "rb") as fh:
            matched = sum(1 for _ in fh)
        doc = json.loads((Path(d) / "raydlc.out").read_text().strip().splitlines()[-1])
        print(f"grep -E -n:       {g:7.2f} s  {size / g / 1e6:8.1f} MB/s  ({matched:,} matching lines)")
        print(f"raydlc nccl:      {r:7.2f} s  {size / r / 1e6:8.1f} MB/s  (verdict {doc['verdict']}, "
              f"{doc['candidates']:,} lines parsed, {len(doc['ranks'])} ranks, {doc['nodes']} nodes)")
        if doc["verdict"] != "efa" or doc["nodes"] != 2:
            print(f"unexpected analysis of the generated log: {doc['verdict']}, {doc['nodes']} nodes", file=sys.stderr)
        print(f"raydlc/grep time ratio: {r / g:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
