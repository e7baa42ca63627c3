"""`submit --rayjob` end to end: moto for S3, kmock as the Kubernetes API with the emulated KubeRay operator (its
RayCluster part in tests/doubles/kuberay.py, its RayJob controller in tests/doubles/rayjobs.py), the kubectl
double's port-forward, and a real local Ray head (token auth on) standing in for the head pod.

The head's runtime-env agent is pointed at moto (AWS_ENDPOINT_URL, as boto3 reads it), so the `py_modules` zip
the RayJob names is the one raydlc uploaded, fetched and unpacked by Ray itself; the job's program prints where
`import raydlc` came from, and the test checks it is the unpacked zip, not the raydlc installed on this machine.
The program is a stand-in for `python -m raydlc.train` (ENTRYPOINT patched): training itself is tested elsewhere.
One head for the module, ended by its PID.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raydlc.edges import local_head
from raydlc.edges.local_head import LocalHead

pytestmark = pytest.mark.slow  # a Ray head starts once (~30-60 s on a busy machine); each test then takes seconds

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "doubles"))

import servers  # noqa: E402
from rayjobs import RayJobController  # noqa: E402
from world import Kube, node_allocatable  # noqa: E402

NS, RC, JOB = "ray-train", "ray-train-cluster", "ray-train-job"
BUCKET = "raydlc-123456789012-us-east-2-eks-cluster"  # the default bucket of moto's account
TOKEN = secrets.token_urlsafe(32)
WHERE = "import raydlc, sys; print('raydlc from', raydlc.__file__, flush=True)"


_world = servers.lifecycle_world("lifecycle_world_rayjob")  # the lifecycle tests' world, reused
moto_server, kube_server, world = _world.moto_server, _world.kube_server, _world.world


@pytest.fixture(scope="module")
def head(moto_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHead]:
    """A token-auth head whose runtime-env agent fetches s3:// from moto."""
    aws = {"AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-2", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials"}
    with local_head.start_head(num_cpus=1, log_dir=tmp_path_factory.mktemp("head-log"), token=TOKEN, env=aws, timeout=240) as h:
        yield h


@contextlib.contextmanager
def standing_cluster(world: Any, head: LocalHead, monkeypatch: pytest.MonkeyPatch, program: str,
                     clock: Any = time.time) -> Iterator[Kube]:
    """What `up` leaves: the bucket, a system node, the KubeRay operator, the RayCluster and its token Secret; the head
    pod's dashboard is the local head (kubectl double's port-forward), KubeRay's RayJob controller armed."""
    import raydlc.render.raycluster as rc_render
    from raydlc import lifecycle
    from raydlc.render.raycluster import render_raycluster

    monkeypatch.setenv("RAYDLC_USE_GPU", "false")  # the local head has no GPU: no GPU worker is waited for
    monkeypatch.setattr(rc_render, "ENTRYPOINT", f'python -c "{program}"')
    assert lifecycle.up(world.config(), only="storage").ok
    world.client("s3").delete_object(Bucket=BUCKET, Key=code_key())  # the zip comes from submit, not from `up`, here
    kube = Kube(world.kube.url)
    alloc = node_allocatable("m7i.xlarge")
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ip-10-0-0-9.us-east-2.compute.internal",
                 "labels": {"role": "system"}}, "status": {"allocatable": alloc, "capacity": alloc,
                                                            "conditions": [{"type": "Ready", "status": "True"}]}})
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "kuberay-operator", "namespace": "kuberay-operator"},
                 "spec": {"replicas": 1}, "status": {"availableReplicas": 1}})
    kube.create(render_raycluster(world.config()))
    kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{RC}-ray-token", "namespace": NS},
                 "data": {"auth_token": base64.b64encode(TOKEN.encode()).decode()}})
    servers.write_kubeconfig(Path(os.environ["HOME"]) / ".raydlc" / "eks-cluster-us-east-2" / "kubeconfig", world.kube.url)
    world.scenario(forward={f"{NS}/{RC}-head-svc:8265": head.dashboard_url.removeprefix("http://")})
    deadline = time.monotonic() + 60
    while not any(p["metadata"]["name"] == f"{RC}-head" and (p.get("status") or {}).get("phase") == "Running" for p in kube.list("Pod", NS)):
        assert time.monotonic() < deadline, "the emulated operator never ran the head pod"
        time.sleep(0.1)
    with RayJobController(world.kube.url, {f"{NS}/{RC}": head.dashboard_url}, TOKEN, clock=clock) as controller:
        yield kube
    assert not controller.errors, controller.errors


