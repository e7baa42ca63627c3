"""What travels with a job, checked before anything is sent: the upload, pip pins, env, the program."""

from __future__ import annotations

import os
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from raydlc.errors import InputError
from raydlc.jobs import runtime_env

IMAGE = {"torch": "2.13.0", "ray": "2.58.0"}


def _tree(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())


def test_the_upload_leaves_out_git_and_what_each_ignore_file_names(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "train.py": "print(1)\n", ".git/objects/ab/cdef": b"x" * 5000, ".gitignore": "*.ckpt\n/build/\n",
        "model.ckpt": b"x" * 100, "build/out.bin": b"x", "src/build/keep.py": "", "data/.rayignore": "*.bin\n",
        "data/a.bin": b"x", "data/keep.txt": "k", "sub/.git": "gitdir: elsewhere\n",
    })
    up = runtime_env.working_dir_upload(tmp_path)
    files = {rel for rel, _ in up.files}
    assert files == {"train.py", ".gitignore", "src/build/keep.py", "data/.rayignore", "data/keep.txt"}
    assert up.size > sum(n for _, n in up.files)  # zip headers counted


def test_the_size_checked_is_the_size_ray_would_send(tmp_path: Path) -> None:
    """Ray stores (does not compress) each file in its zip: our count matches a real stored zip."""
    _tree(tmp_path, {"a.py": "x" * 1000, "pkg/b.py": "y" * 333, "pkg/deeper/c.txt": "z"})
    up = runtime_env.working_dir_upload(tmp_path)
    out = tmp_path.parent / "real.zip"
    with zipfile.ZipFile(out, "w", strict_timestamps=False) as z:
        for rel, _ in up.files:
            z.write(tmp_path / rel, rel)
    assert up.size == out.stat().st_size


def test_a_working_dir_over_the_dashboards_limit_is_refused_naming_the_biggest_file(tmp_path: Path) -> None:
    _tree(tmp_path, {"train.py": "print(1)\n"})
    big = tmp_path / "weights.bin"
    with big.open("wb") as f:  # sparse: 101 MiB that costs no disk
        f.truncate(101 * 2**20)
    with pytest.raises(InputError) as e:
        runtime_env.check_upload(runtime_env.working_dir_upload(tmp_path))
    assert "over the Ray dashboard's 100.0 MiB limit" in e.value.message
    assert "weights.bin (101.0 MiB)" in e.value.message
    assert ".rayignore" in (e.value.hint or "")
    (tmp_path / ".rayignore").write_text("weights.bin\n")
    runtime_env.check_upload(runtime_env.working_dir_upload(tmp_path))  # ignored: fits


class FakeDist:
    """A distribution as importlib.metadata shows one: version, requirements, files."""

    def __init__(self, version: str, requires: list[str] | None = None, top_level: str | None = None) -> None:
        self.version = version
        self.requires = requires
        self._top = top_level
        self.files: list[str] = []

    def read_text(self, name: str) -> str | None:
        return self._top if name == "top_level.txt" else None


def _pin(specs: list[str], dists: dict[str, Any]) -> list[str]:
    return runtime_env.pin_packages(specs, IMAGE, installed=lambda n: dists.get(n.lower()))


def test_pip_packages_are_pinned_to_what_is_installed_here() -> None:
    dists = {"pyyaml": FakeDist("6.0.4"), "einops": FakeDist("0.8.1", ["torch>=2.0"], "einops")}
    assert _pin(["pyyaml", "einops==0.8.0", "pyyaml[extra]==6.0.4; python_version >= '3'"], dists) == [
        "pyyaml==6.0.4", "einops==0.8.0", 'pyyaml[extra]==6.0.4; python_version >= "3"']
    # the real installed one, through importlib.metadata
    assert runtime_env.pin_packages(["PyYAML"], IMAGE) == [f"PyYAML=={metadata.version('PyYAML')}"]


@pytest.mark.parametrize(("spec", "dists", "says"), [
    ("nosuchpkg", {}, "unpinned and not installed here"),
    ("pyyaml>=6", {"pyyaml": FakeDist("6.0.4")}, "not pinned to one version (installed here: 6.0.4)"),
    ("pyyaml==6.*", {}, "not pinned to one version"),
    ("torch==2.0.0", {}, "the image's own torch 2.13.0"),
    ("Ray", {}, "the image's own ray 2.58.0"),
    ("oldlib", {"oldlib": FakeDist("1.0", ["torch<2.0", "numpy"])}, "requires torch<2.0, which would replace the image's torch 2.13.0"),
    ("shadow", {"shadow": FakeDist("1.0", None, "ray\nshadow_util")}, "installs a module named 'ray'"),
    ("git+https://example.invalid/x.git", {}, "not a requirement"),
])
def test_pip_packages_that_float_or_replace_torch_or_ray_are_refused(spec: str, dists: dict[str, Any], says: str) -> None:
    with pytest.raises(InputError) as e:
        _pin([spec], dists)
    assert says in e.value.message


def test_requirements_of_the_image_own_that_it_satisfies_are_fine() -> None:
    dists = {"accel": FakeDist("1.0", ["torch>=2.0", "ray[train]>=2.50; python_version >= '3'", "torch<2; extra == 'old'"])}
    assert _pin(["accel"], dists) == ["accel==1.0"]


