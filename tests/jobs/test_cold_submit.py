"""`submit` on a cold cluster, end to end: a real Ray head reached through the kubectl double's port-forward,
kmock as the Kubernetes API with the emulated KubeRay operator and scheduler, and moto for EKS.

The RayCluster is raydlc's own, rendered and then set to autoscale its GPU group from zero (what Ray's
in-tree autoscaler and `minReplicas: 0` make of it). What the test does in a thread is what the three
engines outside raydlc would do, in their own words:
- Ray's autoscaler: once the job is on the head, it raises the GPU group's replicas (KubeRay then creates
  the worker pods, which the emulated scheduler leaves Pending with FailedScheduling: no GPU node);
- the Kubernetes Cluster Autoscaler: a `TriggeredScaleUp` event on each Pending pod, in its format
  (cluster-autoscaler-1.36.1 processors/status/eventing_scale_up_processor.go), and its Deployment's
  `--max-node-provision-time` flag (charts/cluster-autoscaler: `./cluster-autoscaler` with `--key=value` flags);
- the Auto Scaling group: its scaling activities. moto 5.2.5 answers DescribeScalingActivities with an
  empty list always (autoscaling/responses.py), so a botocore `before-call` handler answers it from the
  test's table instead, as AWS would (FIDELITY.md); and, when capacity is there, GPU nodes that join Ready.
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from raydlc.jobs import targets

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "doubles"))

import servers  # noqa: E402
from world import Kube, node_allocatable  # noqa: E402

_world = servers.lifecycle_world("lifecycle_world_cold")  # the lifecycle tests' world, reused
moto_server, kube_server, world = _world.moto_server, _world.kube_server, _world.world

NS, RC, CLUSTER, NODEGROUP = "ray-train", "ray-train-cluster", "eks-cluster", "gpu-workers"
ICE = ("We currently do not have sufficient g6.12xlarge capacity in the Availability Zone you requested (us-east-2a). "
       "Our system will be working on provisioning additional capacity. You can currently get g6.12xlarge capacity by not "
       "specifying an Availability Zone in your request or choosing us-east-2b, us-east-2c. Launching EC2 instance failed.")


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[targets.HeadRecord]:
    """A real local Ray head standing in for the head pod's dashboard, with a HOME of its own; ended by its PID."""
    home = tmp_path_factory.mktemp("head-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYDLC_")} | {"HOME": str(home)}
    subprocess.run([sys.executable, "-c", "from raydlc.jobs import targets; targets.ensure_local_head(start=True)"], check=True, timeout=300, env=env)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        rec = targets.running_head()
    assert rec is not None
    from raydlc.edges.ray_dashboard import Dashboard
    from raydlc.errors import RayError

    deadline = time.monotonic() + 120  # a head just started may answer /api/version before its Jobs API
    while True:
        try:
            Dashboard(rec.dashboard_url).jobs()
            break
        except RayError:
            assert time.monotonic() < deadline, "the head's Jobs API never answered"
            time.sleep(1)
    yield rec
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        targets.stop_local_head()


