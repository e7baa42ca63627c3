"""Cluster-side code in the Ray Train image's own packages (tests/doubles/dlc_env.py, dlc_packages.json).

The image is built from aws/deep-learning-containers docker/ray-train/uv.lock; it has no matplotlib, no
kubernetes, no pathspec, and typer 0.26.8. What runs there (the training entrypoint and its workers,
data preparation, the node probe, the preflight's collectives job) runs here under an import guard that
shows only those packages, in the driver and in every Ray worker; raydlc itself travels with the job.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.doubles import dlc_env as D

sys.path.insert(0, str(D.REPO / "scripts"))
import dlc_packages

# What a job's processes import on the cluster: the training entrypoint, its loop and data, the probes.
CLUSTER_MODULES = (
    "raydlc.train.__main__", "raydlc.train.loop", "raydlc.train.launch", "raydlc.train.checkpoint", "raydlc.train.lora",
    "raydlc.train.lora_export", "raydlc.data.dataset",
    "raydlc.data.pipeline", "raydlc.edges.storage", "raydlc.edges.ray_runtime", "raydlc.checks.node_probe",
    "raydlc.checks.storage_access", "raydlc.checks.head_isolation", "raydlc.checks.collectives_job", "raydlc.checks.preflight",
)


@pytest.fixture(scope="module")
def guard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("dlc-guard")
    D.prepare(where)
    return where


def test_the_fact_file_is_the_locks_package_set() -> None:
    f = D.facts()
    assert f["source"] == {"repo": "aws/deep-learning-containers", "path": "docker/ray-train/uv.lock", "commit": f["source"]["commit"]}
    assert len(f["source"]["commit"]) == 40 and f["requires_python"] == "==3.13.*"
    pk = f["packages"]
    assert f["ray"] == pk["ray"] == "2.56.0" and pk["typer"] == "0.26.8" and pk["torch"] == "2.13.0"
    assert not {"matplotlib", "kubernetes", "pathspec", "dlc-ray-train"} & set(pk)
    assert {"pyarrow", "transformers", "tokenizers", "safetensors", "pydantic", "rich", "pyyaml", "boto3", "numpy"} <= set(pk)


def test_the_script_keeps_names_and_versions_and_leaves_the_project_out() -> None:
    lock = """version = 1
[[package]]
name = "dlc-ray-train"
version = "2.56.0"
source = { virtual = "." }
[[package]]
name = "PyYAML"
version = "6.0.3"
source = { registry = "https://pypi.org/simple" }
[[package]]
name = "torch"
version = "2.13.0+cu130"
source = { registry = "https://download.pytorch.org/whl/cu130" }
"""
    assert dlc_packages.packages(lock) == {"pyyaml": "6.0.3", "torch": "2.13.0"}


def guarded(code: str, guard: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    return D.run(["-c", code], guard, extra_env=env, timeout=timeout)


def test_the_guard_refuses_what_the_image_lacks_and_lets_the_image_through(guard: Path) -> None:
    code = """
import importlib, importlib.util, json
out = {}
for m in ("matplotlib", "kubernetes", "pathspec", "typer", "ray", "torch", "pyarrow", "transformers", "yaml"):
    try:
        importlib.import_module(m)
        out[m] = "ok"
    except ImportError as e:
        out[m] = type(e).__name__
out["find_spec(matplotlib)"] = importlib.util.find_spec("matplotlib")
print(json.dumps(out))
"""
    done = guarded(code, guard)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert {m: got[m] for m in ("matplotlib", "kubernetes", "pathspec", "typer")} == dict.fromkeys(("matplotlib", "kubernetes", "pathspec", "typer"), "ModuleNotFoundError")
    assert {got[m] for m in ("ray", "torch", "pyarrow", "transformers", "yaml")} == {"ok"}
    assert got["find_spec(matplotlib)"] is None  # absent, not broken: optional imports see it as not installed
    assert {"matplotlib", "kubernetes", "pathspec", "typer"} <= D.refused(guard)
    # raydlc's command line needs typer (>= 0.28, the image has 0.26.8): it does not load there, and the job does not use it.
    assert guarded("import raydlc.cli.app", guard).returncode != 0


def test_the_cluster_side_modules_load_in_the_image_and_import_only_what_the_lock_has(guard: Path) -> None:
    code = f"""
