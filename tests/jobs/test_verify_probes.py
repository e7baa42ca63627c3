"""The two inside-the-cluster criteria of `verify`: the run prefix (storage) and the head's port (head-port).

storage: the node-side probe (`raydlc.checks.storage_access`, pyarrow as Ray Train uses it) against a real moto
server that enforces IAM, as a user whose only policy is the one the Ray pods get
(`raydlc.render.bucket.pod_policy`), run as a Ray task pinned to a node of a real local Ray; a
widened policy lets the outside write through and the criterion fails. head-port: the probe pod
made through raydlc's Kubernetes gateway against kmock, run by the `netpolicy` double, which judges
the connect by the NetworkPolicies stored there (the rendered one, or none).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from raydlc.checks import gate, head_isolation, storage_access
from raydlc.checks.gate import FAIL, NA, PASS, Facts, JobFact
from raydlc.checks.head_isolation import HeadReach, PodOutcome
from raydlc.config import load_config
from raydlc.edges import kube as k8s
from raydlc.edges import poll
from raydlc.render.bucket import Bucket, pod_policy
from raydlc.render.netpol import head_policy
from raydlc.render.raycluster import CLUSTER_LABEL

DOUBLES = Path(__file__).resolve().parents[1] / "doubles"
sys.path.insert(0, str(DOUBLES))
import netpolicy  # noqa: E402
import servers  # noqa: E402
from world import Kube as RawKube  # noqa: E402

JOB = JobFact("train-1", "02000000", "SUCCEEDED")
BUCKET = "raydlc-verify-probe"
NS, NAME = "ray-train", "ray-train-cluster"
SVC = f"{NAME}-head-svc.{NS}.svc"


def _rows(v: gate.GateVerdict) -> dict[str, gate.Row]:
    return {r.criterion: r for r in v.rows}


# ---- storage: moto with IAM enforced, pyarrow, a Ray task pinned to the node -------------------------


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    with servers.moto_process() as url:  # IAM enforcement is switched on and off: no other module's moto shares it
        yield url


def _user(url: str, name: str, policy: dict[str, Any]) -> dict[str, str]:
    """An IAM user holding only `policy`, and the environment a pod with that identity would have."""
    import boto3

    kw = {"endpoint_url": url, "region_name": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    s3, iam = boto3.client("s3", **kw), boto3.client("iam", **kw)
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="pods", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}


def _keys(url: str) -> list[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def _on_the_node(ray: Any, uri: str, env: dict[str, str], token: str) -> dict[str, Any]:
    """`raydlc.checks.node_probe`'s task, pinned to the (only) node, with the identity's variables the pod would have."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raydlc.checks.node_probe import probe_node

    node = next(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    task = ray.remote(num_cpus=0, max_retries=0)(probe_node)
    ref = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False), runtime_env={"env_vars": env}).remote(
        {"fi_info": False, "storage": uri, "head": None, "token": token})
    return dict(ray.get(ref, timeout=60))


def test_the_pods_policy_lets_a_node_write_its_runs_and_refuses_a_write_beside_them(moto: str, ray_local: Any) -> None:
    env = _user(moto, "pods-scoped", pod_policy(Bucket(BUCKET, "runs")))
    with _enforcing(moto):
        answer = _on_the_node(ray_local, f"s3://{BUCKET}/runs", env, "scoped")["storage"]
    assert answer["steps"] == dict.fromkeys(storage_access.STEPS, "ok"), answer
    assert storage_access.refused(answer["outside_write"]) and "CreateMultipartUpload" in answer["outside_write"]
    got = storage_access.judge("ip-10-0-1-5", answer)
    assert got.ok and "refused (AccessDenied)" in got.evidence and env["AWS_SECRET_ACCESS_KEY"] not in json.dumps(answer)
    assert not [k for k in _keys(moto) if "scoped" in k]  # nothing of the probe is left, inside or out


def test_a_policy_wider_than_the_prefix_fails_the_node_and_the_probe_takes_its_object_back(moto: str, ray_local: Any) -> None:
    wide = pod_policy(Bucket(BUCKET, "runs"))
    wide["Statement"][1]["Resource"] = [f"arn:aws:s3:::{BUCKET}/*"]  # one character of widening
    env = _user(moto, "pods-wide", wide)
    with _enforcing(moto):
        answer = _on_the_node(ray_local, f"s3://{BUCKET}/runs", env, "wide")["storage"]
    assert answer["outside_write"] == "ok" and answer["outside_cleanup"] == "ok"
    got = storage_access.judge("ip-10-0-1-5", answer)
    assert not got.ok and got.evidence == f"ip-10-0-1-5: a write outside the prefix was allowed: {BUCKET}/raydlc-verify-outside-wide"
    assert not [k for k in _keys(moto) if "wide" in k]


