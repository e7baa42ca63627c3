"""benchmarks/gpu_check.sh: its limits (time, files), its arguments, and its dry run in a Python
that, like the GPU machine's image, has no ray and no pydantic (pydantic only from the carried wheels)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
PHASES_PY = ROOT / "benchmarks" / "gpu_check_phases.py"
PHASES = ("nccl", "throughput", "memory", "l4", "precision", "lora")
# What the GPU image has that the loop needs (docs/gpu-benchmarks.md); no ray, no pydantic.
IMAGE_LIKE = ("torch==2.13.0", "numpy>=2", "pyyaml>=6", "transformers>=5", "safetensors>=0.4")
WITHOUT = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")


def env_without_ours() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHON")}


def script(args: list[str], tmp_path: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env_without_ours() | {"PYTHON": sys.executable}, cwd=tmp_path)


def test_the_phases_timeouts_add_up_to_at_most_360_s_and_every_phase_has_one() -> None:
    text = SCRIPT.read_text()
    limits = {k: int(v) for k, v in re.findall(r"^TIMEOUT_([A-Z0-9_]+)_S=(\d+)$", text, re.M)}
    assert sum(v for k, v in limits.items() if k.lower() in PHASES) <= 360, limits  # a rerun fits the GPU machine's 15 minutes
    phases = re.search(r"^PHASES=\((.*)\)$", text, re.M).group(1).split()
    assert [p.split(":")[0] for p in phases] == list(PHASES)
    assert [p.split(":")[1] for p in phases] == [f"$TIMEOUT_{n.upper()}_S" for n in PHASES]
    assert not re.search(r"import ray\b", text) and "pip install" not in text  # nothing installed on the GPU machine


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--bogus", "out"], "unknown option --bogus"),
        (["--dry-run"], "no OUTDIR"),
        (["--dry-run", "a", "b"], "one OUTDIR only"),
        (["--dry-run", "--gpu"], "--gpu needs a value"),
        (["--dry-run", "--python", "/no/such/python", "out"], "no Python at"),
        (["--dry-run", "--gpu", "tpu", "out"], "unknown GPU 'tpu'"),
    ],
)
def test_bad_arguments_stop_with_one_line_and_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    r = script(args, tmp_path)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_table_row_is_on_disk_the_moment_it_is_added(tmp_path: Path) -> None:
    sys.path.insert(0, str(PHASES_PY.parent))
    try:
        import gpu_check_phases as g
    finally:
        sys.path.remove(str(PHASES_PY.parent))
    g.add_row(tmp_path, {"phase": "throughput", "name": "m eager", "status": "ok", "measured": 900.0, "planned": 1000.0, "unit": " tok/s"})
    g.add_row(tmp_path, {"phase": "l4", "name": "m capped", "status": "skipped", "planned": 7.0, "note": "no | CUDA"})
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["m eager", "m capped"]
    table = (tmp_path / "summary.md").read_text()
    assert "| throughput | m eager | ok | 900 tok/s | 1,000 tok/s | 0.9 |" in table
    assert "no / CUDA" in table  # a cell never breaks the table
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "summary.md"]


def test_a_row_this_tree_cannot_measure_is_skipped_with_its_reason() -> None:
    """The lora phase before LoRA lands (or with a build that ignores LORA_RANK): a skipped row naming why,
    never a full fine-tune's figures under LoRA's name, and never an `error` that fails the check."""
    sys.path.insert(0, str(PHASES_PY.parent))
    try:
        import gpu_check_phases as g
    finally:
        sys.path.remove(str(PHASES_PY.parent))
    rows: list[tuple[str, str, str]] = []
    phase = SimpleNamespace(row=lambda name, status, **f: rows.append((name, status, f.get("note", ""))), cuda=False)

    def not_applied() -> None:
        raise g.LoRANotApplied("the product's build trained 3 parameters, not adapters only")

    g.Phase.guarded(phase, "m LoRA r16 eager", not_applied)  # type: ignore[arg-type]
    assert rows == [("m LoRA r16 eager", "skipped", "the product's build trained 3 parameters, not adapters only")]
    assert "lora" in g.PHASES and g.RUN["lora"] is g.phase_lora and g.LORA_RANK == 16


@pytest.mark.parametrize("lora_rank", [0, 16])
def test_a_planned_micro_batch_that_does_not_fit_is_a_row_and_half_of_it_is_measured(
    lora_rank: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The throughput and lora phases share one fallback: the OOM is a finding, the half is the figure."""
    sys.path.insert(0, str(PHASES_PY.parent))
    try:
        import gpu_check_phases as g
    finally:
        sys.path.remove(str(PHASES_PY.parent))
    tried: list[tuple[int, int]] = []

    def measured(ph: object, model: str, mb: int, compile: bool, lora_rank: int = 0) -> tuple[str, list[float], list[float]]:
        tried.append((mb, lora_rank))
        if len(tried) == 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return "trainer", [0.1], [2.0]

    monkeypatch.setattr(g, "_measured", measured)
    monkeypatch.setattr(g, "planned", lambda model, gpu, *, seq, micro_batch=None, lora_rank=0, compile=True: {"micro_batch": micro_batch or 8, "lora": lora_rank})
    rows: list[tuple[str, str, dict[str, object]]] = []
    phase = SimpleNamespace(row=lambda name, status, **f: rows.append((name, status, f)), cuda=False,
                            size=SimpleNamespace(gpu="L4", seq=128, toy=False))
    p, mb, t, times, losses = g._at_planned_micro_batch(phase, "m", "m eager", compile=False, lora_rank=lora_rank)  # type: ignore[arg-type]
    assert tried == [(8, lora_rank), (4, lora_rank)] and (mb, p, t, times, losses) == (4, {"micro_batch": 4, "lora": lora_rank}, "trainer", [0.1], [2.0])
    assert [(n, s, f["micro_batch"]) for n, s, f in rows] == [("m eager at the planner's micro-batch 8", "oom", 8)]


