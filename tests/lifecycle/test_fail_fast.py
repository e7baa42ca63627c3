"""Waiting for pods ends early, naming node, pod, state and event, when a pod cannot come up by itself."""

from __future__ import annotations

from typing import Any

import pytest

from raydlc import lifecycle
from raydlc.lifecycle import Timings
from raydlc.lifecycle.stuck import StuckWatch, stuck_now

# Long pod waits: a wait that is not ended by the stuck pod would run into these and fail the message checks.
PATIENT = Timings(poll_s=0.1, cluster_s=120, nodegroup_s=120, stack_s=120, helm_s=120, nodes_s=60, plugins_s=600, pods_s=600,
                  stuck_s=1.0)


def _pod(name: str, node: str | None = "ip-10-0-1-5", phase: str = "Pending", waiting: dict[str, str] | None = None,
         restarts: int = 0) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"name": "ray-worker", "restartCount": restarts, "state": {"waiting": waiting}}]
    return {"metadata": {"name": name}, "spec": {"nodeName": node} if node else {}, "status": status}


def _event(pod: str, reason: str, message: str) -> dict[str, Any]:
    return {"involvedObject": {"kind": "Pod", "name": pod}, "reason": reason, "message": message, "type": "Warning"}


def _node(name: str, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError"])
def test_a_container_the_kubelet_gave_up_on_is_stuck_at_once(reason: str) -> None:
    pod = _pod("w-0", waiting={"reason": reason, "message": 'Back-off pulling image "x:1"'})
    line = stuck_now(pod, [_event("w-0", "Failed", "Error: " + reason)])
    assert line == f'pod w-0 on node ip-10-0-1-5: container ray-worker is {reason}: Back-off pulling image "x:1"; event Failed: Error: {reason}'


def test_crash_loop_counts_only_after_a_few_restarts() -> None:
    waiting = {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}
    assert stuck_now(_pod("w-0", waiting=waiting, restarts=2)) is None
    line = stuck_now(_pod("w-0", waiting=waiting, restarts=3))
    assert line is not None and "is CrashLoopBackOff after 3 restarts: back-off 40s" in line
    assert stuck_now(_pod("w-0", waiting={"reason": "ContainerCreating"})) is None  # only slow


def test_failed_scheduling_ends_the_wait_after_it_persists_with_no_node_joining() -> None:
    clock = Clock()
    watch = StuckWatch(persist_s=120, clock=clock)
    pod = _pod("rc-head", node=None)
    events = [_event("rc-head", "FailedScheduling", "0/3 nodes are available: 3 Insufficient cpu.")]
    nodes = [_node("a"), _node("b")]
    assert watch.verdict([pod], events, nodes) is None
    clock.t = 100
    assert watch.verdict([pod], events, nodes) is None
    clock.t = 110
    assert watch.verdict([pod], events, [*nodes, _node("c", ready=False)]) is None  # a node is joining: the clock restarts
    clock.t = 200
    assert watch.verdict([pod], events, [*nodes, _node("c", ready=False)]) is None
    clock.t = 231
    line = watch.verdict([pod], events, [*nodes, _node("c", ready=False)])
    assert line == ("pod rc-head on node (none) is Pending for 121 s with no node joining; "
                    "event FailedScheduling: 0/3 nodes are available: 3 Insufficient cpu.")
    assert watch.verdict([_pod("rc-head", node=None, phase="Running")], events, nodes) is None  # it came up after all


@pytest.mark.slow
@pytest.mark.parametrize(("state", "says"), [
    ("ImagePullBackOff", 'is ImagePullBackOff: Back-off pulling image "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/'),
    ("FailedMount", 'with no node joining; event FailedMount: MountVolume.SetUp failed for volume "infiniband-volume"'),
])
def test_an_efa_plugin_pod_that_cannot_start_ends_the_step_naming_it(world: Any, state: str, says: str) -> None:
    """eksctl's DaemonSet is `aws-efa-k8s-device-plugin` (eksctl v0.230.0 pkg/addons/assets/efa-device-plugin.yaml)."""
    world.scenario(plugin_stuck={"aws-efa-k8s-device-plugin": {"gpu:1": state}})
    steps = {r.step: r for r in lifecycle.up(world.config(), timings=PATIENT).results}
    gpu = sorted(o["metadata"]["name"] for k, o in world.kube.snapshot().items()
                 if k.startswith("/v1/nodes/") and o["metadata"]["labels"].get("role") == "gpu-worker")
    failed = steps["device-plugins"]
    assert failed.outcome == "failed", failed
    assert "pod aws-efa-k8s-device-plugin-" in failed.reason and f"on node {gpu[1]}" in failed.reason
    assert says in failed.reason and "timed out" not in failed.reason
    assert steps["raycluster"].outcome == "skipped"
