"""The capacity report for a person: one row per AZ in ranking order, then quotas, checks and the verdict."""

from __future__ import annotations

from typing import Any

from raydlc.capacity import CapacityReport


def print_report(report: CapacityReport, console: Any) -> None:
    from rich.table import Table

    q = report.quota
    headroom = "?" if q.headroom is None else f"{q.headroom:g}"
    title = f"{report.count} × {report.instance_type} in {report.region}: {report.vcpus_needed or '?'} vCPUs needed"
    table = Table(title=title)
    for col in ("AZ", "id", "offered", "quota headroom", "spot score", "spot $/h a node", "private subnet", "verdict"):
        table.add_column(col)
    style = {"ready": "green", "quota-short": "yellow", "not-offered": "red", "unknown": "dim"}
    yes_no = {True: "yes", False: "no", None: "?"}
    for z in report.zones:
        subnet = "-" if report.cluster is None and "subnets" not in report.unknown else yes_no[z.private_subnet]
        table.add_row(
            z.zone, z.zone_id or "?", yes_no[z.offered], headroom if z.offered else "",
            "?" if z.spot_score is None else str(z.spot_score),
            "?" if z.spot_price_usd is None else f"{z.spot_price_usd:.3f}", subnet, f"[{style[z.verdict]}]{z.verdict}[/]",
        )
    console.print(table)
    if q.value is not None:
        used = "?" if q.used is None else q.used
        kind = "Spot" if q.code and q.code == report.spot_quota.code else "On-Demand"
        console.print(f"{kind} quota {q.code} ({q.name}): {q.value:g} vCPUs, {used} in use")
    od = report.on_demand_usd_per_node_hour
    console.print(f"On-Demand list price: {'unknown' if od is None else f'${od:.3f}/h a node'} (raydlc's table); "
                  f"Spot: the current price per AZ above; GPU_CAPACITY_TYPE={report.capacity_type}", highlight=False)
    if report.spot_quota.value is not None:
        console.print(f"Spot quota {report.spot_quota.code} ({report.spot_quota.name}): {report.spot_quota.value:g} vCPUs")
    for name, why in report.unknown.items():
        console.print(f"[dim]unknown {name}: {why}[/]")
    for line in report.checks:
        console.print(f"[yellow]check:[/] {line}")
    if report.quota_request:
        r = report.quota_request
        console.print(f"quota short: request {r.quota_code} ({r.quota_name}) = {r.value:g} vCPUs:")
        console.print(f"  {r.command}", soft_wrap=True, highlight=False)
    if report.probe:
        console.print(f"probe: {report.probe.message}")
    best = next((z for z in report.zones if z.zone == report.best_zone), None)
    if best is None:
        console.print("best zone: [bold red]none[/]" + (f" ({report.zones[0].reason})" if report.zones else ""))
    else:
        console.print(f"best zone: [bold]{best.zone}[/] ({best.verdict}: {best.reason})")
