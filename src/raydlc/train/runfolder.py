"""A run's folder under STORAGE_PATH: raydlc's own, one writer at a time, never another run's by accident.

A folder raydlc makes holds `raydlc_run.json` (its name, start time and the PID that started it),
written when the run starts: the proof that the folder is raydlc's, and the time `--resume` orders
runs by (a name says nothing: a day-old run called `zebra` sorts after `run-2026…`). A run name
that already holds a run is refused unless `--resume` continues it or `--overwrite` replaces it; a
folder without the record (the user's own files) is never written into; nothing is written through
a symlink that leads outside STORAGE_PATH. While a run writes, it holds `.raydlc.lock` in its folder
(an exclusive `flock`, released by the kernel when the process ends, however it ends), so a second
`train` into the same folder is refused at once, naming the PID of the first.

Local folders get all of this; a URI (s3://…) gets the record and the reused-name refusal (object
stores have no locks).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydlc import storage
from raydlc.errors import InputError, RaydlcError

RECORD = "raydlc_run.json"
CHECKPOINT_MANIFEST = "raydlc_checkpoint.json"  # train.checkpoint.MANIFEST (which orders runs by this module: no import back)
LOCK = ".raydlc.lock"
# Folders raydlc itself keeps beside the runs under STORAGE_PATH (data.dataset.DATASETS): no run may take their name.
RESERVED = ("datasets",)


@dataclass(frozen=True)
class Claim:
    """What `claim` decided about the run folder: whether it holds an earlier run, and whether that one is replaced."""

    run_dir: str
    existed: bool  # the folder held a run of raydlc's (it is continued or replaced)
    started_at: float | None  # the earlier run's recorded start, when there was one


def resolved(out: str) -> str:
    """STORAGE_PATH made absolute (storage.resolve); a symlink loop is one line, not pathlib's RuntimeError."""
    try:
        return storage.resolve(out)
    except (RuntimeError, OSError):
        raise InputError(f"{out}: is a symlink loop (too many levels of symbolic links)", hint="pass a real path") from None


def check_root(root: str, flag: str = "--out") -> None:
    """A storage root raydlc may write runs under: not the file system's root."""
    if storage.is_uri(root):
        return
    if Path(root).resolve() == Path(Path(root).resolve().anchor):
        raise InputError(f"{flag} {root}: is the file system's root; raydlc writes its runs and datasets into a folder of their own",
                         hint=f"pass a folder, e.g. {flag} ./raydlc-out")


def check_name(name: str) -> None:
    if name in RESERVED:
        raise InputError(f"--run-name {name}: is the folder raydlc keeps its {name} in under --out", hint="choose another --run-name")


def check_modes(*, resume: bool, resume_from: str | None, overwrite: bool) -> None:
    """--resume, --resume-from and --overwrite say three different things: at most one of them."""
    given = [f for f, on in (("--resume", resume), ("--resume-from", bool(resume_from)), ("--overwrite", overwrite)) if on]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)} given together: --resume continues the run named by --run-name (or the newest), "
                         "--resume-from starts from one checkpoint, --overwrite replaces a run", hint="pass one of them")


def read_record(run_dir: str) -> dict[str, Any] | None:
    """The run's record, or None when the folder has none (not raydlc's, or made before records)."""
    from raydlc.edges.storage import read_text

    try:
        doc = json.loads(read_text(storage.join(run_dir, RECORD)) if storage.is_uri(run_dir) else Path(run_dir, RECORD).read_text())
    except (OSError, ValueError, RaydlcError):  # none, unreadable, or storage that does not let us read it
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("started_at"), (int, float)) else None


def started_at(run_dir: str) -> float | None:
    """When the run in `run_dir` started: its record's time, else (a run from before records) the
    folder's own modification time; None when neither can be read."""
    rec = read_record(run_dir)
    if rec is not None:
        return float(rec["started_at"])
    if storage.is_uri(run_dir):
        return None
    try:
        return Path(run_dir).stat().st_mtime
    except OSError:
        return None


def newest_first(root: str, runs: list[str]) -> list[str]:
    """`runs` (folder names under `root`) by recorded start time, newest first; the name breaks ties."""
    times = {r: started_at(storage.join(root, r)) for r in runs}
    return sorted(runs, key=lambda r: (times[r] if times[r] is not None else float("-inf"), r), reverse=True)


def _escapes(root: Path, run_dir: Path) -> Path | None:
    """The first path in the run folder (the folder itself included) that is a symlink leading outside `root`."""
    real_root = root.resolve()

    def outside(p: Path) -> bool:
        try:
            return not p.resolve().is_relative_to(real_root)
        except (OSError, RuntimeError):  # a symlink loop leads nowhere raydlc may write
            return True

    if run_dir.is_symlink():
        return run_dir if outside(run_dir) else None
    if not run_dir.is_dir():
        return None
    for here, dirs, files in os.walk(run_dir, followlinks=False):
        for name in (*dirs, *files):
            p = Path(here, name)
            if p.is_symlink() and outside(p):
                return p
    return None


def _holds_checkpoints(run_dir: Path) -> bool:
    return any(run_dir.glob(f"checkpoint_*/{CHECKPOINT_MANIFEST}"))