# ---- the dry run in a Python like the GPU image's -----------------------------------------------------


def image_like_python() -> Path:
    """A venv with the GPU image's packages the loop needs and neither ray nor pydantic, built once per
    set of versions (in the temp folder, renamed into place only when complete), from scratch on a clean machine."""
    key = hashlib.sha256(repr((sys.version_info[:2], IMAGE_LIKE, WITHOUT)).encode()).hexdigest()[:12]
    home = Path(tempfile.gettempdir()) / f"raydlc-gpu-check-venv-{key}"
    py = home / "bin" / "python"
    if (home / "complete").exists():
        return py
    # Renamed after the build: only `python -m ...` is used, which a moved venv still runs (its scripts' shebangs would not).
    staging = Path(str(home) + f".{os.getpid()}")
    subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True, timeout=120)
    subprocess.run([str(staging / "bin" / "python"), "-m", "pip", "install", "-q", *IMAGE_LIKE], check=True, timeout=900)
    # transformers pulls typer, whose release here pulls pydantic; the image's typer comes without it: so does this venv's.
    subprocess.run([str(staging / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", *WITHOUT], check=True, timeout=120)
    (staging / "complete").write_text("ok\n")
    try:
        staging.rename(home)
    except OSError:  # another run finished first
        shutil.rmtree(staging, ignore_errors=True)
    return py


@pytest.mark.slow
def test_dry_run_runs_every_phase_without_ray_or_pydantic_within_the_limits(tmp_path: Path) -> None:
    py = image_like_python()
    for missing in ("ray", "pydantic"):
        probe = subprocess.run([str(py), "-c", f"import {missing}"], capture_output=True, text=True, env=env_without_ours())
        assert probe.returncode != 0, f"the image-like venv must lack {missing}"
    wheels = tmp_path / "wheels"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(["bash", str(ROOT / "benchmarks" / "fetch_wheels.sh"), "--python-version", version, str(wheels)],
                   check=True, timeout=300, env=env_without_ours() | {"PIP": f"{sys.executable} -m pip"})
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--python", str(py), "--wheels", str(wheels), str(out)],
                       capture_output=True, text=True, timeout=600, env=env_without_ours(), cwd=tmp_path)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr + (out / "log.txt").read_text()
    print(f"dry run: {took:.0f} s")
    log = (out / "log.txt").read_text()
    assert "pydantic from the wheels" in log and "torch 2.13.0" in log
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["phase"] for r in rows} == {*PHASES, "fit"}
    assert "planning for GPU h100" in log and all(r["status"] == "ok" and r["gpu"] == "h100" for r in rows if r["phase"] == "fit")
    assert all(r["status"] in ("ok", "skipped") for r in rows), [r for r in rows if r["status"] not in ("ok", "skipped")]
    # The image's torch has every API the phases use: a "newer torch?" skip here is a bug the guard hid
    # (the memory phase once called optimizer_step without its loss and reported itself skipped).
    assert not [r for r in rows if "needs a newer torch" in str(r.get("note", ""))]
    names = {r["name"] for r in rows}
    assert {"tiny eager", "tiny compiled", "collectives"} <= names  # one process: NCCL is skipped, with its reason
    assert any("bf16 vs fp32 loss, 8 steps" in n for n in names) and any("chunked vs plain" in n for n in names)
    throughput = [r for r in rows if r["phase"] == "throughput"]
    assert all(r["planned"] > 0 and r["measured"] > 0 for r in throughput)  # the planner beside each measurement
    table = (out / "summary.md").read_text()
    assert all(f"| {p} |" in table for p in PHASES if p != "nccl")
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(p.relative_to(out).parts) <= 3 for p in files), files
    assert sorted(p.name for p in files) == ["log.txt", "results.json", "summary.md"]