def test_env_passes_nccl_and_fi_but_refuses_secrets() -> None:
    assert runtime_env.parse_env(["NCCL_DEBUG=INFO", "FI_PROVIDER=efa", "X=a=b"]) == {"NCCL_DEBUG": "INFO", "FI_PROVIDER": "efa", "X": "a=b"}
    for pair in ("HF_TOKEN=hf_x", "AWS_SECRET_ACCESS_KEY=k", "AWS_ACCESS_KEY_ID=AKIA", "DB_PASSWORD=p", "WANDB_API_KEY=k"):
        with pytest.raises(InputError, match="looks like a secret"):
            runtime_env.parse_env([pair])
    with pytest.raises(InputError, match="not NAME=VALUE"):
        runtime_env.parse_env(["1BAD=x"])


def _build(tmp_path: Path, **kw: Any) -> runtime_env.JobSpec:
    args: dict[str, Any] = dict(script=None, args=[], working_dir=None, pip=[], env={}, settings_env={}, image=IMAGE, name=None, target="local")
    args.update(kw)
    return runtime_env.build(**args)


def test_a_script_job_carries_raydlc_its_working_dir_and_nothing_secret(tmp_path: Path) -> None:
    _tree(tmp_path, {"proj/train.py": "print(1)\n", "proj/.git/HEAD": "ref"})
    spec = _build(tmp_path, script=tmp_path / "proj/train.py", args=["--lr", "1e-3", "two words"], env={"NCCL_DEBUG": "WARN"}, name="run-1")
    assert spec.entrypoint == "python train.py --lr 1e-3 'two words'"
    assert spec.runtime_env["working_dir"] == str((tmp_path / "proj").resolve())
    assert spec.runtime_env["excludes"] == [".git", "__pycache__", "*.pyc"]
    assert spec.runtime_env["py_modules"] == [str(Path(runtime_env.__file__).resolve().parents[1])]
    assert spec.runtime_env["env_vars"] == {"NCCL_DEBUG": "WARN"}
    assert spec.submission_id == "run-1" and spec.metadata["program"] == "train.py"
    assert any("NCCL_DEBUG=WARN" in w for w in spec.warnings)  # verify could not prove the transport


def test_the_builtin_program_takes_the_training_settings(tmp_path: Path) -> None:
    spec = _build(tmp_path, settings_env={"RAYDLC_STEPS": "12"}, args=["--seq-len", "32"])
    assert spec.entrypoint == "python -m raydlc.train --seq-len 32" and spec.builtin
    assert "working_dir" not in spec.runtime_env and spec.runtime_env["env_vars"] == {"RAYDLC_STEPS": "12"}


@pytest.mark.parametrize(("kw", "says"), [
    ({"script": "missing.py"}, "no such file"),
    ({"script": "proj", "working_dir": None}, "is not a file"),
    ({"script": "other/x.py", "working_dir": "proj"}, "is not inside --working-dir"),
    ({"script": "proj/skip.py"}, "left out of the upload"),
    ({"working_dir": "nowhere"}, "no such directory"),
    ({"name": "two words"}, "--name"),
])
def test_bad_programs_are_refused_before_anything_is_sent(tmp_path: Path, kw: dict[str, Any], says: str) -> None:
    _tree(tmp_path, {"proj/train.py": "", "proj/skip.py": "", "proj/.rayignore": "skip.py\n", "other/x.py": ""})
    kw = {k: (tmp_path / v if isinstance(v, str) and k != "name" else v) for k, v in kw.items()}
    with pytest.raises(InputError, match=says):
        _build(tmp_path, **kw)


def test_local_runs_write_where_submit_was_run(tmp_path: Path) -> None:
    (tmp_path / "corpus.txt").write_text("x")
    env = runtime_env.absolute_local_paths({"RAYDLC_DATA": "corpus.txt", "RAYDLC_STEPS": "3"}, cwd=tmp_path)
    assert env == {"RAYDLC_DATA": str(tmp_path / "corpus.txt"), "RAYDLC_STEPS": "3", "RAYDLC_STORAGE_PATH": str(tmp_path / "raydlc-out")}
    assert runtime_env.absolute_local_paths({"RAYDLC_STORAGE_PATH": "s3://b/p"}, cwd=tmp_path)["RAYDLC_STORAGE_PATH"] == "s3://b/p"
    assert os.path.isabs(runtime_env.absolute_local_paths({"RAYDLC_STORAGE_PATH": "~/runs"}, cwd=tmp_path)["RAYDLC_STORAGE_PATH"])


def test_a_dashboard_traceback_is_shortened_to_the_error_it_ends_with() -> None:
    from raydlc.edges.ray_dashboard import _short

    body = "Request failed with status code 500: Traceback (most recent call last):\n  File \"x.py\", line 1\n    f()\nValueError: no such package\n"
    assert _short(RuntimeError(body)) == "Request failed with status code 500: ValueError: no such package"
    assert _short(RuntimeError("status code 404: job not found\nmore")) == "status code 404: job not found"
    assert _short(RuntimeError("")) == "RuntimeError"
