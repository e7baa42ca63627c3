"""Where a run keeps its files: a local path, a shared file system, or a URI such as s3://.

Ray Train, the checkpoints and the export all take the same `STORAGE_PATH`, and every place
that must treat a URI differently from a path asks here, once. A path is only as shared as
the file system under it, so a path mounted on every node (EFS, FSx, NFS) is declared with
`STORAGE_SHARED=true`; a URI with a remote scheme is shared by nature. What is here is pure
(strings in, strings out); reading and writing the files is `raydlc.edges.storage`.
"""

from __future__ import annotations

import re
from pathlib import Path

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
