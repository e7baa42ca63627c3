"""Collective bus bandwidth and node facts measured inside Ray Train workers (the preflight's edge).

It runs as a short Ray Train job on the same worker layout as training, so the process
group, the NCCL plugin and the network path are exactly the ones the job will get. Groups:
all ranks (world), the ranks of each node (intra), and one rank per node (cross; local rank
0 of each node, alone on the NIC so the figure is the node's network, not a share of it).
"""

from __future__ import annotations

import glob
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from raydlc.errors import TrainError

LOCAL_SIZES = [1 << 18, 1 << 22, 1 << 25]  # 256 KiB, 4 MiB, 32 MiB
GPU_SIZES = [1 << 20, 1 << 25, 1 << 28, 1 << 29]  # 1 MiB .. 512 MiB
PLUGIN_DIRS = (
    "/opt/amazon/ofi-nccl/lib",
    "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu",
    "/opt/amazon/ofi-nccl/lib64",
    "/opt/aws-ofi-nccl/lib",
    "/usr/local/lib",
    "/usr/lib/x86_64-linux-gnu",
)


def _plugin_files() -> list[str]:
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(PLUGIN_DIRS)
    found: list[str] = []
    for d in dict.fromkeys(dirs):
        found.extend(sorted(glob.glob(os.path.join(d, "libnccl-net*.so*"))))
    return list(dict.fromkeys(found))


def _plugin_loaded() -> str | None:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                if "libnccl-net" in os.path.basename(path):
                    return path
    except OSError:
        return None
    return None


