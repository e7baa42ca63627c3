"""`up` and `down` against moto, kmock and the tool doubles: the scenarios of the lifecycle issue."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from raydlc import lifecycle
from raydlc.lifecycle import Reporter, StepResult, Timings
from raydlc.lifecycle.types import Interrupted, StepPlan

pytestmark = pytest.mark.slow  # each runs up and/or down end to end: seconds, not milliseconds

# Success paths end as soon as the doubles are done, so their limits only matter on a loaded machine
# (CI's two cores): generous. A test that wants a wait to expire shortens just that wait.
FAST = Timings(poll_s=0.1, cluster_s=120, nodegroup_s=120, stack_s=120, helm_s=120, nodes_s=60, plugins_s=60, pods_s=90)
PLUGINS_EXPIRE = replace(FAST, plugins_s=1.5)
PODS_EXPIRE = replace(FAST, pods_s=3)
UP_ORDER = ["capacity", "storage", "cluster", "gpu-nodegroup", "kuberay", "device-plugins", "raycluster"]
DOWN_ORDER = ["raycluster", "device-plugins", "kuberay", "gpu-nodegroup", "cluster", "storage", "capacity"]
CLUSTER = "eks-cluster"


class Recorder(Reporter):
    """Keeps every event; optionally sends this process a real SIGINT (Ctrl-C) when a step finishes."""

    def __init__(self, interrupt_after: str | None = None) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.interrupt_after = interrupt_after

    def started(self, step: str) -> None:
        self.events.append(("started", step, ""))

    def acting(self, step: str, plan: StepPlan) -> None:
        self.events.append(("acting", step, plan.action))

    def line(self, step: str, text: str) -> None:
        self.events.append(("line", step, text))

    def finished(self, result: StepResult) -> None:
        self.events.append(("finished", result.step, result.outcome))
        if result.step == self.interrupt_after and result.outcome == "done":
            os.kill(os.getpid(), signal.SIGINT)


def by_step(run: lifecycle.Run) -> dict[str, StepResult]:
    return {r.step: r for r in run.results}


def inventory(world: Any) -> dict[str, Any]:
    """What exists, counted: a re-run that duplicated anything changes one of these numbers."""
    eks, ec2 = world.client("eks"), world.client("ec2")
    snap = world.kube.snapshot()
    kinds = Counter(k.split("/")[2] for k in snap)
    helm = sorted(o["metadata"]["name"] for k, o in snap.items() if k.startswith("/v1/secrets/") and
                  (o["metadata"].get("labels") or {}).get("owner") == "helm")
    running = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"] if i["State"]["Name"] == "running"]
    clusters = eks.list_clusters()["clusters"]
    return {
        "clusters": clusters,
        "nodegroups": sorted(eks.list_nodegroups(clusterName=CLUSTER)["nodegroups"]) if clusters else [],
        "instances": Counter(i["InstanceType"] for i in running),
        "stacks": sorted(s["StackName"] for s in world.client("cloudformation").list_stacks()["StackSummaries"]
                         if s["StackStatus"] != "DELETE_COMPLETE"),
        "nodes": kinds["nodes"], "pods": kinds["pods"], "rayclusters": kinds["rayclusters"],
        "daemonsets": kinds["daemonsets"], "deployments": kinds["deployments"], "helm": helm,
    }


FULL = {
    "clusters": [CLUSTER],
    "nodegroups": ["gpu-workers", "system"],
    "instances": Counter({"g6.12xlarge": 2, "m7i.xlarge": 1}),
    "stacks": [f"eksctl-{CLUSTER}-cluster", f"eksctl-{CLUSTER}-nodegroup-gpu-workers", f"eksctl-{CLUSTER}-nodegroup-system",
               f"eksctl-{CLUSTER}-podidentityrole-ray-train-raydlc-ray",  # the Ray head's S3 role (pod identity)
               f"eksctl-{CLUSTER}-podidentityrole-ray-train-raydlc-ray-worker"],  # the GPU workers' S3 role
    "nodes": 3,
    "pods": 2 + 2 + 1 + 3,  # EFA and NVIDIA plugin pods on 2 GPU nodes, the operator, head + 2 workers
    "rayclusters": 1, "daemonsets": 2, "deployments": 1,
    "helm": ["sh.helm.release.v1.kuberay-operator.v1", "sh.helm.release.v1.nvidia-device-plugin.v1"],
}


# ---------------------------------------------------------------------- up


def test_fresh_up_runs_every_step_in_dependency_order_and_a_second_acts_on_nothing(world) -> None:
    rec = Recorder()
    run = lifecycle.up(world.config(), timings=FAST, reporter=rec)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    steps = by_step(run)
    assert [r.step for r in run.results] == UP_ORDER
    assert steps["capacity"].action == "none" and "us-east-2a" in steps["capacity"].reason
    assert {s: steps[s].action for s in UP_ORDER[1:]} == dict.fromkeys(UP_ORDER[1:], "create")
    assert "2 × g6.12xlarge Ready in us-east-2a" in steps["gpu-nodegroup"].reason
    assert "nvidia.com/gpu=4 and vpc.amazonaws.com/efa>=1" in steps["device-plugins"].reason
    assert "2 workers Running" in steps["raycluster"].reason
    started = [s for kind, s, _ in rec.events if kind == "started"]
    done = [s for kind, s, _ in rec.events if kind == "finished"]
    for step, needs in {"cluster": "capacity", "gpu-nodegroup": "cluster", "kuberay": "cluster",
                        "device-plugins": "gpu-nodegroup", "raycluster": "device-plugins"}.items():
        assert done.index(needs) < started.index(step), f"{step} started before {needs} finished"
    assert inventory(world) == FULL
    mutating = [" ".join(a[:3]) for a in world.mutating_calls()]
    assert Counter(mutating) == Counter({"create cluster --config-file": 1, "create nodegroup --config-file": 2,
                                         "upgrade --install kuberay-operator": 1, "upgrade --install nvidia-device-plugin": 1})
    # the owner tag is on every AWS resource raydlc made, and every Kubernetes object it applied
    assert world.client("eks").describe_cluster(name=CLUSTER)["cluster"]["tags"]["raydlc.io/cluster"] == CLUSTER
    ns = world.kube.snapshot()["/v1/namespaces/None/ray-train"]
    assert ns["metadata"]["labels"]["raydlc.io/cluster"] == CLUSTER

    before_calls = len(world.calls())
    again = lifecycle.up(world.config(), timings=FAST)
    assert again.ok
    assert {r.step: r.action for r in again.results} == dict.fromkeys(UP_ORDER, "none")
    looked = world.calls()[before_calls:]
    assert looked, "the second up still looks (helm get metadata, versions)"
    assert all(a[0] in ("version", "status", "get") for a in looked), looked
    assert ["get", "metadata"] in [a[:2] for a in looked] and not any(a[0] == "upgrade" for a in looked)  # no helm upgrade
    assert inventory(world) == FULL


def _kube(world: Any) -> Any:
    from world import Kube

    return Kube(world.kube.url)


def _edit_release(world: Any, name: str, ns: str, edit: Any) -> None:
    """Change what helm's last stored revision of a release says, as a `helm upgrade` by hand would."""
    secret = _kube(world).get("Secret", f"sh.helm.release.v1.{name}.v1", ns)
    rel = json.loads(base64.b64decode(secret["data"]["release"]))
    edit(rel)
    _kube(world).patch("Secret", secret["metadata"]["name"], {"data": {"release": base64.b64encode(json.dumps(rel).encode()).decode()}}, ns)


