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


SCHEMES = ("s3", "file")  # what raydlc reads and writes (S3, or a path); pyarrow would try others, and GCS's lookup hangs minutes


def uri_problem(uri: str, schemes: tuple[str, ...] = SCHEMES) -> str | None:
    """Why a URI cannot be storage, said before anything reaches for it; None when it can (or is a plain path).

    Another scheme (gs://, http://) is refused by name; an s3:// URI needs a bucket whose name
    holds only the characters bucket names are made of."""
    s = scheme(uri)
    if s is None or (s not in SCHEMES and s in schemes):
        return None
    if s not in schemes:
        return f"the {s}:// scheme is not one raydlc stores to: use s3://bucket/prefix or a local path"
    if s == "s3":
        bucket = uri.split("://", 1)[1].split("/", 1)[0]
        if not bucket:
            return "an s3:// URI needs a bucket: s3://bucket/prefix"
        if not _ANY_BUCKET.match(bucket):  # not the new-bucket rules (bucket_problem): older buckets may hold capitals and '_'
            return f"the bucket name {bucket!r} is invalid: S3 bucket names hold only letters, digits, '.', '_' and '-'"
    return None


_ANY_BUCKET = re.compile(r"^[A-Za-z0-9._-]{1,255}$")  # what any bucket ever made may be named (us-east-1's legacy names included)
_BUCKET_CHARS = re.compile(r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")
_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def bucket_problem(name: str) -> str | None:
    """S3's rules for a general purpose bucket's name (the S3 user guide, "General purpose bucket naming rules"):
    3-63 characters of a-z 0-9 . -, a letter or digit at each end, no '..', not an IP address, none of the
    prefixes and suffixes S3 keeps for itself. The rule broken, or None."""
    return (
        f"3 to 63 characters, got {len(name):,}" if not 3 <= len(name) <= 63
        else "only lowercase letters, digits, '.' and '-', starting and ending with a letter or digit" if not _BUCKET_CHARS.match(name)
        else "no two adjacent periods" if ".." in name
        else "not formatted as an IP address" if _IPV4.match(name)
        else f"not starting with {next(p for p in BUCKET_PREFIXES if name.startswith(p))!r} (S3 reserves it)"
        if name.startswith(BUCKET_PREFIXES)
        else f"not ending with {next(s for s in BUCKET_SUFFIXES if name.endswith(s))!r} (S3 reserves it)"
        if name.endswith(BUCKET_SUFFIXES)
        else None
    )


def resolve(path: str) -> str:
    """Ray workers do not start in the driver's directory: local paths must be absolute."""
    return path if is_uri(path) else str(resolved(Path(path).expanduser()))


def resolved(p: Path) -> Path:
    """`p.resolve()`, with a symbolic link loop (Python's RuntimeError) as raydlc's one-line InputError."""
    from raydlc.errors import InputError

    try:
        return p.resolve()
    except RuntimeError as e:  # "Symlink loop from '…'"
        raise InputError(f"{p}: a symbolic link loop (a link that leads back to itself)", hint="remove the link or give another path") from e


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def reaches_every_node(path: str | None, declared_shared: bool) -> bool:
    """True for a remote URI, or a path declared to be on a file system every node mounts."""
    if path is None:
        return False
    s = scheme(path)
    return (s is not None and s != "file") or declared_shared