import importlib, json, sys
for m in {CLUSTER_MODULES!r}:
    importlib.import_module(m)
print(json.dumps(sorted(m.__file__ for n, m in sys.modules.items() if n.startswith("raydlc") and getattr(m, "__file__", None))))
"""
    done = guarded(code, guard)
    assert done.returncode == 0, done.stderr[-3000:]
    files = json.loads(done.stdout.splitlines()[-1])
    assert len(files) > 20 and any(f.endswith("train/loop.py") for f in files)
    assert not any(f.endswith(("cli/app.py",)) for f in files)
    # raydlc's own imports, module level or inside functions, held to the lock itself (not this venv's extra dependencies).
    lock_modules = lock_top_level_modules()
    foreign = {}
    for f in files:
        for top in imported_tops(Path(f)):
            if top not in lock_modules and top not in sys.stdlib_module_names and top != "raydlc":
                foreign.setdefault(top, []).append(Path(f).name)
    assert foreign == {}, f"imports of packages the image does not have: {foreign}"


def lock_top_level_modules() -> set[str]:
    from importlib import metadata

    image = set(D.image_packages())
    out = {n.replace("-", "_") for n in image}
    for module, dists in metadata.packages_distributions().items():
        if any(D.normalized(d) in image for d in dists):
            out.add(module)
    return out - set(D.NOT_IN_IMAGE) - {"typer"}


def imported_tops(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.partition(".")[0])
    return out


# ---- on a local Ray whose every process has the image's packages -----------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HEAD = """
import json, sys, ray
ctx = ray.init(address="local", num_cpus=4, include_dashboard=True, dashboard_port=int(sys.argv[1]), log_to_driver=False)
print(json.dumps({"gcs": ctx.address_info["gcs_address"], "dashboard": ctx.dashboard_url}), flush=True)
sys.stdin.read()  # until the test closes it
ray.shutdown()
"""


@pytest.fixture(scope="module")
def head(guard: Path) -> Iterator[dict[str, Any]]:
    """A local Ray head started under the guard: its raylet, dashboard and every worker inherit it."""
    p = subprocess.Popen([sys.executable, "-c", HEAD, str(free_port())], env={**D.env(guard), "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"},
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=D.REPO)
    try:
        line = p.stdout.readline() if p.stdout else ""
        if not line:
            raise AssertionError(f"the guarded head did not start: {p.stderr.read()[-3000:] if p.stderr else ''}")
        yield json.loads(line)
    finally:
        if p.stdin:
            p.stdin.close()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.terminate()  # the head this fixture started, by its own handle
            p.wait(timeout=30)


def on_head(argv: list[str], guard: Path, head: dict[str, Any], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return D.run(argv, guard, extra_env={"RAY_ADDRESS": head["gcs"]}, timeout=timeout)


@pytest.mark.slow
def test_matplotlib_is_absent_inside_a_ray_worker_of_the_guarded_head(guard: Path, head: dict[str, Any]) -> None:
    code = """
import json, ray
ray.init(address="auto", log_to_driver=False)

@ray.remote(num_cpus=0)
def inside() -> dict:
    import os, sys
    out = {"pid": os.getpid(), "guard": type(sys.meta_path[0]).__name__}
    try:
        import matplotlib  # installed in this venv: only the guard can keep it out
        out["matplotlib"] = matplotlib.__file__
    except ImportError as e:
        out["matplotlib"] = type(e).__name__
    return out