@pytest.mark.slow
def test_a_phase_killed_midway_leaves_the_rows_it_finished(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = env_without_ours() | {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", str(PHASES_PY),
                          "throughput", "--out", str(out), "--toy"], env=env, cwd=ROOT, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (out / "results.json").exists():
            time.sleep(0.2)
        assert (out / "results.json").exists(), "no row within 240 s"
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # what `timeout` does to a phase that runs past its limit
        p.wait()
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert len(rows) < 4 and rows[0]["name"] == "tiny compiled" and rows[0]["status"] == "ok"  # killed before the last row
    assert "| throughput | tiny compiled | ok |" in (out / "summary.md").read_text()


# ---- the check knows its GPU (issue 46) ----------------------------------------------------------------


def phases_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_phases", PHASES_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("gpu, gib", [("h100", 80.0), ("h200", 141.0)])
def test_the_shapes_planned_for_a_gpu_fit_its_memory(gpu: str, gib: float, tmp_path: Path) -> None:
    """`fit` (what `gpu_check.sh --dry-run --gpu h100` runs first) plans the real shapes for that GPU: each one's planned
    total at the planner's micro-batch is within its memory, the 7B's layer count chosen for it."""
    r = subprocess.run([sys.executable, str(PHASES_PY), "fit", "--gpu", gpu, "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=120, env=env_without_ours() | {"PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(rows) == 7 and all(row["status"] == "ok" and row["measured"] <= gib == row["planned"] for row in rows)
    assert rows[0]["name"] == "qwen2.5-7b-fit compiled"  # the most valuable row first
    seven = {row["layers"] for row in rows if row["name"].startswith("qwen2.5-7b-fit")}
    assert seven == ({12} if gpu == "h100" else {25})  # a 7B sized for an 80 GB H100, not the H200's 141 GB


def test_eager_rows_are_planned_eager_and_the_mfu_counts_the_planners_flops() -> None:
    mod = phases_module()
    mod.register_shapes(True, "h100")
    eager = mod.planned("qwen2.5-1.5b", "h100", seq=2048, micro_batch=2, compile=False)
    compiled = mod.planned("qwen2.5-1.5b", "h100", seq=2048, micro_batch=2, compile=True)
    assert eager["mfu"] == pytest.approx(compiled["mfu"] / 1.157, rel=1e-3) and eager["tokens_per_s"] < compiled["tokens_per_s"]
    assert eager["flops_per_token"] > 6 * eager["params"]  # attention and the head again, beside 6N
    order = mod.throughput_order(mod.size_for(False, "h100"))
    assert order[0] == ("qwen2.5-7b-fit", True) and len(order) == 6 and len(set(order)) == 6
