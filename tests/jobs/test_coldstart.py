"""The cold-cluster judge on hand-built snapshots: every verdict, and the lines a person reads.

The event messages are the Cluster Autoscaler's formats (kubernetes/autoscaler cluster-autoscaler-1.36.1,
processors/status/eventing_scale_up_processor.go: "pod triggered scale-up: %v" of ScaleUpInfo
"{group cur->new (max: n)}", "pod didn't trigger scale-up: <count> <reason>, …"); the ASG activities
are DescribeScalingActivities' fields with EC2's insufficient-capacity message.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from raydlc.facts import instances
from raydlc.jobs import cold_start
from raydlc.jobs.cold_start import FAILED, WAITING, WARM, Demand, Snapshot
from raydlc.jobs.warmup import parse_duration

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ASG = "eks-gpu-workers-1ac9a3f2-0b7c-4e2d"
TWO_NODES = Demand(gpus=8, gpus_per_pod=4, max_pods=2)


def node(name: str, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"role": "gpu-worker"}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name: str, phase: str = "Pending", waiting: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if phase == "Running":
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    if waiting:
        status["containerStatuses"] = [{"name": "ray-worker", "state": {"waiting": {"reason": waiting, "message": "pull access denied"}}}]
    return {"metadata": {"name": name, "labels": {"ray.io/group": "gpu-workers"}}, "spec": {}, "status": status}


def event(pod_name: str, reason: str, message: str, at: int = 0) -> dict[str, Any]:
    return {"involvedObject": {"kind": "Pod", "name": pod_name}, "reason": reason, "message": message,
            "type": "Warning" if reason == "FailedScheduling" else "Normal",
            "lastTimestamp": (T0 + timedelta(seconds=at)).strftime("%Y-%m-%dT%H:%M:%SZ")}


def activity(status: str, minutes: float, message: str = "", took: float | None = None,
             description: str = "Launching a new EC2 instance: i-0a1b2c3d4e5f") -> dict[str, Any]:
    start = T0 + timedelta(minutes=minutes)
    a: dict[str, Any] = {"ActivityId": f"a-{minutes}", "AutoScalingGroupName": ASG, "Description": description,
                         "Cause": "a user request update of AutoScalingGroup constraints to min: 0, max: 2, desired: 2",
                         "StartTime": start, "StatusCode": status, "Progress": 100 if status != "InProgress" else 30}
    if message:
        a["StatusMessage"] = message
    if took is not None:
        a["EndTime"] = start + timedelta(minutes=took)
    return a


ICE = ("We currently do not have sufficient g6.12xlarge capacity in the Availability Zone you requested (us-east-2a). "
       "Our system will be working on provisioning additional capacity. You can currently get g6.12xlarge capacity by not "
       "specifying an Availability Zone in your request or choosing us-east-2b, us-east-2c. Launching EC2 instance failed.")
PODS = ("rc-gpu-workers-worker-aaaaa", "rc-gpu-workers-worker-bbbbb")
SCHED = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
TRIGGERED = f"pod triggered scale-up: [{{{ASG} 0->2 (max: 2)}}]"


def snap(**kw: Any) -> Snapshot:
    base: dict[str, Any] = {"demand": TWO_NODES, "nodes": (), "pods": tuple(pod(p) for p in PODS), "events": (), "asg": ASG, "since": T0}
    return Snapshot(**{**base, **kw})


def test_warm_when_the_pods_the_job_needs_run() -> None:
    v = cold_start.judge(snap(nodes=(node("n1"), node("n2")), pods=tuple(pod(p, "Running") for p in PODS)))
    assert (v.state, v.reason) == (WARM, "2 of 2 GPU worker pods running")
    half = cold_start.judge(snap(nodes=(node("n1"),), pods=(pod(PODS[0], "Running"), pod(PODS[1]))))
    assert half.state == WAITING and half.reason == "GPU nodes at 1 of 2, GPU worker pods running 1 of 2"
    none_needed = cold_start.judge(snap(demand=Demand(0, 4, 2), pods=()))
    assert none_needed.state == WARM


def test_waiting_says_what_the_scheduler_the_autoscaler_and_the_asg_say_each_once() -> None:
    events = tuple(event(p, "FailedScheduling", SCHED) for p in PODS) + tuple(event(p, "TriggeredScaleUp", TRIGGERED, 5) for p in PODS)
    v = cold_start.judge(snap(events=events, activities=(activity("InProgress", 0.2),), waited_s=60))
    assert v.state == WAITING and v.reason == "GPU nodes at 0 of 2, GPU worker pods running 0 of 2"
    assert v.lines == (f"scheduler: {SCHED}", f"cluster-autoscaler: {TRIGGERED}",
                       f"ASG {ASG}: Launching a new EC2 instance: i-0a1b2c3d4e5f (InProgress)")


def test_insufficient_capacity_is_named_as_such_with_its_zone_while_waiting_and_when_the_time_is_up() -> None:
    acts = (activity("Failed", 1, ICE, took=0.1, description="Launching a new EC2 instance.  Status Reason: " + ICE),
            activity("Successful", -600, took=3.5))  # an old launch: history, not this scale-up
    v = cold_start.judge(snap(activities=acts, waited_s=120))
    assert v.state == WAITING
    assert v.lines[-1].startswith(f"ASG {ASG}: InsufficientInstanceCapacity in us-east-2a (Failed): We currently do not have sufficient g6.12xlarge")
    late = cold_start.judge(snap(activities=acts, waited_s=15 * 60))
    assert late.state == FAILED
    assert late.reason.startswith("GPU nodes still at 0 of 2 after 15.0 min, the node group's scale-up time limit (15.0 min")
    assert f"last activity of ASG {ASG}: InsufficientInstanceCapacity in us-east-2a" in late.reason
    assert cold_start.capacity_zone("InsufficientInstanceCapacity ... in the Availability Zone us-east-2a") == "us-east-2a"


def test_a_scale_up_that_never_comes_names_the_last_activity_or_else_the_last_word_heard() -> None:
    quiet = cold_start.judge(snap(waited_s=901, provision_s=900))
    assert quiet.state == FAILED and quiet.reason.endswith("no event from the scheduler or the cluster autoscaler, and no ASG activity")
    heard = cold_start.judge(snap(waited_s=901, provision_s=900, events=(event(PODS[0], "TriggeredScaleUp", TRIGGERED),)))
    assert heard.reason.endswith(f"cluster-autoscaler: {TRIGGERED}")


def test_the_autoscaler_refusing_for_good_fails_at_once_and_a_backoff_does_not() -> None:
    never = "pod didn't trigger scale-up: 1 Insufficient nvidia.com/gpu"
    v = cold_start.judge(snap(events=(event(PODS[0], "NotTriggerScaleUp", never),)))
    assert v.state == FAILED and v.reason == f"no GPU node can ever hold pod {PODS[0]}: cluster-autoscaler: {never}"
    backoff = "pod didn't trigger scale-up: 1 in backoff after failed scale-up"
    assert cold_start.judge(snap(events=(event(PODS[0], "NotTriggerScaleUp", backoff),))).state == WAITING
    superseded = (event(PODS[0], "NotTriggerScaleUp", never, 0), event(PODS[0], "TriggeredScaleUp", TRIGGERED, 30))
    assert cold_start.judge(snap(events=superseded)).state == WAITING  # the newest word of the autoscaler counts


def test_a_pod_that_cannot_start_fails_at_once_and_slow_pods_on_ready_nodes_fail_after_their_allowance() -> None:
    bad = cold_start.judge(snap(nodes=(node("n1"), node("n2")), pods=(pod(PODS[0], waiting="ImagePullBackOff"), pod(PODS[1]))))
    assert bad.state == FAILED and bad.reason.startswith(f"pod {PODS[0]} on node (none): container ray-worker is ImagePullBackOff")
    ready = (node("n1"), node("n2"))
    assert cold_start.judge(snap(nodes=ready, nodes_ready_s=60, waited_s=20 * 60)).state == WAITING  # nodes came: the node limit is past
    slow = cold_start.judge(snap(nodes=ready, nodes_ready_s=cold_start.POD_START_S))
    assert slow.state == FAILED and slow.reason.startswith("the GPU nodes are Ready but 2 of 2 GPU worker pods have not started")


def test_a_job_larger_than_the_gpu_workers_can_ever_hold() -> None:
    assert cold_start.never_fits(Demand(9, 4, 2)) == "the job needs 9 GPUs and the RayCluster's GPU workers hold at most 8 (2 pods x 4 GPUs)"
    assert cold_start.never_fits(Demand(8, 4, 2)) is None and cold_start.never_fits(Demand(0, 0, 0)) is None
    assert "no GPU worker group" in str(cold_start.never_fits(Demand(1, 0, 0)))
    assert cold_start.judge(snap(demand=Demand(16, 4, 2))).state == FAILED


@pytest.mark.parametrize(("scaling", "expected"), [(True, Demand(8, 4, 3)), (False, Demand(8, 4, 0))])
def test_demand_reads_the_gpu_worker_groups_as_kuberay_runs_them(scaling: bool, expected: Demand) -> None:
    group = {"groupName": "gpu-workers", "replicas": 0, "minReplicas": 0, "maxReplicas": 3,
             "template": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "4", "cpu": "44"}}}]}}}
    cpu = {"groupName": "cpu", "replicas": 5, "template": {"spec": {"containers": [{"resources": {"limits": {"cpu": "4"}}}]}}}
    rc = {"spec": {"enableInTreeAutoscaling": scaling, "workerGroupSpecs": [group, cpu]}}
    assert cold_start.demand_of(rc, 8) == expected
    assert expected.pods == 2


def test_expected_wait_is_the_last_launch_else_the_catalogue_estimate() -> None:
    acts = (activity("Successful", -120, took=4.5), activity("Successful", -60, took=3.0), activity("Failed", -30, ICE, took=0.1))
    assert cold_start.expected_wait(acts, "g6.12xlarge") == (180.0, "the node group's last scale-up took 3.0 min")
    seconds, basis = cold_start.expected_wait((), "p5.48xlarge")
    assert seconds == instances.scale_up_estimate_s("p5.48xlarge") == 15 * 60 and "estimate for p5.48xlarge" in basis
    assert instances.scale_up_estimate_s("x9.huge") == instances.SCALE_UP_DEFAULT_MIN * 60
    line = cold_start.headline(snap(activities=acts), "g6.12xlarge")
    assert line.startswith("GPU nodes are at 0 of 2; expected wait ~3 min (the node group's last scale-up took 3.0 min)")


def test_go_durations_of_the_autoscaler_flags() -> None:
    assert [parse_duration(t) for t in ("15m0s", "10m", "1h30m", "90s", "2s", "", "soon", "15")] == [900, 600, 5400, 90, 2, None, None, None]


# ---- the job's side: a driver on a cluster whose GPU group is at zero asks for its GPUs ---------------------------


def test_a_driver_that_finds_too_few_gpus_asks_rays_autoscaler_for_them_and_withdraws_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polling ray.nodes() creates no demand; `request_resources` does (Ray 2.58.0 ray/autoscaler/sdk/sdk.py), and it
    persists until overridden, so it is withdrawn once the wait ends, whatever its outcome."""
    import ray.autoscaler.sdk

    from raydlc.edges import ray_runtime

    asked: list[Any] = []
    waits: list[tuple[int, float]] = []
    monkeypatch.setattr(ray.autoscaler.sdk, "request_resources", lambda bundles=None, **kw: asked.append(bundles))

    def capacities(resource: str, *, at_least: int = 0, wait_s: float = 0.0) -> list[int]:
        waits.append((at_least, wait_s))
        return [4, 4] if wait_s else []

    monkeypatch.setattr(ray_runtime, "node_capacities", capacities)
    assert ray_runtime.await_resources("GPU", 8, wait_s=1800) == [4, 4]
    assert asked == [[{"GPU": 1.0}] * 8, []] and waits == [(0, 0.0), (8, 1800)]
    asked.clear()
    monkeypatch.setattr(ray_runtime, "node_capacities", lambda resource, **kw: [4, 4])
    assert ray_runtime.await_resources("GPU", 8, wait_s=1800) == [4, 4] and asked == []  # warm: nothing asked


