"""Files the CLI reads and writes: output locations checked before the work, writes all or nothing.

A command that will write should know it can before it spends a minute preparing data or
starting Ray, and a failed write should leave the file system as it found it. An OSError
that still escapes is turned into one line naming the path at the CLI boundary
(`os_error`): the user's paths give exit 2, the machine's faults (disk full, I/O) exit 1.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

from raydlc.errors import InputError, MachineError, RaydlcError

# errno values that say something about the path the user gave; anything else is the machine's fault.
_USER = {
    errno.ENOENT: "does not exist",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EISDIR: "is a directory",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EEXIST: "already exists",
    errno.EROFS: "is on a read-only file system",
    errno.ENAMETOOLONG: "the name is too long",
    errno.ELOOP: "too many levels of symbolic links",
    errno.ENOTEMPTY: "is a directory that is not empty",
    errno.EINVAL: "invalid argument",
    errno.ENXIO: "no such device",
    errno.ENODEV: "no such device",
}


def os_error(e: OSError, what: str = "") -> RaydlcError:
    """One line naming the path and what is wrong with it; exit 2 for the user's paths, 1 for the machine.
    A pyarrow S3 failure (a bare OSError) is named by `raydlc.edges.storage.s3_error`: never a disk's hint."""
    from raydlc.edges.storage import s3_error

    mapped = s3_error(e)
    if mapped is not None:
        return mapped
    reason = _USER.get(e.errno or -1) or (e.strerror or type(e).__name__).lower()
    path = e.filename if e.filename is not None else what or "(unnamed file)"
    second = f" -> {e.filename2}" if e.filename2 is not None else ""
    label = f"{what} " if what and e.filename is not None else ""
    message = f"{label}{path}{second}: {reason}"
    if e.errno in _USER:
        return InputError(message)
    return MachineError(message, hint="free space or fix the device, then retry")


def _nearest_existing(path: Path) -> Path:
    return next((p for p in (path, *path.parents) if p.exists()), Path(path.anchor or "."))


def check_output_dir(path: str | os.PathLike[str], flag: str, *, target: Path | None = None) -> Path:
    """Fail now, before any expensive work, unless `path` is a writable directory or can be created.

    Creates nothing that stays: writability is tried with a temporary file in the directory,
    or in its nearest existing ancestor when it does not exist yet. `target`, when given, is
    the file that will go there: the messages name it.
    """
    p = Path(path).expanduser()
    shown = target or p
    where = _nearest_existing(p)
    if not where.is_dir():
        if where == shown:
            raise InputError(f"{flag} {shown}: exists and is not a directory", hint="pass a directory path")
        raise InputError(f"{flag} {shown}: {where} is a file, not a directory", hint="pass a path under a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".raydlc-probe-")
    except OSError as e:
        raise InputError(
            f"{flag} {shown}: cannot create files in {where} ({(e.strerror or str(e)).lower()})",
            hint="pass a directory you can write",
        ) from e
    os.close(fd)
    os.unlink(probe)
    return p


def check_output_file(path: str | os.PathLike[str], flag: str, *, force: bool) -> Path:
    """`path` can be written as a file: not a directory, not there unless `force`, its directory writable."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputError(f"{flag} {p}: is a directory", hint=f"name a file, e.g. {p / 'raydlc.yaml'}")
    if p.exists() and not force:
        raise InputError(f"{p} already exists", hint="pass --force to overwrite it")
    check_output_dir(p.parent, flag, target=p)
    return p


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


@contextmanager
def _created_dirs(dirs: list[Path]) -> Iterator[None]:
    """Make the missing directories; remove the ones made here if the block fails."""
    made: list[Path] = []
    try:
        for d in dirs:
            missing = [d, *d.parents]
            for m in reversed(missing):
                if not m.exists():
                    m.mkdir()
                    made.append(m)
        yield
    except BaseException:
        for m in reversed(made):
            with suppress(OSError):
                m.rmdir()
        raise


def write_all(texts: Mapping[Path, str], flag: str) -> list[Path]:
    """Write every file or none: targets checked first, temporaries written, renamed only when all are.

    A failure at any point removes the temporaries (and directories made for them), so the
    directory holds either the old files or all the new ones.
    """
    for path in texts:
        if path.is_dir():
            raise InputError(f"{flag}: {path} exists and is a directory; nothing was written", hint="move it away or pick another --out")
        check_output_dir(path.parent, flag, target=path)
    mode = 0o666 & ~_umask()
    staged: dict[Path, str] = {}
    with _created_dirs(sorted({p.parent for p in texts})):
        try:
            for path, text in texts.items():
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
                staged[path] = tmp
                os.fchmod(fd, mode)  # mkstemp's 0600 is for secrets; these are ordinary files
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(text)
            for path, tmp in staged.items():
                os.replace(tmp, path)
        except BaseException:
            for tmp in staged.values():
                Path(tmp).unlink(missing_ok=True)
            raise
    return list(staged)


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_png_path(path: str | os.PathLike[str], flag: str, command: str) -> Path:
    """An output that will be a PNG: named .png, and not an existing file of another kind (which the
    write would replace with an image). `command` is the command line a hint repeats, up to the flag."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {str(p)[:200]} is a directory: the plot is one PNG file",
                         hint=f"{command} {flag} {p / 'scan.png'}")
    if p.suffix.lower() != ".png":
        raise InputError(f"{flag} {str(p)[:200]}: the plot is a PNG image, so its name must end in .png",
                         hint=f"{command} {flag} {(p.stem or 'scan') + '.png'}")
    if p.is_file():
        with p.open("rb") as f:
            if f.read(8) != PNG_MAGIC:
                raise InputError(f"{flag} {p} exists and is not a PNG image: it would be overwritten",
                                 hint=f"{command} {flag} {p.stem}-scan.png")
    return p


# ---- directories raydlc made: the only ones it ever deletes -----------------------------------------

OWNED_MARKER = ".raydlc-owned"


def make_owned_dir(prefix: str, parent: str | Path) -> Path:
    """A fresh directory with raydlc's marker inside: the proof `remove_owned_dir` asks for later.

    A path prefix proves nothing (anyone may name a directory /tmp/raydlc-head-x); the marker
    records the directory's own path, so a marker copied elsewhere does not make that place ours.
    """
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=str(parent)))
    (d / OWNED_MARKER).write_text(f"created by raydlc for {d}\n")
    return d


def owned(path: str | Path) -> bool:
    """Whether raydlc made this directory: a real directory (not a link) holding its own marker."""
    d = Path(path)
    marker = d / OWNED_MARKER
    try:
        if d.is_symlink() or not d.is_dir() or marker.is_symlink() or not marker.is_file():
            return False
        return marker.read_text(errors="replace").strip() == f"created by raydlc for {d}"
    except OSError:
        return False


def remove_owned_dir(path: str | Path) -> bool:
    """Delete `path` only when raydlc made it (`owned`); True when it was deleted."""
    import shutil

    if not owned(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True
