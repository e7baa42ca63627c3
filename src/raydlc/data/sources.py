"""A source's files and their records: local files and directories, s3:// prefixes, the bundled corpus.

A source is listed once, in the driver, into `Unit`s of work (a JSONL or text file, a Parquet
row group, the bundled corpus) in a fixed order, and fingerprinted from the files' names, sizes
and modification times, so a source that changed since it was prepared is noticed without
reading it. Each unit is read by one Ray Data task (`read_unit`), which yields every record with
where it came from (`FILE:LINE`, `FILE:row N`) or the reason it cannot be read.

`read_local` reads a local .txt/.jsonl source whole, in one process, into `Document`s, failing on
the first problem with its file and line: the check a job makes of `--data` before it starts, and
the reference the prepared blocks are tested against (`read_hub` is its Hugging Face counterpart).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raydlc import storage
from raydlc.data.corpus import BUNDLED, Document, bundled_corpus
from raydlc.edges.storage import filesystem, s3_error
from raydlc.errors import InputError

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
    refuse_hub(spec)
    fs, root = filesystem(spec)
    infos = _remote_files(fs, root, spec) if storage.is_uri(spec) else _local_files(root, spec)
    units: list[Unit] = []
    h = hashlib.sha256()
    for i in infos:
        uri = _uri(spec, root, i.path)
        h.update(f"{i.path[len(root):]}\0{i.size}\0{i.mtime_ns}\n".encode())
        kind = SUFFIXES[_suffix(i.path)]
        units.extend(_parquet_units(fs, i.path, uri) if kind == "parquet" else [Unit(i.path, uri, kind)])
    plain = all(u.kind != "parquet" for u in units)  # Parquet's bytes are compressed: no bound from them
    return Source(spec, tuple(units), h.hexdigest()[:16], len(infos), sum(int(i.size) for i in infos) if plain else None)


@dataclass(frozen=True)
class _File:
    path: str
    size: int
    mtime_ns: int


def _remote_files(fs: Any, root: str, spec: str) -> list[_File]:
    """The data files under an s3:// (or other URI) prefix, or the one file it names."""
    import pyarrow.fs as pafs

    try:
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.Directory:
            found = [i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True)) if i.type == pafs.FileType.File and _suffix(i.path) in SUFFIXES]
        else:
            found = [info]
    except OSError as e:
        raise s3_error(e, spec) or InputError(f"--data {spec}: cannot list it ({e})", hint="check the path and the credentials for it") from e
    if info.type == pafs.FileType.NotFound:
        raise InputError(f"--data {spec}: no such file or directory", hint="pass a .jsonl/.parquet/.txt file or a directory of them")
    if info.type == pafs.FileType.Directory and not found:
        raise InputError(f"--data {spec}: the directory holds no .jsonl, .parquet or .txt files")
    if info.type != pafs.FileType.Directory and _suffix(info.path) not in SUFFIXES:
        raise InputError(f"--data {spec}: unsupported file type {_suffix(info.path) or '(none)'!r}", hint="use .jsonl, .parquet or .txt")
    return sorted((_File(i.path, int(i.size or 0), int(i.mtime_ns or 0)) for i in found), key=lambda f: f.path)