def test_the_builtin_program_on_the_cluster_uses_gpus_even_while_the_gpu_group_is_at_zero() -> None:
    from raydlc.config import load_config
    from raydlc.jobs.runtime_env import builtin_env
    from raydlc.jobs.submit import gpus_needed

    cfg = load_config(env={})
    assert builtin_env(cfg, "cluster")["RAYDLC_USE_GPU"] == "true"
    assert "RAYDLC_USE_GPU" not in builtin_env(cfg, "address")  # --address: a head raydlc did not make, as before
    assert builtin_env(load_config(env={"RAYDLC_USE_GPU": "false"}), "cluster")["RAYDLC_USE_GPU"] == "false"
    assert gpus_needed(cfg, None, builtin=True) == 8 and gpus_needed(cfg, None, builtin=False) == 0
    assert gpus_needed(cfg, 3, builtin=False) == 3
    assert gpus_needed(load_config(env={"RAYDLC_USE_GPU": "false"}), None, builtin=True) == 0


class _Deployments:
    """Just `list` of a Kube: the Deployments the cluster runs, or the API's refusal."""

    def __init__(self, items: list[dict[str, Any]] | Exception) -> None:
        self.items = items

    def list(self, api_version: str, kind: str, namespace: str | None = None, **kw: Any) -> list[dict[str, Any]]:
        if isinstance(self.items, Exception):
            raise self.items
        return self.items


