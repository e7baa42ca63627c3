"""`raydlc train` as a person runs it, with Ray: the default writes TensorBoard events a newcomer opens with
`raydlc tb`; TRACKING=mlflow against a real local server is one run with params, per-step metrics and the
run's end as artifacts, and a `--resume` continues that same run, its steps contiguous."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.test_tracking import accumulated, mlflow_server  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow

RAYDLC = Path(sys.executable).with_name("raydlc")
TINY = ["--seq-len", "32", "--batch-size", "2", "--workers", "2", "--checkpoint-every", "2", "--out", "out", "--run-name", "r1", "--json"]


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "RAY_ADDRESS", "MLFLOW_", "WANDB_"))}
    return {**out, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", **extra}


def test_train_writes_tensorboard_and_mlflow_and_resume_continues_the_same_run(tmp_path: Path, mlflow_server: str) -> None:  # noqa: F811
    from mlflow.tracking import MlflowClient

    e = env(RAYDLC_MLFLOW_TRACKING_URI=mlflow_server, RAYDLC_MLFLOW_EXPERIMENT_NAME="e2e")
    first = subprocess.run([str(RAYDLC), "train", "--steps", "4", "--tracking", "tensorboard,mlflow", *TINY],
                           cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    again = subprocess.run([str(RAYDLC), "train", "--steps", "6", "--tracking", "tensorboard,mlflow", "--resume", *TINY],
                           cwd=tmp_path, env=e, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] and "trackers_stopped" not in summary and "tracker" not in again.stderr.replace("trackers", "")
    tb = tmp_path / "out" / "r1" / "tb"
    assert summary["tracking"]["tensorboard"] == f"tensorboard --logdir {tb}"
    acc = accumulated(tb)
    assert [x.step for x in acc.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    # --resume into the same RUN_NAME: Ray Train restores its own checkpoint of that run first (a restart to the loop)
    continued = [t for t in ("events/resume", "events/restart") if t in acc.Tags()["scalars"]]
    assert [x.step for t in continued for x in acc.Scalars(t)] == [4]

    c = MlflowClient(mlflow_server)
    (run,) = c.search_runs([c.get_experiment_by_name("e2e").experiment_id])
    assert run.info.run_id and run.info.status == "FINISHED" and run.data.tags["raydlc.tracking_id"] == summary["tracking"]["mlflow"]
    assert sorted(m.step for m in c.get_metric_history(run.info.run_id, "train/loss")) == [1, 2, 3, 4, 5, 6]
    assert run.data.params["config/STEPS"] == "4"  # params are the first attempt's; MLflow's are immutable
    assert {"summary.json", "metrics.jsonl"} <= {f.path for f in c.list_artifacts(run.info.run_id)}

    tb_cmd = subprocess.run([str(RAYDLC), "tb", "r1", "--out", "out"], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=60)
    assert tb_cmd.returncode == 0 and tb_cmd.stdout.strip() == f"tensorboard --logdir {tb}", tb_cmd.stderr
