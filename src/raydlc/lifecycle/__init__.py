"""Cluster lifecycle: `up`, `down` and `status` over resources, each check → act → verify.

Each resource (`lifecycle/resources/`: capacity, cluster, GPU node group, the KubeRay and device
plugin releases, the RayCluster) is one class that knows how to look at, make, remove and report
one thing; `up` and `down` are two dependency orders over them (`lifecycle/orders.py`) that the
scheduler (`lifecycle/steps.py`) runs, independent steps at the same time. `up` and `down` are
idempotent and resumable because every step starts by looking at the world (`check`) and acts
only on the difference; `--dry-run` stops after the look and prints the plan. The tools are
eksctl (cluster and node groups) and helm (raydlc's releases), run through `raydlc.edges.tools`;
everything else in Kubernetes goes through `raydlc.edges.kube`, and AWS through `raydlc.edges.aws`. Nothing
here imports boto3 or kubernetes at import time, and `up`/`down`/`status` load the resources
only when called.
"""

from __future__ import annotations

import importlib
from typing import Any

from raydlc.lifecycle.context import Context, Timings
from raydlc.lifecycle.types import Interrupted, Reporter, Run, StepFailed, StepResult

__all__ = ["Context", "Interrupted", "Reporter", "Run", "StepFailed", "StepResult", "Timings", "down", "status", "up"]

_LAZY = {"up": "raydlc.lifecycle.orders", "down": "raydlc.lifecycle.orders", "status": "raydlc.lifecycle.orders"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'raydlc.lifecycle' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
