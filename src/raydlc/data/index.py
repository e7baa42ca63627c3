"""Which rows a run trains and evaluates on, by index alone: no process holds the row list.

The eval split is a fixed set of at most 64 rows (a multiple of the world size) drawn by the
seed; the i-th train row is the i-th row that is not one of them. These are exactly the rows the
in-driver split of raydlc.train.data made (`split`), so runs over prepared data keep their losses.
"""

from __future__ import annotations

import numpy as np


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
