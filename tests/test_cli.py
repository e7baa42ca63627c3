from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raydlc.cli import main

HEAVY = ("torch", "ray", "transformers", "kubernetes", "boto3")


def run_cli(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RAYDLC_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "raydlc.cli", *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=120
    )


def test_bad_env_value_exits_2_naming_the_field(tmp_path: Path) -> None:
    r = run_cli(["config", "show"], env={"RAYDLC_GPU_NODE_COUNT": "-1"}, cwd=tmp_path)
    assert r.returncode == 2
    assert "GPU_NODE_COUNT" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_env_value_shows_with_source_env(tmp_path: Path) -> None:
    r = run_cli(["config", "show", "--json"], env={"RAYDLC_CLUSTER_NAME": "my-probe"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["config"]["cluster"]["name"] == "my-probe"
    row = next(f for f in doc["fields"] if f["name"] == "CLUSTER_NAME")
    assert (row["value"], row["source"]) == ("my-probe", "env")


def test_set_flag_beats_env(tmp_path: Path) -> None:
    r = run_cli(["--set", "STEPS=12", "config", "show", "--json"], env={"RAYDLC_STEPS": "3"}, cwd=tmp_path)
    doc = json.loads(r.stdout)
    row = next(f for f in doc["fields"] if f["name"] == "STEPS")
    assert (row["value"], row["source"]) == (12, "flag")


def test_config_init_then_show_gives_defaults(tmp_path: Path, clean_env: Path) -> None:
    target = tmp_path / "raydlc.yaml"
    assert main(["config", "init", str(target)]) == 0
    text = target.read_text()
    assert "RAYDLC_GPU_NODE_COUNT" in text
    assert main(["config", "init", str(target)]) == 2  # refuses to overwrite
    assert target.read_text() == text
    assert main(["config", "init", str(target), "--force"]) == 0
    r = run_cli(["config", "show", "--json"], cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert {f["source"] for f in doc["fields"]} == {"file"}
    r0 = run_cli(["config", "show", "--json"], cwd=tmp_path.parent)
    assert json.loads(r0.stdout)["config"] == doc["config"]


def test_debug_shows_traceback(tmp_path: Path) -> None:
    r = run_cli(["--debug", "config", "show"], env={"RAYDLC_STEPS": "0"}, cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_unknown_command_is_a_usage_error() -> None:
    assert main(["no-such-command"]) == 2


def test_version_json_reports_local_and_image() -> None:
    r = run_cli(["version", "--json"])
    doc = json.loads(r.stdout)
    assert doc["image"]["ray"] == "2.58.0" and doc["image"]["torch"] == "2.13.0"
    assert doc["local"]["ray"] == "2.58.0"


@pytest.mark.parametrize("args", [["--help"], ["config", "--help"], ["config", "show", "--json"]])
def test_cli_start_imports_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    code = (
        "import sys; from raydlc.cli import main; rc = main(%r); "
        "print('HEAVY=' + ','.join(sorted(m for m in %r if m in sys.modules)))" % (args, HEAVY)
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "HEAVY=\n" in r.stdout or r.stdout.rstrip().endswith("HEAVY="), r.stdout[-500:]


def test_importtime_of_help_has_no_heavy_module() -> None:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "raydlc.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
    assert imported.isdisjoint(HEAVY), imported & set(HEAVY)


def test_human_output_keeps_host_pid_tid_prefixes_verbatim(tmp_path: Path) -> None:
    """rich turns ':1234:' into an emoji unless told not to; evidence must quote the log as it is."""
    log = tmp_path / "w.log"
    log.write_text("ip-10-0-1-5:1234:1234 [0] NCCL INFO NCCL version 2.29.7+cuda13.0\n")
    r = run_cli(["nccl", str(log)])
    assert "ip-10-0-1-5:1234:1234 [0] NCCL INFO NCCL version" in r.stdout, r.stdout
