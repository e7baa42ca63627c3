"""One place decides a cluster run's settings (issue 46, item 0): the RayJob `render --only rayjob` writes (and
`submit --rayjob` applies) carries the same resolved settings as `submit --builtin` sends through the Jobs API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raydlc.config import load_config
from raydlc.jobs import runtime_env
from raydlc.jobs.submit import JobRequest, _spec
from raydlc.jobs.targets import JobTarget
from raydlc.render import FILES, render_all

JOB_ONLY = {"RAYDLC_JOB_DEADLINE_S", "RAYDLC_GPU_USD_PER_HOUR"}  # the RayJob's own stop and price, not training settings


def _rayjob_env(cfg) -> dict[str, str]:
    job = render_all(cfg, ["us-east-2a"], only="rayjob")[FILES["rayjob"]]["spec"]
    env = json.loads(job["runtimeEnvYAML"])["env_vars"]
    return {k: v for k, v in env.items() if k not in JOB_ONLY}


def _builtin_env(cfg) -> dict[str, str]:
    """The env_vars of the job spec `submit --builtin` hands the Jobs API on the cluster target."""
    request = JobRequest(target=JobTarget(kind="cluster"))
    spec = _spec(cfg, request, None, lambda line: None)
    return dict(spec.runtime_env["env_vars"])


@pytest.mark.parametrize("overrides, expect", [
    ({}, {"RAYDLC_SEQ_LEN": "2048", "RAYDLC_GRAD_ACCUM": "auto", "RAYDLC_USE_GPU": "true"}),
    ({"SEQ_LEN": 512, "LORA_RANK": 8}, {"RAYDLC_SEQ_LEN": "512", "RAYDLC_LORA_RANK": "8", "RAYDLC_LEARNING_RATE": "0.0002"}),
], ids=["default", "user-set"])
def test_the_rayjob_and_submit_builtin_carry_the_same_cluster_settings(tmp_path: Path, overrides: dict, expect: dict) -> None:
    cfg = load_config(env={}, overrides={"STORAGE_PATH": "s3://raydlc-runs/team", **overrides}, cwd=tmp_path)
    rayjob, builtin = _rayjob_env(cfg), _builtin_env(cfg)
    assert rayjob == builtin
    assert {k: rayjob.get(k) for k in expect} == expect
    assert builtin == runtime_env.builtin_env(cfg, "cluster")