def _time_collective(dist: Any, torch: Any, op: str, size: int, group: Any, n: int, device: Any, iters: int, warmup: int) -> float:
    """Seconds per call, the slowest member's, so every member reports the same figure."""
    numel = max(n, size // 4 // n * n)
    if op == "all_reduce":
        buf = torch.ones(numel, dtype=torch.float32, device=device)
        call = lambda: dist.all_reduce(buf, group=group)
    else:
        out = torch.empty(numel, dtype=torch.float32, device=device)
        inp = torch.ones(numel // n, dtype=torch.float32, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        call = lambda: gather(out, inp, group=group)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        call()
    sync()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    sync()
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return float(elapsed.item())


@dataclass(frozen=True)
class _Groups:
    """The process groups every rank creates alike: each node's ranks (intra), one rank per node (cross)."""

    node: str  # this rank's node
    nodes: list[str]
    members: dict[str, list[int]]
    intra: dict[str, Any]
    cross_ranks: list[int]
    cross: Any  # None on one node


def _groups(dist: Any, rank: int, world: int, ranks_per_node: int | None) -> _Groups:
    import ray

    node = f"node-{rank // ranks_per_node}" if ranks_per_node else ray.util.get_node_ip_address()
    keys: list[Any] = [None] * world
    dist.all_gather_object(keys, node)
    nodes = list(dict.fromkeys(keys))
    members = {n: [r for r, k in enumerate(keys) if k == n] for n in nodes}
    intra = {n: dist.new_group(members[n]) for n in nodes}  # every rank creates every group, in order
    cross_ranks = [members[n][0] for n in nodes]
    return _Groups(node, nodes, members, intra, cross_ranks, dist.new_group(cross_ranks) if len(nodes) > 1 else None)


def _measure_all(dist: Any, torch: Any, g: _Groups, *, rank: int, world: int, device: Any, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every size and op over the world, within this node, across nodes: the same collectives in the
    same order on every rank; each group's first member keeps the row."""
    rows: list[dict[str, Any]] = []

    def timed(op: str, size: int, group: Any, n: int) -> float:
        return _time_collective(dist, torch, op, size, group, n, device, config["iters"], config["warmup"])

    def record(op: str, scope: str, size: int, n: int, t: float, on: list[str]) -> None:
        rows.append({"op": op, "scope": scope, "size_bytes": size, "group_size": n, "time_s": t, "nodes": on})

    mine = g.members[g.node]
    for size in config["sizes"]:
        for op in ("all_reduce", "all_gather"):
            t = timed(op, size, None, world)
            if rank == 0:
                record(op, "world", size, world, t, g.nodes)
            if len(mine) > 1:
                t = timed(op, size, g.intra[g.node], len(mine))
                if rank == mine[0]:
                    record(op, "intra", size, len(mine), t, [g.node])
            dist.barrier()
            if g.cross is not None and rank in g.cross_ranks:
                t = timed(op, size, g.cross, len(g.cross_ranks))
                if rank == g.cross_ranks[0]:
                    record(op, "cross", size, len(g.cross_ranks), t, g.nodes)
            dist.barrier()
    return rows


def _node_facts(torch: Any, node: str, rank: int, local_rank: int) -> dict[str, Any]:
    return {
        "node": node,
        "hostname": socket.gethostname(),
        "rank": rank,
        "local_rank": local_rank,
        "gpus_visible": torch.cuda.device_count(),
        "infiniband": os.path.isdir("/dev/infiniband"),
        "fi_provider": os.environ.get("FI_PROVIDER"),
        "nccl_net": os.environ.get("NCCL_NET"),
        "net_plugin_files": _plugin_files(),
        "net_plugin_loaded": _plugin_loaded(),
    }


def _picture(dist: Any, world: int, rows: list[dict[str, Any]], facts: dict[str, Any]) -> dict[str, Any]:
    """Every rank's rows and facts gathered (a collective), the facts merged per node."""
    all_rows: list[Any] = [None] * world
    all_facts: list[Any] = [None] * world
    dist.all_gather_object(all_rows, rows)
    dist.all_gather_object(all_facts, facts)
    by_node: dict[str, dict[str, Any]] = {}
    for f in sorted(all_facts, key=lambda f: f["rank"]):
        entry = by_node.setdefault(f["node"], f | {"ranks": []})
        entry["ranks"].append(f["rank"])
        entry["net_plugin_loaded"] = entry["net_plugin_loaded"] or f["net_plugin_loaded"]
    return {
        "backend": dist.get_backend(),
        "world_size": world,
        "measurements": [r for rs in all_rows for r in rs],
        "nodes": list(by_node.values()),
    }


def worker_loop(config: dict[str, Any]) -> None:
    """Runs in every Ray Train worker; rank 0 hands the whole picture to the driver's collector.

    Ray Train V2 keeps only metrics reported with a checkpoint, and a checkpoint needs
    storage shared by all nodes; the driver's mailbox actor (raydlc.edges.ray_runtime.mailbox) needs neither.
    """
    import ray
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    ctx = ray.train.get_context()
    rank, world, local_rank = ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank()
    use_cuda = torch.cuda.is_available() and dist.get_backend() == "nccl"
    device = ray.train.torch.get_device() if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    g = _groups(dist, rank, world, config.get("ranks_per_node"))
    rows = _measure_all(dist, torch, g, rank=rank, world=world, device=device, config=config)
    doc = _picture(dist, world, rows, _node_facts(torch, g.node, rank, local_rank))
    if rank == 0:
        ray.get(config["collector"].put.remote([json.dumps(doc)]))
    dist.barrier()


def measure(
    *,
    num_workers: int,
    use_gpu: bool,
    sizes: list[int] | None = None,
    iters: int = 5,
    warmup: int = 2,
    ranks_per_node: int | None = None,
    storage_path: str | None = None,
) -> dict[str, Any]:
    """One short TorchTrainer run, in the Ray of `raydlc.edges.ray_runtime.connected` (RAY_ADDRESS, or a local one)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raydlc.edges import ray_runtime

    with ray_runtime.connected(workers=num_workers):
        gpus = ray_runtime.cluster_resources().get("GPU", 0)
        if use_gpu and gpus < num_workers:
            raise TrainError(
                f"the Ray cluster has {gpus:g} GPUs and the preflight needs {num_workers} (one per worker)",
                hint="run it where Ray reaches the GPU cluster (RAY_ADDRESS, or `raydlc train --preflight`), or pass --local",
            )
        collector = ray_runtime.mailbox()
        config = {
            "collector": collector,
            "sizes": list(sizes or (GPU_SIZES if use_gpu else LOCAL_SIZES)),
            "iters": iters,
            "warmup": warmup,
            "ranks_per_node": ranks_per_node,
        }
        trainer = TorchTrainer(
            worker_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
            run_config=RunConfig(
                name=f"raydlc-preflight-{int(time.time())}",
                storage_path=storage_path or os.path.join(tempfile.gettempdir(), "raydlc-preflight"),
                worker_runtime_env={"env_vars": ray_runtime.worker_env()},
            ),
        )
        try:
            trainer.fit()
        except Exception as e:
            raise ray_runtime.run_error(
                e, f"preflight run on {num_workers} workers",
                hint="check that the cluster has the workers' GPUs free and that NCCL can initialise (NCCL_DEBUG=INFO)",
            ) from e
        docs = ray_runtime.drain(collector)
        if not docs:
            raise TrainError("preflight run reported no figures", hint="rerun with --debug and read the worker logs")
        return json.loads(docs[-1])
