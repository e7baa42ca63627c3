"""The platform world itself: what it holds, and RBAC refusing and reviewing as the API server does."""

from __future__ import annotations

from typing import Any

import platform_world as pw
import pytest

from raydlc.errors import KubeError


def test_the_platform_holds_kuberay_nodes_pools_and_another_team(platform: Any) -> None:
    snap = platform.snapshot()
    crds = {k.rsplit("/", 1)[-1]: v for k, v in snap.items() if "/customresourcedefinitions/" in k}
    assert sorted(crds) == ["rayclusters.ray.io", "rayjobs.ray.io"]
    assert [v["name"] for v in crds["rayclusters.ray.io"]["spec"]["versions"] if v["served"]] == ["v1", "v1alpha1"]
    dep = snap["apps/v1/deployments/kuberay-system/kuberay-operator"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "quay.io/kuberay/operator:v1.7.0" and "args" not in container  # watches all namespaces
    gpu = snap["/v1/nodes/None/gpu-0"] if "/v1/nodes/None/gpu-0" in snap else next(v for k, v in snap.items() if k.endswith("/nodes/None/gpu-0"))
    assert gpu["spec"]["taints"] == [pw.GPU_TAINT]
    assert gpu["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "g6.12xlarge"
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert any(k.endswith("/nodepools/None/gpu") for k in snap)
    assert any(k.endswith(f"/rayclusters/{pw.NAMESPACE}/{pw.OTHER_TEAM_CLUSTER}") for k in snap)


def test_a_watch_list_reaches_the_operator_args_as_the_chart_renders_them(platform: Any) -> None:
    platform.install_kuberay("1.7.0", watch=["team-a", "team-c"])
    dep = platform.kube.get("Deployment", "kuberay-operator", pw.KUBERAY_NS)
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"] == ["--watch-namespace", "team-a,team-c"]


def test_the_user_reads_and_writes_in_the_namespace_and_is_refused_elsewhere(platform: Any, user_kube: Any) -> None:
    assert [c["metadata"]["name"] for c in user_kube.list("ray.io/v1", "RayCluster", pw.NAMESPACE)] == [pw.OTHER_TEAM_CLUSTER]
    assert len(user_kube.nodes()) >= 3  # the ClusterRole's read of nodes
    with pytest.raises(KubeError) as e:
        user_kube.list("v1", "Secret", "kube-system")
    assert e.value.status == 403  # type: ignore[attr-defined]
    assert 'secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" in the namespace "kube-system"' in str(e.value)


@pytest.mark.parametrize("platform", [{"variant": "platform", "cluster_reads": False}], indirect=True)
def test_without_the_cluster_role_nodes_are_forbidden_at_the_cluster_scope(platform: Any, user_kube: Any) -> None:
    with pytest.raises(KubeError) as e:
        user_kube.nodes()
    assert 'nodes is forbidden: User "alice" cannot list resource "nodes" in API group "" at the cluster scope' in str(e.value)


def test_a_bad_token_is_unauthorized(platform: Any) -> None:
    from raydlc.edges import kube

    k = kube.Kube(kube.load_client(platform.kubeconfig(token="stolen")))
    with pytest.raises(KubeError) as e:
        k.list("v1", "Pod", pw.NAMESPACE)
    assert e.value.status == 401  # type: ignore[attr-defined]


def review(k: Any, **attrs: str) -> dict[str, Any]:
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {"resourceAttributes": attrs}}
    status, out = k.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=body)
    assert status == 201, out
    return dict(out["status"])


def test_self_subject_access_review_answers_from_the_same_rules(platform: Any, user_kube: Any) -> None:
    ns = pw.NAMESPACE
    allowed = review(user_kube, namespace=ns, verb="create", group="ray.io", resource="rayclusters")
    assert allowed["allowed"] and 'RoleBinding "raydlc-user/team-a"' in allowed["reason"]
    assert review(user_kube, namespace=ns, verb="get", resource="pods", subresource="log")["allowed"]
    assert not review(user_kube, namespace=ns, verb="create", resource="pods", subresource="exec")["allowed"]
    assert not review(user_kube, namespace="team-b", verb="create", group="ray.io", resource="rayclusters")["allowed"]
    assert review(user_kube, verb="list", resource="nodes")["allowed"]  # the ClusterRoleBinding
    assert not review(user_kube, verb="delete", resource="nodes")["allowed"]


