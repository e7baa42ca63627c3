"""A source's files and their records: local files and directories, s3:// prefixes, the bundled corpus.

A source is listed once, in the driver, into `Unit`s of work (a JSONL or text file, a Parquet
row group, the bundled corpus) in a fixed order, and fingerprinted from the files' names, sizes
and modification times, so a source that changed since it was prepared is noticed without
reading it. Each unit is read by one Ray Data task (`read_unit`), which yields every record with
where it came from (`FILE:LINE`, `FILE:row N`) or the reason it cannot be read.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from raydlc import storage
from raydlc.errors import InputError

BUNDLED = "bundled"
SUFFIXES = {".jsonl": "jsonl", ".txt": "txt", ".parquet": "parquet"}
SAMPLE_CHARS = 2_000_000  # what a tokenizer trained here learns from: the first this many characters


@dataclass(frozen=True)
class Unit:
    """One task's share of a source: a file (or one Parquet row group), read start to end."""

    path: str  # on the unit's file system: a local absolute path, or bucket/key for s3://
    uri: str  # as the user names it, for messages
    kind: str  # jsonl | txt | parquet | bundled
    group: int = 0  # the Parquet row group
    first_row: int = 0  # the row group's first row in its file, for messages

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Source:
    spec: str  # what the user passed
    units: tuple[Unit, ...]
    fingerprint: str
    files: int
    text_bytes: int | None = None  # bytes of JSONL/text files (or the bundled corpus): a bound on byte-level tokens

    def max_tokens(self) -> int | None:
        """At most this many tokens from a byte-level BPE trained here (each token is at least one byte,
        and a record's EOS and default chat markup take fewer bytes than its JSON): twice the bytes."""
        return None if self.text_bytes is None else 2 * self.text_bytes


def _suffix(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:].lower() if dot > name.rfind("/") else ""


def list_source(spec: str | None) -> Source:
    """The units of `spec` in order (files sorted by path); every problem is an `InputError` naming it."""
    if spec is None or spec == BUNDLED:
        size = sum(len(r[1] or "") for r in _bundled_rows())
        return Source(BUNDLED, (Unit(BUNDLED, BUNDLED, BUNDLED),), _bundled_fingerprint(), 0, size)
    import pyarrow.fs as pafs

    fs, root = storage.filesystem(spec)
    try:
        info = fs.get_file_info(root)
    except OSError as e:
        raise InputError(f"--data {spec}: cannot list it ({e})", hint="check the path and the credentials for it") from e
    if info.type == pafs.FileType.NotFound:
        raise InputError(f"--data {spec}: no such file or directory", hint="pass a .jsonl/.parquet/.txt file or a directory of them")
    if info.type == pafs.FileType.Directory:
        infos = sorted(
            (i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True)) if i.type == pafs.FileType.File and _suffix(i.path) in SUFFIXES),
            key=lambda i: i.path,
        )
        if not infos:
            raise InputError(f"--data {spec}: the directory holds no .jsonl, .parquet or .txt files")
    else:
        if _suffix(info.path) not in SUFFIXES:
            raise InputError(f"--data {spec}: unsupported file type {_suffix(info.path) or '(none)'!r}", hint="use .jsonl, .parquet or .txt")
        infos = [info]
    units: list[Unit] = []
    h = hashlib.sha256()
    for i in infos:
        uri = _uri(spec, root, i.path)
        h.update(f"{i.path[len(root):]}\0{i.size}\0{i.mtime_ns}\n".encode())
        kind = SUFFIXES[_suffix(i.path)]
        units.extend(_parquet_units(fs, i.path, uri) if kind == "parquet" else [Unit(i.path, uri, kind)])
    plain = all(u.kind != "parquet" for u in units)  # Parquet's bytes are compressed: no bound from them
    return Source(spec, tuple(units), h.hexdigest()[:16], len(infos), sum(int(i.size) for i in infos) if plain else None)


def _uri(spec: str, root: str, path: str) -> str:
    """A file as the user would name it: under the prefix they gave."""
    return spec.rstrip("/") + path[len(root.rstrip("/")):] if path != root else spec