def _ca(*flags: str) -> dict[str, Any]:
    return {"metadata": {"name": "cluster-autoscaler"}, "spec": {"template": {"spec": {"containers": [
        {"name": "aws-cluster-autoscaler", "image": "registry.k8s.io/autoscaling/cluster-autoscaler:v1.36.1",
         "command": ["./cluster-autoscaler", "--cloud-provider=aws", *flags]}]}}}}


def test_the_wait_is_the_autoscalers_own_provision_time_else_its_documented_default() -> None:
    from raydlc.errors import KubeError
    from raydlc.jobs.warmup import provision_limit

    other = {"metadata": {"name": "kuberay-operator"}, "spec": {"template": {"spec": {"containers": [{"name": "op", "args": ["--max-node-provision-time=1s"]}]}}}}
    assert provision_limit(_Deployments([other, _ca("--max-node-provision-time=20m0s")])) == (
        1200.0, "--max-node-provision-time=20m0s of the cluster autoscaler")
    assert provision_limit(_Deployments([_ca()]))[0] == cold_start.NODE_PROVISION_S == 900  # FAQ: 15m0s
    assert provision_limit(_Deployments([other]))[1].endswith("(no autoscaler found)")  # another container's flag is not the autoscaler's
    refused = provision_limit(_Deployments(KubeError("kubernetes: cannot list deployments (403 Forbidden: …)")))
    assert refused[0] == 900 and "403 Forbidden" in refused[1]


