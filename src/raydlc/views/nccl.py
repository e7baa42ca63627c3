"""The NCCL report for a person at a terminal: verdict first, then who, then the proof."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from raydlc.nccl import NcclReport, expect_ok

MAX_ROWS = 64
MAX_LINES = 24
_STYLE = {"efa": "bold green", "ib": "bold green", "single-node": "bold cyan", "socket": "bold red", "libfabric": "bold yellow",
          "libfabric-other": "bold yellow", "mixed": "bold red", "unknown": "bold yellow"}


def headline(r: NcclReport) -> str:
    """One line a person can read aloud: what carried the traffic and how sure."""
    parts = []
    if r.plugin:
        parts.append(r.plugin + (f" {r.plugin_version}" if r.plugin_version and r.plugin_version not in r.plugin else ""))
    if r.provider:
        parts.append(f"provider {r.provider}" + (f" (fabric {r.fabric})" if r.fabric and r.fabric != r.provider else ""))
    elif r.verdict == "libfabric":
        parts.append("provider unproven")
    if r.gdr is not None:
        parts.append("GPUDirect RDMA" if r.gdr else "no GPUDirect RDMA")
    if r.nccl_version:
        parts.append(f"NCCL {r.nccl_version}")
    nranks = len([x for x in r.ranks if x.rank is not None])
    where = f"{nranks} rank{'s' if nranks != 1 else ''}" if nranks else "ranks unknown"
    if r.nodes:
        where += f" on {r.nodes} node{'s' if r.nodes != 1 else ''}"
    proof = {"carried": ", carried", "selected": ", SELECTED ONLY"}.get(r.proof or "", "")
    return f"{r.verdict}{proof}{' + FALLBACK' if r.fallback else ''}  ({'; '.join(parts) or 'no plugin/provider lines'}) — {where}"


def proof_line(r: NcclReport) -> str:
    """How the verdict is known, in words."""
    if r.proof == "carried":
        return "proof: carried — channel lines show the connections" + (" (all inside one host)" if r.verdict == "single-node" else "")
    if r.proof == "selected" and r.verdict == "single-node":
        return "proof: selected — NCCL's communicators report one node, but no channel line shows the traffic"
    if r.proof == "selected":
        return "proof: selected — NCCL reported its choice, but no channel line shows traffic over it"
    return "proof: none — neither channel lines nor a reported selection settle it"


def why_not(r: NcclReport, expect: str, accept_selected: bool) -> str:
    if r.verdict == "libfabric" and expect == "efa":
        return "the log shows libfabric with the provider unproven: no 'Selected provider is efa', fi_addr_efa address or efa_<k> device line"
    if r.verdict != expect:
        return f"the log shows {r.verdict}"
    if r.fallback:
        return "a fallback"
    if r.errors:
        return f"{len(r.errors)} error line(s)"
    if r.proof == "selected" and not accept_selected:
        return "only selected, not carried (--accept-selected accepts that)"
    return "not proven"


def render(r: NcclReport, console: Console, expect: str | None = None, accept_selected: bool = False) -> None:
    style = "bold red" if r.fallback else _STYLE.get(r.verdict, "bold")
    console.print(f"[{style}]verdict: {escape(headline(r))}[/]", highlight=False, soft_wrap=True)
    console.print(f"  {escape(proof_line(r))}", highlight=False, soft_wrap=True)
    for reason in r.reasons:
        console.print(f"  · {escape(reason)}", highlight=False, soft_wrap=True)
    if expect:
        ok = expect_ok(r, expect, accept_selected)
        verdict = "[green]yes[/]" if ok else f"[red]no[/] ({escape(why_not(r, expect, accept_selected))})"
        console.print(f"  expected {expect}: {verdict}", highlight=False, soft_wrap=True)

    if r.ranks:
        t = Table(title="ranks", show_lines=False, title_justify="left")
        for col in ("rank", "host", "pid", "dev", "network", "provider", "transports", "inter-node", "proof", "GDR", "errors"):
            t.add_column(col, overflow="fold")
        for x in r.ranks[:MAX_ROWS]:
            t.add_row(
                "" if x.rank is None else f"{x.rank}/{x.nranks or '?'}", x.host or x.node or "", "" if x.pid is None else str(x.pid),
                "" if x.device is None else str(x.device), x.network or "", x.provider or "", ", ".join(x.transports),
                (x.inter_node or "").rstrip("*"), x.proof or "", {True: "yes", False: "no", None: ""}[x.gdr], str(x.errors) if x.errors else "",
            )
        console.print(t)
        if len(r.ranks) > MAX_ROWS:
            console.print(f"  … {len(r.ranks) - MAX_ROWS} more processes (use --json for all)")

    if len(r.hosts) > 1 or any(h.machines != 1 for h in r.hosts):
        t = Table(title="machines", show_lines=False, title_justify="left")
        for col in ("host", "addresses", "machines", "processes", "ranks", "inter-node", "proof"):
            t.add_column(col, overflow="fold")
        for h in r.hosts[:MAX_ROWS]:
            ranks = ", ".join(map(str, h.ranks[:16])) + (" …" if len(h.ranks) > 16 else "")
            inter = h.inter_node or ""
            if inter == "mixed":
                inter += " (" + "; ".join(f"{w}: {', '.join(rs[:8])}" for w, rs in h.inter_node_ranks.items()) + ")"
            t.add_row(h.host, ", ".join(h.addresses[:4]), str(h.machines), str(len(h.processes)), ranks, inter, h.proof or "")
        console.print(t)

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
