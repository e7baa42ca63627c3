"""benchmarks/gpu_efficiency.py: its figures' arithmetic, its probe, and a real `--smoke` run on CPU."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from raydlc.errors import InputError, TrainError
from raydlc.facts.instances import GPUS, gpu_for_device_name
from raydlc.facts.models import SPECS
from raydlc.train.schedule import lr_at

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_efficiency.py"
LAST = re.compile(r"^raydlc/reference tokens/s: (\d+\.\d\d), raydlc MFU: (\d+\.\d)%$")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_efficiency", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_efficiency"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True)
def _restore_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process `main` sets env defaults; monkeypatch puts them back after each test."""
    for name, value in (("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_VERBOSITY", "error")):
        monkeypatch.setenv(name, os.environ.get(name, value))


def run_script(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYDLC_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_smoke_run_prints_the_last_line_and_writes_finite_figures(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    r = run_script(["--smoke", "--out", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    m = LAST.match(lines[-1])
    assert m, lines[-1]
    ratio, mfu_pct = float(m.group(1)), float(m.group(2))
    assert ratio > 0 and mfu_pct > 0
    assert any(l.startswith("reference (FSDP1") for l in lines) and any(l.startswith("raydlc (FSDP2, AC)") for l in lines)

    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [r["loop"] for r in rows] == ["reference", "raydlc", "raydlc"]
    assert (rows[0]["batch"], rows[0]["seq"]) == (1, 128)
    for row in rows:
        assert row["timed_steps"] == len(row["step_times_s"]) == len(row["losses"]) == 8
        for key in ("step_time_median_s", "tokens_per_s", "mfu", "mfu_vs_measured_matmul", "peak_memory_gib"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["name"], key, row[key])
        assert all(math.isfinite(x) for x in row["losses"])
        assert row["loss_falls"] and row["loss_last_quarter_mean"] < row["loss_first_quarter_mean"]
        assert row["tokens_per_s"] == pytest.approx(row["tokens_per_step"] / row["step_time_median_s"])
    assert doc["model"]["params"] == SPECS["tiny"].param_count()
    assert doc["hardware"]["matmul_tflops"] > 0 and doc["failed_variants"] == []
    best = max(rows[1:], key=lambda r: r["tokens_per_s"])
    assert doc["summary"]["raydlc_best"] == best["name"]
    assert ratio == pytest.approx(best["tokens_per_s"] / rows[0]["tokens_per_s"], abs=0.006)
    assert mfu_pct == pytest.approx(100 * best["mfu"], abs=0.06)


def test_non_finite_loss_ends_the_run_with_an_error(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    r = run_script(["--smoke", "--variants", "none", "--steps", "4", "--warmup", "1", "--lr", "1e30", "--out", str(out)])
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "non-finite loss" in r.stderr and "Traceback" not in r.stderr
    assert not LAST.search(r.stdout) and not out.exists()


def test_a_broken_variant_is_reported_and_the_other_rows_stand(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = bench.timed_raydlc

    def broken_ac(*args: object, ac: bool, **kw: object) -> object:
        if ac:
            raise RuntimeError("backend compiler failed")
        return real(*args, ac=ac, **kw)

    monkeypatch.setattr(bench, "timed_raydlc", broken_ac)
    out = tmp_path / "figures.json"
    assert bench.main(["--smoke", "--steps", "4", "--warmup", "1", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert LAST.match(lines[-1]) and lines[-2] == "variant ac failed: RuntimeError: backend compiler failed"
    doc = json.loads(out.read_text())
    assert [r["name"] for r in doc["rows"]] == ["reference (FSDP1, bs1x128)", "raydlc (FSDP2)"]
    assert doc["failed_variants"] == [{"variant": "ac", "error": "RuntimeError: backend compiler failed"}]
    assert "variant(s) ac failed" in captured.err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--smoke", "--variants", "warp"], "warp"),
        (["--smoke", "--steps", "2"], "--steps 2"),
        (["--device", "cpu"], "qwen2.5-1.5b"),
        (["--smoke", "--model", "gpt-9"], "gpt-9"),
        (["--smoke", "--out", "/nonexistent/dir/f.json"], "/nonexistent/dir"),
        (["--smoke", "--device", "cuda"], "no CUDA GPU"),
        (["--smoke", "--batch", "0"], "--batch must be positive"),
    ],
)
def test_bad_input_exits_2_naming_it(bench: ModuleType, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and "hint:" in err


def test_probe_doubles_then_bisects_to_the_largest_fitting_batch(bench: ModuleType) -> None:
    shape = bench.probe_shape(lambda b, s: b * s <= 12 * 4096, max_seq=4096, max_batch=64)
    assert (shape.batch, shape.seq) == (12, 4096)
    assert [(t["batch"], t["fits"]) for t in shape.trials] == [(1, True), (2, True), (4, True), (8, True), (16, False), (12, True)]


def test_probe_halves_the_sequence_when_one_row_does_not_fit(bench: ModuleType) -> None:
    shape = bench.probe_shape(lambda b, s: b * s <= 3000, max_seq=8192, max_batch=64)
    assert (shape.batch, shape.seq) == (1, 2048)
    capped = bench.probe_shape(lambda b, s: True, max_seq=512, max_batch=5)
    assert (capped.batch, capped.seq) == (4, 512)
    with pytest.raises(TrainError, match="not even one sequence"):
        bench.probe_shape(lambda b, s: False, max_seq=1024, max_batch=8, min_seq=128)


def test_batch_and_seq_flags_skip_the_probe(bench: ModuleType) -> None:
    cfg = bench.parse_args(["--smoke", "--batch", "3", "--seq", "64"])
    shape = bench.choose_shape(SPECS["tiny"], cfg, ac=False)
    assert (shape.batch, shape.seq, shape.how, shape.trials) == (3, 64, "flags", [])
    capped = bench.choose_shape(SPECS["tiny"], bench.parse_args(["--smoke", "--max-seq", "99999"]), ac=False)
    assert capped.seq == SPECS["tiny"].max_position_embeddings


def test_losses_must_be_finite_and_falling(bench: ModuleType) -> None:
    assert bench.check_losses("x", [5.0, 4.9, 4.8, 4.7, 4.6, 4.5, 4.4, 4.3])
    assert not bench.check_losses("x", [5.0, 5.0, 5.0, 5.0])
    assert not bench.check_losses("x", [4.0, 4.2, 4.4, 4.6])
    with pytest.raises(TrainError, match="non-finite loss at timed step 2"):
        bench.check_losses("x", [5.0, 4.9, float("nan"), 4.7])
    with pytest.raises(InputError):
        bench.check_losses("x", [5.0, 4.0])


def test_mfu_is_six_n_t_over_peak(bench: ModuleType) -> None:
    params = SPECS["qwen2.5-1.5b"].param_count()
    # 50,000 tokens/s of the 1.5B model is 463 TFLOP/s: 46.8 % of an H200's 989.
    assert bench.mfu(params, 50_000, GPUS["h200"].bf16_tflops) == pytest.approx(6 * params * 50_000 / 989e12)
    assert 0.468 < bench.mfu(params, 50_000, 989.0) < 0.469


def test_summary_takes_raydlcs_fastest_row_and_formats_the_last_line(bench: ModuleType) -> None:
    rows = [
        {"name": "ref", "loop": "reference", "tokens_per_s": 1000.0, "mfu": 0.01},
        {"name": "a", "loop": "raydlc", "tokens_per_s": 40_000.0, "mfu": 0.40},
        {"name": "b", "loop": "raydlc", "tokens_per_s": 45_678.9, "mfu": 0.4567},
    ]
    s = bench.summary(rows)
    assert (s["raydlc_best"], s["speedup_tokens_per_s"]) == ("b", pytest.approx(45.6789))
    assert bench.last_line(s) == "raydlc/reference tokens/s: 45.68, raydlc MFU: 45.7%"


def test_variants_parse(bench: ModuleType) -> None:
    assert bench.parse_variants("all") == ["compile", "ac", "compile+ac"]
    assert bench.parse_variants("none") == []
    assert bench.parse_variants("ac, compile,ac") == ["ac", "compile"]


@pytest.mark.parametrize(
    ("device_name", "key"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA GH200 480GB", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10G", "a10g"),
    ],
)
def test_gpu_peak_is_found_by_device_name(device_name: str, key: str) -> None:
    assert gpu_for_device_name(device_name) is GPUS[key]


def test_unknown_gpu_has_no_peak() -> None:
    assert gpu_for_device_name("NVIDIA GeForce RTX 4090") is None
    assert (GPUS["h200"].bf16_tflops, GPUS["a100-80gb"].bf16_tflops, GPUS["l4"].bf16_tflops, GPUS["a10g"].bf16_tflops) == (989.0, 312.0, 121.0, 125.0)


def test_raydlc_rows_time_the_products_own_step_with_the_products_settings(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from raydlc.config import TrainConfig
    from raydlc.train import loop as product

    calls: list[tuple[TrainConfig, float]] = []
    real = product.train_step

    def counting(t: product.Trainer, batch: object, lr: float) -> product.StepOutput:
        calls.append((t.settings, lr))
        return real(t, batch, lr)  # type: ignore[arg-type]

    monkeypatch.setattr(product, "train_step", counting)
    cfg = bench.parse_args(["--smoke", "--steps", "4", "--warmup", "1"])
    with bench.process_group("cpu"):
        r = bench.raydlc_loop(SPECS["tiny"], cfg, batch=1, seq=32, compile=False, ac=True, steps=4, warmup=1)
    assert len(calls) == 1 + len(r.step_times_s) == 5  # the warm-up step, then one per timed step
    used, defaults = calls[0][0], TrainConfig()
    assert (used.weight_decay, used.max_grad_norm, used.warmup_steps, used.seed) == (defaults.weight_decay, defaults.max_grad_norm, defaults.warmup_steps, defaults.seed)
    assert used.activation_checkpointing and used.bf16 and not used.compile
    assert [lr for _, lr in calls] == [lr_at(i, used) for i in range(1, 6)]
    assert r.activation_checkpointing and len(r.losses) == 4 and all(math.isfinite(x) for x in r.losses)
