"""The data order: which rows a run trains and evaluates on, and which each rank reads at each step.

Every choice is a function of the row count, the step, the global batch and the seed, by index
alone: no process holds the row list, and a run resumed at step k reads exactly what an
uninterrupted run reads at step k. The eval split is a fixed set of at most 64 rows (a multiple
of the world size) drawn by the seed; the i-th train row is the i-th row that is not one of them.
These are exactly the rows the in-driver split made (tests/reference_packing.py), so runs over
prepared data keep their losses. `global_batch`/`rank_slice` depend on the step and the global
batch, not on the number of workers: 1 worker × 2B sequences and 2 workers × B see the same tokens.
"""

from __future__ import annotations

import numpy as np

from raydlc.errors import InputError


def eval_rows(n: int, *, eval_fraction: float, world_size: int, seed: int, max_eval: int = 64) -> np.ndarray:
    """The sorted eval rows of a dataset of `n` rows (one permutation of n, made once in the driver)."""
    n_eval = min(max_eval, max(world_size, round(n * eval_fraction)))
    n_eval -= n_eval % world_size
    return np.sort(np.random.default_rng(seed).permutation(n)[:n_eval])


def train_rows(i: np.ndarray, held_out: np.ndarray) -> np.ndarray:
    """The dataset rows of train indices `i`: the i-th row not held out (`held_out` sorted, small)."""
    i = np.asarray(i, dtype=np.int64)
    shifted = np.asarray(held_out, dtype=np.int64) - np.arange(len(held_out))
    return i + np.searchsorted(shifted, i, side="right")


def check_count(*, n_train: int, n_eval: int, global_batch: int, seq_len: int, world_size: int) -> None:
    """Enough blocks for one global batch and one eval block per rank, else a clear error."""
    need = global_batch + world_size
    have = n_train + n_eval
    if n_train < global_batch or n_eval < world_size:
        raise InputError(
            f"the data gives {have} sequences of {seq_len} tokens; this run needs at least {need} "
            f"(one global batch of {global_batch} plus one eval sequence per worker)",
            hint="add data, or lower --seq-len, the batch size, GRAD_ACCUM or --workers",
        )


def global_batch(step: int, n_train: int, global_size: int, seed: int) -> np.ndarray:
    """Block indices of optimizer step `step` (1-based): a fresh permutation each epoch.

    A pure function of the step, so a run resumed at step k reads exactly what an
    uninterrupted run reads at step k; the only data position to save is the step.
    """
    per_epoch = n_train // global_size
    epoch, within = divmod(step - 1, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n_train)
    return perm[within * global_size : (within + 1) * global_size]


def rank_slice(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank r's contiguous, disjoint share of a global batch."""
    if len(indices) % world_size:
        raise ValueError(f"global batch of {len(indices)} does not divide over {world_size} ranks")
    per = len(indices) // world_size
    return indices[rank * per : (rank + 1) * per]


def eval_slice(n_eval: int, rank: int, world_size: int) -> np.ndarray:
    """Every rank evaluates the same number of blocks (FSDP needs equal collective counts)."""
    per = n_eval // world_size
    return np.arange(rank * per, (rank + 1) * per)