def code_key() -> str:
    from raydlc.render import codezip

    return codezip.build().key


def rayjob(kube: Kube) -> dict[str, Any]:
    rj = kube.get("RayJob", JOB, NS)
    assert rj is not None
    return rj


def test_submit_rayjob_uploads_the_zip_applies_the_rendered_rayjob_and_follows_its_job(
        world: Any, head: LocalHead, monkeypatch: pytest.MonkeyPatch) -> None:
    import raydlc.api as api
    from raydlc.render import FILES, codezip, render_all
    from raydlc.render.bucket import for_cluster

    said, logs = [], []
    with standing_cluster(world, head, monkeypatch, WHERE) as kube:
        done = api.submit(rayjob=True, notice=said.append, write=logs.append)
        applied = rayjob(kube)
    code = codezip.build()
    rendered = render_all(for_cluster(world.config(), lambda: "123456789012"), only="rayjob")[FILES["rayjob"]]
    assert applied["spec"] == rendered["spec"]  # what `raydlc render --only rayjob` writes, as is
    job_id = applied["status"]["jobId"]
    assert job_id.startswith(f"{JOB}-") and len(job_id) == len(JOB) + 6
    assert done.ok and done.job.submission_id == job_id and done.job.status == "SUCCEEDED"
    assert applied["status"]["jobDeploymentStatus"] == "Complete"
    assert world.client("s3").get_object(Bucket=BUCKET, Key=code.key)["Body"].read() == code.data
    (line,) = [ln for ln in "".join(logs).splitlines() if ln.startswith("raydlc from ")]
    origin = Path(line.removeprefix("raydlc from "))
    assert "runtime_resources" in origin.parts and "py_modules_files" in origin.parts, origin  # Ray's unpacked zip
    assert origin.parent.name == "raydlc" and origin.parent.parent.name.startswith("s3_"), origin
    assert said[:2] == [f"uploaded raydlc's code zip s3://{BUCKET}/{code.key}", f"applied RayJob {NS}/{JOB}; KubeRay submits it as job {job_id}"]
    assert f"submitted job {job_id} on the cluster target" in said
    doc = done.to_dict()
    assert doc["job_id"] == job_id and doc["rayjob"] == {"name": JOB, "namespace": NS, "replaced": False,
                                                         "code_zip": f"s3://{BUCKET}/{code.key}", "code_uploaded": True}


