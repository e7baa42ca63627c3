"""raydlc.views: what people see is drawn from the rooms' data, and only views (and the CLI) touch rich."""

from __future__ import annotations

import ast
from pathlib import Path

from rich.console import Console

import raydlc
from raydlc.checks.preflight import Expectation, Measurement, NodeFacts, judge
from raydlc.views.preflight import print_report

SRC = Path(raydlc.__file__).resolve().parent
# Where people-facing output may live: the views, and the command line that prints them.
MAY_USE_RICH = ("views/", "cli/")


def test_only_views_import_rich() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        if rel.startswith(MAY_USE_RICH):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "rich" or n.startswith("rich.") for n in names):
                offenders.append(rel)
    assert offenders == []


def test_preflight_view_shows_figures_nodes_findings_and_verdict() -> None:
    nodes = [
        NodeFacts("10.0.1.5", "a", (0, 1), 2, True, "efa", "Libfabric", ("libnccl-net-ofi.so",), "libnccl-net-ofi.so"),
        NodeFacts("10.0.1.6", "b", (2, 3), 2, False, "tcp", None, (), None),
    ]
    m = Measurement("all_reduce", "cross", 64 << 20, 2, 0.05, ("10.0.1.5", "10.0.1.6"))
    report = judge([m], nodes, Expectation(network_gbps=40, efa=True, gpus_per_node=2))
    console = Console(record=True, width=160)
    print_report(report, console)
    text = console.export_text()
    assert "all_reduce" in text and "64 MiB" in text and f"{m.busbw_gbytes_s:.3f}" in text
    assert "10.0.1.6" in text and "fail:" in text and "verdict: fail" in text