def test_rule_matching_follows_rbac() -> None:
    a = pw.request_attributes("GET", "/api/v1/namespaces/x/pods/p1/log", {})
    assert (a["verb"], a["resource"], a["subresource"], a["name"], a["namespace"]) == ("get", "pods", "log", "p1", "x")
    assert pw.rule_allows(pw.rule([""], ["*/log"], ["get"]), a)
    assert not pw.rule_allows(pw.rule([""], ["pods"], ["get"]), a)  # a subresource needs its own entry
    assert not pw.rule_allows(pw.rule([""], ["pods/*"], ["get"]), a)  # `pods/*` is no wildcard in RBAC
    assert pw.rule_allows({**pw.rule([""], ["pods/log"], ["get"]), "resourceNames": ["p1"]}, a)
    assert not pw.rule_allows({**pw.rule([""], ["pods/log"], ["get"]), "resourceNames": ["p2"]}, a)
    w = pw.request_attributes("GET", "/apis/ray.io/v1/namespaces/x/rayclusters", {"watch": "true"})
    assert (w["verb"], w["group"]) == ("watch", "ray.io")
    assert pw.request_attributes("DELETE", "/api/v1/namespaces/x/pods", {})["verb"] == "deletecollection"
    assert pw.request_attributes("GET", "/api/v1/namespaces/x", {})["namespace"] == "x"


# variant -> (operator image or None, GPU instance types of the nodes, NodePool names, /version)
SHAPES = {
    "no-kuberay": (None, {"g6.12xlarge"}, {"gpu", "general"}, pw.EKS_VERSION),
    "old-operator": ("quay.io/kuberay/operator:v1.5.1", {"g6.12xlarge"}, {"gpu", "general"}, pw.EKS_VERSION),
    "nodepool-only": ("quay.io/kuberay/operator:v1.7.0", set(), {"gpu", "general"}, pw.EKS_VERSION),
    "no-gpu": ("quay.io/kuberay/operator:v1.7.0", set(), {"general"}, pw.EKS_VERSION),
    "hyperpod": ("quay.io/kuberay/operator:v1.7.0", {"ml.p5.48xlarge"}, {"general"}, pw.EKS_VERSION),
    "kind": ("quay.io/kuberay/operator:v1.7.0", set(), set(), pw.KIND_VERSION),
}


@pytest.mark.parametrize("platform", list(SHAPES), indirect=True)
def test_every_variant_has_its_shape(platform: Any, request: pytest.FixtureRequest, user_kube: Any) -> None:
    image, gpu_types, pools, version = SHAPES[request.node.callspec.params["platform"]]
    dep = platform.kube.get("Deployment", "kuberay-operator", pw.KUBERAY_NS)
    assert (dep["spec"]["template"]["spec"]["containers"][0]["image"] if dep else None) == image
    nodes = platform.kube.list("Node")
    gpus = [n for n in nodes if (n["status"]["allocatable"].get("nvidia.com/gpu") or "0") != "0"]
    assert {n["metadata"]["labels"]["node.kubernetes.io/instance-type"] for n in gpus} == gpu_types
    kind = version == pw.KIND_VERSION
    code, body = platform.kube.call("GET", "/apis/karpenter.sh/v1/nodepools")
    assert code == (404 if kind else 200)  # no Karpenter on kind: its group is not served
    assert {p["metadata"]["name"] for p in body["items"]} == pools if not kind else not pools
    assert user_kube.version() == version
    assert all(n["spec"]["providerID"].startswith("kind://" if kind else "aws:///") for n in nodes)
    for n in gpus:
        if n["metadata"]["labels"]["node.kubernetes.io/instance-type"].startswith("ml."):
            assert n["metadata"]["labels"]["sagemaker.amazonaws.com/node-health-status"] == "Schedulable"


def test_the_emulated_operator_reconciles_only_the_namespaces_it_watches(platform: Any) -> None:
    from kuberay import Operator

    op = Operator(platform.server.url)
    platform.install_kuberay("1.7.0", watch=["team-c"])
    op.tick(), op.tick()  # the first sighting of a cluster only starts its pod delay
    assert [p["metadata"]["name"] for p in platform.kube.list("Pod", pw.NAMESPACE)] == []  # team-b-ray in team-a: not watched
    platform.install_kuberay("1.7.0")  # the platform widens it to every namespace
    op.tick(), op.tick()
    assert [p["metadata"]["name"] for p in platform.kube.list("Pod", pw.NAMESPACE)] == [f"{pw.OTHER_TEAM_CLUSTER}-head"]


@pytest.mark.parametrize("platform", [{"variant": "kind", "cluster_reads": False}], indirect=True)
def test_authorization_comes_before_the_group_is_looked_up(platform: Any, user_kube: Any) -> None:
    status, _ = user_kube.request("GET", "/apis/karpenter.sh/v1/nodepools")
    assert status == 403  # refused the read: told so, whether or not Karpenter is installed
    platform.grant_cluster(pw.DISCOVERY_RULES)
    status, _ = user_kube.request("GET", "/apis/karpenter.sh/v1/nodepools")
    assert status == 404  # allowed: now the API server says the group is not served
