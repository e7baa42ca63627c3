"""The data order: the reference split and its size check, global batches by step, and each rank's share."""

from __future__ import annotations

import numpy as np
import pytest

from raydlc.data.order import eval_slice, global_batch, rank_slice
from raydlc.errors import InputError
from reference_packing import Packed, check_size, split


def test_split_is_disjoint_deterministic_and_a_multiple_of_the_world() -> None:
    n = 203
    packed = Packed(np.arange(n * 2, dtype=np.int32).reshape(n, 2), np.zeros((n, 2), dtype=np.int32))
    s = split(packed, eval_fraction=0.05, world_size=4, seed=1)
    assert len(s.eval) % 4 == 0 and len(s.eval) >= 4
    assert len(s.train) + len(s.eval) == n
    train_rows = {int(r[0]) for r in s.train.input_ids}
    eval_rows = {int(r[0]) for r in s.eval.input_ids}
    assert not train_rows & eval_rows
    again = split(packed, eval_fraction=0.05, world_size=4, seed=1)
    assert np.array_equal(again.eval.input_ids, s.eval.input_ids)


def test_too_little_data_is_reported_with_what_is_needed() -> None:
    packed = Packed(np.zeros((5, 8), dtype=np.int32), np.zeros((5, 8), dtype=np.int32))
    s = split(packed, eval_fraction=0.05, world_size=2, seed=0)
    with pytest.raises(InputError, match="needs at least 18"):
        check_size(s, global_batch=16, seq_len=8, world_size=2)


def test_global_batches_cover_each_epoch_once_and_depend_only_on_step() -> None:
    n, g = 20, 4
    epoch0 = np.concatenate([global_batch(s, n, g, seed=3) for s in range(1, 6)])
    assert sorted(epoch0.tolist()) == list(range(20))
    epoch1 = np.concatenate([global_batch(s, n, g, seed=3) for s in range(6, 11)])
    assert sorted(epoch1.tolist()) == list(range(20)) and not np.array_equal(epoch0, epoch1)
    assert np.array_equal(global_batch(7, n, g, seed=3), global_batch(7, n, g, seed=3))
    assert not np.array_equal(global_batch(7, n, g, seed=3), global_batch(7, n, g, seed=4))


def test_rank_shards_are_disjoint_and_cover_the_global_batch() -> None:
    gidx = global_batch(1, 100, 8, seed=0)
    parts = [rank_slice(gidx, r, 4) for r in range(4)]
    assert all(len(p) == 2 for p in parts)
    assert np.array_equal(np.concatenate(parts), gidx)
    assert np.array_equal(rank_slice(gidx, 0, 1), gidx)
    with pytest.raises(ValueError):
        rank_slice(gidx, 0, 3)
    ev = [eval_slice(10, r, 3) for r in range(3)]
    assert [len(e) for e in ev] == [3, 3, 3] and len(set(np.concatenate(ev).tolist())) == 9
