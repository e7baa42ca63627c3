"""Jobs, the verify gate and the transport comparison for a person: tables with the evidence beside each verdict."""

from __future__ import annotations

import time
from typing import Any

from raydlc.checks.gate import FAIL, NA, PASS, GateVerdict
from raydlc.edges.ray_dashboard import Job

_STATUS = {"SUCCEEDED": "green", "FAILED": "bold red", "STOPPED": "yellow", "RUNNING": "cyan", "PENDING": "cyan"}
_ROW = {PASS: "green", FAIL: "bold red", NA: "dim"}


def _when(t: float | None) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _secs(s: float | None) -> str:
    return f"{s:.1f} s" if s is not None else "-"


def print_jobs(jobs: list[Job], where: str, console: Any) -> None:
    from rich.table import Table

    t = Table(title=f"jobs on {where}")
    for col in ("job", "status", "started", "duration", "program"):
        t.add_column(col, no_wrap=col != "program", overflow="fold")
    for j in jobs:
        t.add_row(j.submission_id, f"[{_STATUS.get(j.status, 'white')}]{j.status}[/]", _when(j.start_time), _secs(j.duration_s),
                  j.metadata.get("program", "-"))
    console.print(t if jobs else f"no jobs on {where}")


def print_job(j: Job, console: Any) -> None:
    color = _STATUS.get(j.status, "white")
    console.print(f"[bold]{j.submission_id}[/]: [{color}]{j.status}[/]" + (f" — {j.message}" if j.message else ""), highlight=False)
    console.print(f"  ray job id {j.job_id or '-'}, started {_when(j.start_time)}, ran {_secs(j.duration_s)}", highlight=False)
    console.print(f"  entrypoint: {j.entrypoint}", highlight=False)


def print_cost(cost: dict[str, Any], console: Any) -> None:
    """The budget line of `job status`: spend at the last step the job printed, and the forecast to its last step."""
    forecast = f", forecast to the last step ${cost['forecast_usd']:.2f}" if cost.get("forecast_usd") is not None else ""
    price = cost.get("price", "list prices")  # a Spot job: the Spot price read at submit (api.job_status)
    console.print(f"  spend at step {cost['step']}: ${cost['spent_usd']:.2f} of ${cost['budget_usd']:.2f}{forecast} ({price})", highlight=False)


def print_restarts(restarts: list[dict[str, Any]], console: Any) -> None:
    """The restarts row of `job status`: each preemption or failure and where the run resumed (jobs.restarts)."""
    from raydlc.jobs.restarts import describe

    for r in restarts:
        console.print(f"  restart: {describe(r)}", highlight=False)


def print_verdict(v: GateVerdict, console: Any) -> None:
    from rich.table import Table

    job = f", job {v.job.submission_id}" if v.job else ""
    t = Table(title=f"verify: {v.target} target{job}", show_lines=True)
    t.add_column("criterion", max_width=32, overflow="fold")
    t.add_column("result", no_wrap=True)
    t.add_column("evidence", overflow="fold", ratio=1)
    for r in v.rows:
        t.add_row(f"[bold]{r.criterion}[/]\n[dim]{r.title}[/]", f"[{_ROW[r.status]}]{r.status}[/]", "\n".join(r.evidence))
    console.print(t)
    failed = [r for r in v.rows if r.status == FAIL]
    if failed:
        named = sorted({n for r in failed for n in r.failed_nodes})
        console.print(f"[bold red]gate failed[/]: {', '.join(r.criterion for r in failed)}" + (f" (nodes: {', '.join(named)})" if named else ""), highlight=False)
    else:
        na = sum(r.status == NA for r in v.rows)
        console.print("[green]gate passed[/]" + (f" ({na} criteria not applicable on the {v.target} target)" if na else ""), highlight=False)


def print_bench(doc: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    t = Table(title=f"transport comparison ({doc['target']} target)")
    for col in ("run", "job", "status", "steps/s", "tokens/s", "transport (per node)", "counts"):
        t.add_column(col, no_wrap=col in ("run", "status", "steps/s", "tokens/s"), overflow="fold")
    for r in doc["runs"]:
        sps, tps = r.get("steps_per_s"), r.get("tokens_per_s")
        t.add_row(r["label"], r["submission_id"], r["status"], f"{sps:.3f}" if sps else "-", f"{tps:,.0f}" if tps else "-",
                  "\n".join(f"{n}: {w}" for n, w in r["transport"].items()) or "-", "yes" if r["counts"] else f"no: {r['why']}")
    console.print(t)
    if doc.get("speedup") is not None:
        console.print(f"[bold]speed-up:[/] {doc['speedup']:.2f}x steps/s, {doc['tokens_speedup']:.2f}x tokens/s ({doc['reason']})", highlight=False)
    else:
        console.print(f"[bold]speed-up:[/] {doc['reason']}", highlight=False)