class Engines:
    """Ray's autoscaler, the cluster autoscaler and the ASG, as far as the test needs them (see the module doc)."""

    def __init__(self, kube: Kube, dashboard: str, job: str, asg: str, *, capacity: bool) -> None:
        self.kube, self.dashboard, self.job, self.asg, self.capacity = kube, dashboard, job, asg, capacity
        self.activities: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _job_on_head(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.dashboard}/api/jobs/{self.job}", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def _activity(self, status: str, message: str = "", minutes: float = 1.5) -> dict[str, Any]:
        start = datetime.now(UTC)
        a = {"ActivityId": f"act-{len(self.activities)}", "AutoScalingGroupName": self.asg, "StartTime": start,
             "Description": "Launching a new EC2 instance: i-0c0ffee0123456789" if status != "Failed" else
             f"Launching a new EC2 instance.  Status Reason: {message}",
             "Cause": f"At {start:%Y-%m-%dT%H:%M:%SZ} a user request explicitly set group desired capacity changing the desired capacity from 0 to 2.",
             "StatusCode": status, "Progress": 100 if status != "InProgress" else 20}
        if message:
            a["StatusMessage"] = message
        if status != "InProgress":
            a["EndTime"] = start + timedelta(minutes=minutes)
        return a

    def _run(self) -> None:
        try:
            while not self._job_on_head():
                if self.stop.wait(0.2):
                    return
            rc = self.kube.get("RayCluster", RC, NS)
            assert rc is not None
            groups = copy.deepcopy(rc["spec"]["workerGroupSpecs"])
            groups[0]["replicas"] = 2  # Ray's autoscaler, for the job's two 4-GPU bundles
            self.kube.patch("RayCluster", RC, {"spec": {"workerGroupSpecs": groups}}, NS)
            pods = self._pending_workers(2)
            for p in pods:  # the cluster autoscaler, on each pod it scales up for
                self.kube.create({"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{p}.triggered", "namespace": NS},
                                  "involvedObject": {"kind": "Pod", "name": p, "namespace": NS}, "reason": "TriggeredScaleUp",
                                  "type": "Normal", "source": {"component": "cluster-autoscaler"},
                                  "message": f"pod triggered scale-up: [{{{self.asg} 0->2 (max: 2)}}]",
                                  "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            if not self.capacity:
                self.activities.insert(0, self._activity("Failed", ICE, minutes=0.1))
                return
            self.activities.insert(0, self._activity("InProgress"))
            self.stop.wait(1.0)
            for i in range(2):  # the instances join as GPU nodes, as eksctl's node group labels and taints them
                name = f"ip-10-0-1-{20 + i}.us-east-2.compute.internal"
                alloc = {**node_allocatable("g6.12xlarge"), "nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1"}
                self.kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
                    "role": "gpu-worker", "nvidia.com/gpu.present": "true", "eks.amazonaws.com/nodegroup": NODEGROUP}},
                    "spec": {"taints": [{"key": "aws.amazon.com/efa", "value": "true", "effect": "NoSchedule"}]},
                    "status": {"allocatable": alloc, "capacity": alloc, "conditions": [{"type": "Ready", "status": "True"}]}})
            self.activities[0] = self._activity("Successful")
        except Exception as e:  # kept for the test to see
            self.errors.append(repr(e))

    def _pending_workers(self, n: int) -> list[str]:
        deadline = time.monotonic() + 30
        while True:
            pods = [p["metadata"]["name"] for p in self.kube.list("Pod", NS)
                    if (p["metadata"].get("labels") or {}).get("ray.io/node-type") == "worker"
                    and (p.get("status") or {}).get("phase") == "Pending"]
            if len(pods) >= n:
                return pods
            assert time.monotonic() < deadline, "KubeRay's double made no worker pods"
            time.sleep(0.1)

    def handler(self, **kw: Any) -> Any:
        """botocore before-call for autoscaling DescribeScalingActivities: the ASG's activities, newest first."""
        from botocore.awsrequest import AWSResponse

        return AWSResponse("http://stub", 200, {}, None), {"Activities": [dict(a) for a in self.activities],
                                                             "ResponseMetadata": {"HTTPStatusCode": 200}}


