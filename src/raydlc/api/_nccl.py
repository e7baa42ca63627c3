"""`raydlc nccl` as a function: which transport NCCL really used, read from NCCL_DEBUG=INFO logs."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydlc.errors import InputError

if TYPE_CHECKING:
    from raydlc.nccl import NcclReport


@dataclass(frozen=True)
class NcclResult:
    """The report, and, when a transport was expected, whether the log proves it (`ok`)."""

    report: NcclReport
    expect: str | None = None
    accept_selected: bool = False
    ok: bool = True

    def to_dict(self) -> dict[str, Any]:
        doc = self.report.as_dict()
        if self.expect is not None:
            doc["expect"], doc["expect_ok"], doc["accept_selected"] = self.expect, self.ok, self.accept_selected
        return doc


def nccl(paths: Sequence[str] | None = None, *, expect: str | None = None, accept_selected: bool = False) -> NcclResult:
    """Judge NCCL's own log lines: the transport per rank and machine, how it is proven, and any fallback.

    `paths` are log files (.gz too), directories (a Ray session's logs) or "-" for standard
    input; None reads standard input when it is not a terminal. With `expect` (efa, socket,
    ib, single-node) `ok` is true only when channel lines show exactly that transport, with
    no fallback and no error; `accept_selected` also accepts NCCL's reported selection.

    Example:
        from pathlib import Path

        import raydlc.api as api

        Path("worker.log").write_text(
            "node-a:11:11 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)\\n"
            "node-a:11:20 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA\\n"
        )
        result = api.nccl(["worker.log"], expect="efa")
        print(result.report.verdict, result.report.proof, result.report.gdr, result.ok)
    """
    from raydlc.nccl import EXPECTABLE, expect_ok
    from raydlc.nccl.collect import analyze_paths

    if expect is not None and expect not in EXPECTABLE:
        raise InputError(f"--expect {expect!r} is not one of {', '.join(EXPECTABLE)}")
    if accept_selected and expect is None:
        raise InputError("--accept-selected only changes what --expect accepts", hint="add --expect efa|socket|ib|single-node")
    if not paths:
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("no input given", hint="raydlc nccl PATH|DIR|- (for example: kubectl logs POD | raydlc nccl -)")
        paths = ["-"]
    report = analyze_paths(paths)
    ok = expect is None or expect_ok(report, expect, accept_selected)
    return NcclResult(report, expect, accept_selected, ok)
