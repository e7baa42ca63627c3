"""raydlc.render against the real schemas of the tools that read its output, and its safety rules.

RayCluster/RayJob are checked against the KubeRay v1.7.0 CRDs' openAPIV3Schema made strict
(unknown fields rejected), the ClusterConfig against eksctl v0.230.0's JSON schema — both as the
package carries them (derived by scripts/derive_schemas.py), so nothing beside the repo is read — and core
kinds with kubernetes-validate --strict. Golden files: set RAYDLC_UPDATE_GOLDEN=1 to rewrite
tests/golden/default/ from the current renderer, then review the diff.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

import raydlc
from raydlc import schemas
from raydlc.config import Config, load_config, with_cluster_defaults
from raydlc.errors import InputError
from raydlc.facts import instances
from raydlc.render import FILES, codezip, render_all, to_yaml, write
from raydlc.render.eksctl import availability_zones
from raydlc.render.helm import releases
from raydlc.render.nodes import EFA_RESOURCE, GPU_RESOURCE, GPU_TAINT_KEY
from raydlc.render.raycluster import SECRET_KEYS
from raydlc.render.sizing import allocatable_for_pods, kube_reserved_cpu, worker_size

GOLDEN = Path(__file__).resolve().parent / "golden" / "default"
ZONES = ["us-east-2a", "us-east-2b", "us-east-2c"]

# name -> (overrides, zones): the spread the issue asks for, plus the switches that change shape.
SPREAD: dict[str, tuple[dict[str, Any], list[str]]] = {
    "default": ({}, ZONES),
    "one-node": ({"GPU_NODE_COUNT": 1}, ZONES),
    "four-nodes": ({"GPU_NODE_COUNT": 4, "GPU_AZ": "us-east-2b"}, ZONES),
    "p5": (
        {"GPU_NODE_TYPE": "p5.48xlarge", "GPUS_PER_NODE": 8, "REGION": "us-west-2", "GPU_AZ": "us-west-2c"},
        ["us-west-2a", "us-west-2c"],
    ),
    "custom-image": ({"DLC_IMAGE": "123456789012.dkr.ecr.us-east-2.amazonaws.com/my/ray:2.58.0-custom"}, ZONES),
    "autoscale": ({"IDLE_MINUTES": 15}, ZONES),
    "namespace": ({"NAMESPACE": "team-a-training", "RAY_CLUSTER_NAME": "team-a", "RAY_JOB_NAME": "team-a-job"}, ZONES),
    "bottlerocket-untainted": ({"NODE_AMI_FAMILY": "Bottlerocket", "GPU_TAINT": False, "NCCL_NET": ""}, ZONES),
    "spot": ({"GPU_CAPACITY_TYPE": "spot", "GPU_AZ": "us-east-2c"}, ZONES),
    "http-mode": ({"JOB_SUBMISSION_MODE": "HTTPMode", "JOB_DEADLINE_S": 600, "KUBERAY_NAMESPACE": "ray-system"}, ZONES),
}


# A job on several GPU nodes needs storage every node sees; the spread renders with one.
RUNS = "s3://raydlc-runs/team"


def make_config(overrides: dict[str, Any], cwd: Path) -> Config:
    """The spread is the fixed-size cluster (IDLE_MINUTES=0, whose documents tests/golden/default holds) unless an
    entry says otherwise; "autoscale" is the default IDLE_MINUTES=15 (tests/golden/autoscale)."""
    return load_config(env={}, overrides={"STORAGE_PATH": RUNS, "IDLE_MINUTES": 0, **overrides}, cwd=cwd)


@pytest.fixture(scope="module")
def empty_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("no-config-here")


@pytest.fixture(scope="module")
def rendered(empty_dir: Path) -> dict[str, tuple[Config, dict[str, dict[str, Any]]]]:
    out = {}
    for name, (overrides, zones) in SPREAD.items():
        cfg = make_config(overrides, empty_dir)
        out[name] = (cfg, render_all(cfg, zones))
    return out


@pytest.fixture(scope="module")
def crd_validators() -> dict[str, jsonschema.Draft7Validator]:
    """The packaged, strict KubeRay v1.7.0 schemas: the same ones `raydlc render` checks with."""
    return {kind: schemas.validator(kind) for kind in ("RayCluster", "RayJob")}


@pytest.fixture(scope="module")
def eksctl_validator() -> jsonschema.Draft7Validator:
    return schemas.validator("ClusterConfig")


def k8s_schema_version(wanted: str) -> str:
    """The Kubernetes schema version to validate against: the configured one when kubernetes-validate
    ships it, else the newest shipped one not newer than it, else (config newer than all) the newest."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split(".")[:2])

    shipped = sorted({".".join(v.split(".")[:2]) for v in all_versions()}, key=key)
    older = [v for v in shipped if key(v) <= key(wanted)]
    return older[-1] if older else shipped[0]


