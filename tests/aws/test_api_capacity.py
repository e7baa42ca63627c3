"""raydlc.api.capacity against the moto server: its example, and the same JSON as `raydlc capacity --json`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import raydlc.api as api
from raydlc.cli import main
from raydlc.errors import ConfigError
from raydlc.views.output import to_json


def _warm(url: str, region: str = "us-west-2") -> None:
    """moto builds a region's EC2 backend on its first request, which on a loaded machine outlasts raydlc's 8 s read timeout."""
    import boto3
    from botocore.config import Config

    boto3.client("ec2", region_name=region, endpoint_url=url, config=Config(read_timeout=300, retries={"max_attempts": 1})).describe_availability_zones()


def test_capacity_example_runs_against_moto(api_example: Any, aws_env: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    _warm(aws_env)
    out = api_example(api.capacity)
    report = api.capacity(region="us-west-2", instance_type="g6.12xlarge", count=2)
    assert out == f"us-west-2 {report.best_zone} {[(z.zone, z.verdict) for z in report.zones][:3]}\n"
    assert report.zones and all(z.zone.startswith("us-west-2") for z in report.zones)
    assert report.quota.value is None and report.quota.unknown  # moto has no Service Quotas: unknown, not guessed


def test_capacity_json_is_the_clis(aws_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    _warm(aws_env)
    report = api.capacity(region="us-west-2", instance_type="g6.12xlarge", count=2)
    rc = main(["capacity", "--region", "us-west-2", "--instance-type", "g6.12xlarge", "--count", "2", "--json"])
    assert rc == (0 if report.best_zone else 3)
    assert capsys.readouterr().out.strip().splitlines()[-1] == to_json(report.to_dict())
    # A known instance type sets GPUS_PER_NODE (g6.48xlarge: 8) unless the configuration does; then the config must match.
    assert api.capacity(region="us-west-2", instance_type="g6.48xlarge", count=1).instance_type == "g6.48xlarge"
    with pytest.raises(ConfigError, match="GPUS_PER_NODE"):
        api.capacity(region="us-west-2", instance_type="g6.48xlarge", count=1, settings={"GPUS_PER_NODE": 4})