def test_an_existing_rayjob_is_refused_and_yes_replaces_it_stopping_its_job_first(
        world: Any, head: LocalHead, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import raydlc.api as api
    import raydlc.render.raycluster as rc_render
    from raydlc.cli import main
    from raydlc.edges.ray_dashboard import Dashboard
    from raydlc.errors import InputError

    dash = Dashboard(head.dashboard_url, token=TOKEN)
    with standing_cluster(world, head, monkeypatch, "import time; print('long', flush=True); time.sleep(600)") as kube:
        first = api.submit(rayjob=True, no_wait=True)
        old = first.job.submission_id
        assert first.rayjob is not None and first.rayjob["code_uploaded"] and not first.waited
        deadline = time.monotonic() + 120
        while dash.job(old).status != "RUNNING" or rayjob(kube)["status"].get("jobStatus") != "RUNNING":  # its runtime env set up
            assert time.monotonic() < deadline, dash.job(old)
            time.sleep(0.2)
        with pytest.raises(InputError) as refused:
            api.submit(rayjob=True)
        assert refused.value.message == f"RayJob {NS}/{JOB} already exists (job {old}, Running, RUNNING); nothing was applied"
        assert "`raydlc submit --rayjob --yes` replaces it" in (refused.value.hint or "") and f"raydlc job logs {old}" in (refused.value.hint or "")
        assert rayjob(kube)["status"]["jobId"] == old and dash.job(old).status == "RUNNING"  # untouched
        monkeypatch.setattr(rc_render, "ENTRYPOINT", 'python -c "import sys; print(\'failing\', flush=True); sys.exit(3)"')
        rc = main(["submit", "--rayjob", "--yes", "--json"])
        out = capsys.readouterr()
        new = rayjob(kube)["status"]["jobId"]
    doc = json.loads(out.out.strip().splitlines()[-1])
    assert rc == 1 and doc["job_id"] == new != old and doc["status"] == "FAILED" and doc["rayjob"]["replaced"] is True
    assert doc["rayjob"]["code_uploaded"] is False  # the same code: the zip was there, nothing was put again
    assert f"found raydlc's code zip s3://{BUCKET}/{code_key()}" in out.err and "failing" in out.err  # the log streams to stderr with --json
    (error,) = [ln for ln in out.err.splitlines() if ln.startswith("error:")]
    assert error.startswith(f"error: job {new} FAILED")
    assert dash.job(old).status == "STOPPED"  # stopped before its RayJob was replaced


def until(what: str, ok: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_past_its_deadline_kuberay_only_fails_the_rayjob_and_raydlc_stops_its_job(
        world: Any, head: LocalHead, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import raydlc.api as api
    from raydlc.edges.ray_dashboard import Dashboard

    later = [0.0]  # how far the operator's clock is ahead of this one: a deadline passes without waiting it out
    dash = Dashboard(head.dashboard_url, token=TOKEN)
    with standing_cluster(world, head, monkeypatch, "import time; print('long', flush=True); time.sleep(600)",
                          clock=lambda: time.time() + later[0]) as kube:
        # KubeRay alone (nobody follows the job): the RayJob is Failed at its deadline, and its Ray job runs on.
        old = api.submit(rayjob=True, no_wait=True).job.submission_id
        until("the first job running", lambda: dash.job(old).status == "RUNNING" and rayjob(kube)["status"].get("jobStatus") == "RUNNING")
        deadline_s = rayjob(kube)["spec"]["activeDeadlineSeconds"]
        assert deadline_s == 4 * 3600  # JOB_DEADLINE_S's default
        later[0] = deadline_s + 1.0
        until("KubeRay's DeadlineExceeded", lambda: rayjob(kube)["status"].get("reason") == "DeadlineExceeded")
        time.sleep(2.0)
        st = rayjob(kube)["status"]
        assert st["jobDeploymentStatus"] == "Failed" and st["message"].startswith("The RayJob has passed the activeDeadlineSeconds")
        assert dash.job(old).status == "RUNNING"  # what KubeRay v1.7.0 leaves behind on a standing cluster

        # raydlc following its RayJob's job stops it at the deadline.
        later[0] = 0.0
        said: list[str] = []
        result: dict[str, Any] = {}
        follower = threading.Thread(target=lambda: result.update(done=api.submit(rayjob=True, yes=True, notice=said.append)), daemon=True)
        follower.start()

        def replacement_running() -> bool:
            job = ((kube.get("RayJob", JOB, NS) or {}).get("status") or {}).get("jobId")  # absent while --yes replaces it
            return job not in (None, old) and dash.job(job) is not None and dash.job(job).status == "RUNNING"

        until("the replacement running", replacement_running)
        new = rayjob(kube)["status"]["jobId"]
        assert dash.job(old).status == "STOPPED"  # --yes stopped the one KubeRay had left running
        later[0] = deadline_s + 1.0
        follower.join(timeout=180)
        assert not follower.is_alive()
        done = result["done"]
        assert done.job.submission_id == new and done.job.status == "STOPPED" and dash.job(new).status == "STOPPED"
        assert rayjob(kube)["status"]["reason"] == "DeadlineExceeded"
        (line,) = [s for s in said if "passed its deadline" in s]
        assert f"raydlc stopped job {new}" in line and "scale down once idle" in line