print(json.dumps(ray.get(inside.remote(), timeout=120)))
"""
    done = on_head(["-c", code], guard, head)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["matplotlib"] == "ModuleNotFoundError" and got["guard"] == "NotInImage" and got["pid"] != os.getpid()


@pytest.mark.slow
def test_the_builtin_job_prepares_its_data_trains_and_exports_in_the_image(guard: Path, head: dict[str, Any], tmp_path: Path) -> None:
    from raydlc.data.corpus import bundled_corpus

    corpus = tmp_path / "docstrings.txt"
    corpus.write_text("\n\n".join(d.text for d in bundled_corpus(max_chars=150_000)))
    settings = {"MODEL_ID": "tiny", "STEPS": 4, "SEQ_LEN": 32, "BATCH_SIZE": 2, "NUM_WORKERS": 2, "USE_GPU": "false", "CHECKPOINT_EVERY": 2,
                "LEARNING_RATE": 2e-3, "DATA": str(corpus), "STORAGE_PATH": str(tmp_path / "runs")}
    done = on_head(["-m", "raydlc.train", *(a for k, v in settings.items() for a in ("--set", f"{k}={v}"))], guard, head)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4 and summary["plot"] is None and summary["workers"] == 2
    run_dir = Path(summary["run_dir"])
    assert (run_dir / "export" / "config.json").is_file() and (run_dir / "metrics.jsonl").is_file() and (run_dir / "summary.json").is_file()
    assert sorted(p.name for p in run_dir.glob("checkpoint_*") if p.is_dir()) == ["checkpoint_000002", "checkpoint_000004"]
    assert not (run_dir / "loss.png").exists() and "matplotlib is not installed" in summary["plot_note"]
    assert not (run_dir / "export" / "loss.png").exists()  # the card keeps its loss table only


@pytest.mark.slow
def test_the_node_probe_answers_for_every_node_in_the_image(guard: Path, head: dict[str, Any]) -> None:
    done = on_head(["-m", "raydlc.checks.node_probe", "--fi-info", "--head", "auto"], guard, head)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["probe"] == "nodes" and len(doc["nodes"]) == 1
    node = doc["nodes"][0]
    assert not node.get("failed") and "fi_info" in node and node["head"]["connected"] is True  # the dashboard the head runs, reached from a worker


@pytest.mark.slow
def test_the_preflight_collectives_job_measures_in_the_image(guard: Path, head: dict[str, Any]) -> None:
    code = """
import json, ray
ray.init(address="auto", log_to_driver=False)
from raydlc.checks.preflight import run_preflight
r = run_preflight(num_workers=2, use_gpu=False, expectation=None, sizes=[4096], iters=2, warmup=1)
print(json.dumps({"measurements": len(r.measurements), "backend": r.backend}))
"""
    done = on_head(["-c", code], guard, head)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["measurements"] > 0 and got["backend"] == "gloo"


DEADLINE_S = 150  # past Ray's job start, the data's preparation and the workers' start on a loaded two-core CI machine (60 was not)


@pytest.mark.slow
def test_the_builtin_job_given_a_deadline_stops_itself_there(guard: Path, head: dict[str, Any], tmp_path: Path) -> None:
    """As a RayJob carries it (RAYDLC_JOB_DEADLINE_S = activeDeadlineSeconds): the driver aborts the run at the deadline,
    since KubeRay v1.7.0 would only mark the RayJob Failed and leave the job on the GPU nodes."""
    import time

    from raydlc.data.corpus import bundled_corpus

    corpus = tmp_path / "docstrings.txt"
    corpus.write_text("\n\n".join(d.text for d in bundled_corpus(max_chars=150_000)))
    settings = {"MODEL_ID": "tiny", "STEPS": 1_000_000, "SEQ_LEN": 32, "BATCH_SIZE": 2, "NUM_WORKERS": 1, "USE_GPU": "false",
                "CHECKPOINT_EVERY": 0, "DATA": str(corpus), "STORAGE_PATH": str(tmp_path / "runs")}
    began = time.monotonic()
    done = D.run(["-m", "raydlc.train", *(a for k, v in settings.items() for a in ("--set", f"{k}={v}"))], guard,
                 extra_env={"RAY_ADDRESS": head["gcs"], "RAYDLC_JOB_DEADLINE_S": str(DEADLINE_S)}, timeout=DEADLINE_S + 300)
    took = time.monotonic() - began
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-3000:])
    assert "past its deadline" in done.stderr and "deadline: training run" in done.stdout
    assert DEADLINE_S <= took < DEADLINE_S + 180, took
    assert "loss" in done.stdout, done.stderr[-3000:]  # it was training when the deadline came
