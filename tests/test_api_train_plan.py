"""raydlc.api.plan, .scan and .train: the CLI's use cases from Python, their examples, and `to_dict()` = `--json`."""

from __future__ import annotations

import doctest
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import raydlc.api as api
from raydlc.cli import main


def run_example(fn: Any) -> None:
    """The docstring's `Example:` block, run as the docs show it (it must be the docstring's last section)."""
    doc = inspect.getdoc(fn) or ""
    head, _, example = doc.rpartition("Example:")
    assert head and ">>>" in example, f"{fn.__name__}: no Example: block at the end of its docstring"
    test = doctest.DocTestParser().get_doctest(example, {}, fn.__name__, None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0 and runner.tries > 0, f"{fn.__name__}: {runner.failures} of {runner.tries} example lines failed"


@pytest.mark.parametrize("name", ["plan", "scan"])
def test_the_plan_examples_run(name: str, clean_env: Path) -> None:
    run_example(getattr(api, name))


@pytest.mark.slow
def test_the_train_example_runs(clean_env: Path, ray_local: Any) -> None:
    run_example(api.train)


def test_acceptance_print_plan_without_typer(tmp_path: Path) -> None:
    code = (
        "import sys, raydlc.api as a; print(a.plan(model='qwen2.5-1.5b', nodes=2, gpus_per_node=4)); "
        "print('LOADED=' + ','.join(m for m in ('typer', 'click', 'torch', 'ray', 'kubernetes', 'boto3') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("qwen2.5-1.5b (1,543,714,304 parameters), bf16-mixed, 2 x 4 L4")
    assert "per-GPU memory" in out and re.search(r"recommended: (fsdp|hsdp), micro-batch \d+", out) and "why: " in out
    assert "[bold]" not in out and "\x1b[" not in out  # plain text, no markup or colour codes
    assert out.rstrip().splitlines()[-1] == "LOADED="


def cli_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(args) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_plan_to_dict_is_the_cli_json(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "qwen2.5-0.5b", "--nodes", "2", "--grad-accum", "auto", "--seq-len", "512", "--policy", "pure-bf16"]
    via_cli = cli_json(["plan", *args, "--json"], capsys)
    result = api.plan(model="qwen2.5-0.5b", nodes=2, grad_accum="auto", seq_len=512, policy="pure-bf16")
    assert result.to_dict() == via_cli
    assert isinstance(result, api.PlanResult) and result.recommendation == via_cli["recommendation"]
    from dataclasses import FrozenInstanceError

    with pytest.raises(FrozenInstanceError):
        result.policy = "fp32"  # type: ignore[misc]


def test_scan_to_dict_is_the_cli_json_and_writes_the_plot(clean_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "scan.png"
    via_cli = cli_json(["plan", "--model", "qwen2.5-1.5b", "--scan-nodes", "1,2,4", "--plot", str(png), "--json"], capsys)
    png.unlink()
    result = api.scan([4, 2, 1], model="qwen2.5-1.5b", plot=png)
    assert result.to_dict() == via_cli and via_cli["plot"] == str(png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "scale-out (predicted)" in str(result)


def test_settings_and_config_layer_as_on_the_command_line(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (clean_env / "mine.yaml").write_text("train:\n  seq_len: 256\ngpu_nodes:\n  count: 4\n")
    via_cli = cli_json(["--config", "mine.yaml", "--set", "BATCH_SIZE=2", "plan", "--model", "tiny", "--json"], capsys)
    result = api.plan(config="mine.yaml", settings={"BATCH_SIZE": 2}, model="tiny")
    assert result.to_dict() == via_cli
    assert (result.seq_len, result.micro_batch, result.layout["nodes"]) == (256, 2, 4)
    assert api.plan(config="mine.yaml", settings={"BATCH_SIZE": 2}, model="tiny", micro_batch=3).micro_batch == 3  # named beats settings


def test_bad_input_raises_the_cli_error(clean_env: Path) -> None:
    from raydlc.errors import ConfigError, InputError

    with pytest.raises(ConfigError, match="BATCH_SIZE"):
        api.plan(micro_batch=0)
    with pytest.raises(InputError, match="at most 16"):
        api.plan(gpus_per_node=99)  # the CLI's parser bounds it; the use case states the bound itself
    with pytest.raises(InputError, match="'two' is not a node count"):
        api.scan("1,two")
    with pytest.raises(TypeError, match="unexpected keyword argument 'stpes'"):
        api.train(stpes=3)


def test_train_takes_every_training_flag_as_a_keyword() -> None:
    from raydlc.config import flags

    params = inspect.signature(api.train).parameters
    assert [o.keyword for o in flags.options("train")] == [p for p in params if p not in ("config", "settings", "address", "on_progress", "log_to_driver")]
    assert {"model", "steps", "out", "lr", "bf16", "resume", "max_failures"} <= set(params)
    assert all(params[o.keyword].default is None for o in flags.options("train"))


def test_train_result_to_dict_keeps_the_summary_order_and_omits_an_absent_preflight() -> None:
    from dataclasses import fields

    names = [f.name for f in fields(api.TrainResult)]
    summary = {n: None for n in names if n != "preflight"}
    r = api.TrainResult.from_summary(summary)
    assert list(r.to_dict()) == [n for n in names if n not in ("preflight", "end_warnings", "trackers_stopped")]  # omitted when absent
    with_pf = api.TrainResult.from_summary({**summary, "preflight": {"ok": True}})
    assert list(with_pf.to_dict())[-1] == "preflight"


def test_train_bad_data_fails_before_a_stage_is_reported(clean_env: Path, tmp_path: Path) -> None:
    from raydlc.errors import InputError

    seen: list[dict[str, Any]] = []
    with pytest.raises(InputError, match=r"nope\.txt"):
        api.train(data=str(tmp_path / "nope.txt"), out=tmp_path / "out", on_progress=seen.append)
    assert seen == []  # a missing data file is found before any stage starts: no spinner, no Ray, no bar
    assert not (tmp_path / "out").exists()
