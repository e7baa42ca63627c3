"""raydlc as a library: every command's use case as one typed function, the same work the CLI does.

    import raydlc.api as api
    result = api.plan(model="qwen2.5-1.5b", nodes=2, gpus_per_node=4)
    print(result.recommendation)

Conventions every use case follows (so one page of docs covers them all):
- Keyword arguments are named like the command's flags. Use cases that read the configuration also
  take `config` (a YAML file; default `./raydlc.yaml` or `$RAYDLC_CONFIG`) and `settings` (env.sh
  names to values, as `--set NAME=VALUE`), layered as the CLI layers them: default < file <
  `RAYDLC_*` environment < `settings` < the named arguments.
- The return value is typed and frozen; its `to_dict()` is exactly what `raydlc <command> --json`
  prints. Nothing is printed: progress reaches the caller through optional callbacks.
- Failures raise `raydlc.errors.RaydlcError` (message, hint, exit code), never a library's own error.
- Each function's docstring ends with an `Example:` block that the test suite runs and
  `docs/api.md` shows.

The functions live in private modules by command family and are imported on first use, so
`import raydlc.api` costs nothing until a use case runs (no torch, ray or kubernetes).
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> private module that defines it; one line per use case or result type
_EXPORTS: dict[str, str] = {
    "capacity": "raydlc.api._capacity",
    "config_show": "raydlc.api._info",
    "EffectiveConfig": "raydlc.api._info",
    "nccl": "raydlc.api._nccl",
    "NcclResult": "raydlc.api._nccl",
    "preflight": "raydlc.api._preflight",
    "render": "raydlc.api._render",
    "Rendered": "raydlc.api._render",
    "version": "raydlc.api._info",
    "VersionInfo": "raydlc.api._info",
    "plan": "raydlc.api._plan",
    "scan": "raydlc.api._plan",
    "PlanResult": "raydlc.api._plan",
    "ScanResult": "raydlc.api._plan",
    "train": "raydlc.api._train",
    "TrainResult": "raydlc.api._train",
    "tb": "raydlc.api._tracking",
    "TensorBoardRun": "raydlc.api._tracking",
    "generate": "raydlc.api._evaluate",
    "evaluate": "raydlc.api._evaluate",
    "GenerateResult": "raydlc.api._evaluate",
    "EvalResult": "raydlc.api._evaluate",
    "data_prepare": "raydlc.api._data",
    "data_show": "raydlc.api._data",
    "PreparedDataset": "raydlc.api._data",
    "DatasetShown": "raydlc.api._data",
    "submit": "raydlc.api._jobs",
    "job_list": "raydlc.api._jobs",
    "job_logs": "raydlc.api._jobs",
    "job_status": "raydlc.api._jobs",
    "job_stop": "raydlc.api._jobs",
    "verify": "raydlc.api._jobs",
    "bench_transport": "raydlc.api._jobs",
    "down_local": "raydlc.api._jobs",
    "SubmitResult": "raydlc.api._jobs",
    "JobListResult": "raydlc.api._jobs",
    "JobLogsResult": "raydlc.api._jobs",
    "JobStatusResult": "raydlc.api._jobs",
    "JobStopResult": "raydlc.api._jobs",
    "BenchResult": "raydlc.api._jobs",
    "DownLocalResult": "raydlc.api._jobs",
    "Job": "raydlc.edges.ray_dashboard",
    "Detached": "raydlc.jobs.control",
    "GateVerdict": "raydlc.checks.gate",
    "up": "raydlc.api._cluster",
    "down": "raydlc.api._cluster",
    "status": "raydlc.api._cluster",
    "Run": "raydlc.lifecycle.types",
    "StepResult": "raydlc.lifecycle.types",
    "Reporter": "raydlc.lifecycle.types",
    "ClusterStatus": "raydlc.lifecycle.cluster_status",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raydlc.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
