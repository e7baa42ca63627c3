"""Discovery on the platform cluster, read through raydlc's gateway as the platform's user (the official client)."""

from __future__ import annotations

from typing import Any

import platform_world as pw
import pytest

from raydlc.discovery import facts as F
from raydlc.discovery.gather import gather
from raydlc.discovery.read import admits, discover, nodepool, type_labels, watch_of
from raydlc.facts import instances


def found(platform: Any, user_kube: Any, **kw: Any) -> F.ClusterFacts:
    return discover(gather(user_kube, pw.NAMESPACE, **kw), context="platform", cluster_name="platform-eks")


def test_the_platform_is_read_as_it_is(platform: Any, user_kube: Any) -> None:
    f = found(platform, user_kube)
    assert f.eks.is_known and f.eks.value.version == pw.EKS_VERSION
    crds = {c.name: c for c in f.kuberay.crds.value}
    assert crds["rayclusters.ray.io"].served_versions == ("v1", "v1alpha1") and crds["rayclusters.ray.io"].storage_version == "v1"
    (op,) = f.kuberay.operators.value
    assert (op.namespace, op.version, op.watch.all_namespaces, op.watch.covers(pw.NAMESPACE)) == ("kuberay-system", "1.7.0", True, True)
    assert [(n.name, n.instance_type, n.gpus, n.efa, n.ready, n.capacity_type) for n in f.gpu_nodes.value] == [
        ("gpu-0", "g6.12xlarge", 4, 1, True, "on-demand"), ("gpu-1", "g6.12xlarge", 4, 1, True, "on-demand")]
    assert f.gpu_nodes.value[0].taints == (F.Taint("nvidia.com/gpu", "true", "NoSchedule"),)
    assert [(p.name, p.instance_types, p.capacity_types) for p in f.node_pools.value] == [
        ("gpu", ("g6.12xlarge", "g6e.12xlarge"), ("spot", "on-demand"))]  # the CPU pool admits no GPU type
    assert {(p.resource, p.ready) for p in f.device_plugins.value} == {("nvidia.com/gpu", 2), ("vpc.amazonaws.com/efa", 2)}
    assert f.node_autoscaler.value == "karpenter"
    assert f.asg_groups.state is F.State.UNKNOWN  # AWS not read here


def test_to_dict_is_json_with_each_fact_s_source(platform: Any, user_kube: Any) -> None:
    import json

    d = json.loads(json.dumps(found(platform, user_kube).to_dict()))
    assert d["gpu_nodes"]["state"] == "known" and d["gpu_nodes"]["source"] == "list nodes"
    assert d["gpu_nodes"]["value"][0]["labels"]["node.kubernetes.io/instance-type"] == "g6.12xlarge"
    assert d["kuberay"]["operators"]["value"][0]["watch"] == {"all_namespaces": True, "namespaces": [], "configured_by_file": False}
    assert d["asg_groups"]["state"] == "unknown" and d["asg_groups"]["note"]


@pytest.mark.parametrize("platform", [{"variant": "platform", "cluster_reads": False}], indirect=True)
def test_forbidden_reads_are_unknown_with_the_refusal_never_a_failure(platform: Any, user_kube: Any) -> None:
    f = found(platform, user_kube)
    for fact in (f.gpu_nodes, f.node_pools, f.device_plugins, f.kuberay.crds, f.kuberay.operators):
        assert fact.state is F.State.UNKNOWN and "forbidden by RBAC" in fact.note, fact
    assert 'cannot list resource "nodes" in API group "" at the cluster scope' in f.gpu_nodes.note
    assert f.server_version.value == pw.EKS_VERSION and f.eks.is_known  # /version is readable by everyone


