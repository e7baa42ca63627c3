"""`raydlc preflight` as a function: collective bus bandwidth on the job's workers, judged against the instance."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from raydlc.api._config import load
from raydlc.errors import InputError

if TYPE_CHECKING:
    from raydlc.checks.preflight import PreflightReport

MAX_ITERS = 1000
MAX_SIZE_MIB = 16384


def preflight(
    *,
    local: bool = False,
    workers: int | None = None,
    size_mib: Sequence[float] | None = None,
    iters: int = 5,
    config: str | os.PathLike[str] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> PreflightReport:
    """All-reduce/all-gather bus bandwidth on Ray Train workers, and whether EFA is really in use.

    It runs in the Ray that `RAY_ADDRESS` names, or a local one. `local` runs over gloo on
    this machine (figures only, no network verdict); otherwise one worker per GPU of the
    cluster (`workers`, default NUM_WORKERS) is measured and judged against what the GPU
    instance type should reach. `size_mib` are the message sizes (default 0.25/4/32 MiB
    locally, 1..512 on GPUs). `report.ok` is false when a figure or a node fails. The example
    starts a local Ray with two CPU workers (about a minute).

    Example:
        import raydlc.api as api

        report = api.preflight(local=True, workers=2, size_mib=[1], iters=2)
        print(report.verdict, report.backend, report.world_size, len(report.measurements) > 0)
    """
    from raydlc.checks import preflight as pf

    cfg = load(config, settings, NUM_WORKERS=workers)
    if iters < 1 or any(s <= 0 for s in size_mib or []):
        raise InputError("--iters and --size-mib must be positive", hint="e.g. --size-mib 4 --size-mib 64 --iters 5")
    if iters > MAX_ITERS or any(s > MAX_SIZE_MIB for s in size_mib or []):
        raise InputError(
            f"--iters must be at most {MAX_ITERS} and --size-mib at most {MAX_SIZE_MIB} (16 GiB): "
            "bus bandwidth saturates far below that",
            hint="e.g. --size-mib 512 --iters 20",
        )
    n = workers if workers is not None else ((cfg.train.num_workers or 2) if local else cfg.num_workers)
    if n < 1:
        raise InputError(f"--workers must be at least 1, got {n}", hint="pass --workers 2 for a local run")
    every_gpu = cfg.gpu_nodes.gpus_per_node if n == cfg.total_gpus else None
    expectation = None if local else pf.expectation_for(cfg.gpu_nodes.instance_type, every_gpu)
    return pf.run_preflight(
        num_workers=n, use_gpu=not local, expectation=expectation, iters=iters,
        sizes=[int(s * 2**20) for s in size_mib] if size_mib else None,
    )
