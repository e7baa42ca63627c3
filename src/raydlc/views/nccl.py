"""The NCCL report for a person at a terminal: verdict first, then who, then the proof."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from raydlc.telemetry.nccl import NcclReport

MAX_ROWS = 64
MAX_LINES = 24
_STYLE = {"efa": "bold green", "ib": "bold green", "single-node": "bold cyan", "socket": "bold red",
          "libfabric-other": "bold yellow", "mixed": "bold red", "unknown": "bold yellow"}


def headline(r: NcclReport) -> str:
    """One line a person can read aloud: what carried the traffic and how sure."""
    parts = []
    if r.plugin:
        parts.append(r.plugin + (f" {r.plugin_version}" if r.plugin_version and r.plugin_version not in r.plugin else ""))
    if r.provider:
        parts.append(f"provider {r.provider}" + (f" (fabric {r.fabric})" if r.fabric and r.fabric != r.provider else ""))
    if r.gdr is not None:
        parts.append("GPUDirect RDMA" if r.gdr else "no GPUDirect RDMA")
    if r.nccl_version:
        parts.append(f"NCCL {r.nccl_version}")
    nranks = len([x for x in r.ranks if x.rank is not None])
    where = f"{nranks} rank{'s' if nranks != 1 else ''}" if nranks else "ranks unknown"
    if r.nodes:
        where += f" on {r.nodes} node{'s' if r.nodes != 1 else ''}"
    return f"{r.verdict}{' + FALLBACK' if r.fallback else ''}  ({'; '.join(parts) or 'no plugin/provider lines'}) — {where}"


def render(r: NcclReport, console: Console, expect: str | None = None) -> None:
    style = "bold red" if r.fallback else _STYLE.get(r.verdict, "bold")
    console.print(f"[{style}]verdict: {escape(headline(r))}[/]", highlight=False, soft_wrap=True)
    for reason in r.reasons:
        console.print(f"  · {escape(reason)}", highlight=False, soft_wrap=True)
    if expect:
        ok = r.verdict == expect and not r.fallback and not r.errors
        console.print(f"  expected {expect}: " + ("[green]yes[/]" if ok else "[red]no[/]"), highlight=False, soft_wrap=True)

    if r.ranks:
        t = Table(title="ranks", show_lines=False, title_justify="left")
        for col in ("rank", "node", "pid", "dev", "network", "provider", "transports", "inter-node", "GDR", "errors"):
            t.add_column(col, overflow="fold")
        for x in r.ranks[:MAX_ROWS]:
            t.add_row(
                "" if x.rank is None else f"{x.rank}/{x.nranks or '?'}", x.node or "", "" if x.pid is None else str(x.pid),
                "" if x.device is None else str(x.device), x.network or "", x.provider or "", ", ".join(x.transports),
                x.inter_node or "", {True: "yes", False: "no", None: ""}[x.gdr], str(x.errors) if x.errors else "",
            )
        console.print(t)
        if len(r.ranks) > MAX_ROWS:
            console.print(f"  … {len(r.ranks) - MAX_ROWS} more processes (use --json for all)")

    if r.evidence:
        console.print("[bold]evidence[/]")
        for e in r.evidence[:MAX_LINES]:
            console.print(f"  {escape(e.source)}:{e.line}  [dim]{e.kind}[/]  {escape(e.text[:220])}", highlight=False, soft_wrap=True)
    if r.failures:
        console.print("[bold red]failures[/]")
        for e in r.failures[:MAX_LINES]:
            console.print(f"  {escape(e.source)}:{e.line}  {escape(e.text[:220])}", highlight=False, soft_wrap=True)
    if r.errors:
        console.print(f"[bold red]errors ({len(r.errors)})[/]")
        for e in r.errors[:MAX_LINES]:
            console.print(f"  {escape(e.source)}:{e.line}  {escape(e.text[:220])}", highlight=False, soft_wrap=True)
    if r.causes:
        console.print("[bold]likely causes / what to check[/]")
        for c in r.causes:
            console.print(f"  - {escape(c)}", highlight=False, soft_wrap=True)
    console.print(f"[dim]{r.lines} lines read, {r.candidates} parsed, from {len(r.sources)} source(s)[/]", highlight=False, soft_wrap=True)
