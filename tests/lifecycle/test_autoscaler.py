"""`up`, `status` and `down` with the default IDLE_MINUTES=15: the GPU group scales 0..GPU_NODE_COUNT.

Against moto, kmock and the tool doubles (the helm double installs the cluster-autoscaler chart's
Deployment and pod). The Cluster Autoscaler and Ray's autoscaler do not run here: where the test
needs what they would do (the node group at 0, a worker count Ray asked for), it does it and says so.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from raydlc import lifecycle
from raydlc.lifecycle import StepResult, Timings

pytestmark = pytest.mark.slow  # each runs up end to end

FAST = Timings(poll_s=0.1, cluster_s=120, nodegroup_s=120, stack_s=120, helm_s=120, nodes_s=60, plugins_s=60, pods_s=90)
CLUSTER = "eks-cluster"
UP_ORDER = ["capacity", "storage", "cluster", "gpu-nodegroup", "kuberay", "device-plugins", "raycluster", "autoscaler"]
CA_ROLE_STACK = f"eksctl-{CLUSTER}-podidentityrole-kube-system-cluster-autoscaler"


@pytest.fixture
def elastic(world: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("RAYDLC_IDLE_MINUTES", "15")  # the default; the world pins 0 for the fixed-size scenarios
    return world


def _kube(world: Any) -> Any:
    from world import Kube

    return Kube(world.kube.url)


def by_step(run: lifecycle.Run) -> dict[str, StepResult]:
    return {r.step: r for r in run.results}


def _failed(run: lifecycle.Run) -> list[tuple[str, str]]:
    return [(r.step, r.reason) for r in run.failed]


def _scale_gpu_group_to_zero(world: Any) -> None:
    """What the Cluster Autoscaler does to idle GPU nodes: the ASG's desired size to 0, the instances
    terminated, the nodes gone from the API."""
    world.client("eks").update_nodegroup_config(clusterName=CLUSTER, nodegroupName="gpu-workers", scalingConfig={"desiredSize": 0})
    ec2 = world.client("ec2")
    ids = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
           if {t["Key"]: t["Value"] for t in i.get("Tags") or []}.get("eks:nodegroup-name") == "gpu-workers"
           and i["State"]["Name"] == "running"]
    ec2.terminate_instances(InstanceIds=ids)
    kube = _kube(world)
    for n in kube.list("Node"):
        if (n["metadata"].get("labels") or {}).get("role") == "gpu-worker":
            for p in kube.list("Pod"):
                if (p.get("spec") or {}).get("nodeName") == n["metadata"]["name"]:
                    kube.delete("Pod", p["metadata"]["name"], p["metadata"].get("namespace"))
            kube.delete("Node", n["metadata"]["name"])


def test_up_installs_the_autoscaler_keeps_ray_s_worker_count_and_acts_on_nothing_once_the_gpu_nodes_left(
        elastic: Any, capsys: pytest.CaptureFixture[str]) -> None:
    world = elastic
    run = lifecycle.up(world.config(), timings=FAST)
    assert run.ok, _failed(run)
    steps: dict[str, StepResult] = by_step(run)
    assert [r.step for r in run.results] == UP_ORDER
    assert steps["autoscaler"].action == "create"
    assert "cluster-autoscaler 9.59.0 (1.36) Available on" in steps["autoscaler"].reason
    assert "idle GPU nodes leave after 15 min" in steps["autoscaler"].reason
    # the group starts at GPU_NODE_COUNT so up sees every GPU once; the Ray workers start only for a job
    assert "2 × g6.12xlarge Ready" in steps["gpu-nodegroup"].reason
    assert "0 workers Running (0..2 as jobs need them)" in steps["raycluster"].reason
    mutating = Counter(" ".join(a[:3]) for a in world.mutating_calls())
    assert mutating["upgrade --install cluster-autoscaler"] == 1
    ng = world.client("eks").describe_nodegroup(clusterName=CLUSTER, nodegroupName="gpu-workers")["nodegroup"]
    assert ng["scalingConfig"] == {"minSize": 0, "maxSize": 2, "desiredSize": 2}
    assert ng["tags"]["k8s.io/cluster-autoscaler/enabled"] == "true"
    assert ng["tags"][f"k8s.io/cluster-autoscaler/{CLUSTER}"] == "owned"
    assert ng["tags"]["k8s.io/cluster-autoscaler/node-template/taint/aws.amazon.com/efa"] == "true:NoSchedule"
    body = world.client("cloudformation").get_template(StackName=CA_ROLE_STACK)["TemplateBody"]
    role = body if isinstance(body, dict) else json.loads(body)
    (policy,) = role["Resources"]["Role"]["Properties"]["Policies"]
    scale = policy["PolicyDocument"]["Statement"][1]
    assert scale["Condition"] == {"StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{CLUSTER}": "owned"}}
    kube = _kube(world)
    deploy = kube.get("Deployment", "cluster-autoscaler", "kube-system")
    assert deploy["spec"]["template"]["spec"]["nodeSelector"] == {"role": "system"}
    # KubeRay (the double, as v1.7.0 common/rbac.go) binds the autoscaler's Role to the head's account only;
    # the workers run under their own account, made by eksctl with its pod identity, bound to nothing
    binding = kube.get("RoleBinding", "ray-train-cluster", "ray-train")
    assert [s["name"] for s in binding["subjects"]] == ["raydlc-ray"]
    assert kube.get("ServiceAccount", "raydlc-ray-worker", "ray-train") is not None
    workers = [p for p in kube.list("Pod", "ray-train") if (p["metadata"].get("labels") or {}).get("ray.io/node-type") == "worker"]
    assert all(p["spec"]["serviceAccountName"] == "raydlc-ray-worker" for p in workers)
    assert not any(s["name"] == "raydlc-ray-worker" for b in kube.list("RoleBinding") for s in b.get("subjects") or [])

    # status: each GPU node without a Ray pod says how long it has been up, and the cost when idle is less
    from raydlc.cli import main

    assert main(["status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    gpu = [n for n in doc["nodes"] if n["role"] == "gpu-worker"]
    assert len(gpu) == 2 and all(n["ray_pod"] is None and n["empty_min"] is not None and n["empty_min"] < 30 for n in gpu)
    system = [n for n in doc["nodes"] if n["role"] == "system"]
    assert system[0]["ray_pod"] and "head" in system[0]["ray_pod"]
    cost = doc["cost"]
    assert cost["idle_minutes"] == 15
    gpu_price = next(i["usd_per_hour"] for i in cost["items"] if i["item"] == "g6.12xlarge instance")
    assert cost["when_idle_usd_per_hour"] == pytest.approx(cost["total_usd_per_hour"] - gpu_price, abs=0.011)

    # a second up on the unchanged cluster: nothing to do, and no helm upgrade
    before = len(world.calls())
    again = lifecycle.up(world.config(), timings=FAST)
    assert again.ok, _failed(again)
    assert {r.step: r.action for r in again.results} == dict.fromkeys(UP_ORDER, "none")
    assert not any(a[0] == "upgrade" for a in world.calls()[before:])

    # Ray's autoscaler asked for one worker: `up` must not put the rendered 0 back under a running job
    kube.patch("RayCluster", "ray-train-cluster", {"spec": {"workerGroupSpecs": [
        {**kube.get("RayCluster", "ray-train-cluster", "ray-train")["spec"]["workerGroupSpecs"][0], "replicas": 1}]}}, "ray-train")
    third = lifecycle.up(world.config(), timings=FAST)
    assert third.ok, _failed(third)
    assert by_step(third)["raycluster"].action == "none"
    assert kube.get("RayCluster", "ray-train-cluster", "ray-train")["spec"]["workerGroupSpecs"][0]["replicas"] == 1

    # the Cluster Autoscaler took the idle GPU nodes away: `up` still finds everything as it should be
    _scale_gpu_group_to_zero(world)
    before = len(world.calls())
    fourth = lifecycle.up(world.config(), timings=FAST)
    assert fourth.ok, _failed(fourth)
    assert {r.step: r.action for r in fourth.results} == dict.fromkeys(UP_ORDER, "none")
    assert "0 × g6.12xlarge Ready in us-east-2a (scales 0..2" in by_step(fourth)["gpu-nodegroup"].reason
    assert not [a for a in world.calls()[before:] if a[0] not in ("version", "status", "get")]

    # down uninstalls the release, then the rest goes as before
    down = lifecycle.down(world.config(), timings=FAST)
    assert down.ok, _failed(down)
    assert by_step(down)["autoscaler"].action == "delete"
    assert ["uninstall", "cluster-autoscaler"] in [a[:2] for a in world.calls("helm")]
    assert world.tagged(CLUSTER) == {}


def test_an_autoscaler_pod_that_cannot_start_fails_up_naming_its_state(elastic: Any) -> None:
    world = elastic
    world.scenario(autoscaler_pod="CrashLoopBackOff")
    run = lifecycle.up(world.config(), timings=FAST)
    assert not run.ok
    (failed,) = run.failed
    assert failed.step == "autoscaler"
    assert "the Cluster Autoscaler did not start: pod cluster-autoscaler-" in failed.reason
    assert "CrashLoopBackOff" in failed.reason
    assert by_step(run)["raycluster"].outcome == "done"  # the rest of the cluster is up; only this step failed


def test_spot_then_on_demand_makes_the_spot_group_and_its_on_demand_twin_and_down_removes_both(elastic: Any) -> None:
    """On an elastic cluster spot-then-on-demand is two GPU groups from 0 (raydlc.render.autoscaler): the Spot one
    and an On-Demand twin at 0 that the Cluster Autoscaler's priority expander takes when Spot cannot launch."""
    world = elastic
    cfg = world.config(RAYDLC_GPU_CAPACITY_TYPE="spot-then-on-demand")
    run = lifecycle.up(cfg, timings=FAST)
    assert run.ok, _failed(run)
    eks = world.client("eks")
    spot = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName="gpu-workers")["nodegroup"]
    twin = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName="gpu-workers-on-demand")["nodegroup"]
    assert (spot["capacityType"], twin["capacityType"]) == ("SPOT", "ON_DEMAND")
    assert (twin["scalingConfig"]["minSize"], twin["scalingConfig"]["desiredSize"]) == (0, 0)
    assert twin["subnets"] == spot["subnets"]  # the same AZ: EFA's one
    assert any("On-Demand group gpu-workers-on-demand" in n for n in run.notes["gpu-nodegroup"])
    again = lifecycle.up(cfg, timings=FAST)
    assert again.ok and by_step(again)["gpu-nodegroup"].action == "none", _failed(again)
    down = lifecycle.down(cfg, keep_cluster=True, timings=FAST)
    assert down.ok, _failed(down)
    assert eks.list_nodegroups(clusterName=CLUSTER)["nodegroups"] == ["system"]
