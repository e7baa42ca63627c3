"""Idle GPU nodes leave and come back: the rendered RayCluster, node group, Helm release and IAM policy.

Pure: config in, documents out (each checked by render_all against the packaged schemas). The
lifecycle of the release runs in tests/lifecycle/test_autoscaler.py; Ray's own autoscaler against
fake nodes in tests/test_autoscale_ray.py.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from raydlc.config import load_config
from raydlc.errors import ConfigError
from raydlc.facts import images, instances
from raydlc.render import FILES, render_all
from raydlc.render import autoscaler as ca

sys.path.insert(0, str(Path(__file__).resolve().parent / "doubles"))

ZONES = ["us-east-2a", "us-east-2b"]
RUNS = "s3://raydlc-runs/team"
GOLDEN = Path(__file__).resolve().parent / "golden" / "default"
CODE_ZIP = re.compile(r"raydlc-[0-9][^\"/\s]*-[0-9a-f]{12}\.zip")  # as test_render.py: the zip's hash follows every source change


def docs_for(tmp_path: Path, **overrides: Any) -> tuple[Any, dict[str, dict[str, Any]]]:
    cfg = load_config(env={}, overrides={"STORAGE_PATH": RUNS, **overrides}, cwd=tmp_path)
    return cfg, render_all(cfg, ZONES)


def gpu_group(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return next(g for g in docs[FILES["eksctl"]]["managedNodeGroups"] if g["name"] == "gpu-workers")


def test_defaults_autoscale_the_gpu_workers_between_zero_and_the_node_count(tmp_path: Path) -> None:
    cfg, docs = docs_for(tmp_path)
    assert cfg.gpu_nodes.idle_minutes == 15
    spec = docs[FILES["raycluster"]]["spec"]  # the RayJob runs on this cluster (clusterSelector): no spec of its own
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"] == {"version": "v2", "idleTimeoutSeconds": 900, "upscalingMode": "Default"}
    (group,) = spec["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (0, 0, 2)
    # KubeRay sets RAY_enable_autoscaler_v2 on the head itself for version v2 (common/pod.go): not rendered twice
    head_env = {e["name"] for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert "RAY_enable_autoscaler_v2" not in head_env


def test_the_gpu_node_group_carries_what_the_cluster_autoscaler_needs_to_scale_from_zero(tmp_path: Path) -> None:
    _, docs = docs_for(tmp_path)
    g = gpu_group(docs)
    assert (g["minSize"], g["maxSize"], g["desiredCapacity"]) == (0, 2, 2)
    assert g["propagateASGTags"] is True
    tags = g["tags"]
    assert tags["k8s.io/cluster-autoscaler/enabled"] == "true"
    assert tags["k8s.io/cluster-autoscaler/eks-cluster"] == "owned"
    t = "k8s.io/cluster-autoscaler/node-template/"
    assert tags[t + "label/role"] == "gpu-worker"
    assert tags[t + "label/nvidia.com/gpu.present"] == "true"
    assert tags[t + "label/k8s.amazonaws.com/accelerator"] == "nvidia-l4"  # g6.12xlarge: L4 (CA's GPULabel)
    assert g["labels"]["k8s.amazonaws.com/accelerator"] == "nvidia-l4"
    # the CA reads a taint tag only as value:Effect (aws_manager.go extractTaintsFromAsg); eksctl writes the value alone
    assert tags[t + "taint/aws.amazon.com/efa"] == "true:NoSchedule"
    assert tags[t + "resources/nvidia.com/gpu"] == "4"
    assert tags[t + "resources/vpc.amazonaws.com/efa"] == "1"
    assert tags["raydlc.io/cluster"] == "eks-cluster"
    system = next(n for n in docs[FILES["eksctl"]]["managedNodeGroups"] if n["name"] == "system")
    assert (system["minSize"], system["maxSize"]) == (1, 1) and "propagateASGTags" not in system


def test_p5_nodes_declare_their_eight_gpus_and_32_efa_interfaces(tmp_path: Path) -> None:
    _, docs = docs_for(tmp_path, GPU_NODE_TYPE="p5.48xlarge", GPUS_PER_NODE=8, GPU_NODE_COUNT=4)
    tags = gpu_group(docs)["tags"]
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == "8"
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"] == "32"
    assert gpu_group(docs)["maxSize"] == 4


def test_the_release_runs_on_the_system_node_with_scale_down_aligned_to_idle_minutes(tmp_path: Path) -> None:
    cfg, docs = docs_for(tmp_path, IDLE_MINUTES=30, K8S_VERSION="1.33")
    values = docs["helm/cluster-autoscaler.values.yaml"]
    assert values["autoDiscovery"] == {"clusterName": "eks-cluster"}
    assert values["awsRegion"] == "us-east-2" and values["cloudProvider"] == "aws"
    assert values["image"] == {"repository": "registry.k8s.io/autoscaling/cluster-autoscaler", "tag": "v1.33.6"}
    assert values["rbac"]["serviceAccount"] == {"create": True, "name": "cluster-autoscaler"}
    assert values["nodeSelector"] == {"role": "system"}
    assert values["extraArgs"]["scale-down-delay-after-add"] == "30m"
    assert values["extraArgs"]["scale-down-unneeded-time"] == f"{ca.EMPTY_NODE_MINUTES}m"
    assert values["fullnameOverride"] == "cluster-autoscaler"
    from raydlc.render.helm import cluster_autoscaler

    r = cluster_autoscaler(cfg)
    assert r is not None and (r.version, r.namespace) == ("9.59.0", "kube-system")


def test_every_pinned_kubernetes_minor_has_its_own_autoscaler_minor() -> None:
    for minor, tag in images.CLUSTER_AUTOSCALER_IMAGES.items():
        assert tag.startswith(f"v{minor}."), (minor, tag)


# ---------------------------------------------------------------------- the pod identity's policy, evaluated


def allowed(policy: dict[str, Any], action: str, resource_tags: dict[str, str]) -> bool:
    """IAM's answer for one action on one resource with these tags, for the statement shapes the policy uses
    (Allow only; Action lists with wildcards; Resource "*"; StringEquals on aws:ResourceTag/<key>)."""
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow" and st["Resource"] == ["*"]
        if not any(fnmatch.fnmatchcase(action, a) for a in st["Action"]):
            continue
        conditions = st.get("Condition", {})
        assert set(conditions) <= {"StringEquals"}
        wants = conditions.get("StringEquals", {})
        if all(k.startswith("aws:ResourceTag/") and resource_tags.get(k.removeprefix("aws:ResourceTag/")) == v
               for k, v in wants.items()):
            return True
    return False


def test_the_autoscalers_role_changes_only_this_clusters_node_groups(tmp_path: Path) -> None:
    _, docs = docs_for(tmp_path)
    (assoc,) = [a for a in docs[FILES["eksctl"]]["iam"]["podIdentityAssociations"] if a["namespace"] == "kube-system"]
    assert assoc["serviceAccountName"] == "cluster-autoscaler" and assoc["createServiceAccount"] is False
    assert assoc["roleName"] == "raydlc-eks-cluster-us-east-2-autoscaler"
    policy = assoc["permissionPolicy"]
    ours = gpu_group(docs)["tags"]  # what eksctl propagates to the GPU group's ASG
    theirs = {"k8s.io/cluster-autoscaler/enabled": "true", "k8s.io/cluster-autoscaler/other-cluster": "owned"}
    for action in ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"):
        assert allowed(policy, action, ours)
        assert not allowed(policy, action, theirs)
        assert not allowed(policy, action, {})
        assert not allowed(policy, action, {"k8s.io/cluster-autoscaler/eks-cluster": "shared"})
    for action in ca.READ_ACTIONS:
        assert allowed(policy, action, {})
    for action in ("autoscaling:DeleteAutoScalingGroup", "autoscaling:UpdateAutoScalingGroup", "ec2:TerminateInstances",
                   "ec2:RunInstances", "iam:PassRole", "eks:UpdateNodegroupConfig", "autoscaling:CreateOrUpdateTags"):
        assert not allowed(policy, action, ours), action
    # the Ray pods' S3 identities are still there, unchanged
    accounts = {a["serviceAccountName"] for a in docs[FILES["eksctl"]]["iam"]["podIdentityAssociations"]}
    assert accounts >= {"raydlc-ray", "raydlc-ray-worker"}


# ---------------------------------------------------------------------- IDLE_MINUTES=0 and bad input


def test_idle_minutes_zero_renders_exactly_todays_documents(tmp_path: Path) -> None:
    from raydlc.render import to_yaml

    cfg = load_config(env={}, overrides={"STORAGE_PATH": RUNS, "IDLE_MINUTES": 0}, cwd=tmp_path)
    docs = render_all(cfg, ["us-east-2a", "us-east-2b", "us-east-2c"])
    on_disk = sorted(str(p.relative_to(GOLDEN)) for p in GOLDEN.rglob("*.yaml"))
    assert on_disk == sorted(docs)  # no cluster-autoscaler values file
    for name, doc in docs.items():
        assert (GOLDEN / name).read_text() == CODE_ZIP.sub("raydlc-VERSION-HASH.zip", to_yaml(doc)), name


@pytest.mark.parametrize(("instance", "minutes"), [("g6.12xlarge", 1), ("g6.12xlarge", 7), ("p5.48xlarge", 14)])
def test_an_idle_time_shorter_than_a_node_takes_to_start_is_refused(tmp_path: Path, instance: str, minutes: int) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(env={"RAYDLC_IDLE_MINUTES": str(minutes), "RAYDLC_GPU_NODE_TYPE": instance,
                                "RAYDLC_GPUS_PER_NODE": "8" if instance.startswith("p5") else "4"}, cwd=tmp_path)
    msg = str(e.value)
    assert "IDLE_MINUTES (env RAYDLC_IDLE_MINUTES)" in msg
    floor = instances.gpu_node_startup_minutes(instance)
    assert minutes < floor and f"at least {floor}" in msg and f"a {instance} node" in msg and "to come back" in msg


def test_zero_and_the_floor_are_accepted_and_a_negative_is_not(tmp_path: Path) -> None:
    assert load_config(env={"RAYDLC_IDLE_MINUTES": "0"}, cwd=tmp_path).gpu_nodes.idle_minutes == 0
    cfg = load_config(env={}, cwd=tmp_path)
    floor = instances.gpu_node_startup_minutes(cfg.gpu_nodes.instance_type)
    assert floor == 8 and cfg.gpu_nodes.instance_type.startswith("g6.")  # a PCIe GPU node's estimate
    assert load_config(env={"RAYDLC_IDLE_MINUTES": str(floor)}, cwd=tmp_path).gpu_nodes.idle_minutes == floor
    with pytest.raises(ConfigError):
        load_config(env={"RAYDLC_IDLE_MINUTES": "-1"}, cwd=tmp_path)


def test_a_kubernetes_version_without_a_pinned_autoscaler_is_refused_only_when_autoscaling(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(env={"RAYDLC_K8S_VERSION": "1.29"}, cwd=tmp_path)
    assert "K8S_VERSION" in str(e.value) and "IDLE_MINUTES=0" in str(e.value)
    assert load_config(env={"RAYDLC_K8S_VERSION": "1.29", "RAYDLC_IDLE_MINUTES": "0"}, cwd=tmp_path).cluster.k8s_version == "1.29"


# ---------------------------------------------------------------------- status: idle GPU nodes and the idle cost


def test_status_says_which_gpu_nodes_hold_no_ray_pod_and_for_at_most_how_long() -> None:
    from datetime import datetime, timedelta
    from types import SimpleNamespace

    from raydlc.lifecycle.cluster_status import NodeRow, gpu_idleness

    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    joined = (now - timedelta(minutes=12)).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = [NodeRow("sys", "system", "m7i.xlarge", "a", True, 0, 0), NodeRow("g1", "gpu-worker", "g6.12xlarge", "a", True, 4, 1),
            NodeRow("g2", "gpu-worker", "g6.12xlarge", "a", True, 4, 1), NodeRow("g3", "gpu-worker", "g6.12xlarge", "a", True, 4, 1)]
    nodes = [{"metadata": {"name": n, "creationTimestamp": joined}} for n in ("sys", "g1", "g2")] + [{"metadata": {"name": "g3"}}]
    pods = [SimpleNamespace(name="rc-head", node="sys"), SimpleNamespace(name="rc-gpu-workers-worker-0", node="g1")]
    out = {r.name: r for r in gpu_idleness(rows, nodes, pods, now)}
    assert (out["sys"].ray_pod, out["sys"].empty_min) == ("rc-head", None)  # not a GPU node
    assert (out["g1"].ray_pod, out["g1"].empty_min) == ("rc-gpu-workers-worker-0", None)  # Ray's to judge
    assert (out["g2"].ray_pod, out["g2"].empty_min) == (None, 12.0)
    assert out["g3"].empty_min is None  # no creation time: nothing to say


def test_the_idle_cost_is_the_cluster_without_its_gpu_nodes_and_the_view_says_so() -> None:
    from raydlc.lifecycle.cluster_status import hourly_cost, idle_cost
    from raydlc.views.lifecycle import _idle_line, _work

    cost = hourly_cost(["g6.12xlarge", "g6.12xlarge", "m7i.xlarge"], 1, 1)
    on = idle_cost(cost, "g6.12xlarge", 15)
    assert on["when_idle_usd_per_hour"] == pytest.approx(0.2016 + 0.10 + 0.045, abs=0.006)
    assert on["total_usd_per_hour"] == cost["total_usd_per_hour"] > 9
    off = idle_cost(cost, "g6.12xlarge", 0)
    assert off["when_idle_usd_per_hour"] == cost["total_usd_per_hour"]
    assert "$0.35/h once the GPU nodes have left (after 15 min" in _idle_line(on)
    assert "IDLE_MINUTES=0 keeps the GPU nodes" in _idle_line(off)
    assert _work({"ray_pod": "rc-head"}) == "head"
    assert _work({"ray_pod": "rc-gpu-workers-worker-abcde"}) == "worker"
    assert _work({"ray_pod": None, "empty_min": 3.2}) == "none <5 min"
    assert _work({"ray_pod": None, "empty_min": 17.9}) == "none 15+ min"
    assert _work({"ray_pod": None, "empty_min": None}) == "-"


# --- the Cluster Autoscaler counts GPUs by label or allocatable (tests/doubles/cluster_autoscaler.py) ---


@pytest.mark.parametrize(("node_type", "gpus", "label"), [("g6.12xlarge", 4, "nvidia-l4"), ("g5.12xlarge", 4, "nvidia-a10g"),
                                                          ("p5.48xlarge", 8, "nvidia-h100"), ("p4d.24xlarge", 8, "nvidia-tesla-a100")])
def test_every_gpu_node_and_its_asg_template_carry_the_accelerator_label(tmp_path: Path, node_type: str, gpus: int,
                                                                           label: str) -> None:
    _, docs = docs_for(tmp_path, GPU_NODE_TYPE=node_type, GPUS_PER_NODE=gpus)
    g = gpu_group(docs)
    assert g["labels"]["k8s.amazonaws.com/accelerator"] == label
    assert g["tags"]["k8s.io/cluster-autoscaler/node-template/label/k8s.amazonaws.com/accelerator"] == label
    system = next(n for n in docs[FILES["eksctl"]]["managedNodeGroups"] if n["name"] == "system")
    assert "k8s.amazonaws.com/accelerator" not in system["labels"]


def _joined(labels: dict[str, str], gpus: int) -> dict[str, Any]:
    """A GPU node as it joins: the node group's labels, Ready, the NVIDIA plugin registered (`gpus`) or not (0)."""
    return {"metadata": {"labels": dict(labels)}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)} if gpus else {}}}


