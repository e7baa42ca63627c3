"""Bytes to candidate lines: the fast search over raw chunks, and the narrow protocol it feeds.

A scanner never parses: it finds the lines that can carry evidence (one regex pass for
"NCCL …", a `bytes.find` pass for libfabric's warnings), drops lines it has already handed
over, and gives the rest to a `LineSink` with their source, machine and (lazily counted)
line numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from raydlc.nccl.rules import CAND_NCCL, CAND_OTHER

# Below this many bytes, bytes.count is cheaper than importing numpy (~0.15 s); above it,
# numpy's vectorised compare counts newlines ~7x faster.
NUMPY_MIN = 4 << 20


class LineSink(Protocol):
    """What a scanner feeds (the parser is one): candidate lines in order, and what it needs to skip the rest.

    `seen` is the set of raw lines already handed over, shared by every stream of one sink
    (a restarted worker group prints its init again; channel lines repeat per channel number).
    `context_wanted` is how many lines after the last one the sink wants verbatim (an error's
    context). A line number of -1 means "ask the counter given to `at`".
    """

    seen: set[bytes]
    context_wanted: int

    def begin(self, source: str) -> None:
        """A new stream starts (a file, stdin, a node's log)."""

    def at(self, node: str | None, line_of: Callable[[], int] | None) -> None:
        """The lines that follow come from machine `node` (None: unknown); `line_of()` numbers the current one."""

    def knows_provider(self, source: str) -> bool:
        """True once `source` has named its OFI provider: libfabric's warnings add nothing after that."""

    def feed_line(self, text: str, line: int = 0, source: str = "-") -> None: ...

    def feed_context(self, text: str, line: int = -1, source: str = "-") -> None: ...

    def count_lines(self, n: int) -> None:
        """`n` more lines were read, candidates or not."""


def candidate_lines(chunk: bytes, start: int = 0, end: int | None = None, libfabric: bool = True) -> Iterator[tuple[int, int]]:
    """(start, end) of each line in `chunk[start:end]` that can carry evidence, in order, once each.

    Works on offsets, never slices, so an 8 MB chunk is not copied to be searched.
    `libfabric=False` skips the pass for libfabric's own warnings.
    """
    if end is None:
        end = len(chunk)
    rfind, find = chunk.rfind, chunk.find
    others: list[int] = []
    for literal, rx in CAND_OTHER if libfabric else ():
        i = find(literal, start, end)
        while i >= 0:
            if rx.match(chunk, i, end):
                others.append(i)
            i = find(literal, i + len(literal), end)
    if others:
        starts: Iterable[int] = sorted([m.start() for m in CAND_NCCL.finditer(chunk, start, end)] + others)
    else:
        starts = (m.start() for m in CAND_NCCL.finditer(chunk, start, end))
    last_end = -1
    for s in starts:
        if s < last_end:
            continue
        b = rfind(b"\n", start, s) + 1 or start
        e = find(b"\n", s, end)
        if e < 0:
            e = end
        last_end = e + 1
        yield b, e


class ChunkScanner:
    """Feeds byte chunks (any sizes) to a sink, tracking line numbers across chunks.

    Newlines are counted with numpy into a reused buffer (a `bytes.count` pass costs as
    much as the whole search), and a candidate's line number is only computed when the
    sink keeps that line as evidence. `node` names the machine the stream came from, when
    the caller knows it (per-node worker logs).
    """

    MAX_LINE = 8 << 20

    def __init__(self, sink: LineSink, source: str = "-", node: str | None = None) -> None:
        self.sink = sink
        self.source = source
        self.node = node
        self._tail = b""
        self._line = 0  # newlines before the current chunk
        self._eq: Any = None  # numpy bool buffer, reused across chunks
        sink.begin(source)

    def feed(self, data: bytes) -> None:
        start = 0
        if self._tail:
            nl = data.find(b"\n")
            if nl < 0:
                self._tail = (self._tail + data)[-self.MAX_LINE:]
                return
            head = self._tail + data[: nl + 1]
            self._tail = b""
            self._scan(head, 0, len(head))
            start = nl + 1
        cut = data.rfind(b"\n", start) + 1
        if cut <= start:
            self._tail = data[start:][-self.MAX_LINE:]
            return
        self._scan(data, start, cut)
        self._tail = data[cut:]

    def close(self) -> None:
        if self._tail:
            tail, self._tail = self._tail + b"\n", b""
            self._scan(tail, 0, len(tail))

    def _newline_counter(self, data: bytes, start: int, end: int) -> Callable[[int, int], int]:
        """newlines(a, b): how many newlines `data[a:b]` holds, numpy-backed for big chunks."""
        if end - start < NUMPY_MIN:
            return lambda a, b: data.count(b"\n", a, b)
        np = _numpy()
        n = end - start
        if self._eq is None or len(self._eq) < n:
            self._eq = np.empty(max(n, 1 << 20), dtype=bool)
        eq = self._eq[:n]
        np.equal(np.frombuffer(data, dtype=np.uint8, count=n, offset=start), 10, out=eq)
        return lambda a, b: int(np.count_nonzero(eq[a - start : b - start]))

    def _scan(self, data: bytes, start: int, end: int) -> None:
        newlines = self._newline_counter(data, start, end)
        sink, source = self.sink, self.source
        state = [start, self._line]  # position counted up to, newlines before it
        off = start

        def line_of() -> int:
            if off > state[0]:
                state[1] += newlines(state[0], off)
                state[0] = off
            return state[1] + 1

        sink.at(self.node, line_of)
        seen, find, startswith = sink.seen, data.find, data.startswith
        node = (self.node or "").encode() + b"\x00" if self.node else b""
        if len(seen) > 1_000_000:
            seen.clear()
        try:
            # libfabric's warnings matter while the OFI provider is unknown: once the plugin has
            # named it in this stream, the (costly) extra pass is skipped.
            libfabric = not sink.knows_provider(source)
            consumed = start
            for b, e in candidate_lines(data, start, end, libfabric):
                if b < consumed:
                    continue  # already read as context of an error
                # An INFO line already parsed (a restarted worker group prints its init again)
                # adds nothing, and channel lines repeat per channel number: one equal to a parsed
                # one except for that number adds nothing either. Ray's folds are always counted.
                i = find(b" NCCL INFO ", b, e)
                if i >= 0 and find(b"x across cluster]", i, e) < 0:
                    j = find(b" : ", i, e) if startswith(b"Channel ", i + 11) else -1
                    key = node + (data[b:i] + data[j:e] if j >= 0 else data[b:e])
                    if key in seen:
                        continue
                    seen.add(key)
                off = b
                sink.feed_line(data[b:e].decode("utf-8", "replace"), -1, source)
                while sink.context_wanted > 0 and e < end:
                    b, e = e + 1, find(b"\n", e + 1, end)
                    if e < 0:
                        e = end
                    off = b
                    sink.feed_context(data[b:e].decode("utf-8", "replace"), -1, source)
                    consumed = e + 1
        finally:
            sink.at(None, None)
        total = newlines(start, end)
        self._line += total
        sink.count_lines(total)


def _numpy() -> Any:
    import numpy

    return numpy
