"""Cluster lifecycle: `up`, `down` and `status` as steps with dependencies, each check → act → verify.

`up` and `down` are idempotent and resumable because every step starts by looking at the world
(`check`) and acts only on the difference; `--dry-run` stops after the look and prints the
plan. The tools are eksctl (cluster and node groups) and helm (raydlc's releases), run through
`raydlc.tools`; everything else in Kubernetes goes through `raydlc.kube`, and AWS through
`raydlc.aws`. Nothing here imports boto3 or kubernetes at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raydlc.lifecycle.context import Context, Timings
from raydlc.lifecycle.steps import Interrupted, Reporter, StepFailed, StepResult

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.tools import Runner

__all__ = ["Context", "Interrupted", "Reporter", "Run", "StepFailed", "StepResult", "Timings", "down", "status", "up"]

STEP_TOOLS = {"cluster": ("eksctl",), "gpu-nodegroup": ("eksctl",), "kuberay": ("helm",), "device-plugins": ("helm",)}


@dataclass
class Run:
    """The outcome of one `up` or `down`: each step's result, and what `down` removed or found absent."""

    command: str
    dry_run: bool
    results: list[StepResult]
    notes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.outcome in ("done", "planned") for r in self.results)

    @property
    def failed(self) -> list[StepResult]:
        return [r for r in self.results if r.outcome == "failed"]

    def to_dict(self) -> dict[str, Any]:
        if self.dry_run:
            return {"steps": [{"step": r.step, "action": r.action, "reason": r.reason, "command": "; ".join(r.commands)}
                              for r in self.results]}
        doc: dict[str, Any] = {"steps": [r.to_dict() for r in self.results], "ok": self.ok}
        if self.command == "down":
            notes = [n.split(" ", 1) for step in self.notes.values() for n in step]
            doc["removed"] = [what for verb, what in notes if verb in ("removed", "released", "cancelled")]
            doc["absent"] = [r.found for r in self.results if r.action == "none" and r.outcome == "done"]
            doc["absent"] += [what for verb, what in notes if verb == "absent"]
        return doc


def _context(cfg: Config, *, dry_run: bool, force: bool, reporter: Reporter | None, timings: Timings | None,
             runner: Runner | None) -> Context:
    from raydlc.tools import Runner

    return Context(cfg, runner=runner or Runner(dry_run=dry_run), reporter=reporter, timings=timings, force=force,
                   dry_run=dry_run)


def _require_tools(ctx: Context, selected: list[str]) -> None:
    """Every tool the selected steps may run, checked before anything changes."""
    for tool in sorted({t for s in selected for t in STEP_TOOLS.get(s, ())}):
        ctx.runner.require(tool)


def up(
    cfg: Config, *, only: str | None = None, from_: str | None = None, until: str | None = None,
    dry_run: bool = False, force: bool = False, reporter: Reporter | None = None, timings: Timings | None = None,
    runner: Runner | None = None,
) -> Run:
    from raydlc.lifecycle import up_steps
    from raydlc.lifecycle.steps import plan_all, run_all, select

    ctx = _context(cfg, dry_run=dry_run, force=force, reporter=reporter, timings=timings, runner=runner)
    selected = select(up_steps.STEPS, only=only, from_=from_, until=until)
    if dry_run:
        return Run("up", True, plan_all(up_steps.STEPS, ctx, selected))
    ctx.aws("eks")  # no usable credentials or an unknown region: stop here, before any step
    _require_tools(ctx, selected)
    return Run("up", False, run_all(up_steps.STEPS, ctx, selected), ctx.notes)


def down(
    cfg: Config, *, keep_cluster: bool = False, dry_run: bool = False, force: bool = False,
    reporter: Reporter | None = None, timings: Timings | None = None, runner: Runner | None = None,
) -> Run:
    from raydlc.errors import InputError
    from raydlc.lifecycle import cloud, down_steps
    from raydlc.lifecycle.steps import order, plan_all, run_all
    from raydlc.render.eksctl import OWNER_TAG

    ctx = _context(cfg, dry_run=dry_run, force=force, reporter=reporter, timings=timings, runner=runner)
    desc = cloud.cluster(ctx.aws("eks"), cfg.cluster.name)
    if desc is not None and not cloud.owned(desc, cfg.cluster.name) and not force:
        raise InputError(
            f"EKS cluster {cfg.cluster.name} in {cfg.cluster.region} was not created by raydlc "
            f"(it has no {OWNER_TAG}={cfg.cluster.name} tag); refusing to delete it",
            hint="check CLUSTER_NAME and REGION; pass --force to delete it anyway",
        )
    selected = [s.name for s in order(down_steps.STEPS) if not (keep_cluster and s.name == "cluster")]
    if dry_run:
        return Run("down", True, plan_all(down_steps.STEPS, ctx, selected))
    _require_tools(ctx, [s for s in selected if s != "raycluster"])
    return Run("down", False, run_all(down_steps.STEPS, ctx, selected), ctx.notes)


def status(cfg: Config, *, timings: Timings | None = None, runner: Runner | None = None) -> dict[str, Any]:
    from raydlc.lifecycle.report import report

    return report(_context(cfg, dry_run=True, force=False, reporter=None, timings=timings, runner=runner))
