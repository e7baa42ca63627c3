"""Ownership as data: which resources an attached run makes, what marks an object raydlc's, the attach settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from raydlc.config import load_config
from raydlc.errors import ConfigError


def cfg(**env: str):
    return load_config(env={f"RAYDLC_{k}": v for k, v in env.items()})


def test_attached_only_the_namespace_resource_is_made_every_other_is_found_with_the_same_needs() -> None:
    from raydlc.lifecycle.orders import resources, steps
    from raydlc.lifecycle.resource import Found

    owned = resources()
    attached = resources(attach=True)
    assert [r.name for r, _ in owned] == [r.name for r, _ in attached]
    assert [n for _, n in owned] == [n for _, n in attached]  # the same graph
    assert not any(isinstance(r, Found) for r, _ in owned)
    made = {r.name for r, _ in attached if not isinstance(r, Found)}
    assert made == {"raycluster"}
    assert {r.inner.scope for r, _ in attached if isinstance(r, Found)} == {"aws", "cluster"}
    assert [s.summary for s in steps("up", attached) if s.name == "kuberay"] == [
        "read the KubeRay operator and its CRDs (found, never changed)"]


def test_a_found_resource_plans_nothing_up_or_down_and_down_keeps_it() -> None:
    from raydlc.lifecycle.context import Context
    from raydlc.lifecycle.resource import Found
    from raydlc.lifecycle.resources.kuberay import KubeRay
    from raydlc.lifecycle.types import Observation

    class Seen(KubeRay):
        def found(self, ctx: Context) -> Observation:
            return Observation("ready", "KubeRay 1.7.0 in kuberay-system", {"source": "list deployments"})

    ctx = Context(cfg(ATTACH="true", KUBE_CONTEXT="c"), dry_run=True)
    f = Found(Seen())
    up = f.plan(ctx, f.check(ctx, "up"), "up")
    assert (up.action, up.reason) == ("none", "found: KubeRay 1.7.0 in kuberay-system")
    down = f.plan(ctx, f.check(ctx, "down"), "down")
    assert down.action == "none" and "left as found" in down.reason
    assert ctx.notes["kuberay"] == ["kept the KubeRay operator and its CRDs (found, not raydlc's)"]
    assert f.status(ctx).facts["source"] == "list deployments"


def test_the_ownership_labels_select_only_this_configs_objects() -> None:
    from raydlc.render import ownership

    c = cfg(CLUSTER_NAME="team-a")
    assert ownership.selector(c) == "app.kubernetes.io/managed-by=raydlc,raydlc.io/owner=team-a"
    assert ownership.made({"metadata": {"labels": ownership.labels(c)}}, c)
    assert not ownership.made({"metadata": {"labels": {"app.kubernetes.io/managed-by": "raydlc", "raydlc.io/owner": "b"}}}, c)
    assert not ownership.made({"metadata": {"labels": {"app.kubernetes.io/managed-by": "team-b"}}}, c)


def test_every_rendered_namespace_object_carries_the_labels_and_attached_pods_run_as_the_given_account() -> None:
    from raydlc.render import ownership, render_all

    c = cfg(ATTACH="true", KUBE_CONTEXT="c", SERVICE_ACCOUNT="team-a-ray", STORAGE_PATH="s3://b/runs")
    docs = render_all(c, only="raycluster")
    rc = next(iter(docs.values()))
    assert ownership.made(rc, c)
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "team-a-ray" and "nodeSelector" not in head
    (policy,) = next(iter(render_all(c, only="netpol").values()))["items"]
    assert ownership.made(policy, c)


@pytest.mark.parametrize(("env", "field"), [
    ({"KUBE_CONTEXT": "kind-x"}, "KUBE_CONTEXT"),
    ({"SERVICE_ACCOUNT": "team-sa"}, "SERVICE_ACCOUNT"),
    ({"ATTACH": "true", "SERVICE_ACCOUNT": "Team_SA"}, "SERVICE_ACCOUNT"),
    ({"ATTACH": "true", "KUBE_CONTEXT": "two words"}, "KUBE_CONTEXT"),
])
def test_attach_settings_are_refused_naming_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        cfg(**env)
    assert e.value.message.startswith(f"invalid configuration: {field} ")


def test_the_kube_target_is_the_users_kubeconfig_at_kube_context_else_raydlcs_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from raydlc.lifecycle.context import kube_target

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert kube_target(cfg(ATTACH="true", KUBE_CONTEXT="team-a")) == (tmp_path / "a", "team-a")
    monkeypatch.delenv("KUBECONFIG")
    assert kube_target(cfg(ATTACH="true", KUBE_CONTEXT="team-a")) == (tmp_path / ".kube" / "config", "team-a")
    path, context = kube_target(cfg(ATTACH="true"))
    assert context is None and path == tmp_path / ".raydlc" / "eks-cluster-us-east-2" / "kubeconfig"
