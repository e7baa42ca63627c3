"""The preflight for a person: bus bandwidth per collective, scope and size, the nodes, then the verdict."""

from __future__ import annotations

from typing import Any

from raydlc.checks.preflight import PreflightReport


def print_report(report: PreflightReport, console: Any) -> None:
    from rich.table import Table

    t = Table(title=f"collective bandwidth, GB/s ({report.backend}, {report.world_size} ranks)")
    for col in ("op", "scope", "ranks", "size", "time", "algbw", "busbw"):
        t.add_column(col, justify="right" if col not in ("op", "scope") else "left", no_wrap=True)
    for m in sorted(report.measurements, key=lambda m: (m.op, m.scope, m.nodes, m.size_bytes)):
        scope = f"intra {m.nodes[0]}" if m.scope == "intra" and m.nodes else m.scope
        t.add_row(m.op, scope, str(m.group_size), f"{m.size_bytes / 2**20:g} MiB", f"{m.time_s * 1e3:.2f} ms",
                  f"{m.algbw_gbytes_s:.3f}", f"{m.busbw_gbytes_s:.3f}")
    console.print(t)
    nt = Table(title="nodes")
    for col in ("node", "ranks", "GPUs", "/dev/infiniband", "FI_PROVIDER", "NCCL net plugin"):
        nt.add_column(col)
    for n in report.nodes:
        nt.add_row(n.node, ",".join(map(str, n.ranks)), str(n.gpus_visible), "yes" if n.infiniband else "no",
                   n.fi_provider or "-", n.net_plugin_loaded or ("on disk" if n.net_plugin_files else "-"))
    console.print(nt)
    style = {"fail": "bold red", "warn": "yellow", "info": "dim"}
    for f in report.findings:
        console.print(f"[{style[f.level]}]{f.level}:[/] {f.message}", highlight=False)
    console.print(f"[bold]verdict:[/] {report.verdict}")
