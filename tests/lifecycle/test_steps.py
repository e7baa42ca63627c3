"""The step graph and scheduler with stand-in steps (no cloud), the cost estimate, the displays, the CLI."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from raydlc.errors import InputError
from raydlc.lifecycle import Context, Run, orders
from raydlc.lifecycle.cluster_status import hourly_cost
from raydlc.lifecycle.steps import Step, critical_path, order, run_all, select
from raydlc.lifecycle.types import Observation, Reporter, StepFailed, StepPlan, StepResult


def fake(name: str, needs: tuple[str, ...], *, sleep: float = 0.0, fail: bool = False, log: list[Any] | None = None) -> Step:
    def check(ctx: Any) -> Observation:
        return Observation("absent", f"{name} missing")

    def plan(ctx: Any, obs: Observation) -> StepPlan:
        return StepPlan("create", obs.reason, (f"make {name}",))

    def act(ctx: Any, obs: Observation) -> None:
        if log is not None:
            log.append(("start", name, time.monotonic()))
        time.sleep(sleep)
        if fail:
            raise StepFailed(f"{name} broke")
        if log is not None:
            log.append(("end", name, time.monotonic()))

    return Step(name, needs, name, check, plan, act, lambda ctx: f"{name} made")


class Ctx:
    """Only what the scheduler touches."""

    def __init__(self) -> None:
        self.reporter = Reporter()
        self.cancel = threading.Event()

    def interrupt(self) -> None:
        self.cancel.set()


def test_up_and_down_declare_the_documented_graph() -> None:
    assert [s.name for s in order(orders.steps("up"))] == [
        "capacity", "storage", "cluster", "gpu-nodegroup", "kuberay", "device-plugins", "raycluster", "autoscaler"]
    needs = {s.name: set(s.needs) for s in orders.steps("up")}
    assert needs == {"capacity": set(), "storage": set(), "cluster": {"capacity"}, "gpu-nodegroup": {"cluster"},
                     "kuberay": {"cluster"}, "device-plugins": {"gpu-nodegroup"},
                     "raycluster": {"device-plugins", "kuberay", "storage"}, "autoscaler": {"gpu-nodegroup"}}
    # IDLE_MINUTES=0: the fixed-size cluster has no autoscaler step
    fixed = orders.steps("up", orders.resources(autoscaling=False))
    assert [s.name for s in order(fixed)] == [
        "capacity", "storage", "cluster", "gpu-nodegroup", "kuberay", "device-plugins", "raycluster"]
    down = {s.name: set(s.needs) for s in orders.steps("down")}
    for step, ns in needs.items():  # down is the reverse: whatever up needed first goes last
        for n in ns:
            assert step in _closure(down, n), f"down must remove {step} before {n}"


def _closure(graph: dict[str, set[str]], name: str) -> set[str]:
    out, todo = set(), list(graph[name])
    while todo:
        n = todo.pop()
        if n not in out:
            out.add(n)
            todo.extend(graph[n])
    return out


def test_partial_runs_follow_the_dependencies() -> None:
    s = orders.steps("up")
    assert select(s) == [x.name for x in order(s)]
    assert select(s, until="gpu-nodegroup") == ["capacity", "cluster", "gpu-nodegroup"]
    assert select(s, until="kuberay") == ["capacity", "cluster", "kuberay"]
    assert select(s, from_="gpu-nodegroup") == ["gpu-nodegroup", "device-plugins", "raycluster", "autoscaler"]
    assert select(s, from_="cluster", until="device-plugins") == ["cluster", "gpu-nodegroup", "device-plugins"]
    assert select(s, only="kuberay") == ["kuberay"]
    with pytest.raises(InputError, match="--only 'nope': no such step"):
        select(s, only="nope")
    with pytest.raises(InputError, match="cannot be combined"):
        select(s, only="kuberay", until="raycluster")
    with pytest.raises(InputError, match="covers no step"):
        select(s, from_="raycluster", until="capacity")


def test_independent_steps_overlap_and_the_critical_path_is_the_longest_chain() -> None:
    log: list[Any] = []
    steps = [fake("a", ()), fake("b", ("a",), sleep=0.6, log=log), fake("c", ("a",), sleep=0.3, log=log),
             fake("d", ("b", "c"), log=log)]
    results = run_all(steps, Ctx(), [s.name for s in steps])  # type: ignore[arg-type]
    assert [r.outcome for r in results] == ["done"] * 4
    starts = {n: t for kind, n, t in log if kind == "start"}
    ends = {n: t for kind, n, t in log if kind == "end"}
    assert starts["c"] < ends["b"] and starts["b"] < ends["c"], "b and c ran at the same time"
    assert starts["d"] >= max(ends["b"], ends["c"])
    assert critical_path(steps, {"a": 0, "b": 0.6, "c": 0.3, "d": 0}) == (0.6, ["a", "b", "d"])


def test_a_failed_step_skips_what_needs_it_and_lets_the_rest_finish() -> None:
    steps = [fake("a", ()), fake("b", ("a",), fail=True), fake("c", ("a",)), fake("d", ("b",)), fake("e", ("c",))]
    results = {r.step: r for r in run_all(steps, Ctx(), [s.name for s in steps])}  # type: ignore[arg-type]
    assert {k: r.outcome for k, r in results.items()} == {"a": "done", "b": "failed", "c": "done", "d": "skipped", "e": "done"}
    assert results["b"].reason == "b broke" and "b did not finish" in results["d"].reason
    assert results["a"].reason == "a missing; a made" and results["a"].found == "a missing"


def test_hourly_cost_is_an_estimate_from_the_table() -> None:
    cost = hourly_cost(["g6.12xlarge", "g6.12xlarge", "m7i.xlarge", "x9.huge"], clusters=1, nat_gateways=1)
    assert cost["total_usd_per_hour"] == 9.55 and cost["estimate"] is True
    assert cost["unpriced"] == ["1 × x9.huge"]
    assert {i["item"]: i["count"] for i in cost["items"]} == {
        "g6.12xlarge instance": 2, "m7i.xlarge instance": 1, "EKS control plane": 1, "NAT gateway": 1}
    assert "as of" in cost["prices"] and hourly_cost([], 0, 0)["total_usd_per_hour"] == 0


def test_the_live_display_shows_each_step_its_time_and_the_tool_line() -> None:
    from rich.console import Console

    from raydlc.views.lifecycle import LiveReporter

    console = Console(record=True, width=160, force_terminal=False)
    rep = LiveReporter(console, ["cluster", "kuberay"], "raydlc up")
    rep.started("cluster")
    rep.acting("cluster", StepPlan("create", "no cluster"))
    rep.line("cluster", '[ℹ]  waiting for CloudFormation stack "eksctl-x-cluster"')
    rep.finished(StepResult("kuberay", "done", "none", "release deployed", elapsed_s=0.1))
    console.print(rep)
    text = console.export_text()
    assert "cluster" in text and "acting" in text and "waiting for CloudFormation stack" in text
    assert "kuberay" in text and "done" in text and "release deployed" in text
    assert "s " in text or "s│" in text  # an elapsed time


def test_the_live_table_appears_only_once_a_step_has_started() -> None:
    """An error before any step (a bad setting, no credentials) prints alone, without an empty table above it."""
    from rich.console import Console

    from raydlc.views.lifecycle import LiveReporter

    quiet = Console(record=True, width=120, force_terminal=False)
    with LiveReporter(quiet, ["cluster"], "raydlc up"):
        pass
    assert quiet.export_text() == ""
    shown = Console(record=True, width=120, force_terminal=False)
    with LiveReporter(shown, ["cluster"], "raydlc up") as rep:
        rep.started("cluster")
        rep.finished(StepResult("cluster", "done", "none", "cluster ACTIVE"))
    text = shown.export_text()
    assert "raydlc up" in text and "cluster ACTIVE" in text


def test_plan_json_has_exactly_the_documented_keys() -> None:
    run = Run("up", True, [StepResult("cluster", "planned", "create", "absent", ["eksctl create cluster", "eksctl create nodegroup"])])
    assert run.to_dict() == {"steps": [{"step": "cluster", "action": "create", "reason": "absent",
                                        "command": "eksctl create cluster; eksctl create nodegroup"}]}


@pytest.mark.parametrize("args", [["up", "--help"], ["down", "--help"], ["status", "--help"]])
def test_lifecycle_commands_import_nothing_heavy(args: list[str]) -> None:
    heavy = ("torch", "ray", "transformers", "kubernetes", "boto3")
    code = ("import sys; from raydlc.cli import main; main(%r); "
            "print('HEAVY=' + ','.join(m for m in %r if m in sys.modules))" % (args, heavy))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.rstrip().endswith("HEAVY="), r.stdout[-300:]
    assert "--dry-run" in r.stdout or args[0] == "status"


def test_bad_step_name_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.cli import main

    assert main(["up", "--only", "nope", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--only 'nope': no such step" in err and "Traceback" not in err


def test_context_keeps_raydlc_files_out_of_the_users_kube_config(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from raydlc.config import load_config

    monkeypatch.setenv("HOME", str(tmp_path))
    ctx = Context(load_config(env={}))
    assert ctx.kubeconfig == tmp_path / ".raydlc" / "eks-cluster-us-east-2" / "kubeconfig"
    ctx = Context(load_config(env={"RAYDLC_KUBECONFIG": str(tmp_path / "k")}))
    assert ctx.kubeconfig == tmp_path / "k"


def test_up_without_credentials_stops_before_any_step(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys) -> None:
    import os

    from raydlc.cli import main

    for k in [k for k in os.environ if k.startswith(("AWS_", "RAYDLC_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no eksctl or helm either: credentials are reported first
    assert main(["up"]) == 2
    err = capsys.readouterr().err
    assert "no AWS credentials found" in err and "Traceback" not in err
    assert not (tmp_path / ".raydlc").exists()
