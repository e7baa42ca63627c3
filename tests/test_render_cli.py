"""`raydlc render`: files, stdout, --only, --json, and bad input that writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raydlc.cli import main
from raydlc.config import load_config
from raydlc.render import render_all

ZONES = "us-east-2a,us-east-2b"
RUNS = "s3://raydlc-runs/team"  # two GPU nodes: the job needs storage every node sees
STORE = ["--set", f"STORAGE_PATH={RUNS}"]
BUCKET = ["--set", "STORAGE_BUCKET=raydlc-test-runs"]  # names the cluster's bucket: no AWS account is asked
ALL_FILES = [
    "eksctl-cluster.yaml",
    "helm/cluster-autoscaler.values.yaml",  # IDLE_MINUTES > 0, the default
    "helm/kuberay-operator.values.yaml",
    "helm/nvidia-device-plugin.values.yaml",
    "networkpolicy.yaml",
    "raycluster.yaml",
    "rayjob.yaml",
]


@pytest.fixture(autouse=True)
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS credentials anywhere: the cluster's default bucket cannot be named, STORAGE_BUCKET must."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_render_out_writes_every_file_as_rendered(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = clean_env / "manifests"
    assert main([*STORE, "--set", "GPU_NODE_COUNT=3", "render", "--zones", ZONES, "--out", str(out)]) == 0
    assert files_under(out) == ALL_FILES
    expected = render_all(load_config(env={}, overrides={"GPU_NODE_COUNT": 3, "STORAGE_PATH": RUNS}, cwd=clean_env), ZONES.split(","))
    for name, doc in expected.items():
        assert yaml.safe_load((out / name).read_text()) == doc
    assert yaml.safe_load((out / "raycluster.yaml").read_text())["spec"]["workerGroupSpecs"][0]["maxReplicas"] == 3
    assert "wrote" in capsys.readouterr().out


def test_render_without_out_prints_yaml_and_writes_nothing(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BUCKET, "render", "--only", "raycluster"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["kind"] for d in docs] == ["RayCluster"]
    assert list(clean_env.iterdir()) == []


def test_render_only_helm_needs_no_zones(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--only", "helm", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc["files"]) == ["helm/cluster-autoscaler.values.yaml", "helm/kuberay-operator.values.yaml",
                                    "helm/nvidia-device-plugin.values.yaml"]


def test_render_json_with_out_lists_files(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = clean_env / "o"
    assert main([*STORE, "render", "--zones", ZONES, "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["out"] == str(out) and sorted(doc["files"]) == ALL_FILES == files_under(out)


def test_render_without_credentials_succeeds_and_says_who_uploads_the_code_zip(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.render import codezip

    assert main([*STORE, "render", "--only", "rayjob"]) == 0
    out = capsys.readouterr()
    uri = codezip.build().uri("raydlc-runs")
    (line,) = [ln for ln in out.err.splitlines() if "code zip" in ln]
    assert line.startswith(f"raydlc's code zip {uri} is not uploaded (no AWS credentials found")
    assert line.endswith("`raydlc up` or `raydlc submit --rayjob` uploads it")
    assert uri in out.out  # the RayJob names it all the same
    assert main([*STORE, "render", "--only", "rayjob", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["code_zip"]["uri"] == uri and (doc["code_zip"]["uploaded"], doc["code_zip"]["present"]) == (False, False)
    assert main([*STORE, "render", "--only", "raycluster"]) == 0 and "code zip" not in capsys.readouterr().err  # no RayJob, no zip


@pytest.mark.parametrize(
    "args, needle",
    [
        (["render", "--only", "bogus"], "--only"),
        ([*BUCKET, "render"], "GPU_AZ"),
        ([*BUCKET, "--set", "GPU_NODE_TYPE=g99.huge", "render", "--zones", ZONES], "GPU_NODE_TYPE"),
        ([*BUCKET, "--set", "GPU_AZ=us-east-2c", "render", "--zones", ZONES], "GPU_AZ"),
        (["--set", "GPU_NODE_COUNT=1", "render", "--zones", ZONES], "STORAGE_BUCKET"),  # no AWS account to name the bucket from
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    args: list[str], needle: str, clean_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = clean_env / "manifests"
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "hint:" in err and "Traceback" not in err
    assert not out.exists()


def test_a_multi_node_job_without_shared_storage_is_a_config_error(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = clean_env / "manifests"
    assert main(["--set", "STORAGE_PATH=./runs", "render", "--zones", ZONES, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "STORAGE_PATH (flag): 2 nodes need storage every node sees" in err and "Traceback" not in err
    assert not out.exists()
    assert main(["--set", "STORAGE_PATH=/mnt/runs", "render", "--only", "rayjob"]) == 2
    assert "STORAGE_PATH (flag)" in capsys.readouterr().err and not out.exists()
    shared = ["--set", "STORAGE_PATH=/mnt/efs/runs", "--set", "STORAGE_SHARED=true"]
    assert main([*shared, "render", "--only", "rayjob", "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["files"]["rayjob.yaml"]
    env = json.loads(job["spec"]["runtimeEnvYAML"])["env_vars"]
    assert (env["RAYDLC_STORAGE_PATH"], env["RAYDLC_STORAGE_SHARED"]) == ("/mnt/efs/runs", "true")
    assert main(["--set", "GPU_NODE_COUNT=1", "--set", "STORAGE_PATH=/tmp/runs", "render", "--only", "rayjob"]) == 0  # one node: its own disk is enough


def test_out_that_is_a_file_is_an_input_error(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = clean_env / "afile"
    target.write_text("keep me")
    assert main([*STORE, "render", "--zones", ZONES, "--out", str(target)]) == 2
    assert target.read_text() == "keep me"
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("only, heavy", [([], "boto3"), (["--only", "raycluster"], "")])
def test_render_command_imports_nothing_heavy(tmp_path: Path, only: list[str], heavy: str) -> None:
    """Only boto3, and only to offer the RayJob's code zip to the bucket (render.md): nothing else heavy, ever."""
    code = (
        "import sys; from raydlc.cli import main; rc = main(['--set', 'STORAGE_PATH=s3://b/p', 'render', '--zones', %r, *%r]); "
        "sys.stderr.write('HEAVY=' + ','.join(sorted(m for m in ('torch','ray','transformers','kubernetes','boto3') "
        "if m in sys.modules)) + '\\n'); sys.exit(rc)" % (ZONES, only)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYDLC_")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-800:]
    assert f"HEAVY={heavy}\n" in r.stderr
    assert ("kind: RayJob" in r.stdout) is not only


def test_render_refuses_a_document_its_schema_rejects_and_writes_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    """A renderer bug (here: a misspelt field) is caught by the packaged CRD schema before any file is written."""
    import raydlc.render.raycluster as rc

    real = rc.render_raycluster

    def misspelt(cfg, target=None):
        doc = real(cfg, target)
        doc["spec"]["headGroupSpec"]["rayStartParam"] = doc["spec"]["headGroupSpec"].pop("rayStartParams")
        return doc

    monkeypatch.setattr(rc, "render_raycluster", misspelt)
    out = tmp_path / "out"
    assert main([*STORE, "render", "--zones", ZONES, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "raycluster.yaml" in err and "spec.headGroupSpec" in err and "rayStartParam" in err
    assert not out.exists() or list(out.iterdir()) == []


def test_schema_tests_need_nothing_beside_the_repo(tmp_path: Path) -> None:
    """A copy of the package and the render tests, with no ../shared anywhere above it, passes the schema tests."""
    import shutil

    repo = Path(__file__).resolve().parents[1]
    clone = tmp_path / "fresh"
    shutil.copytree(repo / "src", clone / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (clone / "tests").mkdir()
    for name in ("conftest.py", "test_render.py"):
        shutil.copy(repo / "tests" / name, clone / "tests" / name)
    assert not (clone.parent / "shared").exists()
    env = {**os.environ, "PYTHONPATH": str(clone / "src")}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs", "tests/test_render.py",
         "-k", "matches_the_eksctl_schema or match_the_kuberay_crds or rejects_an_unknown_field"],
        capture_output=True, text=True, env=env, timeout=300, cwd=clone,
    )
    assert r.returncode == 0, r.stdout[-1500:]
    assert "passed" in r.stdout and "skipped" not in r.stdout and "error" not in r.stdout
    where = subprocess.run([sys.executable, "-c", "import raydlc.schemas; print(raydlc.schemas.__file__)"],
                           capture_output=True, text=True, env=env, timeout=60, cwd=clone)
    assert where.stdout.strip().startswith(str(clone / "src")), where.stdout  # the tests read the copy
