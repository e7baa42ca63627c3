"""Which transport really carried a job, read from NCCL's own debug output.

NCCL falls back silently: when the OFI plugin or the EFA device fails it picks InfiniBand,
then plain sockets, and the job still trains, at half speed. A grep for "Libfabric" cannot
tell the difference, because NCCL names the *selected* network long before any byte crosses
it, and the plugin names the network "Libfabric" whatever provider (efa, tcp, cxi) sits
below. So every verdict carries its level of proof (`carried`, `selected`, or none).

The package, one concept per module, in the order data flows:
- `rules`: the wording NCCL and aws-ofi-nccl print, with sources (`RULES`), which handler
  reads which message (`PREFIXES`), and the patterns;
- `scan`: bytes to candidate lines, fed to a `LineSink` (`ChunkScanner`, `candidate_lines`);
- `parse`: lines to frozen facts per process (`NcclParser`, `facts.NcclFacts`);
- `machines`: telling hosts apart (hostname, addresses, pid, bus id);
- `verdict`: `judge(facts) -> NcclReport`, pure;
- `advice`: what to check next (`likely_causes`);
- `report`: the report's shape (`NcclReport.as_dict()` is what `raydlc nccl --json` prints).

The wording covered spans NCCL 2.3 (`Ring 00 : 0[0] -> 1[1] via ...`, `Using internal Network
IB`) to 2.29 (`Assigned NET plugin ... to comm`, `nRanks ... nNodes`) and aws-ofi-nccl 1.x
(`Using aws-ofi-nccl 1.3.0aws`, `Initializing aws-ofi-nccl 1.17.2`, `Selected Provider is efa
(found 4 nics)`, `Selected provider is efa, fabric is efa-direct`).

Pure: lines or byte chunks in, an `NcclReport` out. Reading files is `telemetry.collect`'s
job; `ChunkScanner(parser, source, node=...)` lets a caller that knows which machine a file
came from (per-node worker logs) say so, and `NcclReport.hosts` answers per machine.
"""

from __future__ import annotations

from raydlc.nccl.advice import likely_causes
from raydlc.nccl.analyze import analyze_chunks, analyze_lines
from raydlc.nccl.facts import Evidence, NcclFacts, Process
from raydlc.nccl.parse import NcclParser
from raydlc.nccl.report import EXPECTABLE, PROOFS, VERDICTS, HostInfo, NcclReport, RankInfo, expect_ok
from raydlc.nccl.rules import PREFIXES, RULES, Prefix, Rule, net_class
from raydlc.nccl.scan import ChunkScanner, LineSink, candidate_lines
from raydlc.nccl.verdict import judge

__all__ = [
    "EXPECTABLE", "PREFIXES", "PROOFS", "RULES", "VERDICTS", "ChunkScanner", "Evidence", "HostInfo", "LineSink", "NcclFacts",
    "NcclParser", "NcclReport", "Prefix", "Process", "RankInfo", "Rule", "analyze_chunks", "analyze_lines", "candidate_lines",
    "expect_ok", "judge", "likely_causes", "net_class",
]