def claim(root: str, name: str, *, resume: bool, overwrite: bool) -> Claim:
    """Whether this run may write into `root/name`: `InputError` when it would lose something.

    Refused: a folder that is not raydlc's (no record, not empty; a run from before records is
    taken only by --resume, by its checkpoints), a run of raydlc's without --resume or --overwrite,
    and a folder holding a symlink that leads outside `root`.
    """
    check_root(root)
    check_name(name)
    run_dir = storage.join(root, name)
    if storage.is_uri(root):
        rec = read_record(run_dir)
        if rec is not None and not (resume or overwrite):
            raise _reused(name, run_dir, rec)
        return Claim(run_dir, rec is not None, None if rec is None else float(rec["started_at"]))
    d = Path(run_dir)
    if (bad := _escapes(Path(root), d)) is not None:
        raise InputError(f"{bad} is a symlink leading outside {root}: raydlc writes nothing through it",
                         hint="remove the link, or choose another --run-name")
    if (pid := _writer(d)) is not None:  # a run writing there now: said first, whatever the folder holds
        raise _in_use(d, pid)
    if not d.exists() or (d.is_dir() and not {p.name for p in d.iterdir()} - {LOCK, RECORD + ".tmp"}):  # new, or just begun
        return Claim(run_dir, False, None)
    if not d.is_dir():
        raise InputError(f"{run_dir} exists and is not a folder", hint="choose another --run-name")
    rec = read_record(run_dir)
    if rec is None and not (resume and _holds_checkpoints(d)):
        raise InputError(f"{run_dir} holds files raydlc did not write (no {RECORD}): it is left as it is",
                         hint="choose another --run-name or --out")
    if rec is not None and not (resume or overwrite):
        raise _reused(name, run_dir, rec)
    if not overwrite and (blocked := _not_a_folder(d)) is not None:  # found now, not when the finished run is copied in
        raise InputError(f"{blocked} is a file: the run writes a folder there; it is left as it is",
                         hint="move it away, or choose another --run-name")
    return Claim(run_dir, True, None if rec is None else float(rec["started_at"]))


PRODUCTS = ("export",)  # the folder a run publishes into its run folder (beside checkpoint_* and files)


def _not_a_folder(run_dir: Path) -> Path | None:
    """A product folder of the run that exists as something else (a file): publishing would fail on it at the end."""
    return next((run_dir / n for n in PRODUCTS if (run_dir / n).exists() and not (run_dir / n).is_dir()), None)


def _reused(name: str, run_dir: str, rec: dict[str, Any]) -> InputError:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(rec["started_at"])))
    return InputError(f"--run-name {name}: {run_dir} already holds a run (started {when}); it is left as it is",
                      hint="--resume continues it, --overwrite replaces it, or choose another --run-name")


@contextlib.contextmanager
def held(c: Claim, *, overwrite: bool) -> Iterator[None]:
    """The run folder, for the block: locked against a second writer, emptied first with --overwrite,
    and its record written when the run is new (or replaces one). A URI gets the record only."""
    if storage.is_uri(c.run_dir):
        if not c.existed or overwrite:
            _write_record(c.run_dir)
        yield
        return
    d = Path(c.run_dir)
    made = _missing(d)  # this run makes these folders (the run's, and --out when new): it removes them if it writes nothing
    d.mkdir(parents=True, exist_ok=True)
    with _locked(d):
        if c.existed and overwrite:
            _empty(d)
        fresh = not c.existed or overwrite
        if fresh or read_record(c.run_dir) is None:
            _write_record(c.run_dir)
        try:
            yield
        finally:
            if fresh:
                _forget_if_empty(d, made)


def _missing(d: Path) -> list[Path]:
    """`d` and those of its parents that do not exist yet, deepest first."""
    out: list[Path] = []
    for p in (d, *d.parents):
        if p.exists():
            break
        out.append(p)
    return out


def _forget_if_empty(d: Path, made: list[Path]) -> None:
    """A run that ended before writing anything (bad input found late, Ctrl-C at Ray's start) leaves no
    record behind, so that its name is free again; the folders go too when this run made them (--out too)."""
    if {p.name for p in d.iterdir()} - {RECORD, LOCK, RECORD + ".tmp"}:
        return
    for name in (RECORD, RECORD + ".tmp", LOCK):
        with contextlib.suppress(OSError):
            (d / name).unlink()
    for folder in made:  # deepest first; one another process wrote into meanwhile is not empty and stays
        with contextlib.suppress(OSError):
            folder.rmdir()


def _in_use(d: Path, pid: str) -> InputError:
    return InputError(f"{d} is being written by another raydlc train (PID {pid}); one run writes a folder at a time",
                      hint="wait for it to end, or choose another --run-name")


def _writer(d: Path) -> str | None:
    """The PID of the process holding the run folder's lock now (`unknown` when it wrote none), or None."""
    import fcntl

    try:
        fd = os.open(d / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # a shared lock taken here goes with it
    return None


@contextlib.contextmanager
def _locked(d: Path) -> Iterator[None]:
    import fcntl

    fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(d, os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _empty(d: Path) -> None:
    """--overwrite: the earlier run's files go (the folder is raydlc's, by its record), the lock stays."""
    import shutil

    for p in d.iterdir():
        if p.name == LOCK:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _write_record(run_dir: str) -> None:
    import socket

    doc = json.dumps({"run_name": run_dir.rstrip("/").rsplit("/", 1)[-1], "started_at": time.time(), "pid": os.getpid(),
                      "host": socket.gethostname()}, indent=1)
    if storage.is_uri(run_dir):
        from raydlc.edges.storage import write_text

        write_text(storage.join(run_dir, RECORD), doc)
        return
    tmp = Path(run_dir, RECORD + ".tmp")
    tmp.write_text(doc)
    os.replace(tmp, Path(run_dir, RECORD))
