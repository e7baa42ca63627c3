"""raydlc.api's up, down and status: each result is the CLI's --json, settings layer, the reporter hears.

Their docstring examples run in tests/test_api_doc.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import raydlc.api as api
from raydlc.lifecycle.types import Reporter, StepPlan, StepResult

pytestmark = pytest.mark.slow  # each talks to moto (capacity discovery) and the doubles


def _cli_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    from raydlc.cli import main

    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_each_result_to_dict_is_what_the_cli_prints_with_json(world, capsys: pytest.CaptureFixture[str]) -> None:
    assert api.up(dry_run=True).to_dict() == _cli_json(["up", "--dry-run", "--json"], capsys)
    assert api.down(dry_run=True).to_dict() == _cli_json(["down", "--dry-run", "--json"], capsys)
    assert api.status().to_dict() == _cli_json(["status", "--json"], capsys)
    cli = _cli_json(["--set", "CLUSTER_NAME=other", "up", "--only", "cluster", "--dry-run", "--json"], capsys)
    assert api.up(settings={"CLUSTER_NAME": "other"}, only="cluster", dry_run=True).to_dict() == cli


def test_settings_config_and_flags_layer_as_on_the_command_line(world) -> None:
    (world.tmp / "mine.yaml").write_text("cluster:\n  name: from-file\n")
    kubeconfig = world.tmp / "kc"
    plan = api.up(config=world.tmp / "mine.yaml", only="cluster", dry_run=True, kubeconfig=kubeconfig)
    create = next(c for c in plan.results[0].commands if c.startswith("eksctl create cluster"))
    assert "from-file-us-east-2/eksctl-cluster.yaml" in create and f"--kubeconfig {kubeconfig}" in create
    plan = api.up(config=world.tmp / "mine.yaml", settings={"CLUSTER_NAME": "from-settings"}, only="cluster", dry_run=True)
    assert "from-settings-us-east-2" in " ".join(plan.results[0].commands)


def test_the_reporter_hears_each_step_as_it_runs(world) -> None:
    events: list[tuple[str, str]] = []

    class Heard(Reporter):
        def started(self, step: str) -> None:
            events.append(("started", step))

        def acting(self, step: str, plan: StepPlan) -> None:
            events.append(("acting", step))

        def finished(self, result: StepResult) -> None:
            events.append(("finished", f"{result.step} {result.outcome}"))

    run = api.up(until="capacity", reporter=Heard())
    assert run.ok and [r.step for r in run.results] == ["capacity"]
    assert events == [("started", "capacity"), ("finished", "capacity done")]
    assert world.mutating_calls() == [], "choosing the zone changes nothing"
