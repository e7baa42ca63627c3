"""A Spot GPU node's reclaim reaches Ray: the GPU worker pod's preStop hook drains its Ray node with reason
preemption and the reclaim deadline, holds the pod while a Ray Train worker still runs there, then returns: the kubelet ends the container."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from raydlc import schemas
from raydlc.config import load_config
from raydlc.render import FILES, render_all
from raydlc.render.raycluster import (
    DRAIN_DEADLINE_S,
    DRAIN_HOLD_S,
    DRAIN_RAY,
    SPOT_GRACE_S,
    SPOT_NOTICE_S,
    TRAIN_WORKER,
)

ZONES = ["us-east-2a", "us-east-2b"]


def _raycluster(tmp_path: Path, **over: object) -> dict:
    cfg = load_config(env={}, overrides={"STORAGE_PATH": "s3://b/runs", **over}, cwd=tmp_path)
    return render_all(cfg, ZONES, only="raycluster")[FILES["raycluster"]]


@pytest.mark.parametrize("kind", ["spot", "spot-then-on-demand"])
def test_spot_gpu_workers_drain_their_ray_node_on_the_way_out_and_nothing_else_does(tmp_path: Path, kind: str) -> None:
    rc = _raycluster(tmp_path, GPU_CAPACITY_TYPE=kind)
    assert list(schemas.validator("RayCluster").iter_errors(rc)) == []
    (group,) = rc["spec"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    (worker,) = pod["containers"]
    assert worker["lifecycle"]["preStop"]["exec"]["command"] == ["/bin/sh", "-c", DRAIN_RAY]
    assert "--reason=DRAIN_NODE_REASON_PREEMPTION" in DRAIN_RAY and f"--deadline-remaining-seconds={DRAIN_DEADLINE_S}" in DRAIN_RAY
    assert DRAIN_RAY.endswith("done")  # drain, hold, return: the kubelet ends the container
    # the hold and the kubelet's SIGTERM fit the pod's grace period, which fits EC2's two-minute notice
    assert DRAIN_HOLD_S < SPOT_GRACE_S < SPOT_NOTICE_S and DRAIN_DEADLINE_S <= SPOT_NOTICE_S
    # Ray Train ends the attempt at the deadline (a PreemptionError, MAX_PREEMPTIONS) before the kubelet's SIGTERM
    # could kill the workers (an expected termination to Ray: MAX_FAILURES); 5 s for the controller's poll.
    assert DRAIN_DEADLINE_S + 5 <= DRAIN_HOLD_S
    assert pod["terminationGracePeriodSeconds"] == SPOT_GRACE_S
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    assert "lifecycle" not in head["containers"][0]
    assert "terminationGracePeriodSeconds" not in head
    on_demand = _raycluster(tmp_path)["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert "lifecycle" not in on_demand["containers"][0]
    assert "terminationGracePeriodSeconds" not in on_demand


def _stub(bin_dir: Path, name: str, body: str) -> None:
    f = bin_dir / name
    f.write_text("#!/bin/sh\n" + body)
    f.chmod(0o755)


def _run_hook(tmp_path: Path, pgrep: str | None) -> tuple[list[str], float]:
    """The hook under /bin/sh with a `ray` that records its calls and a `pgrep` that answers as told."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    _stub(bin_dir, "ray", f'echo "$*" >> {log}\n')
    for tool in ("sleep", "cat"):  # the tools the hook and the stubs use, from the system
        path = subprocess.run(["/bin/sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if path.startswith("/"):
            os.symlink(path, bin_dir / tool)
    if pgrep is not None:
        _stub(bin_dir, "pgrep", pgrep)
    t0 = time.monotonic()
    r = subprocess.run(["/bin/sh", "-c", DRAIN_RAY], env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines(), time.monotonic() - t0


def test_the_hook_drains_then_returns_at_once_when_no_train_worker_runs_here(tmp_path: Path) -> None:
    calls, took = _run_hook(tmp_path, pgrep="exit 1\n")
    assert calls == [f"drain-node --reason=DRAIN_NODE_REASON_PREEMPTION --reason-message=EKS is draining this Spot node "
                     f"--deadline-remaining-seconds={DRAIN_DEADLINE_S}"]  # the one Ray command: the kubelet ends the rest
    assert took < 5


def test_the_hook_holds_the_node_while_a_train_worker_runs_then_returns(tmp_path: Path) -> None:
    """pgrep finds the worker (`ray::RayTrainWorker`) for its first three looks, then not: about three seconds' hold."""
    count = tmp_path / "looks"
    calls, took = _run_hook(tmp_path, pgrep=(
        f'[ "$2" = "{TRAIN_WORKER}" ] || exit 2\n'
        f'n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}; [ $n -le 3 ]\n'))
    assert len(calls) == 1 and calls[0].startswith("drain-node --reason=DRAIN_NODE_REASON_PREEMPTION")
    assert count.read_text().strip() == "4" and 2.5 < took < 15