def _local_files(root: str, spec: str) -> list[_File]:
    """The data files of a local source: links followed within it (a link to a folder outside the source,
    such as `up -> ..`, is not), each directory listed once (a link back to a directory already listed, a
    loop, adds nothing), and a FIFO, socket or device refused by name."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise InputError(f"--data {spec}: no such file or directory", hint="pass a .jsonl/.parquet/.txt file or a directory of them") from None
    except OSError as e:
        raise InputError(f"--data {spec}: cannot read it ({(e.strerror or str(e)).lower()})") from None
    if not stat.S_ISDIR(st.st_mode):
        _check_regular(spec, st)
        if _suffix(root) not in SUFFIXES:
            raise InputError(f"--data {spec}: unsupported file type {_suffix(root) or '(none)'!r}", hint="use .jsonl, .parquet or .txt")
        return [_File(root, st.st_size, st.st_mtime_ns)]
    found: list[_File] = []
    seen: set[tuple[int, int]] = set()
    real_root = os.path.realpath(root)
    todo = [root]
    while todo:
        d = todo.pop()
        key = (os.stat(d).st_dev, os.stat(d).st_ino)
        if key in seen:
            continue
        seen.add(key)
        try:
            names = sorted(os.listdir(d))
        except OSError as e:
            raise InputError(f"--data {_uri(spec, root, d)}: cannot list it ({(e.strerror or str(e)).lower()})") from None
        for name in names:
            path = f"{d}/{name}"
            try:
                st = os.stat(path)
            except OSError:  # a broken link, or one in a loop of links
                if _suffix(name) in SUFFIXES:
                    raise InputError(f"--data {_uri(spec, root, path)}: a link that leads nowhere", hint="remove it or fix its target") from None
                continue
            if stat.S_ISDIR(st.st_mode):
                if not os.path.islink(path) or _inside(os.path.realpath(path), real_root):  # a link out of the source is not followed
                    todo.append(path)
            elif _suffix(name) in SUFFIXES:
                _check_regular(_uri(spec, root, path), st)
                found.append(_File(path, st.st_size, st.st_mtime_ns))
    if not found:
        raise InputError(f"--data {spec}: the directory holds no .jsonl, .parquet or .txt files")
    return sorted(found, key=lambda f: f.path)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _check_regular(where: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        raise InputError(f"--data {where}: {kind}, not a regular file: data is read from files", hint="copy the data into a file and pass that")


def refuse_hub(spec: str | None) -> None:
    """An hf:// path is refused by name: pyarrow would ask the Hub (offline: an OSError that names no file)."""
    if spec is not None and storage.scheme(spec) == "hf":
        raise InputError(f"--data {spec}: a Hugging Face Hub path; raydlc prepares local files and s3:// prefixes",
                         hint="download the dataset's .jsonl/.parquet files first (hf download REPO --repo-type dataset) and pass their folder")


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
    fs, _ = filesystem(unit.uri) if storage.is_uri(unit.uri) else filesystem(unit.path)
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
    if unit.kind == "txt" and (why := not_text(text)):
        yield unit.uri, None, why
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
        except RecursionError:
            yield f"{unit.uri}:{n}", None, NESTED
            continue
        yield f"{unit.uri}:{n}", line, None


NESTED = "a JSON value nested too deeply to be a record"


def not_text(text: str) -> str | None:
    """Why a .txt file's content is not text to train on (NUL bytes: a binary file renamed), or None."""
    nul = text.count("\0")
    return f"not text: {nul:,} NUL bytes of {len(text):,} characters (a binary file?)" if nul else None


@functools.lru_cache(maxsize=1)
def _bundled_rows() -> tuple[Row, ...]:
    """The bundled corpus as rows, made once per process (parsing the standard library takes seconds)."""
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
    from raydlc.data.formats import BadRecord, segments

    for where, rec, error in read_unit(source.units[0]):
        if error is not None:
            return f"{where}: {error}"
        try:
            segments(json.loads(rec or "null"))
        except BadRecord as e:
            return f"{where}: {e}"
        return None
    return f"{source.units[0].uri}: no records"


def sample_texts(source: Source, limit: int = SAMPLE_CHARS) -> list[str]:
    """The text of the first `limit` characters of good records, for a tokenizer trained here."""
    from raydlc.data.formats import BadRecord, segments

    out: list[str] = []
    total = 0
    for unit in source.units:
        for _, rec, error in read_unit(unit):
            if error is not None:
                continue
            try:
                segs = segments(json.loads(rec or "null"))
            except BadRecord:
                continue
            for s in segs:
                out.append(s.text)
                total += len(s.text)
            if total >= limit:
                return out
    return out


# ---- whole documents, in one process -----------------------------------------------------------


def is_local(data: str) -> bool:
    """A path (existing or meant to be) rather than a Hugging Face dataset id."""
    p = Path(data).expanduser()
    return p.exists() or data.startswith((".", "/", "~")) or p.suffix.lower() in (".txt", ".jsonl", ".json") or "\\" in data


