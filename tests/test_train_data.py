"""Data: the bundled corpus, user files and their errors, packing with prompt masks, order and shards."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raydlc.errors import InputError
from raydlc.train import data as D


def test_bundled_corpus_is_real_english_and_deterministic() -> None:
    a = D.bundled_corpus(max_chars=200_000)
    b = D.bundled_corpus(max_chars=200_000)
    assert a == b
    text = " ".join(d.text for d in a)
    assert len(text) >= 200_000
    words = text.lower().split()
    # Real language: the commonest English words are frequent, unlike random ids or code alone.
    for w in ("the", "of", "is", "a", "to"):
        assert words.count(w) / len(words) > 0.005, w
    assert all(not d.prompt for d in a)


def write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("missing.txt", None, "no such file"),
        ("empty.txt", "", "empty"),
        ("blank.jsonl", "  \n\n", "empty"),
        ("bad.jsonl", '{"prompt": "q"}\n', "response"),
        ("wrongfields.jsonl", '{"text": "ok here"}\n{"question": "q", "answer": "a"}\n', ":2"),
        ("notjson.jsonl", '{"text": "ok"}\nnot json\n', "not valid JSON"),
        ("list.jsonl", "[1, 2]\n", "JSON object"),
        ("data.csv", "a,b\n", "unsupported file type"),
    ],
)
def test_bad_local_data_is_an_input_error_naming_the_file(tmp_path: Path, name: str, content: str | None, needle: str) -> None:
    p = tmp_path / name
    if content is not None:
        p.write_text(content)
    with pytest.raises(InputError) as e:
        D.read_local(str(p))
    assert needle in str(e.value) and name in str(e.value)
    assert e.value.exit_code == 2


def test_directory_reads_txt_and_jsonl_in_sorted_order(tmp_path: Path) -> None:
    write(tmp_path / "b.txt", "second file")
    write(tmp_path / "a.jsonl", json.dumps({"prompt": "Q?", "response": "A."}) + "\n" + json.dumps({"text": "plain"}) + "\n")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "c.txt", "third")
    write(tmp_path / "ignored.md", "not read")
    docs = D.read_local(str(tmp_path))
    assert docs == [D.Document("A.", prompt="Q?"), D.Document("plain"), D.Document("second file"), D.Document("third")]
    (tmp_path / "nothing").mkdir()
    write(tmp_path / "nothing" / "readme.md", "no data here")
    with pytest.raises(InputError, match=r"no \.txt or \.jsonl"):
        D.read_local(str(tmp_path / "nothing"))


def test_hub_ids_and_paths_are_told_apart() -> None:
    assert not D.is_local("HuggingFaceFW/fineweb-edu")
    assert D.is_local("./corpus") and D.is_local("/abs/x") and D.is_local("notes.txt") and D.is_local("qa.jsonl")


def fake_encode(texts: list[str]) -> list[list[int]]:
    return [[ord(c) for c in t] for t in texts]


def test_pack_masks_prompts_and_cuts_fixed_blocks() -> None:
    docs = [D.Document("abc", prompt="PQ"), D.Document("de")]
    p = D.pack(docs, fake_encode, eos_id=0, seq_len=4)
    stream = [ord("P"), ord("Q"), 97, 98, 99, 0, 100, 101, 0]
    assert p.input_ids.shape == (2, 4)
    assert p.input_ids.ravel().tolist() == stream[:8]
    assert p.labels.ravel().tolist() == [D.IGNORE, D.IGNORE, 97, 98, 99, 0, 100, 101]


def test_split_is_disjoint_deterministic_and_a_multiple_of_the_world() -> None:
    n = 203
    packed = D.Packed(np.arange(n * 2, dtype=np.int32).reshape(n, 2), np.zeros((n, 2), dtype=np.int32))
    s = D.split(packed, eval_fraction=0.05, world_size=4, seed=1)
    assert len(s.eval) % 4 == 0 and len(s.eval) >= 4
    assert len(s.train) + len(s.eval) == n
    train_rows = {int(r[0]) for r in s.train.input_ids}
    eval_rows = {int(r[0]) for r in s.eval.input_ids}
    assert not train_rows & eval_rows
    again = D.split(packed, eval_fraction=0.05, world_size=4, seed=1)
    assert np.array_equal(again.eval.input_ids, s.eval.input_ids)


def test_too_little_data_is_reported_with_what_is_needed() -> None:
    packed = D.Packed(np.zeros((5, 8), dtype=np.int32), np.zeros((5, 8), dtype=np.int32))
    s = D.split(packed, eval_fraction=0.05, world_size=2, seed=0)
    with pytest.raises(InputError, match="needs at least 18"):
        D.check_size(s, global_batch=16, seq_len=8, world_size=2)


def test_global_batches_cover_each_epoch_once_and_depend_only_on_step() -> None:
    n, g = 20, 4
    epoch0 = np.concatenate([D.global_batch(s, n, g, seed=3) for s in range(1, 6)])
    assert sorted(epoch0.tolist()) == list(range(20))
    epoch1 = np.concatenate([D.global_batch(s, n, g, seed=3) for s in range(6, 11)])
    assert sorted(epoch1.tolist()) == list(range(20)) and not np.array_equal(epoch0, epoch1)
    assert np.array_equal(D.global_batch(7, n, g, seed=3), D.global_batch(7, n, g, seed=3))
    assert not np.array_equal(D.global_batch(7, n, g, seed=3), D.global_batch(7, n, g, seed=4))


def test_rank_shards_are_disjoint_and_cover_the_global_batch() -> None:
    gidx = D.global_batch(1, 100, 8, seed=0)
    parts = [D.rank_slice(gidx, r, 4) for r in range(4)]
    assert all(len(p) == 2 for p in parts)
    assert np.array_equal(np.concatenate(parts), gidx)
    assert np.array_equal(D.rank_slice(gidx, 0, 1), gidx)
    with pytest.raises(ValueError):
        D.rank_slice(gidx, 0, 3)
    ev = [D.eval_slice(10, r, 3) for r in range(3)]
    assert [len(e) for e in ev] == [3, 3, 3] and len(set(np.concatenate(ev).tolist())) == 9