def test_while_device_plugins_register_the_autoscaler_adds_no_gpu_node_for_the_pods_already_placed(tmp_path: Path) -> None:
    """A job of 2 nodes on a group of at most 4: the CA raised the target to 2 and both nodes joined, their NVIDIA plugin
    not registered yet. With the rendered labels the CA waits for them; without the accelerator label (as before) it
    sees two Ready nodes with no GPU and asks for two more, to the maximum."""
    import cluster_autoscaler as cad

    _, docs = docs_for(tmp_path, GPU_NODE_COUNT=4)
    g = gpu_group(docs)
    pods = [4, 4]
    joined = [_joined(g["labels"], 0), _joined(g["labels"], 0)]
    assert all(cad.node_has_gpu(n) for n in joined)
    assert cad.scale_up(target=2, max_size=g["maxSize"], nodes=joined, pending_gpu_pods=pods, asg_tags=g["tags"]) == 2
    unlabelled = {k: v for k, v in g["labels"].items() if k != "k8s.amazonaws.com/accelerator"}
    bare = [_joined(unlabelled, 0), _joined(unlabelled, 0)]
    assert not any(cad.node_has_gpu(n) for n in bare)
    assert cad.scale_up(target=2, max_size=g["maxSize"], nodes=bare, pending_gpu_pods=pods, asg_tags=g["tags"]) == 4
    # once the plugins registered, both count as GPU nodes either way and nothing more is asked
    ready = [_joined(unlabelled, 4), _joined(unlabelled, 4)]
    assert all(cad.node_has_gpu(n) for n in ready)
    assert cad.scale_up(target=2, max_size=g["maxSize"], nodes=ready, pending_gpu_pods=pods, asg_tags=g["tags"]) == 2