@pytest.mark.parametrize("platform", ["kind"], indirect=True)
def test_a_kind_cluster_has_no_aws_facts_and_no_gpu(platform: Any, user_kube: Any) -> None:
    asked: list[str] = []
    f = found(platform, user_kube, asgs=lambda: asked.append("DescribeAutoScalingGroups") or [])  # type: ignore[func-returns-value]
    assert asked == []  # kind: AWS is never asked
    assert f.eks.state is F.State.NOT_APPLICABLE and "not EKS" in f.eks.note
    assert f.asg_groups.state is F.State.NOT_APPLICABLE
    assert f.gpu_nodes.value == () and f.node_pools.value == ()
    assert "not installed" in f.node_pools.note  # NodePools not served on kind


@pytest.mark.parametrize("platform", ["hyperpod"], indirect=True)
def test_hyperpod_nodes_are_read_with_their_ml_type(platform: Any, user_kube: Any) -> None:
    nodes = found(platform, user_kube).gpu_nodes.value
    assert {(n.instance_type, n.gpus, n.efa, n.hyperpod, n.capacity_type) for n in nodes} == {("ml.p5.48xlarge", 8, 32, True, None)}
    assert nodes[0].label("sagemaker.amazonaws.com/node-health-status") == "Schedulable"


@pytest.mark.parametrize("platform", ["no-kuberay"], indirect=True)
def test_kuberay_absent_is_known_absent(platform: Any, user_kube: Any) -> None:
    f = found(platform, user_kube)
    assert f.kuberay.crds.value == () and f.kuberay.operators.value == ()


def test_a_namespace_list_and_a_config_file_are_read_from_the_operator_args() -> None:
    assert watch_of({"args": ["--watch-namespace", "a,b"]}) == F.Watch(False, ("a", "b"))
    assert watch_of({"args": ["--watch-namespace=a"]}).covers("b") is False
    assert watch_of({"command": ["/manager"], "args": []}).covers("x") is True
    assert watch_of({"args": ["--config", "/etc/kuberay/config.yaml"]}).covers("x") is None


def test_nodepool_requirements_admit_gpu_types_as_karpenter_reads_them() -> None:
    p5 = type_labels(instances.INSTANCE_TYPES["p5.48xlarge"])
    assert admits([{"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": ["0"]}], p5)
    assert not admits([{"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["g"]}], p5)
    assert admits([{"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["h100"]}], p5)
    assert admits([{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-2a"]}], p5)
    pool = nodepool({"metadata": {"name": "p"}, "spec": {"template": {"spec": {"requirements": [
        {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["g6"]},
        {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Lt", "values": ["8"]}]}}}})
    assert pool.instance_types == ("g6.12xlarge", "g6.24xlarge")


def test_look_reads_and_rows_say_every_fact_with_its_source(platform: Any, user_kube: Any) -> None:
    from raydlc.discovery.look import look, rows

    table = {what: (found, source) for what, found, source in rows(look(user_kube, pw.NAMESPACE))}
    assert table["KubeRay operator"] == ("v1.7.0 in kuberay-system, watches all namespaces", "list deployments (all namespaces)")
    assert table["GPU nodes"][0] == "2/2 Ready g6.12xlarge (4 GPU, 1 EFA, on-demand; taints nvidia.com/gpu=true:NoSchedule)"
    assert table["GPU NodePools"][0] == "gpu: g6.12xlarge, g6e.12xlarge (spot, on-demand)"
    assert table["GPU node groups at 0"][0] == "unknown: AWS was not read"
    assert table["Node autoscaler"][0] == "karpenter"


@pytest.mark.parametrize("platform", [{"variant": "kind", "cluster_reads": False}], indirect=True)
def test_rows_on_kind_without_cluster_reads(platform: Any, user_kube: Any) -> None:
    from raydlc.discovery.look import look, rows

    table = {what: found for what, found, _ in rows(look(user_kube, pw.NAMESPACE))}
    assert table["EKS"].startswith("not applicable: not EKS (server v1.33.1)")
    assert table["GPU nodes"].startswith("unknown: forbidden by RBAC: kubernetes: cannot list nodes (403 Forbidden")
