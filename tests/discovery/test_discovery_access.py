"""Permissions first, as Kubernetes answers them: every missing one named in one error, and the rendered Role
that, applied by the platform, makes the check pass and the real requests succeed."""

from __future__ import annotations

from typing import Any

import platform_world as pw
import pytest

from raydlc.discovery import access
from raydlc.errors import InputError, KubeError


@pytest.mark.parametrize("platform", [{"variant": "platform", "grant": False, "cluster_reads": False}], indirect=True)
def test_a_user_lacking_create_rayclusters_is_told_before_anything_is_made(platform: Any, user_kube: Any) -> None:
    role = access.render_rbac(pw.NAMESPACE, f"User:{pw.USER}", cluster_reads=False)[0]
    without = [dict(r, verbs=[v for v in r["verbs"] if v != "create"]) if r["resources"] == ["rayclusters"] else r
               for r in role["rules"]]
    platform.grant(pw.NAMESPACE, without)
    before = platform.snapshot()
    with pytest.raises(InputError) as e:
        access.require(user_kube, pw.NAMESPACE)
    assert e.value.exit_code == 2
    assert e.value.message == f"missing Kubernetes permissions in namespace {pw.NAMESPACE}: create rayclusters.ray.io"
    assert "render --only rbac" in (e.value.hint or "")
    assert platform.snapshot() == before  # a review creates nothing


@pytest.mark.parametrize("platform", [{"variant": "platform", "grant": False, "cluster_reads": False}], indirect=True)
def test_with_no_role_every_need_is_named_in_one_error(platform: Any, user_kube: Any) -> None:
    with pytest.raises(InputError) as e:
        access.require(user_kube, pw.NAMESPACE)
    msg = e.value.message
    for name in ("create rayclusters.ray.io", "get pods/log", "create pods/portforward", "create secrets",
                 "create networkpolicies.networking.k8s.io", "list events", "delete rayjobs.ray.io"):
        assert name in msg, name
    assert "serviceaccounts" not in msg  # given: not made
    assert msg.count("\n") == 0


@pytest.mark.parametrize("platform", [{"variant": "platform", "grant": False, "cluster_reads": False}], indirect=True)
def test_applying_the_rendered_rbac_makes_the_check_pass_and_the_requests_succeed(platform: Any, user_kube: Any) -> None:
    docs = access.render_rbac(pw.NAMESPACE, f"User:{pw.USER}", service_account_given=False)
    assert [d["kind"] for d in docs] == ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]
    platform.apply(docs)
    assert access.require(user_kube, pw.NAMESPACE, service_account_given=False) == []
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "raydlc-ray", "namespace": pw.NAMESPACE}}
    user_kube.create(sa)  # what the review allowed, the real request may do
    assert user_kube.get("v1", "ServiceAccount", "raydlc-ray", pw.NAMESPACE) is not None
    assert user_kube.get("v1", "Namespace", pw.NAMESPACE) is not None  # `get namespaces` in a Role: its own namespace
    with pytest.raises(KubeError):
        user_kube.get("v1", "Namespace", "kube-system")
    status, body = user_kube.request("POST", f"/api/v1/namespaces/{pw.NAMESPACE}/pods/x/exec")
    assert status == 403 and 'cannot create resource "pods/exec"' in body["message"]  # and nothing beyond: no exec
    with pytest.raises(KubeError):
        user_kube.list("v1", "Secret", "kube-system")  # nor another namespace


@pytest.mark.parametrize("platform", [{"variant": "platform", "grant": False, "cluster_reads": False}], indirect=True)
def test_discovery_reads_missing_are_returned_not_refused(platform: Any, user_kube: Any) -> None:
    platform.apply(access.render_rbac(pw.NAMESPACE, f"User:{pw.USER}", cluster_reads=False))
    lacking = access.require(user_kube, pw.NAMESPACE)
    assert [str(n) for n in lacking] == ["list nodes", "get customresourcedefinitions.apiextensions.k8s.io",
                                         "list nodepools.karpenter.sh", "list deployments.apps", "list daemonsets.apps"]


def test_the_rendered_rbac_is_valid_kubernetes() -> None:
    import kubernetes_validate

    for doc in access.render_rbac("team-a", "Group:ml-team"):
        kubernetes_validate.validate(doc, "1.33", strict=True)
    with pytest.raises(InputError):
        access.render_rbac("team-a", "alice")


def test_the_role_grants_exactly_the_needs() -> None:
    role = access.render_rbac("ns", "User:u", cluster_reads=False)[0]
    granted = {(r["apiGroups"][0], r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    needed = {(n.group, n.resource + (f"/{n.subresource}" if n.subresource else ""), n.verb) for n in access.namespace_needs()}
    assert granted == needed and all("*" not in v for r in role["rules"] for v in r["verbs"])