def test_status_reports_helm_drift_only_when_the_version_or_the_values_differ(world, capsys) -> None:
    """`helm status -o json` prints no chart (the double strips it as helm does): the version is read with
    `helm get metadata`, so an unchanged release is ready, and only a changed version or values is drift."""
    from raydlc.cli import main

    assert lifecycle.up(world.config(), timings=FAST).ok

    def steps() -> dict[str, Any]:
        assert main(["status", "--json"]) == 0
        return {s["step"]: s for s in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"]}

    assert steps()["kuberay"]["state"] == "ready"
    _edit_release(world, "kuberay-operator", "kuberay-operator", lambda r: r["chart"]["metadata"].update(version="1.6.0"))
    got = steps()["kuberay"]
    assert got["state"] == "degraded" and "has chart 1.6.0, the config pins 1.7.0" in got["reason"], got
    _edit_release(world, "kuberay-operator", "kuberay-operator",
                  lambda r: (r["chart"]["metadata"].update(version="1.7.0"), r["config"].update(replicas=3)))
    got = steps()["kuberay"]
    assert got["state"] == "degraded" and "has other values than" in got["reason"], got
    before = len(world.calls("helm"))
    assert lifecycle.up(world.config(), timings=FAST).ok  # the drift is repaired by one upgrade, and only that one
    assert [a[:3] for a in world.calls("helm")[before:] if a[0] == "upgrade"] == [["upgrade", "--install", "kuberay-operator"]]


@pytest.mark.parametrize("step", UP_ORDER[:-1])
def test_up_interrupted_after_each_step_then_rerun_completes_without_duplicates(world, step: str) -> None:
    with pytest.raises(Interrupted) as e:
        lifecycle.up(world.config(), timings=FAST, reporter=Recorder(interrupt_after=step))
    first = {r.step: r.outcome for r in e.value.results}
    assert first[step] == "done" and first["raycluster"] != "done"
    assert e.value.exit_code == 130 and "re-run the same command" in e.value.message
    run = lifecycle.up(world.config(), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    for s, outcome in first.items():  # what finished stays finished; what was cut off is resumed
        if outcome == "done":
            assert by_step(run)[s].action == "none", (s, by_step(run)[s].reason)
    assert inventory(world) == FULL


def test_ctrl_c_during_helm_leaves_a_pending_release_that_up_resolves(world) -> None:
    """helm killed mid-install leaves its release `pending-install`, which blocks every later upgrade.
    The install takes far longer than the Ctrl-C needs to end it (once, under CI's load, 2 s did not)."""
    world.scenario(delays={"install kuberay-operator": 60.0})

    class Mid(Recorder):
        def line(self, step: str, text: str) -> None:
            super().line(step, text)
            if "Installing it now" in text:
                os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        lifecycle.up(world.config(), timings=FAST, reporter=Mid())
    secrets = [o for k, o in world.kube.snapshot().items() if "kuberay-operator.v" in k]
    assert [o["metadata"]["labels"]["status"] for o in secrets] == ["pending-install"]
    world.scenario(delays={})
    run = lifecycle.up(world.config(), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    helm = [" ".join(a[:2]) for a in world.calls("helm")]
    assert "uninstall kuberay-operator" in helm
    assert inventory(world) == FULL


def test_ctrl_c_during_eksctl_create_cluster_leaves_no_pod_identity_that_up_repairs(world) -> None:
    """eksctl makes the add-ons and the pod identity associations itself after the cluster's stack (pkg/ctl/create/cluster.go);
    killed while it waits on the stack, it never makes them, while CloudFormation finishes the cluster. Once in CI the
    SIGINT after the storage step landed there by chance (test_up_interrupted_after_each_step_…[storage]). `status` names
    what is missing; the re-run makes the add-ons, then the associations, and the Ray pods' S3 roles exist."""
    world.scenario(delays={"create cluster": 2.0})

    class Mid(Recorder):
        def line(self, step: str, text: str) -> None:
            super().line(step, text)
            if step == "cluster" and "waiting for CloudFormation stack" in text:
                os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        lifecycle.up(world.config(), timings=FAST, reporter=Mid())
    world.scenario(delays={})
    cut = next(s for s in lifecycle.status(world.config()).steps if s.step == "cluster")
    assert "add-on(s) coredns, eks-pod-identity-agent, kube-proxy, vpc-cni missing" in cut.reason, cut.reason
    assert "pod identity association(s) ray-train/raydlc-ray, ray-train/raydlc-ray-worker missing" in cut.reason
    before = len(world.calls("eksctl"))
    run = lifecycle.up(world.config(), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert by_step(run)["cluster"].action == "repair"
    made = [a[:2] for a in world.calls("eksctl")[before:] if a[0] == "create"]
    assert made.index(["create", "addon"]) < made.index(["create", "podidentityassociation"])
    assert inventory(world) == FULL
    assert next(s for s in lifecycle.status(world.config()).steps if s.step == "cluster").state == "ready"


def test_gpu_node_without_its_efa_plugin_pod_fails_the_plugin_step_naming_it(world) -> None:
    world.scenario(plugin_missing={"aws-efa-k8s-device-plugin": ["gpu:1"]})
    run = lifecycle.up(world.config(), timings=PLUGINS_EXPIRE)
    steps = by_step(run)
    gpu_nodes = sorted(o["metadata"]["name"] for k, o in world.kube.snapshot().items()
                       if k.startswith("/v1/nodes/") and o["metadata"]["labels"].get("role") == "gpu-worker")
    assert steps["device-plugins"].outcome == "failed"
    reason = steps["device-plugins"].reason
    assert f"node {gpu_nodes[1]}" in reason and gpu_nodes[0] not in reason
    assert "vpc.amazonaws.com/efa 0 (want >= 1)" in reason
    assert "no aws-efa-k8s-device-plugin pod on this node" in reason
    assert steps["raycluster"].outcome == "skipped" and "device-plugins" in steps["raycluster"].reason
    assert steps["kuberay"].outcome == "done"  # independent of the failed branch


TEMPLATE = json.dumps({"Resources": {"T": {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": {}}}}})


def eksctl_stack(world: Any, name: str, status: str, *, tags: dict[str, str] | None = None) -> str:
    """A stack as eksctl leaves it after a failed create: its tags, termination protection on; the status flipped in moto."""
    tags = {"alpha.eksctl.io/cluster-name": CLUSTER, "raydlc.io/cluster": CLUSTER} if tags is None else tags
    sid = world.client("cloudformation").create_stack(
        StackName=name, TemplateBody=TEMPLATE, EnableTerminationProtection=True,
        Tags=[{"Key": k, "Value": v} for k, v in tags.items()])["StackId"]
    world.set_stack_status(name, status)  # moto has no failing create
    return str(sid)


def test_stale_rollback_complete_stack_is_removed_and_the_create_retried(world) -> None:
    cfn = world.client("cloudformation")
    stack = f"eksctl-{CLUSTER}-cluster"
    old = eksctl_stack(world, stack, "ROLLBACK_COMPLETE")
    plan = lifecycle.up(world.config(), dry_run=True)
    assert by_step(plan)["cluster"].action == "replace"
    assert f"cloudformation:DeleteStack {stack}" in by_step(plan)["cluster"].commands[0]
    run = lifecycle.up(world.config(), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert "stale stack" in by_step(run)["cluster"].reason
    now = cfn.describe_stacks(StackName=stack)["Stacks"][0]
    assert now["StackId"] != old and now["StackStatus"] == "CREATE_COMPLETE"
    assert now["EnableTerminationProtection"] is True, "the double creates stacks as eksctl does: protected"
    assert [a[:2] for a in world.calls("eksctl")].count(["create", "cluster"]) == 1


def test_a_raw_delete_of_a_stack_eksctl_made_is_refused_as_on_aws(world) -> None:
    """The double and moto are not lenient: eksctl's stacks are termination-protected, DeleteStack alone fails."""
    from botocore.exceptions import ClientError

    assert lifecycle.up(world.config(), until="cluster", timings=FAST).ok
    cfn = world.client("cloudformation")
    stack = f"eksctl-{CLUSTER}-cluster"
    with pytest.raises(ClientError, match="cannot be deleted while TerminationProtection is enabled"):
        cfn.delete_stack(StackName=stack)
    assert cfn.describe_stacks(StackName=stack)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"


def test_a_stack_without_eksctls_tag_for_this_cluster_is_never_deleted(world) -> None:
    stack = f"eksctl-{CLUSTER}-cluster"
    eksctl_stack(world, stack, "ROLLBACK_COMPLETE", tags={"alpha.eksctl.io/cluster-name": "someone-else"})
    run = lifecycle.up(world.config(), timings=FAST)
    cluster = by_step(run)["cluster"]
    assert cluster.outcome == "failed" and "does not bear eksctl's alpha.eksctl.io/cluster-name=eks-cluster tag" in cluster.reason
    cfn = world.client("cloudformation")
    now = cfn.describe_stacks(StackName=stack)["Stacks"][0]
    assert (now["StackStatus"], now["EnableTerminationProtection"]) == ("ROLLBACK_COMPLETE", True)
    assert world.calls("eksctl") == [] or all(a[:1] == ["version"] for a in world.calls("eksctl"))


def test_the_eksctl_double_refuses_a_create_over_a_stale_stack(world) -> None:
    """The double is not lenient: the stale stack really blocks eksctl, as on AWS."""
    import subprocess

    from raydlc.render import render_all

    cfn = world.client("cloudformation")
    cfn.create_stack(StackName=f"eksctl-{CLUSTER}-cluster", TemplateBody=json.dumps(
        {"Resources": {"T": {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": {}}}}}))
    world.set_stack_status(f"eksctl-{CLUSTER}-cluster", "ROLLBACK_COMPLETE")
    f = world.tmp / "c.yaml"
    from raydlc.render import to_yaml

    f.write_text(to_yaml(render_all(world.config(), ["us-east-2a", "us-east-2b"], only="eksctl")["eksctl-cluster.yaml"]))
    r = subprocess.run(["eksctl", "create", "cluster", "--config-file", str(f), "--without-nodegroup"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "AlreadyExistsException" in r.stderr


def test_the_eksctl_double_validates_the_cluster_config_it_is_given(world) -> None:
    import subprocess

    f = world.tmp / "bad.yaml"
    f.write_text("apiVersion: eksctl.io/v1alpha5\nkind: ClusterConfig\nmetadata: {name: x, region: us-east-2}\n"
                 "managedNodeGroups: [{name: g, instanceType: g6.12xlarge, efaEnabled: yes-please}]\n")
    r = subprocess.run(["eksctl", "create", "cluster", "--config-file", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "invalid ClusterConfig" in r.stderr and "efaEnabled" in r.stderr
    r = subprocess.run(["eksctl", "create", "cluster", "--config-file", str(f), "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unrecognized arguments" in r.stderr
    assert world.client("eks").list_clusters()["clusters"] == []


def test_node_group_short_of_capacity_in_the_first_az_comes_up_in_the_second(world) -> None:
    world.fail_nodegroups_in({"us-east-2a"})  # moto's node groups are ACTIVE at once; this flips them
    run = lifecycle.up(world.config(), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert world.patches == ["gpu-workers CREATE_FAILED in us-east-2a"]
    assert "Ready in us-east-2b" in by_step(run)["gpu-nodegroup"].reason
    assert any("InsufficientInstanceCapacity" in n and "us-east-2b" in n for n in run.notes["gpu-nodegroup"])
    eksctl = [a[:2] + a[-3:-2] for a in world.calls("eksctl") if a[:2] in (["create", "nodegroup"], ["delete", "nodegroup"])]
    assert [a[:2] for a in eksctl] == [["create", "nodegroup"], ["create", "nodegroup"], ["delete", "nodegroup"], ["create", "nodegroup"]]
    ng = world.client("eks").describe_nodegroup(clusterName=CLUSTER, nodegroupName="gpu-workers")["nodegroup"]
    zones = {s["AvailabilityZone"] for s in world.client("ec2").describe_subnets(SubnetIds=ng["subnets"])["Subnets"]}
    assert zones == {"us-east-2b"}
    rendered = (Path(os.environ["HOME"]) / ".raydlc" / f"{CLUSTER}-us-east-2" / "eksctl-cluster.yaml").read_text()
    assert "- us-east-2b\n" in rendered.split("name: gpu-workers")[1]
    assert inventory(world) == FULL


def test_node_group_rolled_back_for_capacity_leaves_a_protected_stack_that_up_clears_before_the_next_az(world) -> None:
    """As on AWS: the failed group's stack rolls back to ROLLBACK_COMPLETE, still protected, and blocks the name."""
    world.roll_back_nodegroups_in({"us-east-2a"})
    rec = Recorder()
    run = lifecycle.up(world.config(), timings=FAST, reporter=rec)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert world.patches == ["gpu-workers rolled back in us-east-2a"]
    assert "Ready in us-east-2b" in by_step(run)["gpu-nodegroup"].reason
    assert any("InsufficientInstanceCapacity" in n and "us-east-2b" in n for n in run.notes["gpu-nodegroup"])
    lines = [t for kind, step, t in rec.events if kind == "line" and step == "gpu-nodegroup"]
    stack = f"eksctl-{CLUSTER}-nodegroup-gpu-workers"
    assert f"turning off the termination protection eksctl put on stack {stack}" in lines
    assert lines.index(f"turning off the termination protection eksctl put on stack {stack}") < lines.index(
        "trying the next ranked AZ: us-east-2b")
    eksctl = [a[:2] for a in world.calls("eksctl") if a[:2] in (["create", "nodegroup"], ["delete", "nodegroup"])]
    assert eksctl == [["create", "nodegroup"]] * 3, "no group was left to delete: the rollback took it"
    now = world.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0]
    assert (now["StackStatus"], now["EnableTerminationProtection"]) == ("CREATE_COMPLETE", True)
    assert inventory(world) == FULL


def test_capacity_failure_in_an_az_the_user_chose_is_reported_not_moved(world) -> None:
    world.fail_nodegroups_in({"us-east-2a"})
    run = lifecycle.up(world.config(RAYDLC_GPU_AZ="us-east-2a"), timings=FAST)
    gpu = by_step(run)["gpu-nodegroup"]
    assert gpu.outcome == "failed"
    assert "us-east-2a: AsgInstanceLaunchFailures" in gpu.reason and "InsufficientInstanceCapacity" in gpu.reason
    assert "us-east-2b" not in gpu.reason
    assert "GPU_AZ" in (gpu.error.hint or "")
    assert world.client("eks").list_nodegroups(clusterName=CLUSTER)["nodegroups"] == ["system"], "the failed group is removed"


def test_head_pending_for_insufficient_cpu_is_named_with_the_schedulers_reason(world) -> None:
    assert lifecycle.up(world.config(), until="device-plugins", timings=FAST).ok
    from world import Kube

    kube = Kube(world.kube.url)
    system = next(o for k, o in world.kube.snapshot().items()
                  if k.startswith("/v1/nodes/") and o["metadata"]["labels"].get("role") == "system")
    kube.patch("Node", system["metadata"]["name"], {"status": {"allocatable": {"cpu": "1500m"}}})
    run = lifecycle.up(world.config(), timings=PODS_EXPIRE)
    rc = by_step(run)["raycluster"]
    assert rc.outcome == "failed"
    assert "pod ray-train-cluster-head (head) is Pending: FailedScheduling: 0/3 nodes are available" in rc.reason
    assert "Insufficient cpu" in rc.reason and "Insufficient cpu" in (rc.error.hint or "")


def test_with_no_aws_cli_up_and_status_reach_the_cluster_through_raydlcs_token_plugin(world, capsys) -> None:
    """eksctl writes an exec plugin of aws-iam-authenticator even when it is not installed; raydlc's replaces it."""
    import shutil

    import yaml

    from raydlc.cli import main

    assert shutil.which("aws") is None and shutil.which("aws-iam-authenticator") is None
    rec = Recorder()
    run = lifecycle.up(world.config(), until="cluster", timings=FAST, reporter=rec)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    path = Path(os.environ["HOME"]) / ".raydlc" / f"{CLUSTER}-us-east-2" / "kubeconfig"
    doc = yaml.safe_load(path.read_text())
    (user,) = doc["users"]
    ex = user["user"]["exec"]
    assert Path(ex["command"]).is_absolute() and Path(ex["command"]).exists()
    assert ex["args"][-5:] == ["eks-token", "--cluster", CLUSTER, "--region", "us-east-2"]
    assert (path.stat().st_mode & 0o777) == 0o600
    assert any("STS accepts an EKS token signed as arn:aws:sts::123456789012:" in t for _, _, t in rec.events)
    assert main(["status", "--json"]) == 0
    steps = {s["step"]: s["state"] for s in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"]}
    assert steps["cluster"] == "ready"
    shown = json.dumps(rec.events) + world.log.read_text() + json.dumps(run.to_dict())
    assert "k8s-aws-v1." not in shown and "X-Amz-Signature" not in shown


def test_up_whose_token_sts_refuses_stops_before_anything_is_created(world, capsys) -> None:
    from servers import refusing_sts

    from raydlc.cli import main

    before = world.aws_snapshot()
    # The bucket named, so up needs no account id: STS is asked only to judge the token it replays.
    world.monkeypatch.setenv("RAYDLC_STORAGE_BUCKET", "raydlc-token-test")
    with refusing_sts() as url:
        world.monkeypatch.setenv("AWS_ENDPOINT_URL_STS", url)
        assert main(["up"]) == 2
    err = capsys.readouterr().err
    assert "error: STS at" in err and "refused the EKS token" in err and "InvalidClientTokenId" in err
    assert world.mutating_calls() == [] and world.aws_snapshot() == before


@pytest.mark.parametrize("name", ["HF_TOKEN", "MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY"])  # the trackers' tokens too (train.tracking)
def test_hf_token_becomes_a_secret_and_appears_nowhere_else(name: str, world, capsys: pytest.CaptureFixture[str]) -> None:
    token = "hf_" + "Zq7" * 10
    world.monkeypatch.setenv(name, token)
    rec = Recorder()
    run = lifecycle.up(world.config(), timings=FAST, reporter=rec)
    assert run.ok
    snap = world.kube.snapshot()
    secret = snap["/v1/secrets/ray-train/raydlc-secrets"]
    assert base64.b64decode(secret["data"][name]).decode() == token
    head = snap["ray.io/v1/rayclusters/ray-train/ray-train-cluster"]["spec"]["headGroupSpec"]["template"]["spec"]
    env = {e["name"]: e for e in head["containers"][0]["env"]}
    assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "raydlc-secrets", "key": name, "optional": True}
    elsewhere = [json.dumps(rec.events), world.log.read_text(), json.dumps(run.to_dict()), capsys.readouterr().out]
    elsewhere += [p.read_text() for p in (Path(os.environ["HOME"]) / ".raydlc").rglob("*") if p.is_file()]
    elsewhere += [json.dumps(o) for k, o in snap.items() if k != "/v1/secrets/ray-train/raydlc-secrets"]
    assert not [t for t in elsewhere if token in t]


# ---------------------------------------------------------------------- down


def test_down_after_a_partial_up_removes_what_exists_and_reports_what_was_absent(world) -> None:
    assert lifecycle.up(world.config(), until="cluster", timings=FAST).ok
    run = lifecycle.down(world.config(), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    steps = by_step(run)
    assert {s: steps[s].action for s in ("raycluster", "device-plugins", "kuberay", "gpu-nodegroup")} == dict.fromkeys(
        ("raycluster", "device-plugins", "kuberay", "gpu-nodegroup"), "none")
    assert steps["cluster"].action == "delete"
    doc = run.to_dict()
    assert f"EKS cluster {CLUSTER}" in doc["removed"]
    assert any("release nvidia-device-plugin is not installed" in a for a in doc["absent"]), doc
    assert any("node group gpu-workers does not exist" in a for a in doc["absent"])
    assert world.tagged(CLUSTER) == {}


def test_down_interrupted_then_rerun_leaves_nothing_tagged_for_the_cluster(world) -> None:
    world.reservations.append({"CapacityReservationId": "cr-0probe", "State": "active",
                               "Tags": [{"Key": "raydlc:capacity-probe", "Value": "t"}]})
    assert lifecycle.up(world.config(), timings=FAST).ok
    kubeconfig = Path(os.environ["HOME"]) / ".raydlc" / f"{CLUSTER}-us-east-2" / "kubeconfig"
    assert kubeconfig.is_file() and world.tagged(CLUSTER)
    with pytest.raises(Interrupted) as e:
        lifecycle.down(world.config(), timings=FAST, reporter=Recorder(interrupt_after="gpu-nodegroup"))
    first = by_step(lifecycle.Run("down", False, e.value.results))
    assert first["gpu-nodegroup"].outcome == "done" and first["capacity"].outcome != "done"
    assert world.tagged(CLUSTER)
    run = lifecycle.down(world.config(), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert [r.step for r in run.results] == DOWN_ORDER
    assert {r.step: r.action for r in run.results} == {
        **dict.fromkeys(["raycluster", "device-plugins", "kuberay", "gpu-nodegroup"], "none"), "cluster": "delete",
        "storage": "none", "capacity": "delete"}  # the bucket is kept: down leaves it and nothing else
    # the zip `up` put under code/ is named apart from the runs
    assert run.to_dict()["kept"] == ["S3 bucket raydlc-123456789012-us-east-2-eks-cluster (0 objects, 0 B, plus 1 code zip)"]
    assert world.tagged(CLUSTER) == {}
    assert not kubeconfig.exists()
    assert "capacity reservation cr-0probe" in " ".join(run.to_dict()["removed"])
    again = lifecycle.down(world.config(), timings=FAST)
    assert again.ok and all(r.action == "none" for r in again.results)


def test_down_removes_what_a_failed_cluster_delete_left_billing(world) -> None:
    assert lifecycle.up(world.config(), until="cluster", timings=FAST).ok
    world.scenario(delete_leaves_nat=True)
    world.stack_delete_fails_once(f"eksctl-{CLUSTER}-cluster")  # CloudFormation's DELETE_FAILED, flipped in moto
    run = lifecycle.down(world.config(), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    removed = " ".join(run.to_dict()["removed"])
    assert "NAT gateway nat-" in removed and "Elastic IP eipalloc-" in removed and f"stack eksctl-{CLUSTER}-cluster" in removed
    assert world.tagged(CLUSTER) == {}


def test_down_sweeps_the_protected_stacks_a_failed_up_left(world) -> None:
    """A create that failed before any cluster existed leaves eksctl's stacks ROLLBACK_COMPLETE and protected."""
    eksctl_stack(world, f"eksctl-{CLUSTER}-cluster", "ROLLBACK_COMPLETE")
    eksctl_stack(world, f"eksctl-{CLUSTER}-addon-vpc-cni", "CREATE_COMPLETE")
    plan = lifecycle.down(world.config(), dry_run=True)
    assert by_step(plan)["cluster"].action == "delete"
    run = lifecycle.down(world.config(), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    removed = " ".join(run.to_dict()["removed"])
    assert f"stack eksctl-{CLUSTER}-cluster" in removed and f"stack eksctl-{CLUSTER}-addon-vpc-cni" in removed
    assert world.tagged(CLUSTER) == {}
    assert world.calls("eksctl") == [] or all(a[:1] == ["version"] for a in world.calls("eksctl"))


def test_down_keep_cluster_stops_after_the_node_groups_and_up_brings_back_the_rest(world) -> None:
    assert lifecycle.up(world.config(), timings=FAST).ok
    run = lifecycle.down(world.config(), keep_cluster=True, timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert "cluster" not in by_step(run)
    left = inventory(world)
    assert left["clusters"] == [CLUSTER] and left["nodegroups"] == ["system"]
    assert left["instances"] == Counter({"m7i.xlarge": 1}) and left["rayclusters"] == 0 and left["helm"] == []
    again = lifecycle.up(world.config(), timings=FAST)
    assert again.ok, [(r.step, r.reason) for r in again.failed]
    assert {r.step: r.action for r in again.results} == {
        "capacity": "none", "storage": "none", "cluster": "none", **dict.fromkeys(UP_ORDER[3:], "create")}
    assert inventory(world) == FULL


def test_down_refuses_a_cluster_raydlc_did_not_create_unless_forced(world) -> None:
    from raydlc.errors import InputError

    ec2, eks = world.client("ec2"), world.client("eks")
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    sub = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.0.0/24", AvailabilityZone="us-east-2a")["Subnet"]["SubnetId"]
    eks.create_cluster(name=CLUSTER, roleArn="arn:aws:iam::123456789012:role/someone", resourcesVpcConfig={"subnetIds": [sub]})
    with pytest.raises(InputError, match="was not created by raydlc"):
        lifecycle.down(world.config(), timings=FAST)
    with pytest.raises(InputError, match="was not created by raydlc"):
        lifecycle.down(world.config(), dry_run=True)
    plan = lifecycle.up(world.config(), dry_run=True)
    assert by_step(plan)["cluster"].action == "refuse"
    assert eks.list_clusters()["clusters"] == [CLUSTER]
    run = lifecycle.down(world.config(), timings=FAST, force=True)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert eks.list_clusters()["clusters"] == []


# ---------------------------------------------------------------------- dry run and partial runs


def _unchanged(world: Any, fn: Any) -> Any:
    aws, kube = world.aws_snapshot(), world.kube.snapshot()
    home = sorted(str(p) for p in Path(os.environ["HOME"]).rglob("*"))
    calls = len(world.mutating_calls())
    out = fn()
    assert world.aws_snapshot() == aws
    assert world.kube.snapshot() == kube
    assert sorted(str(p) for p in Path(os.environ["HOME"]).rglob("*")) == home
    assert len(world.mutating_calls()) == calls
    return out


@pytest.mark.parametrize("command", ["up", "down"])
def test_dry_run_on_a_fresh_account_lists_the_steps_and_changes_nothing(world, capsys, command: str) -> None:
    from raydlc.cli import main

    rc = _unchanged(world, lambda: main([command, "--dry-run", "--json"]))
    assert rc == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    names = [s["step"] for s in doc["steps"]]
    assert sorted(names) == sorted(UP_ORDER)
    assert names == (UP_ORDER if command == "up" else DOWN_ORDER)
    assert all(set(s) == {"step", "action", "reason", "command"} for s in doc["steps"])
    if command == "up":
        acts = {s["step"]: s["action"] for s in doc["steps"]}
        assert acts == {"capacity": "none", **dict.fromkeys(UP_ORDER[1:], "create")}
        cluster = next(s for s in doc["steps"] if s["step"] == "cluster")
        assert "eksctl create cluster --config-file" in cluster["command"] and "--without-nodegroup" in cluster["command"]
    else:
        assert all(s["action"] == "none" for s in doc["steps"])


def test_until_and_only_run_just_those_steps(world) -> None:
    run = lifecycle.up(world.config(), until="gpu-nodegroup", timings=FAST)
    assert [r.step for r in run.results] == ["capacity", "cluster", "gpu-nodegroup"] and run.ok
    assert world.calls("helm") == [], "no step that runs helm was selected"
    only = lifecycle.up(world.config(), only="kuberay", timings=FAST)
    assert [r.step for r in only.results] == ["kuberay"] and only.ok
    rest = lifecycle.up(world.config(), from_="device-plugins", timings=FAST)
    assert [r.step for r in rest.results] == ["device-plugins", "raycluster"] and rest.ok
    assert inventory(world) == FULL


# ---------------------------------------------------------------------- status


def test_status_and_dry_runs_on_a_running_cluster(world, capsys) -> None:
    """status: each step, the nodes with GPUs/EFA, the Ray pods, the cost; dry runs change nothing."""
    from raydlc.cli import main

    assert lifecycle.up(world.config(), timings=FAST).ok
    assert main(["status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(s["step"], s["state"]) for s in doc["steps"]] == [(s, "ready") for s in UP_ORDER]
    gpu = [n for n in doc["nodes"] if n["role"] == "gpu-worker"]
    assert len(gpu) == 2 and all((n["gpu"], n["efa"], n["instance_type"], n["zone"], n["ready"]) ==
                                 (4, 1, "g6.12xlarge", "us-east-2a", True) for n in gpu)
    pods = doc["raycluster"]["pods"]
    assert sorted(p["type"] for p in pods) == ["head", "worker", "worker"]
    assert {p["node"] for p in pods if p["type"] == "worker"} == {n["name"] for n in gpu}
    cost = doc["cost"]
    assert cost["estimate"] is True and "as of 2025-06" in cost["prices"]
    assert cost["total_usd_per_hour"] == round(2 * 4.6016 + 0.2016 + 0.10 + 0.045, 2) == 9.55
    assert main(["status"]) == 0
    human = capsys.readouterr().out
    assert "$9.55/h (estimate)" in human and "g6.12xlarge" in human

    # the dry runs on this running cluster: up has nothing to do, down plans the teardown
    assert _unchanged(world, lambda: main(["up", "--dry-run", "--json"])) == 0
    up = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {s["action"] for s in up["steps"]} == {"none"}
    assert _unchanged(world, lambda: main(["down", "--dry-run", "--json"])) == 0
    down = {s["step"]: s for s in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"]}
    assert {k: v["action"] for k, v in down.items()} == {
        **dict.fromkeys(UP_ORDER[2:], "delete"), "storage": "none", "capacity": "none"}
    assert "`raydlc down --delete-storage` removes it" in down["storage"]["reason"]
    assert down["cluster"]["command"].startswith(f"eksctl delete cluster --name {CLUSTER} --region us-east-2 --wait")
    assert "helm uninstall kuberay-operator --namespace kuberay-operator" in down["kuberay"]["command"]


def test_a_changed_pod_template_recreates_the_ray_pods_only_when_agreed(world) -> None:
    """KubeRay v1.7.0 keeps the old pods of a changed RayCluster unless `upgradeStrategy: Recreate` (rendered);
    `up` names what changed and that running jobs stop, refuses without --yes, and with it waits for the new pods."""
    assert lifecycle.up(world.config(), timings=FAST).ok
    kube = _kube(world)
    for p in kube.list("Pod", "ray-train"):  # kmock gives no uid: a label tells the old pods from new ones
        kube.patch("Pod", p["metadata"]["name"], {"metadata": {"labels": {"test/old": "yes"}}}, "ray-train")
    old = sorted(p["metadata"]["name"] for p in kube.list("Pod", "ray-train"))
    image = "763104351884.dkr.ecr.us-east-2.amazonaws.com/ray:2.58.0-gpu-py312-cu130-ubuntu22.04-ec2-v2"
    changed = world.config(RAYDLC_DLC_IMAGE=image, RAYDLC_NCCL_NET="Socket")

    plan = {s.step: s for s in lifecycle.up(changed, dry_run=True).results}["raycluster"]
    assert plan.action == "replace" and "running jobs will stop" in plan.reason
    assert "gpu-workers/ray-worker: image " in plan.reason and f"-> {image}" in plan.reason
    assert "gpu-workers/ray-worker: env NCCL_NET Libfabric -> Socket" in plan.reason
    assert "headgroup/ray-head: image " in plan.reason

    refused = by_step(lifecycle.up(changed, timings=FAST))["raycluster"]
    assert refused.outcome == "failed" and "stops the running jobs, so nothing was changed" in refused.reason
    kept = kube.list("Pod", "ray-train")
    assert sorted(p["metadata"]["name"] for p in kept) == old and all(p["metadata"]["labels"].get("test/old") for p in kept)

    agreed = lifecycle.up(changed, timings=FAST, yes=True)
    assert agreed.ok, [(r.step, r.reason) for r in agreed.failed]
    pods = kube.list("Pod", "ray-train")
    assert len(pods) == 3 and not any(p["metadata"]["labels"].get("test/old") for p in pods)  # every Ray pod is new
    assert {c["image"] for p in pods for c in p["spec"]["containers"]} == {image}
    assert {s.step: s.action for s in lifecycle.up(changed, dry_run=True).results}["raycluster"] == "none"


def test_the_kuberay_double_keeps_old_pods_without_the_recreate_strategy(world) -> None:
    """The double's side of KubeRay's rule: a spec change without `upgradeStrategy: Recreate` leaves the pods as they are."""
    assert lifecycle.up(world.config(), timings=FAST).ok
    kube = _kube(world)
    rc = kube.get("RayCluster", "ray-train-cluster", "ray-train")
    assert rc["spec"]["upgradeStrategy"] == {"type": "Recreate"}
    head = next(p for p in kube.list("Pod", "ray-train") if p["metadata"]["labels"]["ray.io/node-type"] == "head")
    assert head["metadata"]["annotations"]["ray.io/kuberay-version"] == "v1.7.0"
    for p in kube.list("Pod", "ray-train"):
        kube.patch("Pod", p["metadata"]["name"], {"metadata": {"labels": {"test/old": "yes"}}}, "ray-train")
    spec = rc["spec"]
    spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = "other:1"
    spec["upgradeStrategy"] = {"type": "None"}
    kube.patch("RayCluster", "ray-train-cluster", {"spec": spec}, "ray-train")
    time.sleep(1.0)  # ten ticks of the operator
    pods = kube.list("Pod", "ray-train")
    assert len(pods) == 3 and all(p["metadata"]["labels"].get("test/old") for p in pods)
    assert "other:1" not in {c["image"] for p in pods for c in p["spec"]["containers"]}


def test_spot_up_creates_a_spot_gpu_node_group_and_an_on_demand_system_group(world) -> None:
    run = lifecycle.up(world.config(RAYDLC_GPU_CAPACITY_TYPE="spot"), timings=FAST)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    eks = world.client("eks")
    ng = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName="gpu-workers")["nodegroup"]
    system = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName="system")["nodegroup"]
    assert (ng["capacityType"], system["capacityType"]) == ("SPOT", "ON_DEMAND")
    assert by_step(run)["gpu-nodegroup"].reason.endswith(", Spot capacity")
    rendered = (Path(os.environ["HOME"]) / ".raydlc" / f"{CLUSTER}-us-east-2" / "eksctl-cluster.yaml").read_text()
    assert "spot: true" in rendered.split("name: gpu-workers")[1] and "spot: true" not in rendered.split("name: gpu-workers")[0]


def test_spot_then_on_demand_falls_back_to_on_demand_when_spot_has_no_capacity(world) -> None:
    world.no_spot_capacity_in({"us-east-2a", "us-east-2b", "us-east-2c"})
    rec = Recorder()
    run = lifecycle.up(world.config(RAYDLC_GPU_CAPACITY_TYPE="spot-then-on-demand"), timings=FAST, reporter=rec)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert world.patches and all(p.startswith("gpu-workers no Spot capacity in ") for p in world.patches)
    ng = world.client("eks").describe_nodegroup(clusterName=CLUSTER, nodegroupName="gpu-workers")["nodegroup"]
    assert ng["capacityType"] == "ON_DEMAND"
    assert not by_step(run)["gpu-nodegroup"].reason.endswith(", Spot capacity")
    assert any("UnfulfillableCapacity" in n and "came up On-Demand" in n for n in run.notes["gpu-nodegroup"])
    lines = [t for kind, step, t in rec.events if kind == "line" and step == "gpu-nodegroup"]
    assert any(t.startswith("no Spot capacity; falling back to On-Demand") for t in lines)


def test_spot_alone_does_not_fall_back_and_says_how_to(world) -> None:
    world.no_spot_capacity_in({"us-east-2a", "us-east-2b", "us-east-2c"})
    run = lifecycle.up(world.config(RAYDLC_GPU_CAPACITY_TYPE="spot"), timings=FAST)
    gpu = by_step(run)["gpu-nodegroup"]
    assert gpu.outcome == "failed" and "(Spot): AsgInstanceLaunchFailures" in gpu.reason and "UnfulfillableCapacity" in gpu.reason
    assert "(On-Demand)" not in gpu.reason
    assert [c[:2] for c in world.calls("eksctl")].count(["create", "nodegroup"]) >= 2


def test_spot_quota_exceeded_goes_to_on_demand_at_once_under_spot_then_on_demand(world) -> None:
    """MaxSpotInstanceCountExceeded is the region's Spot quota, not one AZ's capacity: one Spot try, then On-Demand."""
    world.spot_quota_exceeded()
    rec = Recorder()
    run = lifecycle.up(world.config(RAYDLC_GPU_CAPACITY_TYPE="spot-then-on-demand"), timings=FAST, reporter=rec)
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    assert len(world.patches) == 1 and world.patches[0].startswith("gpu-workers Spot quota exceeded in ")
    ng = world.client("eks").describe_nodegroup(clusterName=CLUSTER, nodegroupName="gpu-workers")["nodegroup"]
    assert ng["capacityType"] == "ON_DEMAND"
    assert any("MaxSpotInstanceCountExceeded" in n and "came up On-Demand" in n for n in run.notes["gpu-nodegroup"])


def test_spot_quota_exceeded_under_spot_is_one_clear_error(world) -> None:
    world.spot_quota_exceeded()
    run = lifecycle.up(world.config(RAYDLC_GPU_CAPACITY_TYPE="spot"), timings=FAST)
    gpu = by_step(run)["gpu-nodegroup"]
    assert gpu.outcome == "failed" and "MaxSpotInstanceCountExceeded" in gpu.reason and "(On-Demand)" not in gpu.reason
    hint = getattr(gpu.error, "hint", None) or ""  # the StepFailed's hint
    assert "Spot vCPU quota" in hint and "spot-then-on-demand" in hint
    gpu_creates = [c for c in world.calls("eksctl") if c[:2] == ["create", "nodegroup"] and "gpu-workers" in c]
    assert len(gpu_creates) == 1  # no other AZ is tried: same quota


def test_status_shows_the_spot_price_beside_on_demand_and_prices_spot_nodes_at_it(world, capsys) -> None:
    """The GPU nodes are Spot: `status` prices them at the live Spot price (DescribeSpotPriceHistory) and shows
    the On-Demand list price beside it; the system node stays On-Demand."""
    from raydlc.cli import main

    world.spot_price_is(1.75)
    os.environ["RAYDLC_GPU_CAPACITY_TYPE"] = "spot"
    try:
        assert lifecycle.up(world.config(), timings=FAST).ok
        assert main(["status", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        p = doc["gpu_prices"]
        assert (p["az"], p["capacity_type"], p["on_spot"], p["run_price"]) == ("us-east-2a", "spot", True, "spot")
        assert (p["on_demand_usd_per_node_hour"], p["spot_usd_per_node_hour"]) == (4.6016, 1.75)
        assert (p["on_demand_usd_per_hour"], p["spot_usd_per_hour"]) == (9.2032, 3.5)
        items = {i["item"]: i for i in doc["cost"]["items"]}
        assert items["g6.12xlarge instance (Spot)"]["usd_per_hour"] == 3.5 and "g6.12xlarge instance" not in items
        assert doc["cost"]["total_usd_per_hour"] == round(3.5 + 0.2016 + 0.10 + 0.045, 2)
        assert main(["status"]) == 0
        human = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
        assert "on-demand $9.20/h, spot $3.50/h; GPU_CAPACITY_TYPE=spot, runs priced at spot" in human
    finally:
        del os.environ["RAYDLC_GPU_CAPACITY_TYPE"]


def test_down_dry_run_beside_an_active_cluster_whose_api_does_not_answer_plans_the_removals_and_says_why(world) -> None:
    """An ACTIVE cluster whose API server cannot be reached through the kubeconfig is not a gone cluster: the
    releases and the Ray objects are planned for removal, each saying the API server does not answer."""
    import socket

    from raydlc.lifecycle.context import kubeconfig_path

    assert lifecycle.up(world.config(), timings=FAST).ok
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{s.getsockname()[1]}"
    kc = kubeconfig_path(world.config())
    kc.write_text(kc.read_text().replace(world.kube.url, refused))
    plan = by_step(lifecycle.down(world.config(), keep_cluster=True, dry_run=True))
    releases = [name for name, r in plan.items() if any("helm" in c and "uninstall" in c for c in r.commands)]
    assert {"kuberay", "raycluster"} <= set(plan) and "cluster" not in plan
    for name in ["kuberay", "raycluster", *releases]:
        r = plan[name]
        assert r.action == "delete", (name, r)
        assert "its API server does not answer" in r.reason and "the cluster is gone" not in r.reason, (name, r.reason)
    assert len(releases) >= 2, plan  # KubeRay and the device plugins at least
    whole = by_step(lifecycle.down(world.config(), dry_run=True))  # the cluster goes too: what is inside goes with it
    for name in ["kuberay", "raycluster", *releases]:
        assert whole[name].action == "none" and "goes when the cluster is deleted" in whole[name].reason, (name, whole[name])
    assert whole["cluster"].action == "delete"


def test_up_and_down_exit_2_when_the_failure_is_the_users_input(world, capsys: pytest.CaptureFixture[str]) -> None:
    """An unusable ~/.raydlc (here a file) or a garbage --kubeconfig is the user's to fix: exit 2, as for any
    other command, with the path named; the failure of the world (the API, AWS) stays exit 1."""
    from raydlc.cli import main

    home = Path(os.environ["HOME"])
    (home / ".raydlc").write_text("not a directory")
    assert main(["up", "--json"]) == 2
    err = capsys.readouterr().err
    assert ".raydlc" in err and "Traceback" not in err, err
    (home / ".raydlc").unlink()
    assert lifecycle.up(world.config(), timings=FAST).ok
    garbage = home / "kc"
    garbage.write_text("clusters: [unclosed\n")
    assert main(["down", "--keep-cluster", "--kubeconfig", str(garbage), "--json"]) == 2
    err = capsys.readouterr().err
    assert f"kubeconfig {garbage} cannot be used" in err and "Traceback" not in err, err