@contextlib.contextmanager
def cold_cluster(world: Any, head: targets.HeadRecord, *, capacity: bool, provision: str | None = None,
                 job: str = "cold-1") -> Iterator[Engines]:
    """A running head on a system node, a RayCluster whose GPU group is at zero, no GPU node; the engines armed."""
    import raydlc.edges.aws
    from raydlc.render.raycluster import render_raycluster

    kube = Kube(world.kube.url)
    alloc = node_allocatable("m7i.xlarge")
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ip-10-0-0-9.us-east-2.compute.internal", "labels": {"role": "system"}},
                 "status": {"allocatable": alloc, "capacity": alloc, "conditions": [{"type": "Ready", "status": "True"}]}})
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "kuberay-operator", "namespace": "kuberay-operator"},
                 "spec": {"replicas": 1}, "status": {"availableReplicas": 1}})
    if provision is not None:
        kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "cluster-autoscaler", "namespace": "kube-system"},
                     "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "aws-cluster-autoscaler", "command": [
                         "./cluster-autoscaler", "--cloud-provider=aws", "--namespace=kube-system",
                         f"--node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled,k8s.io/cluster-autoscaler/{CLUSTER}",
                         f"--max-node-provision-time={provision}"]}]}}}})
    rc = render_raycluster(world.config())
    rc["spec"]["enableInTreeAutoscaling"] = True
    rc["spec"]["workerGroupSpecs"][0].update(replicas=0, minReplicas=0, maxReplicas=2)
    kube.create(rc)
    kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{RC}-ray-token", "namespace": NS},  # what `up` creates
                 "data": {"auth_token": "dW51c2VkLWJ5LWFuLWF1dGgtZGlzYWJsZWQtaGVhZA=="}})
    eks = world.client("eks")
    eks.create_cluster(name=CLUSTER, roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": []})
    ng = eks.create_nodegroup(clusterName=CLUSTER, nodegroupName=NODEGROUP, nodeRole="arn:aws:iam::123456789012:role/node",
                              subnets=["subnet-1"], instanceTypes=["g6.12xlarge"],
                              scalingConfig={"minSize": 0, "maxSize": 2, "desiredSize": 0})["nodegroup"]
    asg = ng["resources"]["autoScalingGroups"][0]["name"]
    servers.write_kubeconfig(Path(os.environ["HOME"]) / ".raydlc" / f"{CLUSTER}-us-east-2" / "kubeconfig", world.kube.url)
    world.scenario(forward={f"{NS}/{RC}-head-svc:8265": head.dashboard_url.removeprefix("http://")})
    engines = Engines(kube, head.dashboard_url, job, asg, capacity=capacity)
    make = raydlc.edges.aws.client

    def client(sess: Any, service: str) -> Any:
        c = make(sess, service)
        c.meta.events.register("before-call.autoscaling.DescribeScalingActivities", engines.handler)
        return c

    world.monkeypatch.setattr(raydlc.edges.aws, "client", client)
    world.monkeypatch.setattr("raydlc.jobs.warmup.POLL_S", 0.3)
    deadline = time.monotonic() + 60
    while not any((p.get("status") or {}).get("phase") == "Running" for p in kube.list("Pod", NS)):
        assert time.monotonic() < deadline, "the emulated operator never ran the head pod"
        time.sleep(0.1)
    engines.thread.start()
    try:
        yield engines
    finally:
        engines.stop.set()
        engines.thread.join(10)
    assert not engines.errors, engines.errors


def script(tmp_path: Path, text: str) -> Path:
    work = tmp_path / "job"
    work.mkdir()
    (work / "job.py").write_text(text)
    return work / "job.py"


def test_submit_follows_the_gpu_workers_from_pending_to_running_then_streams(world: Any, head: targets.HeadRecord, tmp_path: Path) -> None:
    import raydlc.api as api

    said, logs = [], []
    with cold_cluster(world, head, capacity=True, job="cold-1"):
        done = api.submit(script(tmp_path, "print('hello from a cold cluster')"), name="cold-1", gpus=8,
                          notice=said.append, write=logs.append)
    assert done.ok and "hello from a cold cluster" in "".join(logs), said
    assert done.to_dict()["cold_start"]["gpus"] == 8 and done.to_dict()["cold_start"]["pods"] == 2
    text = "\n".join(said)
    first = next(s for s in said if s.startswith("GPU nodes are at"))
    assert first.startswith("GPU nodes are at 0 of 2; expected wait ~8 min (raydlc's estimate for g6.12xlarge nodes")
    assert "scheduler: 0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector." in text
    assert f"cluster-autoscaler: pod triggered scale-up: [{{{done_asg(world)} 0->2 (max: 2)}}]" in said
    assert "GPU nodes Ready: 2 of 2" in said and any(s.startswith("2 of 2 GPU worker pods running after") for s in said)
    assert len(said) == len(set(said))  # each reason once
    assert said.index(first) > said.index("submitted job cold-1 on the cluster target")  # the job's demand is what wakes the engines


def done_asg(world: Any) -> str:
    return str(world.client("eks").describe_nodegroup(clusterName=CLUSTER, nodegroupName=NODEGROUP)["nodegroup"]["resources"]
               ["autoScalingGroups"][0]["name"])


def test_insufficient_capacity_fails_submit_within_the_node_groups_time_limit_naming_the_az(
        world: Any, head: targets.HeadRecord, tmp_path: Path) -> None:
    import raydlc.api as api
    from raydlc.edges.ray_dashboard import Dashboard
    from raydlc.jobs.warmup import ColdStartFailed

    said: list[str] = []
    with cold_cluster(world, head, capacity=False, provision="4s", job="cold-ice"), pytest.raises(ColdStartFailed) as failed:
        api.submit(script(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(600)"), name="cold-ice", gpus=8,
                   notice=said.append)
    msg = failed.value.message
    assert msg.startswith("GPU nodes still at 0 of 2 after ") and "the node group's scale-up time limit (4 s" in msg
    assert "last activity of ASG eks-" in msg and ": InsufficientInstanceCapacity in us-east-2a (Failed): We currently do not have" in msg
    assert msg.endswith("; job cold-ice was stopped") and failed.value.exit_code == 1
    assert any("gives up after 4 s (--max-node-provision-time=4s of the cluster autoscaler)" in s for s in said)
    assert sum("InsufficientInstanceCapacity in us-east-2a" in s for s in said) == 1  # shown as such, once, while it waited
    job = Dashboard(head.dashboard_url).job("cold-ice")
    assert job is not None and job.status == "STOPPED"


def test_a_job_the_gpu_workers_can_never_hold_is_refused_before_it_is_submitted(world: Any, head: targets.HeadRecord, tmp_path: Path) -> None:
    import raydlc.api as api
    from raydlc.edges.ray_dashboard import Dashboard
    from raydlc.errors import InputError

    with cold_cluster(world, head, capacity=True, job="cold-huge"), pytest.raises(InputError) as refused:
        api.submit(script(tmp_path, "print('never')"), name="cold-huge", gpus=12)
    assert refused.value.message == ("the job needs 12 GPUs and the RayCluster's GPU workers hold at most 8 (2 pods x 4 GPUs); "
                                     "nothing was submitted")
    assert Dashboard(head.dashboard_url).job("cold-huge") is None
