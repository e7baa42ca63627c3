"""Data read in one process: the bundled corpus, user files and their errors, the reference packing with prompt masks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raydlc.data.corpus import Document, bundled_corpus
from raydlc.data.encode import IGNORE
from raydlc.data.sources import is_local, read_local
from raydlc.errors import InputError
from reference_packing import pack


def test_bundled_corpus_is_real_english_and_deterministic() -> None:
    a = bundled_corpus(max_chars=200_000)
    b = bundled_corpus(max_chars=200_000)
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
        read_local(str(p))
    assert needle in str(e.value) and name in str(e.value)
    assert e.value.exit_code == 2


def test_directory_reads_txt_and_jsonl_in_sorted_order(tmp_path: Path) -> None:
    write(tmp_path / "b.txt", "second file")
    write(tmp_path / "a.jsonl", json.dumps({"prompt": "Q?", "response": "A."}) + "\n" + json.dumps({"text": "plain"}) + "\n")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "c.txt", "third")
    write(tmp_path / "ignored.md", "not read")
    docs = read_local(str(tmp_path))
    assert docs == [Document("A.", prompt="Q?"), Document("plain"), Document("second file"), Document("third")]
    (tmp_path / "nothing").mkdir()
    write(tmp_path / "nothing" / "readme.md", "no data here")
    with pytest.raises(InputError, match=r"no \.txt or \.jsonl"):
        read_local(str(tmp_path / "nothing"))


def test_hub_ids_and_paths_are_told_apart() -> None:
    assert not is_local("HuggingFaceFW/fineweb-edu")
    assert is_local("./corpus") and is_local("/abs/x") and is_local("notes.txt") and is_local("qa.jsonl")


def fake_encode(texts: list[str]) -> list[list[int]]:
    return [[ord(c) for c in t] for t in texts]


def test_pack_masks_prompts_and_cuts_fixed_blocks() -> None:
    docs = [Document("abc", prompt="PQ"), Document("de")]
    p = pack(docs, fake_encode, eos_id=0, seq_len=4)
    stream = [ord("P"), ord("Q"), 97, 98, 99, 0, 100, 101, 0]
    assert p.input_ids.shape == (2, 4)
    assert p.input_ids.ravel().tolist() == stream[:8]
    assert p.labels.ravel().tolist() == [IGNORE, IGNORE, 97, 98, 99, 0, 100, 101]
