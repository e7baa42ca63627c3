"""benchmarks/gpu_check.sh: what runs without a GPU (arguments, the planner's prediction, the commands)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raydlc import plan as planner
from raydlc.models import get_spec

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def check(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The script with a PATH whose nvidia-smi only records that it was called, and no PYTHONPATH of ours."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    spy = bin_dir / "nvidia-smi"
    spy.write_text(f"#!/bin/sh\necho called >> {tmp_path / 'nvidia-smi-called'}\nexit 1\n")
    spy.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHON")}
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_dry_run_predicts_the_train_run_and_lists_the_commands_without_touching_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = check(["--dry-run", "--gpu", "h200", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "nvidia-smi-called").exists()  # a dry run needs no GPU
    plan = json.loads((out / "plan.json").read_text())
    want = planner.plan(planner.Workload(get_spec("qwen2.5-0.5b"), seq_len=1024, micro_batch=8, grad_accum=4, sync="once", policy="bf16-mixed"),
                        planner.layout_for(1, 1, gpu="h200", network_gbps=100))
    assert (plan["step_time_s"], plan["tokens_per_s"], plan["per_gpu_bytes"]) == (
        want.step_time_s["estimate"], want.step_time_s["tokens_per_s"], want.per_gpu_bytes["total"])
    assert plan["fits"] and plan["grad_accum"] == 4 and plan["sync"] == "once"
    commands = (out / "commands.sh").read_text()
    assert "nvidia-smi" in commands and "benchmarks/gpu_efficiency.py" in commands and "--out " + str(out) in commands
    train = next(line for line in commands.splitlines() if "-m raydlc.train" in line)
    for part in ("--model qwen2.5-0.5b", "--workers 1", "--grad-accum 4", "--batch-size 8", "--seq-len 1024", "--bf16", "USE_GPU=true"):
        assert part in train, part
    assert "pip" not in SCRIPT.read_text().replace("pipefail", "")  # the GPU machine has no network: nothing is installed
    # The final table is printed and written, saying plainly what a dry run did not measure.
    assert f"{want.step_time_s['estimate']:.3f}" in r.stdout and "- (dry run)" in r.stdout
    assert (out / "summary.txt").read_text().strip() in r.stdout
    assert json.loads((out / "summary.json").read_text())["measured"] is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--bogus"], "unknown option --bogus"),
        (["--dry-run", "--gpu", "tpu"], "unknown GPU 'tpu'"),
        (["--dry-run", "a", "b"], "one OUTDIR only"),
        (["--dry-run", "--gpu"], "--gpu needs a value"),
        (["--dry-run", "--python", "/no/such/python"], "no Python at"),
    ],
)
def test_bad_arguments_stop_with_one_line_and_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    r = check(args, tmp_path)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "nvidia-smi-called").exists()


def test_without_a_gpu_the_real_check_refuses_before_running_anything(tmp_path: Path) -> None:
    r = check([str(tmp_path / "out")], tmp_path)
    assert r.returncode == 1 and "sees no CUDA GPU" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "plan.json").exists()


def test_dry_run_plans_the_7b_shaped_memory_check(tmp_path: Path) -> None:
    from dataclasses import replace

    out = tmp_path / "out"
    r = check(["--dry-run", "--gpu", "h200", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "memory_7b.json").read_text())
    spec = replace(get_spec("qwen2.5-7b"), num_layers=4)
    for name, chunk in (("recommended", 1024), ("unchunked", 0)):
        row = doc["variants"][name]
        want = planner.memory_bytes(planner.Workload(spec, seq_len=2048, activation_checkpointing=True, loss_chunk=chunk, reduce_dtype="bf16"), 1)
        assert row["planned"]["total"] == want["total"] and row["measured"] is None  # a dry run measures nothing
    assert doc["variants"]["unchunked"]["planned"]["logits"] == 12 * spec.vocab_size * 2048
    memory = next(line for line in (out / "commands.sh").read_text().splitlines() if "memory_7b.py" in line)
    assert "--model qwen2.5-7b --layers 4 --seq-len 2048" in memory and "planned" in r.stdout
