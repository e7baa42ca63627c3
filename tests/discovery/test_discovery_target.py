"""The worker group rendered against what the platform cluster holds: it lands on the found GPU nodes (the
emulated scheduler binds it), requests EFA only where nodes offer it, and no capacity at all is one error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import platform_world as pw
import pytest

from raydlc import schemas
from raydlc.config import load_config
from raydlc.discovery import facts as F
from raydlc.discovery.gather import gather
from raydlc.discovery.read import discover
from raydlc.discovery.target import NoGpuCapacity, pick
from raydlc.render.raycluster import render_raycluster


def cfg(tmp_path: Path, **overrides: Any) -> Any:
    return load_config(env={}, overrides={"STORAGE_PATH": "s3://b/runs", "IDLE_MINUTES": 0, "NAMESPACE": pw.NAMESPACE, **overrides},
                       cwd=tmp_path)


def facts(user_kube: Any) -> F.ClusterFacts:
    return discover(gather(user_kube, pw.NAMESPACE))


def worker(rc: dict[str, Any]) -> dict[str, Any]:
    return rc["spec"]["workerGroupSpecs"][0]


def scheduled(platform: Any, rc: dict[str, Any]) -> dict[str, str]:
    """Apply the RayCluster as the user would and let the emulated KubeRay and scheduler place its pods."""
    from kuberay import Operator

    platform.kube.create(rc)
    op = Operator(platform.server.url)
    op.tick(), op.tick()
    pods = [p for p in platform.kube.list("Pod", pw.NAMESPACE) if p["metadata"]["labels"].get("ray.io/cluster") == rc["metadata"]["name"]]
    return {p["metadata"]["name"]: p["spec"].get("nodeName") or p["status"]["conditions"][0].get("message", "") for p in pods}


def test_the_workers_land_on_the_found_gpu_nodes(platform: Any, user_kube: Any, tmp_path: Path) -> None:
    t = pick(facts(user_kube))
    assert (t.instance_type, t.gpus, t.efa, t.nodes_now, t.spot) == ("g6.12xlarge", 4, 1, 2, False)
    rc = render_raycluster(cfg(tmp_path, GPU_NODE_COUNT=2), t)
    schemas.check("RayCluster", rc)
    spec = worker(rc)["template"]["spec"]
    assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "g6.12xlarge"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    res = spec["containers"][0]["resources"]["requests"]
    assert (res["nvidia.com/gpu"], res["vpc.amazonaws.com/efa"]) == ("4", "1")
    assert worker(rc)["rayStartParams"]["num-gpus"] == "4"
    assert "nodeSelector" not in rc["spec"]["headGroupSpec"]["template"]["spec"]  # no `role: system` node on a platform
    placed = scheduled(platform, rc)
    assert sorted(placed.values()) == ["gpu-0", "gpu-1", "system-0"], placed


def test_without_a_target_the_owned_rendering_is_unchanged(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    assert json.dumps(render_raycluster(c), sort_keys=True) == json.dumps(render_raycluster(c, None), sort_keys=True)
    assert worker(render_raycluster(c))["template"]["spec"]["nodeSelector"] == {"role": "gpu-worker"}


def test_efa_is_requested_only_where_the_nodes_offer_it(platform: Any, user_kube: Any, tmp_path: Path) -> None:
    for n in ("gpu-0", "gpu-1"):
        platform.kube.patch("Node", n, {"status": {"allocatable": {"vpc.amazonaws.com/efa": "0"}}})
    t = pick(facts(user_kube))
    assert t.efa == 0
    container = worker(render_raycluster(cfg(tmp_path), t))["template"]["spec"]["containers"][0]
    assert "vpc.amazonaws.com/efa" not in container["resources"]["requests"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "FI_PROVIDER" not in env and "NCCL_NET" not in env  # NCCL left to sockets: a pinned Libfabric would fail it


@pytest.mark.parametrize("platform", ["nodepool-only"], indirect=True)
def test_no_gpu_node_but_a_nodepool_targets_the_pool(platform: Any, user_kube: Any, tmp_path: Path) -> None:
    t = pick(facts(user_kube))
    assert (t.instance_type, t.gpus, t.nodes_now, t.spot) == ("g6.12xlarge", 4, 0, True)
    assert t.selector() == {"karpenter.sh/nodepool": "gpu", "node.kubernetes.io/instance-type": "g6.12xlarge"}
    rc = render_raycluster(cfg(tmp_path), t)
    spec = worker(rc)["template"]["spec"]
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert spec["containers"][0]["lifecycle"]["preStop"]  # the pool admits Spot: the drain hook is there
    assert "vpc.amazonaws.com/efa" not in spec["containers"][0]["resources"]["requests"]  # no EFA plugin in this cluster
    assert "no EFA device plugin" in t.note
    platform.device_plugins(efa=True)
    assert pick(facts(user_kube)).efa == 1  # with the EFA plugin's DaemonSet, a g6.12xlarge node will offer one
    assert pick(facts(user_kube), prefer="g6e.12xlarge").instance_type == "g6e.12xlarge"


@pytest.mark.parametrize("platform", ["no-gpu"], indirect=True)
def test_no_gpu_capacity_at_all_is_one_line_exit_2(platform: Any, user_kube: Any) -> None:
    with pytest.raises(NoGpuCapacity) as e:
        pick(facts(user_kube))
    assert e.value.exit_code == 2 and "\n" not in e.value.message
    assert e.value.message.startswith("no GPU capacity in the cluster: no Ready node has nvidia.com/gpu allocatable")


@pytest.mark.parametrize("platform", ["hyperpod"], indirect=True)
def test_hyperpod_nodes_are_selected_by_type_and_health(platform: Any, user_kube: Any, tmp_path: Path) -> None:
    t = pick(facts(user_kube))
    assert t.selector() == {"node.kubernetes.io/instance-type": "ml.p5.48xlarge", "sagemaker.amazonaws.com/node-health-status": "Schedulable"}
    assert (t.gpus, t.efa, t.gpudirect_rdma) == (8, 32, True)
    rc = render_raycluster(cfg(tmp_path, GPU_NODE_COUNT=2), t)
    env = {e["name"]: e.get("value") for e in worker(rc)["template"]["spec"]["containers"][0]["env"]}
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    placed = scheduled(platform, rc)
    assert sorted(v for k, v in placed.items() if "worker" in k) == ["hyperpod-i-0a1b2c3d4e-0", "hyperpod-i-0a1b2c3d4e-1"]
    platform.kube.patch("Node", "hyperpod-i-0a1b2c3d4e-1", {"metadata": {"labels": {
        "sagemaker.amazonaws.com/node-health-status": "UnschedulablePendingReplacement"}}})
    assert pick(facts(user_kube)).nodes_now == 1  # a node HyperPod is replacing is not counted


@pytest.mark.parametrize("platform", [{"variant": "platform", "cluster_reads": False}], indirect=True)
def test_unreadable_nodes_fall_back_to_the_configured_type(platform: Any, user_kube: Any) -> None:
    t = pick(facts(user_kube), configured=("g6.12xlarge", 4))
    assert t.source.startswith("GPU_NODE_TYPE") and t.selector() == {"node.kubernetes.io/instance-type": "g6.12xlarge"}
    with pytest.raises(NoGpuCapacity) as e:
        pick(facts(user_kube))
    assert "not readable: nodes (forbidden by RBAC" in e.value.message


def test_spot_nodes_get_the_drain_hook(platform: Any, user_kube: Any, tmp_path: Path) -> None:
    for n in ("gpu-0", "gpu-1"):
        platform.kube.patch("Node", n, {"metadata": {"labels": {"eks.amazonaws.com/capacityType": "SPOT"}}})
    t = pick(facts(user_kube))
    assert t.spot
    spec = worker(render_raycluster(cfg(tmp_path), t))["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > 0 and "preStop" in spec["containers"][0]["lifecycle"]
