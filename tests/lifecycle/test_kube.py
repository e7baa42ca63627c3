"""raydlc.edges.kube against a local Kubernetes API (kmock), and its pure predicates."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml

from raydlc.edges import kube as k8s
from raydlc.edges.poll import Cancelled
from raydlc.errors import InputError, KubeError


@pytest.fixture
def kube(kube_server, tmp_path: Path) -> k8s.Kube:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "c", "cluster": {"server": kube_server.url}}],
        "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "abc"}}],
    }))
    return k8s.Kube(k8s.load_client(cfg))


def policy(name: str, port: int) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": port, "protocol": "TCP"}]}]}}


def test_apply_creates_then_leaves_alone_then_patches_only_the_difference(kube: k8s.Kube) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": [policy("a", 6379), policy("b", 8265)]}
    assert [(a.name, a.action) for a in kube.apply(doc)] == [("a", "created"), ("b", "created")]
    assert [a.action for a in kube.apply(doc)] == ["unchanged", "unchanged"]
    changed = kube.apply(policy("b", 10001))
    assert [(a.action, a.changed) for a in changed] == [("patched", ("spec.ingress[0].ports[0].port",))]
    assert kube.get("networking.k8s.io/v1", "NetworkPolicy", "b", "ns")["spec"]["ingress"][0]["ports"][0]["port"] == 10001


def test_get_and_delete_tell_absent_from_present(kube: k8s.Kube) -> None:
    assert kube.get("ray.io/v1", "RayCluster", "rc", "ns") is None
    assert kube.delete("ray.io/v1", "RayCluster", "rc", "ns") is False
    kube.apply({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc", "namespace": "ns"}, "spec": {}})
    assert kube.delete("ray.io/v1", "RayCluster", "rc", "ns") is True
    assert kube.get("ray.io/v1", "RayCluster", "rc", "ns") is None


def test_namespaces_nodes_and_selectors(kube: k8s.Kube) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ray-train", "labels": {"a": "b"}}})
    assert k8s.labels_of(kube.get("v1", "Namespace", "ray-train")) == {"a": "b"}
    for name, role in (("n1", "system"), ("n2", "gpu-worker")):
        kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"role": role}},
                     "status": {"allocatable": {"nvidia.com/gpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]}})
    assert [k8s.name_of(n) for n in kube.nodes({"role": "gpu-worker"})] == ["n2"]
    assert all(k8s.node_ready(n) for n in kube.nodes())
    kube.patch("v1", "Node", "n2", {"status": {"allocatable": {"vpc.amazonaws.com/efa": "1"}}})
    n2 = kube.get("v1", "Node", "n2")
    assert (k8s.allocatable(n2, "nvidia.com/gpu"), k8s.allocatable(n2, "vpc.amazonaws.com/efa")) == (4, 1)


def test_logs_come_back_as_text(kube: k8s.Kube, kube_server) -> None:
    kube_server.handler["get /api/v1/namespaces/ns/pods/head/log"] << b"line one\nline two\n"
    assert kube.logs("head", "ns", tail=2) == "line one\nline two\n"


def test_errors_are_mapped_once_with_what_to_do(kube: k8s.Kube, tmp_path: Path) -> None:
    with pytest.raises(KubeError, match="cannot patch RayCluster ghost \\(404"):
        kube.patch("ray.io/v1", "RayCluster", "ghost", {"spec": {}}, "ns")
    with pytest.raises(KubeError, match="does not know the Kubernetes kind v1/Gadget"):
        kube.get("v1", "Gadget", "x")
    with pytest.raises(InputError, match="does not exist"):
        k8s.load_client(tmp_path / "nope")
    from kubernetes.client import ApiClient, Configuration

    c = Configuration()
    c.host = "http://127.0.0.1:9"
    c.retries = 0
    with pytest.raises(k8s.KubeUnreachable, match="did not answer"):
        k8s.Kube(ApiClient(c), connect_s=2, read_s=2).version()


@pytest.fixture
def silent_kubeconfig(tmp_path: Path):
    """A kubeconfig whose server accepts connections (the kernel's backlog) and never answers a byte."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        url = "http://127.0.0.1:%d" % s.getsockname()[1]
        cfg = tmp_path / "silent-kubeconfig"
        cfg.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "t",
            "clusters": [{"name": "c", "cluster": {"server": url}}],
            "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "abc"}}],
        }))
        yield cfg, url


