"""raydlc.api's read commands (nccl, render, preflight, version, config show): examples, JSON, errors.

Each use case's `to_dict()` must be exactly what the command's `--json` prints, it prints
nothing itself, and it fails with a RaydlcError. `capacity` is tested beside the other AWS
tests (tests/aws/test_api_capacity.py), where the moto server lives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import raydlc.api as api
from raydlc.cli import main
from raydlc.errors import ConfigError, InputError, RaydlcError
from raydlc.views.output import to_json

DATA = Path(__file__).resolve().parent / "data" / "nccl"
MINE = ("capacity", "config_show", "nccl", "preflight", "render", "version")


@pytest.fixture
def fresh(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A new user's machine: empty cwd, a temp HOME, no RAYDLC_* settings."""
    monkeypatch.setenv("HOME", str(clean_env))
    return clean_env


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str, rc: int = 0) -> str:
    capsys.readouterr()
    assert main(list(argv)) == rc
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_every_use_case_is_exported_with_an_example() -> None:
    for name in MINE:
        fn = getattr(api, name)
        assert name in api.__all__ and fn.__module__.startswith("raydlc.api._"), name
        assert fn.__doc__.rstrip().splitlines()[-1].startswith("        "), f"{name}: the Example block must end the docstring"


def test_version_example_and_json(api_example: Any, fresh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = api_example(api.version)
    info = api.version()
    assert out.split()[:3] == [info.local["raydlc"], "2.58.0", "2.13.0"]
    assert cli_json(capsys, "version", "--json") == to_json(info.to_dict())
    assert set(info.to_dict()) == {"local", "image", "mismatch"}


def test_config_show_example_and_json(api_example: Any, fresh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert api_example(api.config_show) == "4 flag 4\n"
    shown = api.config_show(settings={"RAYDLC_REGION": "eu-central-1"})
    assert cli_json(capsys, "--set", "REGION=eu-central-1", "config", "show", "--json") == to_json(shown.to_dict())
    (fresh / "raydlc.yaml").write_text("cluster:\n  region: ap-south-1\n")
    assert api.config_show(config="raydlc.yaml").config.cluster.region == "ap-south-1"
    with pytest.raises(ConfigError):
        api.config_show(settings={"GPU_NODE_COUNT": "-1"})


def test_nccl_example_json_and_errors(api_example: Any, fresh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert api_example(api.nccl) == "efa carried True True\n"
    f = str(DATA / "efa_nccl527_noprefix_gdr.log")
    for kw, argv, rc in (({}, [], 0), ({"expect": "socket", "accept_selected": True}, ["--expect", "socket", "--accept-selected"], 3)):
        result = api.nccl([f], **kw)
        assert cli_json(capsys, "nccl", f, "--json", *argv, rc=rc) == to_json(result.to_dict())
    assert api.nccl([f], expect="efa").ok and not api.nccl([f], expect="socket").ok
    for kw in ({"expect": "roce"}, {"accept_selected": True}):
        with pytest.raises(InputError):
            api.nccl([f], **kw)
    with pytest.raises(InputError, match="no such file"):
        api.nccl([str(fresh / "missing.log")])


def test_render_example_json_and_errors(api_example: Any, fresh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = api_example(api.render).splitlines()
    assert out[0] == "['eksctl-cluster.yaml'] ClusterConfig us-west-2"
    assert "raycluster.yaml" in out[1] and (fresh / "manifests" / "raycluster.yaml").is_file()
    common = ["--set", "REGION=us-west-2", "--set", "STORAGE_PATH=s3://b/p", "render", "--zones", "us-west-2a,us-west-2b"]
    settings = {"REGION": "us-west-2", "STORAGE_PATH": "s3://b/p"}
    r = api.render(zones="us-west-2a,us-west-2b", settings=settings)
    assert cli_json(capsys, *common, "--json") == to_json(r.to_dict())
    capsys.readouterr()
    assert main(common) == 0 and capsys.readouterr().out == r.to_yaml()
    w = api.render(out=fresh / "m2", zones=["us-west-2a", "us-west-2b"], settings=settings)
    assert cli_json(capsys, *common, "--out", str(fresh / "m3"), "--json") == to_json(w.to_dict()).replace("m2", "m3")
    with pytest.raises(InputError, match="unknown kind"):
        api.render(only="deployment", zones="us-west-2a", settings=settings)
    (fresh / "file").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        api.render(out=fresh / "file", zones="us-west-2a", settings=settings)


@pytest.mark.parametrize(("kw", "message"), [
    ({"local": True, "iters": 0}, "must be positive"),
    ({"local": True, "size_mib": [20000]}, "at most"),
    ({"local": True, "workers": 0}, "at least 1"),
])
def test_preflight_refuses_bad_arguments_before_starting_anything(fresh: Path, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        api.preflight(**kw)


def test_preflight_passes_what_the_cli_would(fresh: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.checks import preflight

    calls: list[dict[str, Any]] = []

    def fake_run(**kw: Any) -> preflight.PreflightReport:
        calls.append(kw)
        return preflight.judge([], [], kw["expectation"], backend="nccl")

    monkeypatch.setattr(preflight, "run_preflight", fake_run)
    report = api.preflight(size_mib=[4, 64], iters=3, settings={"GPU_NODE_COUNT": 2})
    assert cli_json(capsys, "--set", "GPU_NODE_COUNT=2", "preflight", "--size-mib", "4", "--size-mib", "64", "--iters", "3", "--json",
                    rc=0 if report.ok else 1) == to_json(report.to_dict())
    assert calls[0] == calls[1] and calls[0]["num_workers"] == 8 and calls[0]["sizes"] == [4 << 20, 64 << 20]
    assert calls[0]["expectation"].network_gbps == 40


def test_use_cases_print_nothing(fresh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.version()
    api.config_show()
    api.nccl([str(DATA / "efa_nccl527_noprefix_gdr.log")])
    api.render(only="helm")
    assert capsys.readouterr() == ("", "")


def test_errors_are_raydlc_errors(fresh: Path) -> None:
    with pytest.raises(RaydlcError):
        api.render(only="eksctl")  # GPU_AZ unknown and no zones given
    with pytest.raises(RaydlcError):
        api.config_show(config=fresh / "absent.yaml")


@pytest.mark.slow
def test_preflight_example_runs_on_a_local_ray(api_example: Any, ray_local: Any, fresh: Path) -> None:
    words = api_example(api.preflight).split()
    assert words == ["no-verdict", "gloo", "2", "True"]


def test_api_json_has_the_documented_shapes(fresh: Path) -> None:
    doc = json.loads(to_json(api.nccl([str(DATA / "efa_nccl527_noprefix_gdr.log")], expect="efa").to_dict()))
    assert (doc["verdict"], doc["expect"], doc["expect_ok"], doc["accept_selected"]) == ("efa", "efa", True, False)
    assert "expect" not in api.nccl([str(DATA / "efa_nccl527_noprefix_gdr.log")]).to_dict()
