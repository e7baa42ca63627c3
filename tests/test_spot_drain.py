"""A Spot GPU node's reclaim reaches Ray: the GPU worker pod's preStop hook drains its Ray node with reason
preemption and the reclaim deadline, holds the pod while a Ray Train worker still runs there, then returns: the kubelet ends the container.

The hook is run as the kubelet runs it (`/bin/sh -c`, exec in the container), with the system's real `pgrep`, a `ray`
on PATH that records its calls, and a stand-in worker process whose argv holds `ray::RayTrainWorker` (the title Ray
gives a Train worker actor). The container's PID namespace is stood in for by `unshare` where this machine allows one
(so a Ray Train test running beside this one cannot be found); elsewhere the test first checks the host has none."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raydlc import schemas
from raydlc.config import load_config
from raydlc.render import FILES, render_all
from raydlc.render.raycluster import (
    DRAIN_CLI_START_S,
    DRAIN_DEADLINE_S,
    DRAIN_HOLD_S,
    DRAIN_RAY,
    SPOT_GRACE_S,
    SPOT_NOTICE_S,
    TRAIN_WORKER,
    TRAIN_WORKER_PATTERN,
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
    assert re.search(TRAIN_WORKER_PATTERN, TRAIN_WORKER) and not re.search(TRAIN_WORKER_PATTERN, DRAIN_RAY)
    assert DRAIN_RAY.endswith("done")  # drain, hold, return: the kubelet ends the container
    # the hold and the kubelet's SIGTERM fit the pod's grace period, which fits EC2's two-minute notice
    assert DRAIN_HOLD_S < SPOT_GRACE_S < SPOT_NOTICE_S and DRAIN_DEADLINE_S <= SPOT_NOTICE_S
    # Ray Train ends the attempt at the deadline (a PreemptionError, MAX_PREEMPTIONS) before the kubelet's SIGTERM
    # could kill the workers (an expected termination to Ray: MAX_FAILURES); `ray drain-node` counts the deadline
    # only once it has started, and 5 s for the controller's poll.
    assert DRAIN_CLI_START_S + DRAIN_DEADLINE_S + 5 <= DRAIN_HOLD_S
    assert pod["terminationGracePeriodSeconds"] == SPOT_GRACE_S
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    assert "lifecycle" not in head["containers"][0]
    assert "terminationGracePeriodSeconds" not in head
    on_demand = _raycluster(tmp_path)["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert "lifecycle" not in on_demand["containers"][0]
    assert "terminationGracePeriodSeconds" not in on_demand


# Runs in the hook's PID namespace: starts the hook as the kubelet does, and the stand-in worker when asked; ends the
# worker by its PID after `hold_s`; prints what it saw as JSON.
_DRIVER = r"""
import json, subprocess, sys, time
hook, path, worker_s, hold_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
worker = None
if worker_s:  # argv[0] is the title Ray gives a Train worker actor (spelt apart here: this text is in argv too)
    worker = subprocess.Popen(["ray::" + "RayTrainWorker.__init__", str(worker_s)], executable="sleep")
t0 = time.monotonic()
run = subprocess.Popen(["/bin/sh", "-c", hook], env={"PATH": path}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
held = None
if worker is not None:
    time.sleep(hold_s)
    held = run.poll() is None  # still holding while the worker runs
    worker.kill()  # by its PID: the attempt ended
    worker.wait()
    t0 = time.monotonic()
out, err = run.communicate(timeout=60)
print(json.dumps({"rc": run.returncode, "err": err, "held": held, "after_s": time.monotonic() - t0}))
"""


def _system(tool: str) -> str:
    found = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if found is None:
        pytest.skip(f"no {tool} on this machine: the hook cannot be run as in the pod")
    return found


def _namespace() -> list[str]:
    """A PID namespace of its own, as the container has, where this machine gives one; else the host's."""
    own = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    if shutil.which("unshare") and subprocess.run([*own, "true"], capture_output=True).returncode == 0:
        return own
    if subprocess.run([_system("pgrep"), "-f", TRAIN_WORKER_PATTERN], capture_output=True).returncode == 0:
        pytest.skip("a Ray Train worker runs on this host and no PID namespace can hide it")
    return []


def _run_hook(tmp_path: Path, worker_s: float = 0, hold_s: float = 0) -> tuple[list[str], dict]:
    """The rendered hook under /bin/sh with the real pgrep and sleep and a `ray` that records its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    (bin_dir / "ray").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bin_dir / "ray").chmod(0o755)
    for tool in ("pgrep", "sleep"):
        os.symlink(_system(tool), bin_dir / tool)
    rc = render_all(load_config(env={}, overrides={"STORAGE_PATH": "s3://b/runs", "GPU_CAPACITY_TYPE": "spot"}, cwd=tmp_path),
                    ZONES, only="raycluster")[FILES["raycluster"]]
    (worker,) = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    sh, dash_c, hook = worker["lifecycle"]["preStop"]["exec"]["command"]
    assert (sh, dash_c) == ("/bin/sh", "-c")
    done = subprocess.run([*_namespace(), sys.executable, "-c", _DRIVER, hook, f"{bin_dir}:/usr/bin:/bin", str(worker_s),
                           str(hold_s)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["rc"] == 0, seen["err"]
    return log.read_text().splitlines(), seen


def test_the_hook_drains_then_returns_at_once_when_no_train_worker_runs_here(tmp_path: Path) -> None:
    """The hook's own shell holds the pattern in its argv: the real pgrep must not find it (it once held 100 s)."""
    calls, seen = _run_hook(tmp_path)
    assert calls == [f"drain-node --reason=DRAIN_NODE_REASON_PREEMPTION --reason-message=EKS is draining this Spot node "
                     f"--deadline-remaining-seconds={DRAIN_DEADLINE_S}"]  # the one Ray command: the kubelet ends the rest
    assert seen["after_s"] < 15


def test_the_hook_holds_the_node_while_a_train_worker_runs_then_returns(tmp_path: Path) -> None:
    """A worker process runs for 4 s of the hook: the hook holds; once the worker is ended, it returns within ~1 s."""
    calls, seen = _run_hook(tmp_path, worker_s=60, hold_s=4)
    assert len(calls) == 1 and calls[0].startswith("drain-node --reason=DRAIN_NODE_REASON_PREEMPTION")
    assert seen["held"] is True
    assert seen["after_s"] < 5