def test_a_node_whose_identity_cannot_write_the_prefix_fails_with_s3s_answer(moto: str) -> None:
    env = _user(moto, "pods-readonly", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"arn:aws:s3:::{BUCKET}/runs/*"]}]})
    with _enforcing(moto), pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        answer = storage_access.check(f"s3://{BUCKET}/runs", "readonly")
    assert answer["steps"]["write"].startswith("OSError") and "ACCESS_DENIED" in answer["steps"]["write"]
    got = storage_access.judge("n1", answer)
    # the first refusal is Ray Train's own first call, create_dir's HeadBucket (s3:ListBucket); then the write
    assert not got.ok and got.evidence.startswith(f"n1: under s3://{BUCKET}/runs: create_dir OSError")
    assert "HeadBucket" in answer["steps"]["create_dir"] and "; write OSError" in got.evidence


class _enforcing:
    """IAM enforced for the length of a `with` (moto_server shares the test process's moto)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _set(self, value: bytes) -> str:
        req = urllib.request.Request(f"{self.url}/moto-api/reset-auth", data=value, method="POST", headers={"Content-Type": "text/plain"})
        return str(json.loads(urllib.request.urlopen(req, timeout=10).read())["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"])

    def __enter__(self) -> None:
        self.previous = self._set(b"0")

    def __exit__(self, *exc: object) -> None:
        self._set(self.previous.encode())


@pytest.mark.parametrize("outcome, refused", [
    ("OSError: When initiating multiple part upload for key 'x' in bucket 'b': AWS Error ACCESS_DENIED during CreateMultipartUpload operation: Access Denied", True),
    ("OSError: When initiating multiple part upload for key 'x' in bucket 'b': AWS Error NETWORK_CONNECTION during CreateMultipartUpload operation: curlCode: 7", False),
    ("OSError: When initiating multiple part upload: AWS Error UNKNOWN (HTTP status 400) during CreateMultipartUpload operation", False),
])
def test_only_s3_saying_no_counts_as_refused(outcome: str, refused: bool) -> None:
    assert storage_access.refused(outcome) is refused
    answer = {"uri": "s3://b/runs", "steps": dict.fromkeys(storage_access.STEPS, "ok"), "outside": "b/o", "outside_write": outcome}
    assert storage_access.judge("n1", answer).ok is refused


def test_the_credential_source_is_named_by_variable_never_by_value() -> None:
    pod = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials",
           "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token"}
    assert storage_access.credential_source(pod).startswith("EKS Pod Identity")
    assert storage_access.credential_source({"AWS_WEB_IDENTITY_TOKEN_FILE": "/t"}).startswith("IRSA")
    assert storage_access.credential_source({}) == "no variables: instance profile or none"


# ---- head-port: the probe pod through the gateway, run by the netpolicy double -------------------------


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[k8s.Kube, RawKube, netpolicy.Kubelet]]:
    """kmock with the head pod, its Service and a worker (no policy yet), raydlc's gateway to it, and the double."""
    with servers.kube_server(monkeypatch.setattr) as server, netpolicy.Kubelet(server.url) as kubelet:
        raw = RawKube(server.url)
        head = {"ray.io/cluster": NAME, "ray.io/node-type": "head", CLUSTER_LABEL: NAME}
        for pod, labels in ((f"{NAME}-head", head), (f"{NAME}-gpu-worker-0", {**head, "ray.io/node-type": "worker"})):
            raw.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": NS, "labels": labels},
                        "spec": {"nodeName": "ip-10-0-0-9"}, "status": {"phase": "Running"}})
        raw.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{NAME}-head-svc", "namespace": NS},
                    "spec": {"selector": {"ray.io/cluster": NAME, "ray.io/node-type": "head"}, "ports": [{"name": "dashboard", "port": 8265}]}})
        cfg = tmp_path / "kubeconfig"
        cfg.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "t",
            "clusters": [{"name": "c", "cluster": {"server": server.url}}],
            "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {"token": "abc"}}]}))
        yield k8s.Kube(k8s.load_client(cfg)), raw, kubelet


def _doc(name: str = "raydlc-netprobe-t") -> dict[str, Any]:
    return head_isolation.pod_doc(name, NS, "public.ecr.aws/deep-learning-containers/ray:2.58.0", "ip-10-0-0-9", SVC, 8265)


