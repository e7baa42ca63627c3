"""The in-driver packing that Ray Data's pipeline replaced, kept as the reference its blocks are tested against.

Runs read prepared datasets (raydlc.data: Ray Data packs them, workers read rows by index);
`sources.read_local`, `pack` and `split` are the in-process path they replaced, and the prepared
blocks (and `order.eval_rows`/`train_rows`) must equal theirs bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from raydlc.data.corpus import Document
from raydlc.data.encode import IGNORE
from raydlc.data.order import check_count


@dataclass(frozen=True)
class Packed:
    """Fixed-length blocks; `labels` is `IGNORE` where the loss must not look (prompts)."""

    input_ids: np.ndarray  # [n, seq_len] int32
    labels: np.ndarray  # [n, seq_len] int32

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def take(self, idx: Sequence[int] | np.ndarray) -> Packed:
        idx = np.asarray(idx, dtype=np.int64)
        return Packed(self.input_ids[idx], self.labels[idx])


def pack(docs: Iterable[Document], encode: Callable[[list[str]], list[list[int]]], eos_id: int, seq_len: int) -> Packed:
    """Concatenate documents with EOS between them and cut into `seq_len` blocks (tail dropped)."""
    docs = list(docs)
    texts = [d.text for d in docs]
    prompts_idx = [i for i, d in enumerate(docs) if d.prompt]
    text_ids = encode(texts)
    prompt_ids = dict(zip(prompts_idx, encode([docs[i].prompt for i in prompts_idx]))) if prompts_idx else {}
    ids: list[int] = []
    labels: list[int] = []
    for i, t in enumerate(text_ids):
        p = prompt_ids.get(i, [])
        ids.extend(p)
        labels.extend([IGNORE] * len(p))
        ids.extend(t)
        labels.extend(t)
        ids.append(eos_id)
        labels.append(eos_id)
    n = len(ids) // seq_len
    a = np.asarray(ids[: n * seq_len], dtype=np.int32).reshape(n, seq_len)
    b = np.asarray(labels[: n * seq_len], dtype=np.int32).reshape(n, seq_len)
    return Packed(a, b)


@dataclass(frozen=True)
class Split:
    train: Packed
    eval: Packed


def split(packed: Packed, *, eval_fraction: float, world_size: int, seed: int, max_eval: int = 64) -> Split:
    """Hold out a deterministic random set of blocks; the eval set is a multiple of the world size."""
    n = len(packed)
    n_eval = min(max_eval, max(world_size, round(n * eval_fraction)))
    n_eval -= n_eval % world_size
    perm = np.random.default_rng(seed).permutation(n)
    return Split(train=packed.take(np.sort(perm[n_eval:])), eval=packed.take(np.sort(perm[:n_eval])))


def check_size(s: Split, *, global_batch: int, seq_len: int, world_size: int) -> None:
    """Enough blocks for one global batch and one eval block per rank, else a clear error."""
    check_count(n_train=len(s.train), n_eval=len(s.eval), global_batch=global_batch, seq_len=seq_len, world_size=world_size)