def _parquet_units(fs: Any, path: str, uri: str) -> list[Unit]:
    import pyarrow.parquet as pq

    try:
        with fs.open_input_file(path) as f:
            meta = pq.ParquetFile(f).metadata
    except Exception as e:  # pyarrow raises ArrowInvalid and OSError for a file that is not Parquet
        raise InputError(f"--data {uri}: not a readable Parquet file ({e})") from e
    units, first = [], 0
    for g in range(meta.num_row_groups):
        units.append(Unit(path, uri, "parquet", g, first))
        first += meta.row_group(g).num_rows
    return units


def _bundled_fingerprint() -> str:
    import sys
    import sysconfig

    return hashlib.sha256(f"bundled\0{sys.version}\0{sysconfig.get_paths()['stdlib']}".encode()).hexdigest()[:16]


# ---- reading ------------------------------------------------------------------------------------


Row = tuple[str, str | None, str | None]  # (where, the record as JSON, or the reason it cannot be read)


def read_unit(unit: Unit) -> Iterator[Row]:
    """Every record of `unit` in order; an unreadable file is one bad row naming it."""
    if unit.kind == BUNDLED:
        yield from _bundled_rows()
        return
    fs, _ = storage.filesystem(unit.uri) if storage.is_uri(unit.uri) else storage.filesystem(unit.path)
    if unit.kind == "parquet":
        yield from _parquet_rows(fs, unit)
        return
    try:
        with fs.open_input_stream(unit.path) as f:
            text = bytes(f.read()).decode("utf-8")
    except UnicodeDecodeError as e:
        yield unit.uri, None, f"not UTF-8 text ({e.reason} at byte {e.start})"
        return
    except OSError as e:
        yield unit.uri, None, f"cannot read it ({e})"
        return
    if not text.strip():
        yield unit.uri, None, "the file is empty"
        return
    if unit.kind == "txt":
        yield unit.uri, json.dumps({"text": text}), None
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except json.JSONDecodeError as e:
            yield f"{unit.uri}:{n}", None, f"not valid JSON ({e.msg})"
            continue
        yield f"{unit.uri}:{n}", line, None


@functools.lru_cache(maxsize=1)
def _bundled_rows() -> tuple[Row, ...]:
    """The bundled corpus as rows, made once per process (parsing the standard library takes seconds)."""
    from raydlc.train.data import bundled_corpus

    return tuple((f"bundled:{i + 1}", json.dumps({"text": d.text}), None) for i, d in enumerate(bundled_corpus()))


def _parquet_rows(fs: Any, unit: Unit) -> Iterator[Row]:
    import pyarrow.parquet as pq

    with fs.open_input_file(unit.path) as f:
        table = pq.ParquetFile(f).read_row_group(unit.group)
    for i, rec in enumerate(table.to_pylist()):
        rec = {k: v for k, v in rec.items() if v is not None}  # a column absent from this row is null in Arrow
        yield f"{unit.uri}:row {unit.first_row + i + 1}", json.dumps(rec), None


def first_problem(source: Source) -> str | None:
    """The first record's problem, if it has one: a cheap look before any Ray task starts."""
    from raydlc.data.records import RecordError, segments

    for where, rec, error in read_unit(source.units[0]):
        if error is not None:
            return f"{where}: {error}"
        try:
            segments(json.loads(rec or "null"))
        except RecordError as e:
            return f"{where}: {e}"
        return None
    return f"{source.units[0].uri}: no records"


def sample_texts(source: Source, limit: int = SAMPLE_CHARS) -> list[str]:
    """The text of the first `limit` characters of good records, for a tokenizer trained here."""
    from raydlc.data.records import RecordError, segments

    out: list[str] = []
    total = 0
    for unit in source.units:
        for _, rec, error in read_unit(unit):
            if error is not None:
                continue
            try:
                segs = segments(json.loads(rec or "null"))
            except RecordError:
                continue
            for s in segs:
                out.append(s.text)
                total += len(s.text)
            if total >= limit:
                return out
    return out
