"""The scale-out scan for a person: one row per node count, and a plot of speed and efficiency."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from raydlc.planner import GB
from raydlc.planner.scan import Scan


def _ac(ac: Any, sep: str) -> str:
    """AC for full checkpointing, SAC for selective, nothing without."""
    return f"{sep}SAC" if ac == "selective" else (f"{sep}AC" if ac else "")


def _layout(r: Any) -> str:
    if not r.fits:
        return "[red]does not fit[/]"
    accum = f" x {r.grad_accum} ({r.sync})" if r.grad_accum > 1 else ""
    return f"{r.strategy} mb {r.micro_batch}{accum}{_ac(r.activation_checkpointing, ' +')}"


def print_scan(s: Scan, console: Any) -> None:
    from rich.table import Table

    where = s.instance_type or f"{s.gpus_per_node} x {s.gpu_name}"
    console.print(
        f"[bold]{s.model}[/] ({s.params:,} parameters), {s.policy}, seq {s.seq_len}, on {where}: {s.gpus_per_node} x {s.gpu_name} "
        f"({s.gpu_memory_bytes / GB:.0f} GB) per node, {'NVLink' if s.nvlink else 'PCIe'} inside, "
        f"{s.network_gbps:g} Gb/s {'EFA' if s.efa else 'TCP'} between nodes"
    )
    t = Table(title="scale-out (predicted)")
    for col, just in (("nodes", "right"), ("GPUs", "right"), ("layout", "left"), ("global batch", "right"),
                      ("per GPU", "right"), ("step", "right"), ("tokens/s", "right"), ("vs linear", "right"), ("bound", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in s.rows:
        t.add_row(
            str(r.nodes), str(r.gpus), _layout(r), f"{r.global_batch:,}" if r.fits else "-",
            f"{r.per_gpu_bytes / GB:.1f} GB" if r.per_gpu_bytes else "-", f"{r.step_time_s:.3g} s" if r.step_time_s else "-",
            f"{r.tokens_per_s:,.0f}" if r.fits else "-", f"{r.efficiency:.0%}" if r.efficiency is not None else "-", r.bound or "-",
        )
    console.print(t)
    ceiling = s.assumptions.get("max_global_batch")
    console.print(f"global batch at most {ceiling:,} tokens per step (--max-global-batch): past the node count that fills it, "
                  "each GPU gets fewer tokens and communication sets the pace")
    best = s.best_efficient()
    if s.reference_nodes is None:
        console.print("nothing fits at any of these node counts: enable activation checkpointing, shorten sequences or add GPUs")
    elif best is not None:
        console.print(f"efficiency against linear from {s.reference_nodes} node(s); the largest count at 80% or better: {best.nodes} nodes")


def plot_scan(s: Scan, path: Path) -> None:
    """tokens/s (with the linear line) and efficiency against nodes, as a PNG; written whole or not at all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    rows = [r for r in s.rows if r.fits]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7.5, 6.5), dpi=110, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    nodes = [r.nodes for r in rows]
    ax.plot(nodes, [r.tokens_per_s for r in rows], "o-", color="C0", label="predicted")
    ax.plot(nodes, [r.linear_tokens_per_s for r in rows], "--", color="0.5", label=f"linear from {s.reference_nodes} node(s)")
    for r in rows:
        ax.annotate(f"{r.strategy}{_ac(r.activation_checkpointing, ' ')}\nmb{r.micro_batch}x{r.grad_accum}", (r.nodes, r.tokens_per_s),
                    textcoords="offset points", xytext=(0, -26), ha="center", fontsize=7, color="0.3")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if f"{v:.0e}"[0] in "25" else ""))
    ax.set_ylabel("tokens/s (all GPUs)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left")
    where = s.instance_type or f"{s.gpus_per_node} x {s.gpu_name}"
    missing = [str(r.nodes) for r in s.rows if not r.fits]
    ceiling = s.assumptions.get("max_global_batch")
    ax.set_title(f"{s.model} on {where}: seq {s.seq_len}, {s.policy}, global batch <= {ceiling:,} tokens"
                 + (f"\ndoes not fit on {', '.join(missing)} node(s)" if missing else ""), fontsize=9)
    ax2.plot(nodes, [r.efficiency for r in rows], "s-", color="C1")
    ax2.axhline(1.0, color="0.5", linestyle="--", linewidth=1)
    ax2.axhline(0.8, color="C3", linestyle=":", linewidth=1, label="80%")
    ax2.set_ylim(0, max(1.1, max((r.efficiency or 0 for r in rows), default=1) * 1.05))
    ax2.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax2.set_ylabel("scaling efficiency")
    ax2.set_xlabel("GPU nodes")
    ax2.set_xticks(nodes or [1])
    ax2.set_xticklabels([str(n) for n in nodes] or ["1"])
    ax2.grid(alpha=0.3)
    ax2.legend(loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, format="png")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
