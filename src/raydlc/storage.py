"""Where a run keeps its files: a local path, a shared file system, or a URI such as s3://.

Ray Train, the checkpoints and the export all take the same `STORAGE_PATH`, and every place
that must treat a URI differently from a path asks here, once. A path is only as shared as
the file system under it, so a path mounted on every node (EFS, FSx, NFS) is declared with
`STORAGE_SHARED=true`; a URI with a remote scheme is shared by nature. The file-system calls
go through pyarrow (which Ray Train itself uses), so s3:// and gs:// work where local paths do.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def scheme(path: str) -> str | None:
    """`s3` for `s3://bucket/x`, None for a plain path."""
    m = _SCHEME.match(path)
    return m.group(1).lower() if m else None


def is_uri(path: str) -> bool:
    return scheme(path) is not None


def resolve(path: str) -> str:
    """Ray workers do not start in the driver's directory: local paths must be absolute."""
    return path if is_uri(path) else str(Path(path).expanduser().resolve())


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def reaches_every_node(path: str | None, declared_shared: bool) -> bool:
    """True for a remote URI, or a path declared to be on a file system every node mounts."""
    if path is None:
        return False
    s = scheme(path)
    return (s is not None and s != "file") or declared_shared


def filesystem(path: str) -> tuple[Any, str]:
    """(pyarrow file system, path on it) for a local path or a URI."""
    import pyarrow.fs

    if is_uri(path):
        return pyarrow.fs.FileSystem.from_uri(path)
    return pyarrow.fs.LocalFileSystem(), str(Path(path).expanduser().resolve())


def list_dirs(path: str) -> list[str]:
    """Names of the directories directly under `path`; none when it does not exist."""
    import pyarrow.fs

    fs, root = filesystem(path)
    if fs.get_file_info(root).type != pyarrow.fs.FileType.Directory:
        return []
    infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=False))
    return sorted(i.base_name for i in infos if i.type == pyarrow.fs.FileType.Directory)


def file_sizes(path: str) -> dict[str, int]:
    """name -> size of the files directly under `path`."""
    import pyarrow.fs

    fs, root = filesystem(path)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=False, allow_not_found=True))
    return {i.base_name: int(i.size) for i in infos if i.type == pyarrow.fs.FileType.File}


def read_text(path: str) -> str:
    fs, p = filesystem(path)
    with fs.open_input_stream(p) as f:
        return bytes(f.read()).decode()


def download(path: str, local: Path) -> Path:
    """Copy the directory at `path` (a URI) into the local folder `local`."""
    import pyarrow.fs

    fs, p = filesystem(path)
    local.mkdir(parents=True, exist_ok=True)
    pyarrow.fs.copy_files(p, str(local), source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
    return local


def publish(local: Path, dest: str) -> None:
    """Copy a finished local folder to `dest` (a path, or a URI such as s3://)."""
    if is_uri(dest):
        import pyarrow.fs

        fs, path = filesystem(dest)
        fs.create_dir(path, recursive=True)
        pyarrow.fs.copy_files(str(local), path, destination_filesystem=fs)
    else:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copytree(local, dest, dirs_exist_ok=True)
