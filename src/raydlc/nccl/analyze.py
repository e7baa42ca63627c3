"""Lines or byte chunks in, an `NcclReport` out: the scanner, the parser and the verdict, wired once."""

from __future__ import annotations

from collections.abc import Iterable

from raydlc.nccl.parse import NcclParser
from raydlc.nccl.report import NcclReport
from raydlc.nccl.scan import ChunkScanner, candidate_lines


def analyze_chunks(chunks: Iterable[bytes], source: str = "-", parser: NcclParser | None = None, node: str | None = None) -> NcclReport:
    """Report for one stream of raw bytes; pass `parser` to combine several streams.

    `node` names the machine the stream came from (a pod, an instance) when the caller knows
    it: processes are then told apart by it too, and `report().hosts` is per that machine.
    """
    p = parser or NcclParser()
    sc = ChunkScanner(p, source, node)
    for c in chunks:
        sc.feed(c)
    sc.close()
    return p.report()


def analyze_lines(lines: Iterable[str | bytes], source: str = "-", node: str | None = None) -> NcclReport:
    """Report for an iterable of text lines (each parsed only if it can carry evidence)."""
    p = NcclParser()
    p.begin(source)
    p.at(node, None)
    n = 0
    for n, raw in enumerate(lines, 1):
        b = raw if isinstance(raw, bytes) else raw.encode("utf-8", "replace")
        if p.context_wanted > 0:
            p.feed_context(b.decode("utf-8", "replace"), n, source)
            continue
        for s, e in candidate_lines(b):
            p.feed_line(b[s:e].decode("utf-8", "replace"), n, source)
    p.count_lines(n)
    return p.report()