def test_a_server_that_accepts_and_never_answers_fails_within_the_budget_naming_it(silent_kubeconfig) -> None:
    import time

    cfg, url = silent_kubeconfig
    kube = k8s.Kube(k8s.load_client(cfg))
    t0 = time.monotonic()
    with pytest.raises(k8s.KubeUnreachable) as e:
        kube.version()
    first = time.monotonic() - t0
    assert url in e.value.message and "no answer within the 10 s read timeout" in e.value.message
    assert k8s.READ_TIMEOUT_S <= first < k8s.READ_TIMEOUT_S + 5, "one read timeout, not retried"
    with pytest.raises(k8s.KubeUnreachable):
        kube.nodes()
    t1 = time.monotonic()
    with pytest.raises(k8s.KubeUnreachable, match=f"the Kubernetes API at {url} has not answered for 2[0-9] s"):
        kube.list("v1", "Pod", "ns")
    assert time.monotonic() - t1 < 1, "the budget is spent: the next request fails at once"


def test_submit_to_a_cluster_whose_api_never_answers_fails_in_about_20_s_naming_it(silent_kubeconfig, tmp_path) -> None:
    """As a new user would try it: one `error:` line naming the endpoint, exit 1, instead of a hang."""
    import os
    import subprocess
    import sys
    import time

    cfg, url = silent_kubeconfig
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "AWS_"))}
    env.update(RAYDLC_KUBECONFIG=str(cfg), HOME=str(tmp_path))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "raydlc", "submit", "--builtin"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("error: the Kubernetes API at " + url) and "Traceback" not in r.stderr
    assert took < 30, took


def test_wait_times_out_with_what_it_last_saw_and_stops_on_cancel(kube: k8s.Kube) -> None:
    with pytest.raises(k8s.KubeTimeout, match="waiting for two nodes: 1/2 Ready"):
        kube.wait(lambda: 1, lambda n: n >= 2, timeout=0.2, interval=0.05, what="two nodes",
                  explain=lambda n: f"{n}/2 Ready")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        kube.wait(lambda: 0, lambda n: False, timeout=60, interval=30, what="x", cancel=cancel)
    seen = iter([0, 0, 3])
    assert kube.wait(lambda: next(seen), lambda n: n == 3, timeout=5, interval=0.01, what="x") == 3


def test_differences_ignore_what_only_the_server_set() -> None:
    want = {"spec": {"replicas": 2, "template": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "4"}}}]}}}
    have = {"spec": {"replicas": 2, "template": {"containers": [{"name": "c", "terminationMessagePath": "/dev/x",
                                                                "resources": {"limits": {"cpu": 4}}}]}}, "status": {}}
    assert k8s.differences(want, have) == []
    assert k8s.differences({"spec": {"replicas": 3}}, have) == ["spec.replicas"]
    assert k8s.differences({"spec": {"template": {"containers": []}}}, have) == ["spec.template.containers"]


def test_scheduling_predicates() -> None:
    taint = [{"key": "aws.amazon.com/efa", "value": "true", "effect": "NoSchedule"}]
    assert k8s.taints_tolerated(taint, [{"key": "aws.amazon.com/efa", "operator": "Exists", "effect": "NoSchedule"}])
    assert k8s.taints_tolerated(taint, [{"key": "aws.amazon.com/efa", "operator": "Equal", "value": "true"}])
    assert not k8s.taints_tolerated(taint, [{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert k8s.deployment_available({"spec": {"replicas": 1}, "status": {"availableReplicas": 1}})
    assert not k8s.deployment_available({"spec": {"replicas": 1}, "status": {}})
    pod = {"metadata": {"name": "head"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes: Insufficient cpu."}]}}
    assert k8s.pending_reason(pod) == "Unschedulable: 0/3 nodes: Insufficient cpu."
    ev = [{"involvedObject": {"name": "head"}, "reason": "FailedScheduling", "message": "0/3 nodes are available: 1 Insufficient memory."}]
    assert k8s.pending_reason(pod, ev) == "FailedScheduling: 0/3 nodes are available: 1 Insufficient memory."
