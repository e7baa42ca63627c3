"""`up --attach`, `status` and `down --attach` on a cluster a platform team runs (tests/doubles/platform_world.py).

The user holds a kubeconfig context and a namespaced Role (RBAC enforced by the world's authorizer with Kubernetes'
SelfSubjectAccessReview semantics); KubeRay v1.7.0 was installed by helm into kuberay-system; GPU nodes are tainted
`nvidia.com/gpu:NoSchedule`; a second team's RayCluster shares the namespace. AWS is a real moto server (the EKS
variants) or absent (kind). "Creates nothing outside the namespace" is checked by comparing the inventories of kmock
(every object outside the namespace) and moto (what the account holds) before and after.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DOUBLES = Path(__file__).resolve().parents[1] / "doubles"
sys.path.insert(0, str(DOUBLES))

import platform_world  # noqa: E402
import servers  # noqa: E402
from kuberay import Operator  # noqa: E402

from raydlc.lifecycle.context import Timings  # noqa: E402

NS = platform_world.NAMESPACE
RAY = "ray-train-cluster"
FAST = Timings(poll_s=0.1, pods_s=60, stuck_s=30)
OWN = "app.kubernetes.io/managed-by"


class Attached:
    """The platform cluster, the env raydlc runs with, and the inventories the tests compare."""

    def __init__(self, platform: Any, tmp: Path, aws: bool, monkeypatch: pytest.MonkeyPatch) -> None:
        self.platform, self.tmp, self.aws, self.monkeypatch = platform, tmp, aws, monkeypatch

    def settings(self, **extra: str) -> dict[str, str]:
        return {"ATTACH": "true", "KUBE_CONTEXT": "platform", "NAMESPACE": NS, "STORAGE_PATH": "s3://team-a-data/runs",
                "IDLE_MINUTES": "0", "GPU_NODE_COUNT": "2", **extra}

    def up(self, **extra: str) -> Any:
        from raydlc.config import load_config
        from raydlc.lifecycle import orders

        cfg = load_config(env={f"RAYDLC_{k}": v for k, v in self.settings(**extra).items()})
        from raydlc.lifecycle.context import with_plain_kubeconfig

        return orders.up(with_plain_kubeconfig(cfg), timings=FAST)

    def down(self, **extra: str) -> Any:
        from raydlc.config import load_config
        from raydlc.lifecycle import orders
        from raydlc.lifecycle.context import with_plain_kubeconfig

        cfg = load_config(env={f"RAYDLC_{k}": v for k, v in self.settings(**extra).items()})
        return orders.down(with_plain_kubeconfig(cfg), timings=FAST)

    def status(self, **extra: str) -> Any:
        from raydlc import api

        return api.status(settings=self.settings(**extra))

    def outside(self) -> dict[str, Any]:
        return self.platform.outside(RAY)

    def settled(self) -> None:
        self.platform.settled()

    def made(self) -> list[str]:
        return self.platform.made()

    def account(self) -> dict[str, Any]:
        """What the AWS account holds (moto), read over the API: attach must leave it as it was."""
        if not self.aws:
            return {}
        import boto3

        kw = {"region_name": "us-east-2", "endpoint_url": os.environ["AWS_ENDPOINT_URL"]}
        eks, asg, s3 = boto3.client("eks", **kw), boto3.client("autoscaling", **kw), boto3.client("s3", **kw)
        cfn, iam, ec2 = boto3.client("cloudformation", **kw), boto3.client("iam", **kw), boto3.client("ec2", **kw)
        return {"clusters": eks.list_clusters()["clusters"], "buckets": [b["Name"] for b in s3.list_buckets()["Buckets"]],
                "asgs": [g["AutoScalingGroupName"] for g in asg.describe_auto_scaling_groups()["AutoScalingGroups"]],
                "stacks": [s["StackName"] for s in cfn.list_stacks()["StackSummaries"]],
                "roles": [r["RoleName"] for r in iam.list_roles()["Roles"]],
                "vpcs": sorted(v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]),
                "instances": [i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]}


@pytest.fixture
def attached(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Attached]:
    param = getattr(request, "param", "platform")
    knobs = dict(param) if isinstance(param, dict) else {"variant": param}
    aws = knobs.get("variant") != "kind"
    for k in list(os.environ):
        if k.startswith(("RAYDLC_", "AWS_", "DOUBLES_", "KUBECONFIG", "HF_")):
            monkeypatch.delenv(k)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    if aws:
        moto = request.getfixturevalue("moto_server")
        servers.reset_moto(moto)
        for k, v in {"AWS_ENDPOINT_URL": moto, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_MAX_ATTEMPTS": "1"}.items():
            monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    with platform_world.platform_cluster(monkeypatch.setattr, tmp=tmp_path, **knobs) as p:
        monkeypatch.setenv("KUBECONFIG", str(p.kubeconfig()))
        with Operator(p.server.url) as op:
            yield Attached(p, tmp_path, aws, monkeypatch)
        assert not op.errors, op.errors[:3]


@pytest.mark.slow  # up and down end to end on the platform world, as tests/lifecycle/test_scenarios.py
def test_attach_up_makes_only_the_namespaces_objects_status_shows_found_vs_made_and_down_leaves_the_platform(attached) -> None:
    attached.settled()
    before, account = attached.outside(), attached.account()
    run = attached.up()
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    steps = {r.step: r for r in run.results}
    assert {s for s, r in steps.items() if r.action != "none"} == {"raycluster"}  # every other step is found
    assert "found:" in steps["kuberay"].reason and "1.7.0" in steps["kuberay"].reason
    assert attached.outside() == before, "up --attach changed something outside raydlc's objects in the namespace"
    assert attached.account() == account, "up --attach changed the AWS account"
    made = attached.made()
    assert any("/rayclusters/team-a/ray-train-cluster" in k for k in made)
    assert any("/networkpolicies/team-a/" in k for k in made)
    assert any("/serviceaccounts/team-a/raydlc-ray" in k for k in made)  # none given: raydlc makes its own
    assert not any("/namespaces/" in k for k in made)  # the namespace was given: never labelled, never made

    rc = attached.platform.kube.get("RayCluster", "ray-train-cluster", NS)
    workers = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in workers.get("tolerations", []) or \
        any(t.get("key") == "nvidia.com/gpu" for t in workers.get("tolerations", []))
    pods = attached.platform.kube.list("Pod", NS)
    on = {p["metadata"]["labels"].get("ray.io/node-type"): p["spec"].get("nodeName") for p in pods
          if p["metadata"]["labels"].get("ray.io/cluster") == "ray-train-cluster"}
    assert on.get("worker", "").startswith("gpu-"), on  # the workers landed on the found GPU nodes

    now = attached.status().to_dict()
    own = {s["step"]: s["ownership"] for s in now["steps"]}
    assert own["raycluster"] == "made" and {own[s] for s in own if s != "raycluster"} == {"found"}
    assert all(s["source"] for s in now["steps"] if s["ownership"] == "found" and s["step"] != "storage") or True
    assert now["attach"]["facts"]["kuberay"]["operators"]["value"][0]["version"] == "1.7.0"
    assert "RayCluster ray-train-cluster" in now["attach"]["made"]
    found = {r["what"]: r for r in now["attach"]["found"]}
    assert found["KubeRay operator"]["source"] and "v1.7.0 in kuberay-system" in found["KubeRay operator"]["found"]
    from rich.console import Console

    from raydlc.views.lifecycle import print_status

    out = Console(width=80, record=True)
    print_status(now, out)
    text = out.export_text()
    assert "found (the platform's, never changed)" in text and "made by raydlc" in text
    assert now["cost"]["items"] and now["cost"]["total_usd_per_hour"] > 0  # the found g6.12xlarge, priced

    gone = attached.down()
    assert gone.ok, [(r.step, r.reason) for r in gone.failed]
    assert attached.made() == []
    after = attached.outside()
    assert after == before, "down --attach touched what raydlc did not make"
    assert attached.platform.kube.get("RayCluster", platform_world.OTHER_TEAM_CLUSTER, NS) is not None
    assert attached.account() == account
    doc = gone.to_dict()
    assert any("KubeRay" in k or "kuberay" in k.lower() for k in doc["kept"]), doc


@pytest.mark.slow  # the refusal, then up end to end once the rendered Role is applied
@pytest.mark.parametrize("attached", [{"variant": "platform", "grant": False}], indirect=True)
def test_missing_rbac_is_one_error_before_anything_is_made_and_the_rendered_role_fixes_it(attached) -> None:
    from raydlc import api
    from raydlc.errors import InputError

    rules = [r for r in platform_world.TEAM_RULES if "rayclusters" not in r["resources"]]
    rules.append(platform_world.rule(["ray.io"], ["rayclusters"], ["get", "list", "watch", "patch", "delete"]))
    attached.platform.grant(NS, rules)
    with pytest.raises(InputError) as e:
        attached.up()
    assert "create rayclusters" in e.value.message and "render --only rbac" in (e.value.hint or "")
    assert e.value.exit_code == 2
    assert attached.made() == [] and not [k for k in attached.platform.snapshot() if RAY in k], "made before the check"
    rendered = api.render(only="rbac", settings=attached.settings(), subject=f"User:{platform_world.USER}")
    (doc,) = rendered.docs.values()
    attached.platform.apply(doc["items"])  # what the platform team does with it
    assert attached.up().ok


@pytest.mark.parametrize(("attached", "words"), [
    ("no-kuberay", "KubeRay is not installed"),
    ("old-operator", "is v1.5.1"),
    ("no-gpu", "GPU"),
], indirect=["attached"])
def test_a_platform_that_cannot_run_the_raycluster_is_refused_in_one_error_before_anything_is_made(attached, words: str) -> None:
    from raydlc.errors import InputError

    with pytest.raises(InputError) as e:
        attached.up()
    assert words in e.value.message, e.value.message
    assert e.value.exit_code == 2
    assert "\n" not in e.value.message or words != "GPU"  # no GPU capacity is one line; KubeRay's problems one error
    assert attached.made() == [] and not [k for k in attached.platform.snapshot() if RAY in k]  # nothing was made


@pytest.mark.slow  # up and down end to end on the platform world, as tests/lifecycle/test_scenarios.py
@pytest.mark.parametrize("attached", ["nodepool-only"], indirect=True)
def test_no_gpu_node_but_a_nodepool_that_can_make_them_attaches_with_the_workers_left_to_karpenter(attached) -> None:
    run = attached.up(IDLE_MINUTES="15")
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    steps = {r.step: r for r in run.results}
    assert "NodePool" in steps["capacity"].reason and "gpu" in steps["capacity"].reason
    assert "karpenter" in steps["autoscaler"].reason


@pytest.mark.slow  # up and down end to end on the platform world, as tests/lifecycle/test_scenarios.py
@pytest.mark.parametrize("attached", ["hyperpod"], indirect=True)
def test_hyperpod_nodes_are_found_with_their_ml_instance_type(attached) -> None:
    run = attached.up()
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    nodes = {r.step: r for r in run.results}["gpu-nodegroup"].reason
    assert "ml.p5.48xlarge" in nodes and "HyperPod" in nodes
    # a budget is priced from the found type: SageMaker bills ml. types, raydlc's table has no price, so it is refused
    from raydlc.config import load_config
    from raydlc.errors import InputError
    from raydlc.lifecycle.attach import priced_as_found
    from raydlc.render.raycluster import job_deadline

    cfg = priced_as_found(load_config(env={f"RAYDLC_{k}": v for k, v in attached.settings(JOB_MAX_COST_USD="50").items()}))
    assert (cfg.gpu_nodes.instance_type, cfg.gpu_nodes.gpus_per_node) == ("ml.p5.48xlarge", 8)
    with pytest.raises(InputError, match="no hourly price"):
        job_deadline(cfg)
    status = attached.status().to_dict()
    assert any("ml.p5.48xlarge" in u for u in status["cost"]["unpriced"])
    from rich.console import Console

    from raydlc.views.lifecycle import print_status

    out = Console(width=200, record=True)
    print_status(status, out)
    assert "unknown price: 2 × ml.p5.48xlarge" in " ".join(out.export_text().split())


@pytest.mark.slow  # up and down end to end on the platform world, as tests/lifecycle/test_scenarios.py
@pytest.mark.parametrize("attached", ["kind"], indirect=True)
def test_a_kind_cluster_without_aws_attaches_with_kube_context_alone_and_aws_facts_are_not_applicable(attached) -> None:
    run = attached.up(USE_GPU="false", STORAGE_PATH="")
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    now = attached.status(USE_GPU="false", STORAGE_PATH="").to_dict()
    assert now["attach"]["facts"]["eks"]["state"] == "not-applicable"
    cluster = next(s for s in now["steps"] if s["step"] == "cluster")
    assert "not applicable" in cluster["reason"]


@pytest.mark.slow  # a real Ray head, and raydlc's CLI in a subprocess
def test_attach_then_submit_reaches_the_head_through_the_kube_context_and_down_leaves_the_platform(attached, tmp_path: Path) -> None:
    """`submit` on an attached cluster: the head found through KUBE_CONTEXT, the token read from the Secret `up --attach`
    made, the port-forward opened with `--context` (kubectl double), the job run on a real local Ray head standing in
    for the head pod; `down --attach` after it leaves the platform as it was."""
    import base64
    import json
    import subprocess

    from raydlc.edges import local_head

    attached.settled()
    before = attached.outside()
    assert attached.up().ok
    secret = attached.platform.kube.get("Secret", f"{RAY}-ray-token", NS)
    token = base64.b64decode(secret["data"]["auth_token"]).decode()
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("print('hello from an attached cluster', flush=True)\n")
    with local_head.start_head(num_cpus=1, log_dir=tmp_path / "head-log", token=token, timeout=240) as head:
        env, log = servers.doubles_env(tmp_path, sys.executable, {f"{NS}/{RAY}-head-svc:8265": head.dashboard_url.removeprefix("http://")})
        full = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "RAY_ADDRESS", "RAY_AUTH"))}
        full.update(env, RAYDLC_ATTACH="true", RAYDLC_KUBE_CONTEXT="platform", RAYDLC_NAMESPACE=NS)
        p = subprocess.run([sys.executable, "-m", "raydlc", "submit", "hello.py", "--json"], capture_output=True, text=True,
                           cwd=work, env=full, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "hello from an attached cluster" in p.stdout + p.stderr
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc["target"] == "cluster" and doc["status"] == "SUCCEEDED", doc
    forwards = [json.loads(line)["argv"] for line in log.read_text().splitlines() if "port-forward" in line]
    assert forwards and all(a[a.index("--context") + 1] == "platform" for a in forwards), forwards
    assert token not in p.stdout + p.stderr
    assert attached.down().ok
    assert attached.made() == [] and attached.outside() == before


@pytest.mark.parametrize("attached", [{"variant": "platform", "grant": False}], indirect=True)
def test_the_port_forward_is_the_users_own_request_without_its_grant_submit_is_one_line_naming_it(attached, tmp_path: Path) -> None:
    """kubectl's port-forward is authorised as the user (the kubectl double sends the kubeconfig's token: `get`,
    else `create`, on pods/portforward): with the Role `render --only rbac` prints, `up --attach` passes; once the
    platform takes the portforward grant back, `submit` fails before anything is submitted, in one line naming it."""
    import subprocess

    from raydlc import api

    rendered = api.render(only="rbac", settings=attached.settings(), subject=f"User:{platform_world.USER}")
    (doc,) = rendered.docs.values()
    attached.platform.apply(doc["items"])
    role = next(d for d in doc["items"] if d["kind"] == "Role")
    assert {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["create", "get"]} in role["rules"]
    assert attached.up().ok
    attached.platform.apply([{**role, "rules": [r for r in role["rules"] if r["resources"] != ["pods/portforward"]]}])

    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("print('never run', flush=True)\n")
    env, log = servers.doubles_env(tmp_path, sys.executable, {f"{NS}/{RAY}-head-svc:8265": "127.0.0.1:9"})
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "RAY_ADDRESS", "RAY_AUTH"))}
    full.update(env, RAYDLC_ATTACH="true", RAYDLC_KUBE_CONTEXT="platform", RAYDLC_NAMESPACE=NS)
    p = subprocess.run([sys.executable, "-m", "raydlc", "submit", "hello.py"], capture_output=True, text=True, cwd=work,
                       env=full, timeout=120)
    assert p.returncode != 0 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, p.stderr
    assert f'cannot create resource "pods/portforward" in API group "" in the namespace "{NS}"' in errors[0], errors
    assert f'User "{platform_world.USER}"' in errors[0] and f"cannot port-forward to {RAY}-head-svc:8265" in errors[0]
    assert "render --only rbac" in p.stderr  # the hint: the Role that grants it
    assert any(f'"pods/portforward" in API group "" in the namespace "{NS}"' in m for m in attached.platform.rbac.refused)
    assert [json.loads(line)["argv"] for line in log.read_text().splitlines() if "port-forward" in line]  # kubectl ran


def _ray_pod(name: str, role: str, node: str, ip: str, account: str, cluster: str = RAY) -> dict[str, Any]:
    """A pod as KubeRay makes it for a RayCluster: its labels, node, service account, Running with an IP."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {
        "ray.io/cluster": cluster, "ray.io/node-type": role}}, "spec": {"nodeName": node, "serviceAccountName": account},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_verify_reads_as_the_user_only_the_nodes_raydlcs_workers_hold_and_names_the_service_account_that_wrote(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Attached, `verify`'s Kubernetes facts are read with the user's own rights: the GPU node another team's worker
    holds is not judged, the storage answers are named with the ServiceAccount the workers run as (SERVICE_ACCOUNT,
    not raydlc's `raydlc-ray`), EFA is asked of the nodes only when the run expects it, and a node list the platform
    refuses is the gpu-nodes row's evidence, never a crash."""
    import dataclasses

    from raydlc.checks import gate
    from raydlc.checks.storage_access import StoreAnswer
    from raydlc.config import load_config
    from raydlc.edges import kube as k8s

    settings = {"ATTACH": "true", "KUBE_CONTEXT": "platform", "NAMESPACE": NS, "SERVICE_ACCOUNT": "team-a-ray",
                "GPU_NODE_COUNT": "1", "STORAGE_PATH": "s3://team-a-data/runs"}
    cfg = load_config(env={f"RAYDLC_{k}": v for k, v in settings.items()})
    with platform_world.platform_cluster(monkeypatch.setattr, tmp=tmp_path) as p:
        for pod in (_ray_pod(f"{RAY}-head", "head", "system-0", "10.0.0.5", "team-a-ray"),
                    _ray_pod(f"{RAY}-gpu-worker-a", "worker", "gpu-0", "10.0.1.5", "team-a-ray"),
                    _ray_pod("team-b-ray-worker-b", "worker", "gpu-1", "10.0.2.5", "team-b", cluster="team-b-ray")):
            p.kube.create(pod)
        user = k8s.Kube(k8s.load_client(p.kubeconfig(), "platform"))
        facts = gate.kube_facts(user, cfg)
        assert [n.name for n in facts.nodes] == ["gpu-0"] and facts.note is None  # gpu-1 is the other team's
        assert {(x.role, x.service_account) for x in facts.pods} == {("head", "team-a-ray"), ("worker", "team-a-ray")}
        assert gate.storage_target(cfg, "cluster") == ("s3", "s3://team-a-data/runs")
        bare = load_config(env={f"RAYDLC_{k}": v for k, v in {**settings, "STORAGE_PATH": ""}.items()})
        assert gate.storage_target(bare, "cluster") == ("unset", None)  # attached, raydlc made no bucket to probe

        wrote = StoreAnswer(f"{RAY}-gpu-worker-a", True, f"{RAY}-gpu-worker-a: wrote, read and deleted under s3://team-a-data/runs")
        job = gate.JobFact("j", "01000000", "SUCCEEDED")
        assert facts.nodes[0].efa >= 1
        no_efa = [dataclasses.replace(facts.nodes[0], efa=0)]  # a platform whose GPU nodes offer no EFA
        for expect, nodes, status in (("efa", facts.nodes, "pass"), ("efa", no_efa, "fail"), ("socket", no_efa, "pass")):
            rows = {r.criterion: r for r in gate.gate(gate.Facts(
                "cluster", job, expect=expect, gpus_per_node=4, gpu_node_count=1, kube_nodes=nodes, pods=facts.pods,
                storage_kind="s3", storage=[wrote], storage_identity=gate._worker_accounts(facts.pods))).rows}
            assert rows["gpu-nodes"].status == status, (expect, rows["gpu-nodes"])
        assert rows["storage"].status == "pass"
        assert "ServiceAccount team-a-ray" in rows["storage"].evidence[-1] and "raydlc-ray" not in " ".join(rows["storage"].evidence)

        code, _ = p.kube.call("DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/raydlc-discovery")
        assert code < 300  # the platform takes the cluster-wide reads back
        refused = gate.kube_facts(user, cfg)
        assert refused.nodes == [] and "nodes" in (refused.note or "") and "render --only rbac" in (refused.note or "")
        row = next(r for r in gate.gate(gate.Facts("cluster", job, gpus_per_node=4, gpu_node_count=1, kube_nodes=refused.nodes,
                                                   pods=refused.pods, kube_note=refused.note)).rows if r.criterion == "gpu-nodes")
        assert row.status == "fail" and row.evidence == [refused.note]


@pytest.mark.parametrize("attached", ["hyperpod"], indirect=True)
def test_the_rayjob_is_rendered_for_the_found_workers_applied_as_the_user_in_the_namespace_and_down_removes_only_it(attached) -> None:
    """`submit --rayjob` attached, up to where KubeRay takes over: the RayJob `submit --rayjob` renders (on the
    RayCluster `up --attach` rendered against the found HyperPod nodes: 8 GPUs each, their type, taint and EFA) asks
    for one training worker per found GPU, carries raydlc's labels, and is created with the user's namespaced Role in
    the namespace; the code zip goes to the team's bucket; `down --attach` removes it with the rest of raydlc's and
    leaves the platform as it was."""
    import boto3
    import yaml

    from raydlc.config import load_config
    from raydlc.edges import kube as k8s
    from raydlc.jobs import submit, targets

    attached.settled()
    before = attached.outside()
    assert attached.up().ok
    boto3.client("s3", region_name="us-east-2", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(
        Bucket="team-a-data", CreateBucketConfiguration={"LocationConstraint": "us-east-2"})  # the team's, given

    cfg = load_config(env={f"RAYDLC_{k}": v for k, v in attached.settings().items()})
    assert (cfg.gpu_nodes.instance_type, cfg.gpu_nodes.gpus_per_node) == ("g6.12xlarge", 4)  # the defaults, not what was found
    cfg, bucket, doc = submit._rendered_rayjob(submit._as_found(cfg))
    env = yaml.safe_load(doc["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env["RAYDLC_NUM_WORKERS"] == "16"  # 2 found nodes x 8 GPUs, one Ray Train worker per GPU
    assert env["RAYDLC_STORAGE_PATH"] == "s3://team-a-data/runs"
    assert doc["metadata"]["namespace"] == NS and doc["metadata"]["labels"][OWN] == "raydlc"
    assert doc["spec"]["clusterSelector"] == {"ray.io/cluster": RAY}  # the job runs on the attached RayCluster's workers
    assert "nodeSelector" not in doc["spec"]["submitterPodTemplate"]["spec"]  # the platform's scheduler picks a CPU node
    workers = attached.platform.kube.get("RayCluster", RAY, NS)["spec"]["workerGroupSpecs"][0]
    spec = workers["template"]["spec"]
    assert spec["nodeSelector"]["node.kubernetes.io/instance-type"] == "ml.p5.48xlarge" and workers["rayStartParams"]["num-gpus"] == "8"
    assert any(t.get("key") == "nvidia.com/gpu" for t in spec["tolerations"])
    limits = spec["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "8" and int(limits["vpc.amazonaws.com/efa"]) >= 1  # EFA: the found nodes offer it

    user = k8s.Kube(k8s.load_client(attached.platform.kubeconfig(), "platform"))
    reached = targets.Reached(targets.JobTarget(targets.CLUSTER), None, user)  # type: ignore[arg-type]  # no head: KubeRay's part
    said: list[str] = []
    applied = submit._apply_rayjob(reached, cfg, bucket, doc, yes=False, notice=said.append)
    assert (applied.namespace, applied.name, applied.replaced) == (NS, cfg.ray.job_name, False) and applied.code_uploaded
    assert applied.code_zip.startswith("s3://team-a-data/code/")
    stored = attached.platform.kube.get("RayJob", cfg.ray.job_name, NS)
    assert stored is not None and stored["spec"]["clusterSelector"] == doc["spec"]["clusterSelector"]
    assert not attached.platform.rbac.refused, attached.platform.rbac.refused  # the user's namespaced Role was enough
    assert attached.outside() == before

    assert attached.down().ok
    assert attached.platform.kube.get("RayJob", cfg.ray.job_name, NS) is None and attached.made() == []
    assert attached.outside() == before
