"""The figures of benchmarks/gpu_check.sh: the planner's prediction for its training run, and the final table.

    python benchmarks/gpu_check_report.py predict --out OUTDIR --gpu h100 --model M --seq-len L --micro-batch B --grad-accum N
    python benchmarks/gpu_check_report.py table --out OUTDIR

`predict` is pure arithmetic (no torch, no GPU). `table` reads what the check wrote under
OUTDIR (nvidia-smi.csv, efficiency.json / efficiency.txt, train.json and the run's
metrics.jsonl, plan.json), prints one table and writes it as summary.txt and summary.json.
A missing figure is a dash with the reason, never a made-up number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def predict(out: Path, *, gpu: str, model: str, seq_len: int, micro_batch: int, grad_accum: int) -> dict[str, Any]:
    """The planner on the check's own run: 1 node x 1 GPU, FSDP, bf16-mixed, sync once (the loop's default)."""
    from raydlc import plan as planner
    from raydlc.models import get_spec

    spec = get_spec(model)
    layout = planner.layout_for(1, 1, gpu=gpu, network_gbps=100.0)  # one GPU: the network carries nothing
    work = planner.Workload(spec, seq_len=seq_len, micro_batch=micro_batch, grad_accum=grad_accum, sync="once", policy="bf16-mixed")
    p = planner.plan(work, layout)
    st = p.step_time_s
    doc = {
        "gpu": gpu,
        "model": spec.name,
        "seq_len": seq_len,
        "micro_batch": micro_batch,
        "grad_accum": grad_accum,
        "sync": p.sync,
        "step_time_s": st["estimate"],
        "tokens_per_s": st["tokens_per_s"],
        "bound": st["bound"],
        "per_gpu_bytes": p.per_gpu_bytes["total"],
        "fits": p.fits,
        "gpu_memory_bytes": p.gpu_memory_bytes,
        "mfu_assumed": p.assumptions["mfu"],
    }
    (out / "plan.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _train_figures(out: Path) -> tuple[dict[str, Any] | None, str]:
    """The measured step: median over the steps after the first read window (warm-up), from metrics.jsonl."""
    summary = None
    try:
        lines = (out / "train.json").read_text().strip().splitlines()
        summary = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        pass
    if summary is None:
        return None, "no train.json (the run failed or did not run; see train.txt)"
    try:
        records = [json.loads(x) for x in Path(summary["metrics"]).read_text().splitlines() if x.strip()]
    except (OSError, ValueError, KeyError):
        return None, f"no metrics at {summary.get('metrics')}"
    steps = [r for r in records if "loss" in r]
    first = steps[0]["time"] if steps else None
    steady = [r for r in steps if r["time"] != first] or steps
    step = statistics.median(r["step_time_s"] for r in steady)
    return {
        "step_time_s": step,
        "tokens_per_s": steady[0]["tokens"] / step,
        "tokens_per_step": steady[0]["tokens"],
        "steps_measured": len(steady),
        "peak_mem_mb": summary.get("peak_mem_mb"),
        "first_loss": summary.get("first_loss"),
        "final_loss": summary.get("final_loss"),
        "micro_batch": summary.get("micro_batch"),
        "grad_accum": summary.get("grad_accum"),
        "grad_sync": summary.get("grad_sync"),
    }, ""


def table(out: Path, *, dry_run: bool = False) -> dict[str, Any]:
    rows: list[tuple[str, str]] = []
    doc: dict[str, Any] = {"dry_run": dry_run}
    smi = (out / "nvidia-smi.csv").read_text().strip() if (out / "nvidia-smi.csv").exists() else ""
    rows.append(("GPU (nvidia-smi)", smi or ("- (dry run)" if dry_run else "- (nvidia-smi gave nothing)")))
    doc["gpu"] = smi or None
    eff = _json(out / "efficiency.json")
    if eff:
        s = eff["summary"]
        best = next(r for r in eff["rows"] if r["name"] == s["raydlc_best"])
        rows.append(("efficiency: raydlc / reference tokens/s", f"{s['speedup_tokens_per_s']:.2f}x ({best['name']}, {best['batch']} x {best['seq']})"))
        rows.append(("efficiency: raydlc MFU / reference MFU", f"{100 * s['raydlc_mfu']:.1f}% / {100 * s['reference_mfu']:.2f}%"))
        doc["efficiency"] = s
    else:
        rows.append(("efficiency benchmark", "- (dry run)" if dry_run else "- (no efficiency.json; see efficiency.txt)"))
    plan = _json(out / "plan.json")
    measured, why = (None, "dry run") if dry_run else _train_figures(out)
    if plan:
        run = f"{plan['model']}, micro-batch {plan['micro_batch']} x {plan['grad_accum']} accumulated (sync {plan['sync']}), seq {plan['seq_len']}, bf16, NCCL, 1 GPU"
        rows.append(("train run", run))
        rows.append(("planned step (s) / tokens/s", f"{plan['step_time_s']:.3f} / {plan['tokens_per_s']:,.0f} ({plan['bound']}-bound at {100 * plan['mfu_assumed']:.0f}% MFU; "
                     f"{plan['per_gpu_bytes'] / 1e9:.1f} of {plan['gpu_memory_bytes'] / 1e9:.1f} GB)"))
    if measured:
        rows.append(("measured step (s) / tokens/s", f"{measured['step_time_s']:.3f} / {measured['tokens_per_s']:,.0f} (median of {measured['steps_measured']} steps; "
                     f"peak {measured['peak_mem_mb'] or 0:,.0f} MiB; loss {measured['first_loss']:.3f} -> {measured['final_loss']:.3f})"))
        if plan:
            rows.append(("measured / planned step time", f"{measured['step_time_s'] / plan['step_time_s']:.2f}"))
    else:
        rows.append(("measured step (s) / tokens/s", f"- ({why})"))
    doc["plan"], doc["measured"] = plan, measured
    width = max(len(k) for k, _ in rows)
    text = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    (out / "summary.txt").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(text)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gpu", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--grad-accum", type=int, required=True)
    t = sub.add_parser("table")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    from raydlc.errors import RaydlcError

    try:
        if a.what == "predict":
            doc = predict(a.out, gpu=a.gpu, model=a.model, seq_len=a.seq_len, micro_batch=a.micro_batch, grad_accum=a.grad_accum)
            if not doc["fits"]:
                print(f"error: the planner says {doc['model']} at micro-batch {doc['micro_batch']} needs {doc['per_gpu_bytes'] / 1e9:.1f} GB, "
                      f"more than the {a.gpu}'s {doc['gpu_memory_bytes'] / 1e9:.1f} GB", file=sys.stderr)
                return 2
            print(f"planned: {doc['step_time_s']:.3f} s/step, {doc['tokens_per_s']:,.0f} tokens/s ({doc['bound']}-bound), "
                  f"{doc['per_gpu_bytes'] / 1e9:.1f} GB per GPU")
        else:
            table(a.out, dry_run=a.dry_run)
    except RaydlcError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