# --- the workers run under their own service account: storage, no autoscaler RBAC ---


def test_workers_have_their_own_service_account_with_storage_and_no_autoscaler_binding(tmp_path: Path) -> None:
    """KubeRay (the double, as v1.7.0 common/rbac.go) binds the autoscaler's Role to the head's service account only;
    the workers' account has a pod identity for the bucket (as the head's does) and no RoleBinding."""
    import kuberay

    _, docs = docs_for(tmp_path)
    rc = docs[FILES["raycluster"]]
    head_sa = rc["spec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"]
    (group,) = rc["spec"]["workerGroupSpecs"]
    worker_sa = group["template"]["spec"]["serviceAccountName"]
    assert (head_sa, worker_sa) == ("raydlc-ray", "raydlc-ray-worker")
    rbac = kuberay.autoscaler_rbac({**rc, "metadata": {**rc["metadata"], "namespace": rc["metadata"].get("namespace", "ray-train")}})
    (binding,) = [o for o in rbac if o["kind"] == "RoleBinding"]
    assert [s["name"] for s in binding["subjects"]] == [head_sa]  # the autoscaler sidecar runs in the head pod
    assert not any(s["name"] == worker_sa for o in rbac for s in o.get("subjects", []))
    pias = {a["serviceAccountName"]: a for a in docs[FILES["eksctl"]]["iam"]["podIdentityAssociations"]}
    assert pias[head_sa]["permissionPolicy"] == pias[worker_sa]["permissionPolicy"]
    assert pias[head_sa]["roleName"] != pias[worker_sa]["roleName"]
    assert pias[head_sa]["namespace"] == pias[worker_sa]["namespace"] == "ray-train"


