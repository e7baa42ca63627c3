"""The RayJob on the standing cluster carries raydlc itself: its runtime env is one Ray 2.58 accepts, and the zip it
names, unpacked the way Ray unpacks a remote py_modules zip (`packaging.unzip_package`, top directory stripped),
gives an `import raydlc` that comes from the zip."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from raydlc.config import load_config
from raydlc.render import FILES, codezip, render_all


def test_the_rendered_runtime_env_is_one_ray_accepts(tmp_path: Path) -> None:
    from ray.runtime_env import RuntimeEnv

    cfg = load_config(env={}, overrides={"STORAGE_PATH": "s3://raydlc-runs/team", "STEPS": 7}, cwd=tmp_path)
    job = render_all(cfg, ["us-east-2a"], only="rayjob")[FILES["rayjob"]]["spec"]
    doc = json.loads(job["runtimeEnvYAML"])
    env = RuntimeEnv(**doc)  # Ray validates py_modules URIs and env_vars types here
    (uri,) = env.py_modules()
    assert uri == codezip.build().uri("raydlc-runs") and uri.startswith("s3://raydlc-runs/code/raydlc-")
    assert env.env_vars()["RAYDLC_STEPS"] == "7"
    assert job["entrypoint"] == "python -m raydlc.train"


def test_the_zip_is_stable_and_imports_after_ray_unpacks_it(tmp_path: Path) -> None:
    from ray._private.runtime_env.packaging import unzip_package

    z = codezip.build()
    assert codezip.build() == z  # the same sources give the same bytes, so the same name
    names = zipfile.ZipFile(io.BytesIO(z.data)).namelist()
    assert "raydlc-code/raydlc/__init__.py" in names and not [n for n in names if n.endswith(".pyc")]
    pkg = tmp_path / z.name
    pkg.write_bytes(z.data)
    target = tmp_path / "unpacked"
    target.mkdir()
    unzip_package(package_path=str(pkg), target_dir=str(target), remove_top_level_directory=True, unlink_zip=True)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import raydlc, raydlc.config, raydlc.train; "
            "print(raydlc.__file__)")
    p = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert Path(p.stdout.strip()) == target / "raydlc" / "__init__.py"
