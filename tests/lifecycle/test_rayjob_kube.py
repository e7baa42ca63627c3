"""The RayJob's Kubernetes side (raydlc.jobs.rayjob) against kmock, without a Ray head: the submission id KubeRay gives
it, what raydlc says when no operator takes it or KubeRay refuses it, and the RayJob double's own id rule."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from rayjobs import ALPHABET, RayJobController
from world import Kube as DoubleKube

from raydlc.config import load_config
from raydlc.edges import kube as k8s
from raydlc.errors import InputError, RayError
from raydlc.jobs import rayjob
from raydlc.render.raycluster import render_rayjob


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


@pytest.fixture
def doc(tmp_path: Path) -> dict[str, Any]:
    return render_rayjob(load_config(env={}, overrides={"STORAGE_PATH": "s3://b/runs"}, cwd=tmp_path), "s3://b/code/raydlc-0-abc.zip")


def test_without_an_operator_no_id_comes_and_raydlc_says_so(kube: k8s.Kube, doc: dict[str, Any]) -> None:
    kube.create(doc)
    with pytest.raises(RayError) as e:
        rayjob.submission_id(kube, doc, timeout_s=1)
    assert e.value.message == "KubeRay gave RayJob ray-train/ray-train-job no job id in 1 s: is the KubeRay operator running?"
    assert "kubectl -n ray-train describe rayjob ray-train-job" in (e.value.hint or "")


def test_a_rayjob_kuberay_refuses_is_an_error_with_its_reason(kube: k8s.Kube, doc: dict[str, Any]) -> None:
    kube.create(doc)
    kube.patch("ray.io/v1", "RayJob", "ray-train-job", {"status": {
        "jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed",
        "message": "The RayJob spec is invalid: clusterSelector and rayClusterSpec cannot be both set"}}, "ray-train", subresource="status")
    with pytest.raises(RayError) as e:
        rayjob.submission_id(kube, doc, timeout_s=5)
    assert e.value.message == ("KubeRay refused RayJob ray-train/ray-train-job: ValidationFailed: ValidationFailed: "
                               "The RayJob spec is invalid: clusterSelector and rayClusterSpec cannot be both set")


def test_an_existing_rayjob_is_refused_naming_its_job_and_the_fix(kube: k8s.Kube, doc: dict[str, Any]) -> None:
    kube.create(doc)
    kube.patch("ray.io/v1", "RayJob", "ray-train-job", {"status": {"jobId": "ray-train-job-x2b4z", "jobDeploymentStatus": "Complete",
                                                               "jobStatus": "SUCCEEDED"}}, "ray-train", subresource="status")
    old = rayjob.existing(kube, doc)
    assert old is not None
    err = rayjob.refuse_existing(old, doc)
    assert isinstance(err, InputError) and err.exit_code == 2
    assert err.message == "RayJob ray-train/ray-train-job already exists (job ray-train-job-x2b4z, Complete, SUCCEEDED); nothing was applied"
    assert err.hint == ("`raydlc submit --rayjob --yes` replaces it (its Ray job is stopped first), or --set RAY_JOB_NAME=<a new name>; "
                        "`raydlc job logs ray-train-job-x2b4z` shows what it did")


def test_the_rayjob_double_takes_spec_job_id_else_makes_one_as_kuberay_does(kube_server, kube: k8s.Kube, doc: dict[str, Any]) -> None:
    pinned = copy.deepcopy(doc)
    pinned["metadata"]["name"] = "pinned"
    pinned["spec"]["jobId"] = "my-own-id"
    kube.create(doc)
    kube.create(pinned)
    controller = RayJobController(kube_server.url, {}, None)
    controller.tick()
    assert rayjob.submission_id(kube, pinned, timeout_s=1) == "my-own-id"
    made = rayjob.submission_id(kube, doc, timeout_s=1)
    assert re.fullmatch(f"ray-train-job-[{ALPHABET}]{{5}}", made)
    st = DoubleKube(kube_server.url).get("RayJob", "ray-train-job", "ray-train")["status"]
    assert (st["rayClusterName"], st["jobDeploymentStatus"]) == ("ray-train-cluster", "Initializing")
    controller.tick()  # no head for the cluster: nothing is submitted, the id stays
    assert rayjob.submission_id(kube, doc, timeout_s=1) == made and not controller.submitted
