"""`submit --builtin` to the cluster against the moto server: a Spot run's job carries the Spot price its nodes are
bought at (RAYDLC_GPU_USD_PER_HOUR, one node an hour, read with DescribeSpotPriceHistory at submit), so the training
program keeps JOB_MAX_COST_USD at it; an On-Demand run's carries none (the program keeps the list price).

moto answers DescribeSpotPriceHistory itself (one fixed price, 0.00001, in each AZ offering the type) and has no
such cluster, so `cluster_gpu_prices` reads the price in GPU_AZ; the Jobs API submission itself is not made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raydlc.config import load_config
from raydlc.jobs import submit, targets


def submitted_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **over: object) -> dict[str, Any]:
    """The env vars of the job `submit_builtin` would submit to the cluster (its `_run` replaced by a recorder)."""
    seen: list[Any] = []
    monkeypatch.setattr(submit, "_run", lambda cfg, request, spec, gpus, *, write, notice: seen.append(spec))
    cfg = load_config(env={}, overrides={"REGION": "us-east-2", "GPU_AZ": "us-east-2b", "MODEL_ID": "tiny", "GPU_NODE_COUNT": 2,
                                         "STORAGE_PATH": "s3://b/runs", "JOB_DEADLINE_S": 86400, "JOB_MAX_COST_USD": 10.0, **over},
                      cwd=tmp_path)
    submit.submit_builtin(cfg, submit.JobRequest(targets.JobTarget(targets.CLUSTER)), write=lambda s: None, notice=lambda s: None)
    [spec] = seen
    return dict(spec.runtime_env["env_vars"])


def test_a_spot_runs_job_carries_the_spot_price_and_an_on_demand_runs_none(aws_env: str, offerings: Any,
                                                                           monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    offerings("us-east-2", "g6.12xlarge", ["us-east-2b"])
    spot = submitted_env(monkeypatch, tmp_path, GPU_CAPACITY_TYPE="spot")
    assert spot["RAYDLC_GPU_USD_PER_HOUR"] == "1e-05" and spot["RAYDLC_JOB_MAX_COST_USD"] == "10.0"
    assert not any(k.startswith("AWS_") or "SECRET" in k or "TOKEN" in k for k in spot)  # a price travels, no credential
    assert "RAYDLC_GPU_USD_PER_HOUR" not in submitted_env(monkeypatch, tmp_path)  # On-Demand: the list price, nothing set
    assert "RAYDLC_GPU_USD_PER_HOUR" not in submitted_env(monkeypatch, tmp_path, GPU_CAPACITY_TYPE="spot", JOB_MAX_COST_USD=None)
