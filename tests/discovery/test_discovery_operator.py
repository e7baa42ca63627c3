"""The KubeRay operator found against the fields raydlc renders: refused when too old, not watching, or absent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import platform_world as pw
import pytest

from raydlc.config import load_config
from raydlc.discovery import operator as op_check
from raydlc.discovery.gather import gather
from raydlc.discovery.read import discover
from raydlc.errors import InputError
from raydlc.render.raycluster import render_raycluster


def manifests(tmp_path: Path, **overrides: Any) -> list[dict[str, Any]]:
    cfg = load_config(env={}, overrides={"STORAGE_PATH": "s3://b/runs", "IDLE_MINUTES": 0, "NAMESPACE": pw.NAMESPACE, **overrides},
                      cwd=tmp_path)
    return [render_raycluster(cfg)]


def facts(user_kube: Any) -> Any:
    return discover(gather(user_kube, pw.NAMESPACE))


def test_kuberay_1_7_0_watching_all_namespaces_passes(platform: Any, user_kube: Any, tmp_path: Path) -> None:
    result = op_check.check(facts(user_kube), manifests(tmp_path))
    assert result.ok and result.operator is not None and result.operator.version == "1.7.0"
    assert op_check.require(result) == result.operator


@pytest.mark.parametrize("platform", ["old-operator"], indirect=True)
def test_an_operator_older_than_the_rendered_fields_is_refused_naming_version_and_feature(platform: Any, user_kube: Any,
                                                                                           tmp_path: Path) -> None:
    result = op_check.check(facts(user_kube), manifests(tmp_path))
    assert not result.ok
    assert any("is v1.5.1; RayCluster spec.authOptions (Ray token auth from a Secret) needs KubeRay >= 1.6.0" in p
               for p in result.problems), result.problems
    assert any("spec.upgradeStrategy" in p for p in result.problems)
    with pytest.raises(InputError) as e:
        op_check.require(result)
    assert e.value.exit_code == 2 and "v1.5.1" in e.value.message


@pytest.mark.parametrize("platform", ["no-kuberay"], indirect=True)
def test_kuberay_absent_is_refused_naming_the_crds(platform: Any, user_kube: Any, tmp_path: Path) -> None:
    result = op_check.check(facts(user_kube), manifests(tmp_path))
    assert "no CRD rayclusters.ray.io" in result.problems[0]
    assert "no KubeRay operator runs" in result.problems[-1]


def test_an_operator_watching_other_namespaces_is_refused(platform: Any, user_kube: Any, tmp_path: Path) -> None:
    platform.install_kuberay("1.7.0", watch=["team-b", "team-c"])
    result = op_check.check(facts(user_kube), manifests(tmp_path))
    assert result.problems == ("no KubeRay operator watches namespace team-a (kuberay-system/kuberay-operator watches team-b, team-c)",)


def test_an_operator_watching_this_namespace_passes(platform: Any, user_kube: Any, tmp_path: Path) -> None:
    platform.install_kuberay("1.7.0", watch=["team-b", pw.NAMESPACE])
    assert op_check.check(facts(user_kube), manifests(tmp_path)).ok


@pytest.mark.parametrize("platform", [{"variant": "platform", "cluster_reads": False}], indirect=True)
def test_an_operator_that_cannot_be_read_is_a_note_not_a_refusal(platform: Any, user_kube: Any, tmp_path: Path) -> None:
    result = op_check.check(facts(user_kube), manifests(tmp_path))
    assert result.ok and any("could not be read" in n and "forbidden" in n for n in result.notes)


def test_the_autoscaler_v2_feature_counts_only_when_rendered(tmp_path: Path) -> None:
    fixed = {f.field for f in op_check.features_used(manifests(tmp_path))}
    scaling = {f.field for f in op_check.features_used(manifests(tmp_path, IDLE_MINUTES=15))}
    assert "spec.autoscalerOptions.version" not in fixed and "spec.autoscalerOptions.version" in scaling
    assert {"spec.authOptions", "spec.upgradeStrategy"} <= fixed
