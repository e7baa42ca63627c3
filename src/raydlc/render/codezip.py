"""raydlc's own package as the zip a RayJob's runtime env names in `py_modules`: the DLC image has no raydlc.

Ray 2.58 (`_private/runtime_env/packaging.py` `download_and_unpack_package`) unpacks a remote (s3://) zip
with `remove_top_level_directory=True`: a single top-level directory is stripped and what it held goes on
the worker's PYTHONPATH. So the package sits one level down, `raydlc-code/raydlc/…`, and after unpacking
`import raydlc` finds it. The zip is byte-for-byte the same for the same sources (sorted entries, fixed
timestamps, no bytecode), so its name `raydlc-<version>-<hash>.zip` changes only when the code does.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import raydlc

TOP = "raydlc-code"  # stripped by Ray when it unpacks a remote zip
EPOCH = (1980, 1, 1, 0, 0, 0)
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class CodeZip:
    data: bytes
    digest: str  # the first 12 hex digits of the zip's sha256
    version: str

    @property
    def name(self) -> str:
        return f"raydlc-{self.version}-{self.digest}.zip"

    @property
    def key(self) -> str:
        """Where it lives in the cluster's bucket."""
        from raydlc.render.bucket import CODE_PREFIX

        return f"{CODE_PREFIX}/{self.name}"

    def uri(self, bucket: str) -> str:
        return f"s3://{bucket}/{self.key}"


def package_dir() -> Path:
    return Path(raydlc.__file__).resolve().parent


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not SKIP_DIRS & set(p.relative_to(root).parts)
                  and not p.name.endswith(SKIP_SUFFIXES))


def build(root: Path | None = None) -> CodeZip:
    """The zip of the package at `root` (the installed raydlc by default)."""
    root = package_dir() if root is None else root
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in _files(root):
            info = zipfile.ZipInfo(f"{TOP}/raydlc/{path.relative_to(root).as_posix()}", EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, path.read_bytes())
    data = buf.getvalue()
    return CodeZip(data, hashlib.sha256(data).hexdigest()[:12], raydlc.__version__)
