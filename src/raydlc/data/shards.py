"""The blocks on storage: written shard by shard, verified by checksum, read row by row.

A shard is `shard-NNNNN.bin`: little-endian int32 of shape [rows, 3, seq_len] (each row's input
ids, its labels, then each token's document: 0 for the row's first, counting up at each record
the packer started), so row r of a shard is one contiguous range. A dataset of the older format
(manifest.OLD_FORMAT) has [rows, 2, seq_len] and no documents: read as one document per row. A worker reads only the rows
of its own batch: memory-mapped from a file system, a ranged read from S3. Nothing here holds
more than one shard.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from raydlc import storage
from raydlc.data.manifest import NAME, Manifest, Shard
from raydlc.edges.storage import filesystem, read_text
from raydlc.errors import InputError

ROW_DTYPE = np.dtype("<i4")
SHARD_TOKENS = 1 << 21  # tokens per shard (24 MiB of ids, labels and documents): what the packer holds at most


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.bin"


def write_shard(dest: str, i: int, ids: np.ndarray, labels: np.ndarray, docs: np.ndarray | None = None) -> Shard:
    """One shard from [rows, seq_len] ids, labels and documents (None: one document per row), written through the destination's file system."""
    block = np.stack([ids, labels, np.zeros_like(ids) if docs is None else docs], axis=1).astype(ROW_DTYPE, copy=False)
    data = block.tobytes()
    fs, root = filesystem(dest)
    with fs.open_output_stream(f"{root}/{shard_name(i)}") as f:
        f.write(data)
    return Shard(shard_name(i), int(ids.shape[0]), hashlib.sha256(data).hexdigest(), len(data))


def write_text(dest: str, name: str, text: str) -> None:
    fs, root = filesystem(dest)
    fs.create_dir(root, recursive=True)
    with fs.open_output_stream(f"{root}/{name}") as f:
        f.write(text.encode())


def remove(dest: str, name: str) -> None:
    """Remove one file if it is there (the old manifest, before shards are overwritten)."""
    import pyarrow.fs as pafs

    fs, root = filesystem(dest)
    if fs.get_file_info(f"{root}/{name}").type == pafs.FileType.File:
        fs.delete_file(f"{root}/{name}")


def read_manifest(dest: str) -> Manifest | None:
    """The dataset's manifest, or None where there is none (not prepared, or interrupted)."""
    import pyarrow.fs as pafs

    fs, root = filesystem(dest)
    if fs.get_file_info(f"{root}/{NAME}").type != pafs.FileType.File:
        return None
    return Manifest.from_json(read_text(storage.join(dest, NAME)), storage.join(dest, NAME))


def verify(dest: str, m: Manifest, *, chunk: int = 1 << 22) -> None:
    """Every shard is there with its size and checksum, read in chunks; a failure names the shard."""
    import pyarrow.fs as pafs

    fs, root = filesystem(dest)
    for s in m.shards:
        path = f"{root}/{s.name}"
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.File or info.size != s.bytes:
            have = "missing" if info.type != pafs.FileType.File else f"{info.size} bytes, the manifest says {s.bytes}"
            raise InputError(f"--data {dest}: shard {s.name} is {have}", hint="prepare the dataset again")
        h = hashlib.sha256()
        with fs.open_input_stream(path) as f:
            while part := f.read(chunk):
                h.update(part)
        if h.hexdigest() != s.sha256:
            raise InputError(f"--data {dest}: shard {s.name} fails its checksum (sha256 {h.hexdigest()[:12]}, the manifest says {s.sha256[:12]})",
                             hint="prepare the dataset again")


class Rows:
    """Rows of a prepared dataset by global index: a worker opens this and reads its batches.

    Local shards are memory-mapped once each; remote ones are read by range, one row at a time.
    """

    def __init__(self, dest: str, shard_rows: list[int], names: list[str], seq_len: int, planes: int = 3) -> None:
        self.dest, self.seq_len, self.names, self.planes = dest, seq_len, names, planes
        self.starts = np.concatenate([[0], np.cumsum(shard_rows)]).astype(np.int64)
        self._fs, self._root = filesystem(dest)
        self._remote = storage.is_uri(dest)
        self._maps: dict[int, np.ndarray] = {}
        self._files: dict[int, Any] = {}

    @classmethod
    def open(cls, dest: str, m: Manifest) -> Rows:
        return cls(dest, [s.rows for s in m.shards], [s.name for s in m.shards], m.seq_len, m.planes)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _row_reader(self, shard: int) -> Callable[[int], np.ndarray]:
        row_bytes = self.planes * self.seq_len * ROW_DTYPE.itemsize
        if not self._remote:
            if shard not in self._maps:
                self._maps[shard] = np.memmap(f"{self._root}/{self.names[shard]}", dtype=ROW_DTYPE, mode="r").reshape(-1, self.planes, self.seq_len)
            block = self._maps[shard]
            return lambda r: np.asarray(block[r])
        if shard not in self._files:
            self._files[shard] = self._fs.open_input_file(f"{self._root}/{self.names[shard]}")
        f = self._files[shard]
        return lambda r: np.frombuffer(f.read_at(row_bytes, r * row_bytes), dtype=ROW_DTYPE).reshape(self.planes, self.seq_len)

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(input ids, labels) of these global rows, [len(rows), seq_len] each, in their order."""
        ids, labels, _ = self.take_documents(rows)
        return ids, labels

    def take_documents(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(input ids, labels, documents) of these global rows; documents None where the shards record none (the older format)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"row outside 0..{len(self) - 1}")
        shard = np.searchsorted(self.starts, rows, side="right") - 1
        out = np.empty((len(rows), self.planes, self.seq_len), dtype=ROW_DTYPE)
        for k, (s, r) in enumerate(zip(shard.tolist(), rows.tolist())):
            out[k] = self._row_reader(s)(r - int(self.starts[s]))
        return out[:, 0], out[:, 1], (out[:, 2] if self.planes > 2 else None)