# --- spot-then-on-demand on an elastic cluster: two groups and the CA's priority expander ---


def test_spot_then_on_demand_is_two_gpu_groups_from_zero_and_the_ca_takes_on_demand_when_spot_cannot_launch(
        tmp_path: Path) -> None:
    """Both groups at min 0, the same labels, taints and node-template tags; the chart's values turn the priority
    expander on and the chart writes a priorities table that prefers the Spot group's ASG. The CA double expands the
    Spot group first; once its launch failed (backed off) it expands the On-Demand twin, to the pods' nodes."""
    import re

    import cluster_autoscaler as cad

    cfg, docs = docs_for(tmp_path, GPU_CAPACITY_TYPE="spot-then-on-demand", GPU_NODE_COUNT=2)
    groups = {g["name"]: g for g in docs[FILES["eksctl"]]["managedNodeGroups"]}
    spot, od = groups["gpu-workers"], groups[ca.fallback_group(cfg)]
    assert spot.get("spot") is True and "spot" not in od
    assert (spot["minSize"], od["minSize"], od["desiredCapacity"], od["maxSize"]) == (0, 0, 0, spot["maxSize"])
    assert od["labels"] == spot["labels"] and od["tags"] == spot["tags"] and od["taints"] == spot["taints"]
    values = docs["helm/cluster-autoscaler.values.yaml"]
    table = cad.chart_priorities(values)
    assert table is not None and set(table) == {ca.SPOT_PRIORITY, ca.ON_DEMAND_PRIORITY}
    assert all(re.compile(r) for rs in table.values() for r in rs)
    asg_spot = "eks-gpu-workers-12c5c3b1-8e6e-4f6a-9d1e-0a1b2c3d4e5f"
    asg_od = f"eks-{ca.fallback_group(cfg)}-5d1e2f3a-1b2c-4d5e-8f9a-0b1c2d3e4f5a"
    assert cad.expand([asg_spot, asg_od], table) == asg_spot
    assert cad.expand([asg_spot, asg_od], table, backed_off=[asg_spot]) == asg_od
    assert cad.expand(["eks-system-0b1c2d3e-1b2c-4d5e-8f9a-0b1c2d3e4f5a"], table) is None  # not a GPU option
    target = cad.scale_up(target=0, max_size=od["maxSize"], nodes=[], pending_gpu_pods=[4, 4], asg_tags=od["tags"])
    assert target == 2
    # the fixed-size cluster keeps one GPU group (up's create-time fallback), and the chart gets no expander
    _, docs0 = docs_for(tmp_path, GPU_CAPACITY_TYPE="spot-then-on-demand", IDLE_MINUTES=0)
    assert [g["name"] for g in docs0[FILES["eksctl"]]["managedNodeGroups"]] == ["system", "gpu-workers"]
    _, plain = docs_for(tmp_path, GPU_CAPACITY_TYPE="spot")
    assert cad.chart_priorities(plain["helm/cluster-autoscaler.values.yaml"]) is None
    assert len(plain[FILES["eksctl"]]["managedNodeGroups"]) == 2
