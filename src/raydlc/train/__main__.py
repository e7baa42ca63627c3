"""`python -m raydlc.train`: what a Ray job runs on the cluster (the entrypoint of a RayJob).

Settings come from the same `RAYDLC_*` variables and YAML as the CLI (the job's runtime env
carries them), flags and `--set NAME=VALUE` override; there are no laptop defaults here: the
model, step count and workers (one per GPU) are the cluster's. The last stdout line is the
summary as JSON. Given `JOB_DEADLINE_S` (a rendered RayJob carries its activeDeadlineSeconds so), the
driver stops the run that long after it started, exit 1, its checkpoints kept.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from raydlc.errors import RaydlcError
from raydlc.views.output import emit_json, err_console

if TYPE_CHECKING:
    from raydlc.config import Config


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The training settings' options, built from their fields as `raydlc train`'s are (raydlc.config.flags)."""
    from raydlc.config import flags

    ap = argparse.ArgumentParser(prog="python -m raydlc.train", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--config", help="raydlc.yaml (default: ./raydlc.yaml or $RAYDLC_CONFIG)")
    ap.add_argument("--set", dest="assignments", action="append", metavar="NAME=VALUE", help="any setting by its env.sh name (repeatable)")
    flags.add_arguments(ap, flags.options("train"), extra_names={"STORAGE_PATH": ("--storage-path",)})  # its name before --out
    ap.add_argument("--address", default="auto", help="Ray address (default: auto, the cluster this job runs in)")
    ap.add_argument("--local", action="store_true", help="apply the laptop defaults (tiny model, 2 workers) and start a local Ray")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from raydlc.config import load_config, parse_assignments
    from raydlc.train import launch

    ns = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        overrides: dict[str, Any] = parse_assignments(ns.assignments)
        overrides.update({k: v for k, v in vars(ns).items() if k.isupper() and v is not None})
        cfg = load_config(ns.config, overrides=overrides)
        address = None if ns.local and ns.address == "auto" else ns.address
        where = replace(launch.target(cfg, local=ns.local, address=address), deadline_at=deadline_at(cfg, time.time()))
        summary = launch.run(launch.settings(cfg, local=ns.local), where, on_progress=_print_progress)
    except RaydlcError as e:
        err_console.print(f"error: {e}", highlight=False)
        return e.exit_code
    emit_json(summary)
    return 0


def deadline_at(cfg: Config, now: float) -> float | None:
    """When this driver stops the run: JOB_DEADLINE_S from now when the job was given one (a RayJob carries its
    activeDeadlineSeconds so, since KubeRay v1.7.0 only marks a clusterSelector RayJob Failed there); else never."""
    return now + cfg.ray.job_deadline_s if cfg.origin("JOB_DEADLINE_S") != "default" else None


def _print_progress(rec: dict[str, Any]) -> None:
    if "eval_loss" in rec:
        print(f"step {rec['step']}: eval loss {rec['eval_loss']:.4f}", flush=True)
    elif "loss" in rec:
        print(f"step {rec['step']}: loss {rec['loss']:.4f}  {rec['tokens_per_s']:,.0f} tok/s  {rec['step_time_s']:.3f} s{cost_note(rec.get('cost'))}", flush=True)
    elif rec.get("stage") == "stalled":
        print(f"stall guard: {rec['reason']}; evidence: {rec['evidence']}", flush=True)
    elif rec.get("stage") == "deadline":
        print(f"deadline: {rec['reason']}", flush=True)
    elif rec.get("preempted"):
        print(f"step {rec['step']}: {preempted_line(rec)}", flush=True)
    elif rec.get("resumed"):
        on = f" on {rec['node']}" if rec.get("node") else ""
        print(f"step {rec['step']}: resumed from its checkpoint{on}", flush=True)  # read back by raydlc.jobs.restarts


def preempted_line(rec: dict[str, Any]) -> str:
    """What a drain notice's progress record (train.preempt.Notice.record) says to the user."""
    if rec.get("saved") is False:
        return f"preempted: deadline too short to save at step {rec['step']}; resuming from step {rec.get('resume_from', 0)}"
    return (f"preempted (a drain notice for ranks {rec.get('preempted_ranks')}): the checkpoint of step {rec['step']} is saved; "
            "Ray Train restarts from it when the nodes are back")


def cost_note(cost: dict[str, Any] | None) -> str:
    """`  $1.20 spent of $5.00, forecast $4.10`: what `raydlc job status` reads back from the log (raydlc.jobs.control.latest_cost)."""
    if not cost:
        return ""
    forecast = f", forecast ${cost['forecast_usd']:.2f}" if cost.get("forecast_usd") is not None else ""
    return f"  ${cost['spent_usd']:.2f} spent of ${cost['budget_usd']:.2f}{forecast}"


if __name__ == "__main__":
    sys.exit(main())