def test_follow_says_each_reason_once_and_ends_warm_or_raises_with_the_judges_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from raydlc.config import load_config
    from raydlc.jobs import warmup

    sched = tuple(event(p, "FailedScheduling", SCHED) for p in PODS)
    trig = sched + tuple(event(p, "TriggeredScaleUp", TRIGGERED, 5) for p in PODS)
    ready = (node("n1"), node("n2"))
    seq = [snap(), snap(events=sched), snap(events=trig), snap(events=trig, nodes=ready),
           snap(events=trig, nodes=ready, pods=tuple(pod(p, "Running") for p in PODS))]
    looks = iter(seq[1:])
    monkeypatch.setattr(warmup, "look", lambda *a, **kw: next(looks))
    monkeypatch.setattr(warmup, "provision_limit", lambda kube: (900.0, "the default"))
    said: list[str] = []
    ticks = iter(range(100))
    v = warmup.follow(None, load_config(env={}), TWO_NODES, said.append, first=seq[0], clock=lambda: float(next(ticks)),  # type: ignore[arg-type]
                      sleep=lambda s: None)
    assert v.state == WARM
    assert said[0].startswith("GPU nodes are at 0 of 2; expected wait ~8 min") and said[0].endswith("gives up after 15.0 min (the default)")
    assert said[1:] == [f"scheduler: {SCHED}", f"cluster-autoscaler: {TRIGGERED}", "GPU nodes Ready: 2 of 2",
                        "2 of 2 GPU worker pods running after 5 s"]

    stuck = iter([snap(events=sched)] * 50)
    monkeypatch.setattr(warmup, "look", lambda *a, **kw: next(stuck))
    monkeypatch.setattr(warmup, "provision_limit", lambda kube: (3.0, "--max-node-provision-time=3s of the cluster autoscaler"))
    ticks = iter(range(100))
    with pytest.raises(warmup.ColdStartFailed) as failed:
        warmup.follow(None, load_config(env={}), TWO_NODES, said.append, first=snap(), clock=lambda: float(next(ticks)),  # type: ignore[arg-type]
                      sleep=lambda s: None)
    assert failed.value.message.startswith("GPU nodes still at 0 of 2 after 3 s, the node group's scale-up time limit (3 s")
    assert failed.value.message.endswith(f"scheduler: {SCHED}") and failed.value.exit_code == 1
