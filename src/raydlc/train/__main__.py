"""`python -m raydlc.train`: what a Ray job runs on the cluster (the entrypoint of a RayJob).

Settings come from the same `RAYDLC_*` variables and YAML as the CLI (the job's runtime env
carries them), flags and `--set NAME=VALUE` override; there are no laptop defaults here: the
model, step count and workers (one per GPU) are the cluster's. The last stdout line is the
summary as JSON.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raydlc.errors import RaydlcError
from raydlc.output import emit_json, err_console


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The training settings' options, built from their fields as `raydlc train`'s are (raydlc.flags)."""
    from raydlc import flags

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
        summary = launch.run(launch.settings(cfg, local=ns.local), launch.target(cfg, local=ns.local, address=address), on_progress=_print_progress)
    except RaydlcError as e:
        err_console.print(f"error: {e}", highlight=False)
        return e.exit_code
    emit_json(summary)
    return 0


def _print_progress(rec: dict[str, Any]) -> None:
    if "eval_loss" in rec:
        print(f"step {rec['step']}: eval loss {rec['eval_loss']:.4f}", flush=True)
    elif "loss" in rec:
        print(f"step {rec['step']}: loss {rec['loss']:.4f}  {rec['tokens_per_s']:,.0f} tok/s  {rec['step_time_s']:.3f} s{cost_note(rec.get('cost'))}", flush=True)
    elif rec.get("stage") == "stalled":
        print(f"stall guard: {rec['reason']}; evidence: {rec['evidence']}", flush=True)
    elif rec.get("resumed"):
        print(f"step {rec['step']}: resumed from its checkpoint", flush=True)


def cost_note(cost: dict[str, Any] | None) -> str:
    """`  $1.20 spent of $5.00, forecast $4.10`: what `raydlc job status` reads back from the log (raydlc.jobs.latest_cost)."""
    if not cost:
        return ""
    forecast = f", forecast ${cost['forecast_usd']:.2f}" if cost.get("forecast_usd") is not None else ""
    return f"  ${cost['spent_usd']:.2f} spent of ${cost['budget_usd']:.2f}{forecast}"


if __name__ == "__main__":
    sys.exit(main())