def _pods(raw: RawKube) -> list[str]:
    return sorted(p["metadata"]["name"] for p in raw.list("Pod", NS))


def test_with_the_rendered_policy_the_unlabelled_pod_is_kept_out_and_deleted(cluster: Any, clean_env: Path) -> None:
    kube, raw, kubelet = cluster
    cfg = load_config(env={}, overrides={"NAMESPACE": NS, "RAY_CLUSTER_NAME": NAME}, cwd=clean_env)
    kube.apply(head_policy(cfg, NAME))
    out = head_isolation.run_pod(kube, _doc(), timeout=20, poll_s=0.1)
    assert out == PodOutcome("raydlc-netprobe-t", False, "timeout")
    assert _pods(raw) == [f"{NAME}-gpu-worker-0", f"{NAME}-head"] and not kubelet.errors
    (ran,) = kubelet.seen
    assert not {CLUSTER_LABEL, "ray.io/cluster", "ray.io/node-type"} & set(ran["metadata"]["labels"])
    spec = ran["spec"]
    assert spec["nodeName"] == "ip-10-0-0-9" and spec["tolerations"] == [{"operator": "Exists"}] and spec["automountServiceAccountToken"] is False
    worker = raw.get("Pod", f"{NAME}-gpu-worker-0", NS)
    assert netpolicy.connect(raw, worker, SVC, 8265) == {"connected": True, "error": None}  # the Ray pods' side, by the same rules
    ok, evidence, failed = head_isolation.judge(HeadReach(f"{SVC}:8265", out, {"ip-10-0-1-5": {"connected": True, "error": None}}))
    assert ok and not failed and evidence[0] == f"pod raydlc-netprobe-t without the Ray labels could not open {SVC}:8265 (timeout)"


def test_without_a_policy_the_unlabelled_pod_gets_in_and_the_criterion_fails(cluster: Any) -> None:
    kube, raw, _ = cluster
    out = head_isolation.run_pod(kube, _doc(), timeout=20, poll_s=0.1)
    assert out.connected is True and _pods(raw) == [f"{NAME}-gpu-worker-0", f"{NAME}-head"]
    ok, evidence, _ = head_isolation.judge(HeadReach(f"{SVC}:8265", out, {"ip-10-0-1-5": {"connected": True, "error": None}}))
    assert not ok and "the NetworkPolicy does not hold" in evidence[0]


def test_a_pod_that_never_answers_is_no_proof_and_is_deleted_all_the_same(cluster: Any) -> None:
    kube, raw, kubelet = cluster
    kubelet.stop_event.set()
    kubelet.thread.join(5)
    out = head_isolation.run_pod(kube, _doc(), timeout=0.5, poll_s=0.1)
    assert out.connected is None and "no answer within the wait" in out.detail
    assert "raydlc-netprobe-t" not in _pods(raw)
    ok, evidence, _ = head_isolation.judge(HeadReach(f"{SVC}:8265", out, {"n": {"connected": True, "error": None}}))
    assert not ok and "gave no answer" in evidence[0]