def errors_of(validator: jsonschema.Draft7Validator, doc: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def pod_templates(docs: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(where, pod template) for every pod raydlc defines."""
    out = []
    rc = docs[FILES["raycluster"]]["spec"]
    job = docs[FILES["rayjob"]]["spec"]
    assert "rayClusterSpec" not in job  # the RayJob runs on the standing RayCluster: no pods of its own but the submitter
    for where, spec in (("raycluster", rc),):
        out.append((f"{where}/head", spec["headGroupSpec"]["template"]))
        for g in spec["workerGroupSpecs"]:
            out.append((f"{where}/{g['groupName']}", g["template"]))
    if "submitterPodTemplate" in job:
        out.append(("rayjob/submitter", job["submitterPodTemplate"]))
    return out


def gpu_pods(docs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for where, t in pod_templates(docs) if "head" not in where and "submitter" not in where]


def walk(node: Any):
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


# --- schemas -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SPREAD)
def test_raycluster_and_rayjob_match_the_kuberay_crds(name: str, rendered, crd_validators) -> None:
    _, docs = rendered[name]
    for filename, kind in ((FILES["raycluster"], "RayCluster"), (FILES["rayjob"], "RayJob")):
        assert docs[filename]["kind"] == kind
        assert errors_of(crd_validators[kind], docs[filename]) == [], f"{name} {filename}"


@pytest.mark.parametrize("name", SPREAD)
def test_cluster_config_matches_the_eksctl_schema(name: str, rendered, eksctl_validator) -> None:
    _, docs = rendered[name]
    assert errors_of(eksctl_validator, docs[FILES["eksctl"]]) == []


@pytest.mark.parametrize("name", SPREAD)
def test_core_kinds_pass_kubernetes_validate_strict(name: str, rendered) -> None:
    cfg, docs = rendered[name]
    version = k8s_schema_version(cfg.cluster.k8s_version)
    policies = docs[FILES["netpol"]]["items"]
    assert [p["kind"] for p in policies] == ["NetworkPolicy"]
    for policy in policies:
        kubernetes_validate.validate(policy, version, strict=True)
    for _where, template in pod_templates(docs):
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": template}
        kubernetes_validate.validate(pod_template, version, strict=True)


def test_configured_kubernetes_version_is_one_kubernetes_validate_ships(empty_dir: Path) -> None:
    cfg = make_config({}, empty_dir)
    assert k8s_schema_version(cfg.cluster.k8s_version) == cfg.cluster.k8s_version
    assert k8s_schema_version("1.99") == max(
        {".".join(v.split(".")[:2]) for v in all_versions()}, key=lambda v: tuple(map(int, v.split(".")))
    )


def test_strict_crd_schema_rejects_an_unknown_field(rendered, crd_validators) -> None:
    _, docs = rendered["default"]
    bad = copy.deepcopy(docs[FILES["raycluster"]])
    bad["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["gpuz"] = 1
    assert any("gpuz" in e for e in errors_of(crd_validators["RayCluster"], bad))
    bad2 = copy.deepcopy(docs[FILES["rayjob"]])
    bad2["spec"]["activeDeadline"] = 5
    assert errors_of(crd_validators["RayJob"], bad2) != []


def test_kubernetes_validate_strict_rejects_an_unknown_field(rendered) -> None:
    _, docs = rendered["default"]
    bad = copy.deepcopy(docs[FILES["netpol"]]["items"][0])
    bad["spec"]["ingress"][0]["fromm"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.36", strict=True)


# --- safety properties ----------------------------------------------------------------------


@pytest.mark.parametrize("name", SPREAD)
def test_head_has_no_gpu(name: str, rendered) -> None:
    _, docs = rendered[name]
    for where, template in pod_templates(docs):
        if "head" not in where:
            continue
        spec = template["spec"]
        assert spec["nodeSelector"] == {"role": "system"}
        (c,) = spec["containers"]
        for part in ("requests", "limits"):
            assert GPU_RESOURCE not in c["resources"][part] and EFA_RESOURCE not in c["resources"][part]
        assert c["resources"]["requests"] == c["resources"]["limits"]
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in c["env"]
        assert sorted(p["containerPort"] for p in c["ports"]) == [6379, 8265, 10001]
        assert "lifecycle" not in c  # no hook stops Ray: the kubelet ends the container
        assert {"name": "ray-logs", "mountPath": "/tmp/ray"} in c["volumeMounts"]
        assert "command" not in c and "args" not in c
    for spec in (docs[FILES["raycluster"]]["spec"],):
        assert spec["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
        assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no task or actor lands on the head
        assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"


@pytest.mark.parametrize("name", SPREAD)
def test_no_public_exposure_anywhere(name: str, rendered) -> None:
    _, docs = rendered[name]
    for doc in docs.values():
        for node in walk(doc):
            if isinstance(node, dict):
                assert node.get("kind") != "Ingress"
                assert node.get("serviceType", "ClusterIP") == "ClusterIP"
                assert node.get("type") not in ("LoadBalancer", "NodePort")
                assert node.get("enableIngress", False) is False
                assert "hostNetwork" not in node and "hostPort" not in node


@pytest.mark.parametrize("name", SPREAD)
def test_every_gpu_pod_claims_the_whole_node(name: str, rendered) -> None:
    cfg, docs = rendered[name]
    it = instances.instance_type(cfg.gpu_nodes.instance_type)
    assert it is not None
    pods = gpu_pods(docs)
    assert len(pods) == 1  # the RayCluster's worker group; the RayJob runs on it
    for template in pods:
        (c,) = template["spec"]["containers"]
        req, lim = c["resources"]["requests"], c["resources"]["limits"]
        assert req == lim
        assert req[GPU_RESOURCE] == str(it.gpus) and req[EFA_RESOURCE] == str(it.efa_interfaces)
        assert int(req[EFA_RESOURCE]) >= 1
        assert all(isinstance(v, str) for v in req.values())
        assert template["spec"]["nodeSelector"] == {"role": "gpu-worker"}
        assert "command" not in c and "args" not in c
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "raydlc-secrets", "key": "HF_TOKEN", "optional": True}}} in c["env"]
        assert env["FI_PROVIDER"] == "efa" and env["NCCL_DEBUG"] == "INFO"
        assert env.get("NCCL_NET") == cfg.ray.nccl_net
        assert ("FI_EFA_USE_DEVICE_RDMA" in env) == it.gpudirect_rdma
        if it.gpudirect_rdma:
            assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    for spec in (docs[FILES["raycluster"]]["spec"],):
        (group,) = spec["workerGroupSpecs"]
        n = cfg.gpu_nodes.count
        low = 0 if cfg.gpu_nodes.idle_minutes else n  # autoscaling: Ray's autoscaler starts workers for a job
        assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (low, low, n)
        assert group["rayStartParams"]["num-gpus"] == group["template"]["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE]


@pytest.mark.parametrize("name", SPREAD)
def test_gpu_taint_and_tolerations_agree(name: str, rendered) -> None:
    cfg, docs = rendered[name]
    (gpu_ng,) = [ng for ng in docs[FILES["eksctl"]]["managedNodeGroups"] if ng.get("efaEnabled")]
    taints = gpu_ng.get("taints", [])
    assert bool(taints) == cfg.gpu_nodes.taint
    for template in gpu_pods(docs):
        tolerations = template["spec"].get("tolerations", [])
        for t in taints:
            assert any(
                tol["key"] == t["key"] and tol["effect"] == t["effect"]
                and (tol["operator"] == "Exists" or tol.get("value") == t["value"])
                for tol in tolerations
            ), (t, tolerations)
    for release in releases(cfg):
        if release.name == "nvidia-device-plugin":
            keys = {t["key"] for t in release.values["tolerations"]}
            assert {t["key"] for t in taints} <= keys


@pytest.mark.parametrize("name", SPREAD)
def test_names_image_and_namespace_follow_the_config(name: str, rendered) -> None:
    cfg, docs = rendered[name]
    rc, job = docs[FILES["raycluster"]], docs[FILES["rayjob"]]
    assert (rc["metadata"]["name"], job["metadata"]["name"]) == (cfg.ray.cluster_name, cfg.ray.job_name)
    namespaces = {rc["metadata"]["namespace"], job["metadata"]["namespace"]}
    namespaces |= {p["metadata"]["namespace"] for p in docs[FILES["netpol"]]["items"]}
    assert namespaces == {cfg.cluster.namespace}
    assert rc["spec"]["rayVersion"] == cfg.images.ray_version
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": rc["metadata"]["name"]}  # the job runs on this RayCluster
    images = {c["image"] for _, t in pod_templates(docs) for c in t["spec"]["containers"]}
    assert images == {cfg.images.dlc_image}
    meta = docs[FILES["eksctl"]]["metadata"]
    assert (meta["name"], meta["region"], meta["version"]) == (cfg.cluster.name, cfg.cluster.region, cfg.cluster.k8s_version)


def test_p5_worker_claims_8_gpus_and_32_efa_with_gpudirect(rendered) -> None:
    _, docs = rendered["p5"]
    for template in gpu_pods(docs):
        (c,) = template["spec"]["containers"]
        assert c["resources"]["limits"][GPU_RESOURCE] == "8"
        assert c["resources"]["limits"][EFA_RESOURCE] == "32"
        assert {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"} in c["env"]
    _, default = rendered["default"]
    for template in gpu_pods(default):
        assert "FI_EFA_USE_DEVICE_RDMA" not in {e["name"] for e in template["spec"]["containers"][0]["env"]}


GPU_TYPES = [n for n, t in instances.INSTANCE_TYPES.items() if t.gpus]


@pytest.mark.parametrize("instance", GPU_TYPES)
def test_every_gpu_type_renders_with_all_its_efa_and_gdr_only_where_the_hardware_has_it(instance: str, empty_dir: Path) -> None:
    it = instances.INSTANCE_TYPES[instance]
    cfg = make_config({"GPU_NODE_TYPE": instance, "GPUS_PER_NODE": it.gpus, "GPU_NODE_COUNT": 16, "SYSTEM_NODE_TYPE": "m7i.2xlarge"}, empty_dir)
    docs = render_all(cfg, ZONES, only="raycluster")
    (group,) = docs[FILES["raycluster"]]["spec"]["workerGroupSpecs"]
    (c,) = group["template"]["spec"]["containers"]
    assert c["resources"]["limits"][EFA_RESOURCE] == str(it.efa_interfaces)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env.get("FI_EFA_USE_DEVICE_RDMA") == ("1" if it.gpudirect_rdma else None)
    # The catalogue's facts hang together: GPUDirect RDMA and NVLink come with the p family here.
    assert it.gpudirect_rdma == it.nvlink == it.family.startswith("p")
    assert it.gpu_model is not None and it.gpu_model.memory_gib > 20 and it.gpu_model.bf16_tflops > 100
    assert it.gpu_link_gbytes_s >= (300 if it.nvlink else 32)


def test_efa_interfaces_per_p5_class_type() -> None:
    assert {n: instances.INSTANCE_TYPES[n].efa_interfaces for n in ("p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p4d.24xlarge")} == {
        "p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16, "p4d.24xlarge": 4,
    }
    assert {n: instances.INSTANCE_TYPES[n].efa_interfaces for n in ("g6.12xlarge", "g6e.24xlarge", "g6e.48xlarge")} == {
        "g6.12xlarge": 1, "g6e.24xlarge": 2, "g6e.48xlarge": 4,
    }


def test_the_head_is_sized_for_the_workers(empty_dir: Path) -> None:
    from raydlc.render.sizing import head_needs

    assert [(n.cpu, n.memory_gib) for n in map(head_needs, (8, 128, 512))] == [(2, 7), (4, 10), (10, 22)]
    p5 = {"GPU_NODE_TYPE": "p5.48xlarge", "GPUS_PER_NODE": 8}
    with pytest.raises(InputError) as e:
        render_all(make_config({**p5, "GPU_NODE_COUNT": 16}, empty_dir), ZONES, only="raycluster")
    assert "128 Ray Train workers" in e.value.message and e.value.hint == "set SYSTEM_NODE_TYPE=m7i.2xlarge"
    docs = render_all(make_config({**p5, "GPU_NODE_COUNT": 16, "SYSTEM_NODE_TYPE": "m7i.2xlarge"}, empty_dir), ZONES, only="raycluster")
    head = docs[FILES["raycluster"]]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert (head["cpu"], head["memory"]) == ("6", "24Gi")
    with pytest.raises(InputError) as e:
        render_all(make_config({**p5, "GPU_NODE_COUNT": 64, "SYSTEM_NODE_TYPE": "m7i.2xlarge"}, empty_dir), ZONES, only="raycluster")
    assert "at least 10 CPUs and 22 GiB" in e.value.message and e.value.hint == "set SYSTEM_NODE_TYPE=m7i.4xlarge"


def test_the_job_model_is_checked_where_it_is_rendered(empty_dir: Path, tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    for d, doc in ((good, {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "intermediate_size": 128, "vocab_size": 100}), (bad, {"model_type": "t5"})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(doc))
    job = render_all(make_config({"MODEL_ID": str(good)}, empty_dir), ZONES, only="rayjob")[FILES["rayjob"]]
    assert json.loads(job["spec"]["runtimeEnvYAML"])["env_vars"]["RAYDLC_MODEL_ID"] == str(good)
    with pytest.raises(InputError) as e:
        render_all(make_config({"MODEL_ID": str(bad)}, empty_dir), ZONES, only="rayjob")
    assert e.value.message.startswith("MODEL_ID (") and "model_type 't5'" in e.value.message


def test_gpu_taint_is_one_eksctls_efa_plugin_tolerates() -> None:
    # eksctl's EFA device-plugin DaemonSet tolerates only these keys; see raydlc.render.nodes.
    assert GPU_TAINT_KEY in {"CriticalAddonsOnly", "aws.amazon.com/efa"}


@pytest.mark.parametrize("name", SPREAD)
def test_gpu_node_group_is_in_exactly_one_az(name: str, rendered) -> None:
    cfg, docs = rendered[name]
    cc = docs[FILES["eksctl"]]
    groups = {ng["name"]: ng for ng in cc["managedNodeGroups"]}
    gpu = groups[cfg.gpu_nodes.nodegroup_name]
    assert gpu["efaEnabled"] is True and gpu["privateNetworking"] is True
    assert len(gpu["availabilityZones"]) == 1 and "subnets" not in gpu
    (az,) = gpu["availabilityZones"]
    assert az == (cfg.gpu_nodes.az or SPREAD[name][1][0])
    assert az in cc["availabilityZones"] and len(cc["availabilityZones"]) >= 2
    assert gpu["labels"] == {"role": "gpu-worker", "nvidia.com/gpu.present": "true",
                             "k8s.amazonaws.com/accelerator": instances.accelerator_label(cfg.gpu_nodes.instance_type)}
    n = cfg.gpu_nodes.count
    low = 0 if cfg.gpu_nodes.idle_minutes else n  # autoscaling: the Cluster Autoscaler takes idle nodes to 0
    assert (gpu["desiredCapacity"], gpu["minSize"], gpu["maxSize"]) == (n, low, n)
    system = groups[cfg.system_nodes.nodegroup_name]
    assert system["labels"] == {"role": "system"} and "efaEnabled" not in system
    assert cc["vpc"]["nat"]["gateway"] == "Single" and cc["iam"]["withOIDC"] is True
    assert [a["name"] for a in cc["addons"]] == ["vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent"]
    vpc_cni = next(a for a in cc["addons"] if a["name"] == "vpc-cni")
    # EKS enforces NetworkPolicy only with this set; the value is a JSON string and the flag a string "true".
    assert json.loads(vpc_cni["configurationValues"]) == {"enableNetworkPolicy": "true"}
    assert vpc_cni["version"] == "latest"


@pytest.mark.parametrize("kind", ["spot", "spot-then-on-demand"])
def test_spot_renders_the_gpu_group_as_managed_spot_capacity_in_its_one_az_and_the_system_group_on_demand(
    kind: str, empty_dir: Path, eksctl_validator
) -> None:
    cfg = make_config({"GPU_CAPACITY_TYPE": kind}, empty_dir)
    cc = render_all(cfg, ZONES, only="eksctl")[FILES["eksctl"]]
    assert errors_of(eksctl_validator, cc) == []
    groups = {ng["name"]: ng for ng in cc["managedNodeGroups"]}
    gpu, system = groups["gpu-workers"], groups["system"]
    assert gpu["spot"] is True and gpu["instanceType"] == "g6.12xlarge" and "instanceTypes" not in gpu
    assert gpu["efaEnabled"] is True and gpu["availabilityZones"] == ["us-east-2a"]
    assert "spot" not in system
    on_demand = render_all(make_config({}, empty_dir), ZONES, only="eksctl")[FILES["eksctl"]]
    assert all("spot" not in ng for ng in on_demand["managedNodeGroups"])
    bad = {**cc, "managedNodeGroups": [{**gpu, "spot": "yes"}, system]}
    assert any("spot" in e for e in errors_of(eksctl_validator, bad))  # the schema really checks the field


@pytest.mark.parametrize("name", SPREAD)
def test_network_policy_admits_only_own_cluster_and_operator(name: str, rendered) -> None:
    cfg, docs = rendered[name]
    policies = docs[FILES["netpol"]]["items"]
    instances = [cfg.ray.cluster_name]  # the RayJob's submitter is labelled as a pod of the cluster it submits to
    labels_in_use = [
        t["metadata"]["labels"]["raydlc.io/cluster"] for _, t in pod_templates(docs)
    ]
    assert set(labels_in_use) == set(instances)
    assert len(policies) == len(instances)
    for policy, instance in zip(policies, instances, strict=True):
        spec = policy["spec"]
        assert policy["metadata"]["namespace"] == cfg.cluster.namespace
        assert spec["podSelector"]["matchLabels"] == {"raydlc.io/cluster": instance, "ray.io/node-type": "head"}
        assert spec["policyTypes"] == ["Ingress"]
        own, operator = spec["ingress"]
        assert own["from"] == [{"podSelector": {"matchLabels": {"raydlc.io/cluster": instance}}}]
        (peer,) = operator["from"]
        assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": cfg.ray.operator_namespace}
        assert sorted(p["port"] for p in operator["ports"]) == [6379, 8265, 10001]
        for rule in spec["ingress"]:
            for src in rule["from"]:
                assert "ipBlock" not in src
                assert src.get("podSelector", {}).get("matchLabels"), "an empty podSelector would admit every pod"


def test_no_secret_or_credential_in_any_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secrets = {
        "AWS_ACCESS_KEY_ID": "AKIAZZZZSECRETKEY123",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETVALUE",
        "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEXAMPLESESSIONTOKEN",
        "HF_TOKEN": "hf_NOTAREALTOKENBUTASECRET",
        "MLFLOW_TRACKING_TOKEN": "mlflowNOTAREALTOKENSECRET",
        "WANDB_API_KEY": "wandbNOTAREALAPIKEYSECRETVALUE01",
    }
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    for k in [k for k in os.environ if k.startswith("RAYDLC_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("RAYDLC_STEPS", "7")
    monkeypatch.setenv("RAYDLC_STORAGE_PATH", RUNS)
    monkeypatch.setenv("RAYDLC_TRACKING", "tensorboard,mlflow,wandb")
    monkeypatch.chdir(tmp_path)
    cfg = load_config()
    assert cfg.train.steps == 7
    docs = render_all(cfg, ZONES)
    paths = write(docs, tmp_path / "out")
    assert len(paths) == len(docs) == 7  # 4 manifests, 3 Helm values files (NVIDIA, KubeRay, Cluster Autoscaler)
    text = "\n".join(p.read_text() for p in paths)
    assert "RAYDLC_STEPS" in text and '"7"' in text
    for value in secrets.values():
        assert value not in text
    for name in secrets:
        if name not in SECRET_KEYS:
            assert name not in text
    assert "password" not in text.lower()
    # HF_TOKEN and the trackers' tokens are named only as references to the Secret `raydlc up` makes, never with a value
    assert text.count("secretKeyRef") == 2 * len(SECRET_KEYS)
    for name in SECRET_KEYS:
        assert text.count(f"- name: {name}") == 2  # head and workers of the one RayCluster


# --- the RayJob -----------------------------------------------------------------------------


def test_rayjob_carries_guardrails_and_the_training_settings(empty_dir: Path) -> None:
    knobs = {"STEPS": 11, "LEARNING_RATE": "3e-5", "WEIGHT_DECAY": "0.1", "BF16": "true", "HSDP_REPLICAS": 2, "SEED": 0}
    cfg = make_config({"JOB_DEADLINE_S": 900, **knobs}, empty_dir)
    job = render_all(cfg, ZONES, only="rayjob")[FILES["rayjob"]]["spec"]
    assert job["activeDeadlineSeconds"] == 900 and job["submissionMode"] == "K8sJobMode"
    # on the standing cluster, KubeRay v1.7.0 deletes nothing when the job ends and refuses retries (validation.go)
    assert not {"shutdownAfterJobFinishes", "ttlSecondsAfterFinished", "backoffLimit", "rayClusterSpec"} & set(job)
    assert job["clusterSelector"] == {"ray.io/cluster": cfg.ray.cluster_name}
    assert job["submitterPodTemplate"]["metadata"]["labels"] == {"raydlc.io/cluster": cfg.ray.cluster_name}  # its head's policy admits it
    assert job["entrypoint"].startswith("python -m raydlc.train")
    runtime = yaml.safe_load(job["runtimeEnvYAML"])
    env = runtime["env_vars"]
    assert all(isinstance(v, str) for v in env.values())
    assert env["RAYDLC_STEPS"] == "11" and env["RAYDLC_LEARNING_RATE"] == "3e-05"
    assert (env["RAYDLC_WEIGHT_DECAY"], env["RAYDLC_BF16"], env["RAYDLC_HSDP_REPLICAS"]) == ("0.1", "true", "2")
    assert env["RAYDLC_NUM_WORKERS"] == "8"
    # Every non-default training setting travels, the cluster defaults resolved (as `submit --builtin` sends them), and
    # nothing else but USE_GPU and the deadline: the job has the same defaults, on the cluster an empty USE_GPU is true
    # (GPU workers scaled to zero show no GPU when the job starts), and the job's driver stops itself at the RayJob's
    # activeDeadlineSeconds (KubeRay v1.7.0 only marks the RayJob Failed).
    assert sorted(env) == sorted(["RAYDLC_STEPS", "RAYDLC_LEARNING_RATE", "RAYDLC_WEIGHT_DECAY", "RAYDLC_BF16",
                                  "RAYDLC_HSDP_REPLICAS", "RAYDLC_NUM_WORKERS", "RAYDLC_STORAGE_PATH", "RAYDLC_USE_GPU",
                                  "RAYDLC_JOB_DEADLINE_S", "RAYDLC_SEQ_LEN", "RAYDLC_GRAD_ACCUM"])
    assert env["RAYDLC_USE_GPU"] == "true" and env["RAYDLC_JOB_DEADLINE_S"] == "900" == str(job["activeDeadlineSeconds"])
    reloaded = load_config(env=env, cwd=empty_dir)
    assert reloaded.train == with_cluster_defaults(cfg).train.model_copy(update={"num_workers": cfg.num_workers, "use_gpu": True})
    assert reloaded.ray.job_deadline_s == 900 and reloaded.origin("JOB_DEADLINE_S") != "default"
    cpu = render_all(make_config({"USE_GPU": "false"}, empty_dir), ZONES, only="rayjob")[FILES["rayjob"]]["spec"]
    assert yaml.safe_load(cpu["runtimeEnvYAML"])["env_vars"]["RAYDLC_USE_GPU"] == "false"  # a setting given is kept
    assert runtime["py_modules"] == [f"s3://raydlc-runs/code/raydlc-{raydlc.__version__}-{codezip.build().digest}.zip"]


@pytest.mark.parametrize("overrides, field", [({"JOB_BACKOFF_LIMIT": 1}, "JOB_BACKOFF_LIMIT"),
                                              ({"JOB_SUBMISSION_MODE": "SidecarMode"}, "JOB_SUBMISSION_MODE")])
def test_rayjob_settings_kuberay_refuses_on_a_standing_cluster_are_refused(overrides: dict[str, Any], field: str,
                                                                           empty_dir: Path) -> None:
    from raydlc.errors import ConfigError

    with pytest.raises(ConfigError, match=field):
        render_all(make_config(overrides, empty_dir), ZONES, only="rayjob")


def test_rayjob_http_mode_has_no_submitter_pod(rendered) -> None:
    _, docs = rendered["http-mode"]
    spec = docs[FILES["rayjob"]]["spec"]
    assert spec["submissionMode"] == "HTTPMode" and "submitterPodTemplate" not in spec
    assert spec["activeDeadlineSeconds"] == 600


# --- helm and device-plugin ownership --------------------------------------------------------


def test_helm_releases_and_device_plugin_owners(rendered) -> None:
    cfg, docs = rendered["default"]
    by_name = {r.name: r for r in releases(cfg)}
    assert set(by_name) == {"kuberay-operator", "nvidia-device-plugin"}
    op = by_name["kuberay-operator"]
    assert op.version == cfg.images.kuberay_version == "1.7.0"
    assert op.values["nodeSelector"] == {"role": "system"} and op.namespace == cfg.ray.operator_namespace
    nv = by_name["nvidia-device-plugin"]
    assert nv.version == cfg.images.nvidia_device_plugin_version and nv.values["nodeSelector"] == {"role": "gpu-worker"}
    assert set(docs) >= {"helm/kuberay-operator.values.yaml", "helm/nvidia-device-plugin.values.yaml"}
    assert not any("efa" in name for name in docs if name.startswith("helm/")), "eksctl owns the EFA plugin"
    br_cfg, br_docs = rendered["bottlerocket-untainted"]
    assert [r.name for r in releases(br_cfg)] == ["kuberay-operator"]
    assert "helm/nvidia-device-plugin.values.yaml" not in br_docs


# --- sizing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("instance", [n for n, t in instances.INSTANCE_TYPES.items() if t.gpus])
def test_worker_fits_the_node_after_reservations(instance: str) -> None:
    it = instances.INSTANCE_TYPES[instance]
    size = worker_size(instance)
    cpu, mem = allocatable_for_pods(it)
    assert 1 <= size.cpu <= cpu < it.vcpus - kube_reserved_cpu(it.vcpus)
    assert 1 <= size.memory_gib <= mem < it.memory_gib * 0.95


def test_default_sizes_are_the_documented_ones(rendered) -> None:
    _, docs = rendered["default"]
    rc = docs[FILES["raycluster"]]["spec"]
    head = rc["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    worker = rc["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert (head["cpu"], head["memory"]) == ("2", "9Gi")
    assert (worker["cpu"], worker["memory"]) == ("47", "176Gi")
    assert abs(kube_reserved_cpu(48) - 0.19) < 1e-9


# --- bad input ------------------------------------------------------------------------------


def test_unknown_gpu_type_is_an_input_error_naming_it(empty_dir: Path) -> None:
    cfg = make_config({"GPU_NODE_TYPE": "g99.huge", "GPUS_PER_NODE": 4}, empty_dir)
    with pytest.raises(InputError) as e:
        render_all(cfg, ZONES)
    assert "GPU_NODE_TYPE" in e.value.message and "g99.huge" in e.value.message and e.value.hint


@pytest.mark.parametrize(
    "overrides, zones, needle",
    [
        ({}, None, "GPU_AZ"),
        ({"GPU_AZ": "us-east-2a"}, None, "two Availability Zones"),
        ({"GPU_AZ": "us-east-2c"}, ["us-east-2a", "us-east-2b"], "not among"),
        ({}, ["us-east-2a"], "two Availability Zones"),
        ({}, ["eu-west-1a", "eu-west-1b"], "REGION"),
    ],
)
def test_zone_problems_are_input_errors(overrides: dict[str, Any], zones, needle: str, empty_dir: Path) -> None:
    cfg = make_config(overrides, empty_dir)
    with pytest.raises(InputError) as e:
        availability_zones(cfg, zones)
    assert needle in e.value.message and e.value.hint


def test_capacity_answer_picks_the_gpu_az_first(empty_dir: Path) -> None:
    cfg = make_config({}, empty_dir)
    assert availability_zones(cfg, ["us-east-2c", "us-east-2a", "us-east-2c"]) == (["us-east-2c", "us-east-2a"], "us-east-2c")
    cfg_b = make_config({"GPU_AZ": "us-east-2a"}, empty_dir)
    assert availability_zones(cfg_b, ["us-east-2c", "us-east-2a"]) == (["us-east-2a", "us-east-2c"], "us-east-2a")


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"RAY_JOB_NAME": "Bad_Name"}, "RAY_JOB_NAME"),
        ({"RAY_JOB_NAME": "x" * 41}, "RAY_JOB_NAME"),
        ({"JOB_TTL_S": -1}, "JOB_TTL_S"),
        ({"JOB_BACKOFF_LIMIT": -2}, "JOB_BACKOFF_LIMIT"),
        ({"JOB_SUBMISSION_MODE": "ShellMode"}, "JOB_SUBMISSION_MODE"),
        ({"KUBERAY_NAMESPACE": "-ns"}, "KUBERAY_NAMESPACE"),
    ],
)
def test_new_settings_are_validated(overrides: dict[str, Any], field: str, empty_dir: Path) -> None:
    from raydlc.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        make_config(overrides, empty_dir)
    assert field in str(e.value)


def test_render_functions_are_pure_and_import_nothing_heavy() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from raydlc.config import load_config; from raydlc.render import render_all; "
        "render_all(load_config(env={'RAYDLC_STORAGE_PATH': 's3://b/p'}), ['us-east-2a','us-east-2b']); "
        "print(sorted(m for m in ('boto3','kubernetes','ray','torch') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# --- golden files ---------------------------------------------------------------------------


CODE_ZIP = re.compile(r"raydlc-[0-9][^\"/\s]*-[0-9a-f]{12}\.zip")  # its hash follows every source change


def _golden(doc: dict[str, Any]) -> str:
    return CODE_ZIP.sub("raydlc-VERSION-HASH.zip", to_yaml(doc))


@pytest.mark.parametrize(("name", "golden"), [("default", GOLDEN), ("autoscale", GOLDEN.parent / "autoscale")])
def test_default_config_matches_the_golden_files(rendered, name: str, golden: Path) -> None:
    """RAYDLC_UPDATE_GOLDEN=1 rewrites tests/golden/<dir>/ (then review `git diff`). golden/default is the
    fixed-size cluster (IDLE_MINUTES=0: today's documents, unchanged); golden/autoscale the default IDLE_MINUTES=15."""
    _, docs = rendered[name]
    if os.environ.get("RAYDLC_UPDATE_GOLDEN") == "1":
        if golden.exists():
            for old in golden.rglob("*.yaml"):
                old.unlink()
        for path in write(docs, golden):
            path.write_text(_golden(docs[str(path.relative_to(golden))]))
    on_disk = sorted(str(p.relative_to(golden)) for p in golden.rglob("*.yaml"))
    assert on_disk == sorted(docs), "golden file set differs; RAYDLC_UPDATE_GOLDEN=1 to rewrite"
    for fname, doc in docs.items():
        assert (golden / fname).read_text() == _golden(doc), f"{fname} differs from its golden file"


# --- the system node holds what runs there (raydlc.render.sizing system_node_pods) ---------------------------


def test_the_default_system_node_holds_the_head_the_add_ons_the_submitter_and_a_probe(empty_dir: Path) -> None:
    from raydlc.checks import head_isolation
    from raydlc.render import sizing

    it = instances.INSTANCE_TYPES["m7i.xlarge"]
    assert load_config(env={}, cwd=empty_dir).system_nodes.instance_type == it.name
    names = {p.name for p in sizing.system_node_pods(autoscaling=True)}
    assert {"Ray autoscaler sidecar", "kuberay-operator", "cluster-autoscaler", "metrics-server", "coredns", "kube-proxy",
            "aws-node", "eks-pod-identity-agent", "RayJob submitter", "verify's probe pod"} == names
    assert {p.name for p in sizing.system_node_pods(autoscaling=False)} == names - {"Ray autoscaler sidecar", "cluster-autoscaler"}
    fit = sizing.system_node_fit(it, autoscaling=True)
    assert fit.allocatable_cpu == pytest.approx(3.92) and fit.others_cpu == pytest.approx(1.85)
    head = sizing.head_size(it.name, 8, autoscaling=True)
    assert (head.cpu, head.memory_gib) == (2, 8)
    assert head.cpu + fit.others_cpu <= fit.allocatable_cpu and head.memory_gib + fit.others_gib <= fit.allocatable_gib
    # the figures counted are the ones rendered: the submitter's pod and verify's probe pod
    sub = render_all(make_config({}, empty_dir), ZONES, only="rayjob")[FILES["rayjob"]]["spec"]["submitterPodTemplate"]
    assert sub["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}
    probe = head_isolation.pod_doc("p", "ns", "img", None, "h", 1)["spec"]["containers"][0]["resources"]["requests"]
    assert probe == {"cpu": f"{sizing.PROBE.cpu_m}m", "memory": f"{sizing.PROBE.memory_mi}Mi"}


def test_a_system_node_that_cannot_hold_them_is_refused_by_render_and_up_dry_run(
        empty_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """m7i.large (2 vCPUs, 8 GiB; EC2's figures) leaves the head under 2 CPUs once the add-ons are counted."""
    from raydlc.cli import main

    monkeypatch.chdir(empty_dir)
    for k in [k for k in os.environ if k.startswith(("AWS_", "RAYDLC_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setitem(instances.INSTANCE_TYPES, "m7i.large", instances.InstanceType("m7i.large", 2, 8, 0, None, 0, 12.5))
    with pytest.raises(InputError) as e:
        render_all(make_config({"SYSTEM_NODE_TYPE": "m7i.large"}, empty_dir), ZONES, only="raycluster")
    assert e.value.message.startswith("SYSTEM_NODE_TYPE: m7i.large cannot hold what runs on the system node")
    assert e.value.hint == "set SYSTEM_NODE_TYPE=m7i.xlarge"
    store = ["--set", "STORAGE_PATH=s3://raydlc-runs/team", "--set", "SYSTEM_NODE_TYPE=m7i.large"]
    assert main([*store, "render", "--zones", ",".join(ZONES)]) == 2
    assert "SYSTEM_NODE_TYPE" in capsys.readouterr().err
    assert main([*store, "up", "--dry-run"]) == 2
    assert "SYSTEM_NODE_TYPE: m7i.large cannot hold" in capsys.readouterr().err
