"""Where NCCL logs are read from: files, directories (Ray session dirs), gzip, stdin.

Everything is read in large binary chunks and handed to the pure parser, so a file is
never held whole and gigabytes of Ray session logs cost about what a grep over them costs.
Pods are not read here yet: that needs the cluster lifecycle's `kube` gateway.
"""

from __future__ import annotations

import gzip
import os
import sys
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from raydlc.errors import InputError
from raydlc.nccl import ChunkScanner, NcclParser, NcclReport

CHUNK = 8 << 20
LOG_SUFFIXES = (".out", ".err", ".log", ".txt", ".gz", ".json", ".csv")


def read_chunks(stream: BinaryIO, size: int = CHUNK) -> Iterator[bytes]:
    """Fixed-size reads until EOF."""
    while True:
        b = stream.read(size)
        if not b:
            return
        yield b


def log_files(directory: Path) -> list[Path]:
    """The files worth scanning under a directory, without following symlinked dirs.

    A Ray session tree (`session_*/logs/`) holds raylet, GCS and dashboard logs too; NCCL
    lines only ever appear in the workers' own stdout/stderr, so when worker files exist
    only they are read. `session_latest` is a symlink to a session dir: not followed, so
    nothing is read twice.
    """
    workers: list[Path] = []
    others: list[Path] = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (Path(root) / d).is_symlink())
        for name in sorted(files):
            p = Path(root) / name
            if name.startswith(".") or p.is_symlink() or not p.is_file():
                continue
            if name.startswith("worker-") and (name.endswith(".out") or name.endswith(".err")):
                workers.append(p)
            elif name.endswith(LOG_SUFFIXES) or "." not in name:
                others.append(p)
    return workers or others


def expand(paths: Iterable[str]) -> list[str]:
    """Paths as given, directories expanded; '-' is stdin. Missing paths are an InputError."""
    out: list[str] = []
    for raw in paths:
        if raw == "-":
            out.append("-")
            continue
        p = Path(raw)
        if p.is_dir():
            found = log_files(p)
            if not found:
                raise InputError(f"{raw}: no log files in this directory", hint="point at a Ray session dir (/tmp/ray/session_*/logs) or at log files")
            out.extend(str(f) for f in found)
        elif p.exists():  # files, but also pipes such as <(kubectl logs …)
            out.append(str(p))
        else:
            raise InputError(f"{raw}: no such file or directory", hint="give log files, a directory, or - for stdin")
    if not out:
        raise InputError("no input given", hint="raydlc nccl PATH|DIR|- (for example: kubectl logs POD | raydlc nccl -)")
    return out


def _open(path: str) -> tuple[BinaryIO, BinaryIO]:
    """The byte stream of a path or stdin, gunzipped when it starts like gzip (peeked, so pipes work)."""
    if path == "-":
        if sys.stdin is None:
            raise InputError("-: standard input is closed", hint="pipe the log in (kubectl logs POD | raydlc nccl -) or pass a path")
        f: BinaryIO = sys.stdin.buffer
    else:
        try:
            f = open(path, "rb")  # noqa: SIM115
        except OSError as e:
            raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        head = f.peek(2)[:2] if hasattr(f, "peek") else b""  # type: ignore[attr-defined]
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb"), f  # type: ignore[return-value]
    return f, f


def scan_into(parser: NcclParser, path: str, chunk_size: int = CHUNK, node: str | None = None) -> None:
    """Stream one file (or stdin) through the parser; `node` names the machine it came from, if known."""
    stream, raw = _open(path)
    scanner = ChunkScanner(parser, "<stdin>" if path == "-" else path, node)
    try:
        for c in read_chunks(stream, chunk_size):
            scanner.feed(c)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise InputError(f"{path}: truncated or corrupt gzip ({e})", hint="re-copy the file, or gunzip what is left and pass the text") from None
    except OSError as e:
        raise InputError(f"{path}: read failed ({e.strerror or e})") from None
    finally:
        if path != "-":
            stream.close()
            raw.close()
    scanner.close()


def analyze_paths(paths: Iterable[str], chunk_size: int = CHUNK) -> NcclReport:
    """One report over every given path: ranks of a job are usually spread over files."""
    parser = NcclParser()
    for p in expand(paths):
        scan_into(parser, p, chunk_size)
    return parser.report()


def analyze_node_paths(groups: Mapping[str, Iterable[str]], chunk_size: int = CHUNK) -> NcclReport:
    """One report over logs grouped by the machine they came from (pod or node name -> paths).

    The name tells machines apart even when their containers share a hostname, and lines
    without NCCL's host prefix are that machine's; `report.hosts` then answers per machine.
    """
    parser = NcclParser()
    for node, paths in groups.items():
        for p in expand(paths):
            scan_into(parser, p, chunk_size, node)
    return parser.report()