def read_local(path: str | Path) -> list[Document]:
    """A .txt/.jsonl file, or a directory of them; every problem names the file and line."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"--data {p}: no such file or directory", hint="pass a .txt/.jsonl file or a directory of them")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in (".txt", ".jsonl"))
        if not files:
            raise InputError(f"--data {p}: the directory holds no .txt or .jsonl files")
    else:
        files = [p]
    docs: list[Document] = []
    for f in files:
        docs.extend(_read_file(f))
    if not docs:
        raise InputError(f"--data {p}: no text in it", hint="the file(s) are empty or hold only whitespace")
    return docs


def _read_file(f: Path) -> list[Document]:
    suffix = f.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise InputError(f"--data {f}: unsupported file type {suffix or '(none)'!r}", hint="use .txt (plain text) or .jsonl")
    try:
        text = f.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"--data {f}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise InputError(f"--data {f}: cannot read it ({e.strerror or e})") from e
    if not text.strip():
        raise InputError(f"--data {f}: the file is empty", hint="give it some text, or remove it")
    if suffix == ".txt" and (why := not_text(text)):
        raise InputError(f"--data {f}: {why}")
    if suffix == ".txt":
        return [Document(text)]
    return [_jsonl_record(f, n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _jsonl_record(f: Path, n: int, line: str) -> Document:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"--data {f}:{n}: not valid JSON ({e.msg})") from e
    except RecursionError as e:
        raise InputError(f"--data {f}:{n}: {NESTED}") from e
    hint = 'each line must be {"text": ...} or {"prompt": ..., "response": ...} with string values'
    if not isinstance(rec, dict):
        raise InputError(f"--data {f}:{n}: expected a JSON object, got {type(rec).__name__}", hint=hint)
    if "prompt" in rec or "response" in rec:
        prompt, response = rec.get("prompt"), rec.get("response")
        if not isinstance(prompt, str) or not isinstance(response, str):
            missing = [k for k in ("prompt", "response") if not isinstance(rec.get(k), str)]
            raise InputError(f"--data {f}:{n}: field(s) {', '.join(missing)} missing or not a string", hint=hint)
        if not response.strip():
            raise InputError(f"--data {f}:{n}: empty response (nothing to learn)", hint=hint)
        return Document(response, prompt=prompt)
    if isinstance(rec.get("text"), str) and rec["text"].strip():
        return Document(rec["text"])
    raise InputError(f"--data {f}:{n}: no 'text' or 'prompt'/'response' fields (found {sorted(rec)})", hint=hint)


def read_hub(dataset_id: str, split: str = "train", max_docs: int | None = None) -> list[Document]:
    """A Hugging Face dataset, on the cluster; needs the `hf` extra and network."""
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as e:
        raise InputError(
            f"--data {dataset_id!r} is not a local file, and Hugging Face datasets are not installed",
            hint="install raydlc[hf] to read a dataset id, or pass a local .txt/.jsonl path",
        ) from e
    try:
        ds = datasets.load_dataset(dataset_id, split=split)
    except Exception as e:  # datasets raises many types for offline/unknown ids
        raise InputError(f"--data {dataset_id!r}: cannot load the dataset ({e})", hint="check the id and the network (HF_HUB_OFFLINE)") from e
    cols = set(ds.column_names)
    docs: list[Document] = []
    for i, rec in enumerate(ds):
        if max_docs is not None and i >= max_docs:
            break
        if {"prompt", "response"} <= cols:
            docs.append(Document(str(rec["response"]), prompt=str(rec["prompt"])))
        elif "text" in cols:
            docs.append(Document(str(rec["text"])))
        else:
            raise InputError(f"--data {dataset_id!r}: no 'text' or 'prompt'/'response' columns (has {sorted(cols)})")
    if not docs:
        raise InputError(f"--data {dataset_id!r}: the {split} split is empty")
    return docs


def load_documents(data: str | None) -> list[Document]:
    """What `--data` names, whole: the bundled corpus, a local .txt/.jsonl source, or a Hugging Face dataset."""
    if data is None or data == BUNDLED:
        return bundled_corpus()
    return read_local(data) if is_local(data) else read_hub(data)
