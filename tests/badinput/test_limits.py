"""The rules behind the catalogue, each on its own: the CLI boundary, the AWS call budget, the
bounds every config field gets for free, and rooms that stay free of output and cloud code.
"""

from __future__ import annotations

import errno
import re
import subprocess
import sys
from typing import Any

import pytest

import raydlc.config
from raydlc.cli import main
from raydlc.config.schema import INT_MAX, _env, _Section
from raydlc.edges import aws
from raydlc.errors import ConfigError


@pytest.mark.parametrize(
    ("raised", "code", "line"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "/etc/raydlc.yaml"), 2, "error: /etc/raydlc.yaml: permission denied"),
        (OSError(errno.ENOSPC, "No space left on device", "/data/out"), 1, "error: /data/out: no space left on device"),
        (UnicodeDecodeError("utf-8", b"caf\xe9", 3, 4, "invalid continuation byte"), 2, "error: input is not UTF-8 text (byte 0xe9 at offset 3)"),
        (KeyboardInterrupt(), 130, "interrupted: raydlc config show stopped by Ctrl-C; nothing more was done"),
    ],
)
def test_the_cli_boundary_turns_escaping_errors_into_one_line(
    raised: BaseException, code: int, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clean_env: Any,
) -> None:
    def load_config(*a: Any, **kw: Any) -> Any:
        raise raised

    monkeypatch.setattr(raydlc.config, "load_config", load_config)
    assert main(["config", "show"]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[0] == line


def test_debug_still_shows_the_traceback_of_an_os_error(monkeypatch: pytest.MonkeyPatch, clean_env: Any) -> None:
    def load_config(*a: Any, **kw: Any) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied", "/etc/raydlc.yaml")

    monkeypatch.setattr(raydlc.config, "load_config", load_config)
    with pytest.raises(Exception, match=r"/etc/raydlc\.yaml: permission denied") as e:
        main(["--debug", "config", "show"])
    assert isinstance(e.value.__cause__, PermissionError)


def test_a_closed_stdout_ends_quietly(tmp_path: Any) -> None:
    """`| true` has exited before raydlc writes its table: the write meets a closed pipe."""
    r = subprocess.run(f"{sys.executable} -m raydlc.cli config show | true; echo rc=${{PIPESTATUS[0]}}", shell=True,
                       executable="/bin/bash", capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.stdout.strip() == "rc=1"
    assert r.stderr == "", r.stderr  # no traceback, no "Exception ignored … BrokenPipeError"


def test_a_call_that_gets_no_answer_stops_at_its_budget_not_at_its_attempts(
    black_hole: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ten attempts allowed, each timing out: the budget stops the retries, and the error names the endpoint."""
    for k, v in {"AWS_ENDPOINT_URL": black_hole.url, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                 "AWS_MAX_ATTEMPTS": "10", "AWS_EC2_METADATA_DISABLED": "true", "AWS_RETRY_MODE": "standard"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(aws, "CONNECT_TIMEOUT_S", 0.2)
    monkeypatch.setattr(aws, "READ_TIMEOUT_S", 0.3)
    monkeypatch.setattr(aws, "CALL_BUDGET_S", 1.5)
    ec2 = aws.client(aws.session("us-west-2"), "ec2")
    before = black_hole.accepted
    with pytest.raises(aws.UnreachableError) as e:
        aws.call(ec2, "describe_availability_zones")
    attempts = int(e.value.message.rsplit("(", 1)[1].split()[0])
    assert 1 <= attempts < 10 and black_hole.accepted - before == attempts
    assert f"could not reach AWS in us-west-2: no answer from {black_hole.url}" in e.value.message
    assert e.value.exit_code == 1


def test_the_default_budget_fails_a_black_hole_well_inside_30_seconds() -> None:
    """The arithmetic the catalogue's black-hole row runs for real: one attempt may start only if it can end in budget."""
    assert aws.CONNECT_TIMEOUT_S + aws.READ_TIMEOUT_S <= aws.CALL_BUDGET_S <= 20


def test_a_field_added_without_bounds_still_gets_them() -> None:
    """A TrainConfig field added later needs no validator of its own to refuse inf, nan and absurd counts."""

    class Later(_Section):
        rate: float = _env("LATER_RATE", "a float knob", default=0.1)
        count: int = _env("LATER_COUNT", "an int knob", default=1)
        capped: int = _env("LATER_CAPPED", "an int knob with a stated bound", default=1, le=8, why="eight is plenty")

    assert Later(rate="1e-3", count="7").rate == 1e-3  # type: ignore[arg-type]
    for bad, says in [({"rate": "inf"}, "finite"), ({"rate": "nan"}, "finite"), ({"count": str(INT_MAX + 1)}, "at most 2,147,483,647"),
                      ({"capped": 9}, "at most 8 (eight is plenty), got 9")]:
        with pytest.raises(ValueError, match=re.escape(says)):
            Later(**bad)


def test_bounds_are_stated_in_the_error_with_their_reason(clean_env: Any) -> None:
    with pytest.raises(ConfigError) as e:
        raydlc.config.load_config(env={"RAYDLC_GPU_NODE_COUNT": "451", "RAYDLC_GPUS_PER_NODE": "17"})
    text = "\n".join(e.value.problems)
    assert "GPU_NODE_COUNT (env RAYDLC_GPU_NODE_COUNT): must be at most 450 (EKS's default quota of nodes per managed node group), got 451" in text
    assert "GPUS_PER_NODE (env RAYDLC_GPUS_PER_NODE): must be at most 16" in text


@pytest.mark.parametrize("good", ["g6.12xlarge", "p5en.48xlarge", "u-6tb1.metal", "m7i-flex.large", "c7i.metal-24xl", "trn2.48xlarge"])
def test_real_instance_types_pass_the_shape_check(good: str, clean_env: Any) -> None:
    cfg = raydlc.config.load_config(env={"RAYDLC_SYSTEM_NODE_TYPE": good})
    assert cfg.system_nodes.instance_type == good


@pytest.mark.parametrize("good", [
    "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
    "123456789012.dkr.ecr.us-east-2.amazonaws.com/team/ray-train:2.58.0",
    "localhost:5000/ray",
    "rayproject/ray@sha256:" + "a" * 64,
])
def test_real_image_references_pass_the_shape_check(good: str, clean_env: Any) -> None:
    cfg = raydlc.config.load_config(env={"RAYDLC_DLC_IMAGE": good, "RAYDLC_FORCE_RAY_VERSION": "true"})
    assert cfg.images.dlc_image == good


def test_pure_rooms_import_neither_rich_nor_cloud_nor_ray() -> None:
    code = (
        "import sys; import raydlc.capacity.ranking, raydlc.capacity.signals, raydlc.planner, raydlc.checks.preflight, raydlc.records, raydlc.config; "
        "print(sorted(m for m in ('rich', 'boto3', 'botocore', 'ray', 'torch', 'kubernetes') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