def test_ctrl_c_while_waiting_still_deletes_the_pod(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    kube, raw, kubelet = cluster
    kubelet.stop_event.set()
    kubelet.thread.join(5)

    def interrupted(_s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(poll.time, "sleep", interrupted)  # the pause between looks
    with pytest.raises(KeyboardInterrupt):
        head_isolation.run_pod(kube, _doc(), timeout=30, poll_s=0.1)
    assert "raydlc-netprobe-t" not in _pods(raw)


@pytest.mark.parametrize("error, ok", [("timeout", True), ("refused", True), ("unresolved: [Errno -2] Name or service not known", False)])
def test_only_a_dropped_or_refused_connect_keeps_the_pod_out(error: str, ok: bool) -> None:
    passed, _, _ = head_isolation.judge(HeadReach("h:8265", PodOutcome("p", False, error), {"n": {"connected": True, "error": None}}))
    assert passed is ok


def test_a_ray_pod_that_cannot_reach_the_head_is_named() -> None:
    inside = {"ip-10-0-1-5": {"connected": True, "error": None}, "ip-10-0-2-7": {"connected": False, "error": "timeout"}}
    passed, evidence, failed = head_isolation.judge(HeadReach("h:8265", PodOutcome("p", False, "timeout"), inside))
    assert not passed and failed == ["ip-10-0-2-7"] and "ip-10-0-2-7 (Ray pod) could not open h:8265: timeout" in evidence


def test_the_pod_script_writes_its_answer_where_kubernetes_reads_the_termination_message(tmp_path: Path) -> None:
    """The inline script, run here against a port nothing listens on: it answers `refused`, exit 1."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "termination-log"
    script = head_isolation.POD_SCRIPT.replace(head_isolation.TERMINATION_LOG, str(log))
    p = subprocess.run([sys.executable, "-c", script, "127.0.0.1", str(port)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and json.loads(log.read_text()) == {"connected": False, "error": "refused"}
    pod = {"status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {"exitCode": 1, "message": log.read_text()}}}]}}
    assert head_isolation.outcome("p", pod) == PodOutcome("p", False, "refused")


# ---- the gate: the two rows from facts ----------------------------------------------------------------


def test_both_rows_are_not_applicable_on_the_local_target_and_head_port_on_address() -> None:
    local = _rows(gate.gate(Facts("local", JOB)))
    assert local["storage"].status == NA and local["head-port"].status == NA
    address = _rows(gate.gate(Facts("address", JOB)))
    assert address["storage"].status == NA and "names no s3://" in address["storage"].evidence[0]
    assert address["head-port"].status == NA and "no Kubernetes channel" in address["head-port"].evidence[0]
    shared = _rows(gate.gate(Facts("cluster", JOB, storage_kind="path")))
    assert shared["storage"].status == NA and "not S3" in shared["storage"].evidence[0]


def test_on_a_cluster_the_rows_name_the_failing_node_and_a_missing_probe_fails() -> None:
    good = storage_access.StoreAnswer("ip-10-0-1-5", True, "ip-10-0-1-5: wrote ...")
    bad = storage_access.StoreAnswer("ip-10-0-2-7", False, "ip-10-0-2-7: a write outside the prefix was allowed: b/o")
    reach = HeadReach(f"{SVC}:8265", PodOutcome("p", False, "timeout"), {"ip-10-0-1-5": {"connected": True, "error": None}})
    rows = _rows(gate.gate(Facts("cluster", JOB, storage_kind="s3", storage=[good, bad], head_reach=reach)))
    assert rows["storage"].status == FAIL and rows["storage"].failed_nodes == ["ip-10-0-2-7"]
    assert rows["head-port"].status == PASS
    none = _rows(gate.gate(Facts("cluster", JOB, storage_kind="s3", storage_note="no GPU node in the Ray cluster to probe")))
    assert none["storage"].status == FAIL and none["storage"].evidence == ["no GPU node in the Ray cluster to probe"]
    assert none["head-port"].status == FAIL


# ---- what the probe job is asked, and what verify asks it ---------------------------------------------


def test_the_probe_job_runs_fi_info_alone_by_default_and_an_empty_storage_is_the_heads_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from raydlc.checks import node_probe

    assert {k: v for k, v in node_probe.parse([]).items() if k != "token"} == {"fi_info": True, "storage": None, "head": None}
    monkeypatch.setenv("RAYDLC_STORAGE_PATH", "s3://b/runs")
    asked = node_probe.parse(["--storage", "", "--head", "auto"])
    assert asked["storage"] == "s3://b/runs" and asked["head"] == "auto" and not asked["fi_info"]
    monkeypatch.delenv("RAYDLC_STORAGE_PATH")
    missing = node_probe.probe_node({**node_probe.parse(["--storage", ""]), "fi_info": False})
    assert storage_access.judge("n1", missing["storage"]).evidence == "n1: no STORAGE_PATH on the driver's node (the head pod)"


@pytest.mark.parametrize("overrides, target, expected", [
    ({"STORAGE_PATH": "s3://b/team/runs"}, "cluster", ("s3", "s3://b/team/runs")),
    ({"STORAGE_BUCKET": "team-bucket"}, "address", ("s3", "s3://team-bucket/runs")),
    ({}, "cluster", ("s3", "")),  # the bucket named from the account: the head pod knows it, `up` set it there
    ({}, "address", ("unset", None)),
    ({"STORAGE_PATH": "/fsx/runs", "STORAGE_SHARED": True}, "cluster", ("path", None)),
])
def test_verify_probes_the_prefix_the_config_names_else_the_head_pods(overrides: dict[str, Any], target: str, expected: tuple[str, str | None],
                                                                       clean_env: Path) -> None:
    assert gate.storage_target(load_config(env={}, overrides=overrides, cwd=clean_env), target) == expected
