"""Prepared datasets without Ray: record formats, the encode-and-pack path against the in-driver
packing, shards and their checksums, the manifest's rules, and rows by index."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import reference_packing as RP
from raydlc.data import dataset, formats, order, pipeline, shards, sources
from raydlc.data import tokenizer as T
from raydlc.data.encode import IGNORE, TokenizerSpec, digest, encode_batch
from raydlc.data.manifest import Manifest, check_use
from raydlc.errors import InputError

QA = [{"prompt": f"Question {i}: what is {i} plus {i}?", "response": f" It is {2 * i}."} for i in range(120)]
TEXT = [{"text": f"Document {i} says the number {i} twice: {i} {i}."} for i in range(120)]


def write_jsonl(p: Path, rows: list[dict[str, object]]) -> Path:
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def bpe_spec(texts: list[str], vocab: int = 300) -> TokenizerSpec:
    tok = T.train_bpe(texts, vocab)
    return TokenizerSpec("bpe-300", digest(tok.to_str()), tok.token_to_id(T.EOS), tok.get_vocab_size(), tokenizer_json=tok.to_str())


def prepare_in_process(src: sources.Source, tok: TokenizerSpec, dest: Path, seq_len: int, *, skip: bool = False, loss_on: str = "assistant") -> tuple[list, object]:
    """The pipeline's stages run here in order, as Ray Data runs them with preserve_order."""
    import pyarrow as pa

    packer = pipeline.Packer(str(dest), seq_len, skip=skip)
    dest.mkdir(parents=True, exist_ok=True)
    for unit in src.units:
        rows = pipeline._read(unit.to_dict())
        batch = {k: np.asarray([r[k] for r in rows], dtype=object) for k in ("where", "record", "error")}
        table = encode_batch(batch, spec_json=json.dumps(tok.to_dict()), loss_on=loss_on)  # type: ignore[arg-type]
        assert isinstance(table, pa.Table)
        packer.add(table)
    counts, written = packer.finish()
    return written, counts


# ---- formats ---------------------------------------------------------------------------------------


def test_every_format_gives_segments_with_the_loss_where_asked() -> None:
    assert formats.segments({"text": "hello"}) == [formats.Segment("hello", True)]
    assert formats.segments({"prompt": "Q", "response": "A"}) == [formats.Segment("Q", False), formats.Segment("A", True)]
    assert formats.segments({"prompt": "Q", "completion": "A"}, loss_on="all") == [formats.Segment("Q", True), formats.Segment("A", True)]
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    segs = formats.segments(chat)
    assert "".join(s.text for s in segs) == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    assert [s.text for s in segs if s.learn] == ["hello<|im_end|>\n"]
    assert all(s.learn for s in formats.segments(chat, loss_on="all"))
    sharegpt = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    assert [s.text for s in formats.segments(sharegpt) if s.learn] == ["hello<|im_end|>\n"]


@pytest.mark.parametrize(
    ("rec", "says"),
    [
        ({"messages": [{"role": "bot", "content": "x"}]}, "unknown role 'bot'"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]}, "empty assistant turn"),
        ({"messages": [{"role": "user", "content": "q"}]}, "no assistant turn"),
        ({"messages": []}, "non-empty list"),
        ({"conversations": [{"from": "robot", "value": "x"}]}, "unknown role 'robot'"),
        ({"prompt": "q"}, "response"),
        ({"prompt": "q", "response": ""}, "empty response"),
        ({"question": "q"}, "no 'text'"),
        ({"text": ""}, "empty"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_records_say_why(rec: object, says: str) -> None:
    with pytest.raises(formats.BadRecord, match=says):
        formats.segments(rec)


def test_a_chat_template_is_split_turn_by_turn_into_what_the_model_is_given_and_must_produce() -> None:
    from jinja2 import Template

    tmpl = Template("{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    render = formats.template_render(lambda msgs, add_generation_prompt: tmpl.render(messages=msgs, add_generation_prompt=add_generation_prompt))
    msgs = [("user", "hi"), ("assistant", "hello"), ("user", "and?"), ("assistant", "bye")]
    segs = render(msgs, "assistant")
    assert "".join(s.text for s in segs) == "<user>hi</s><assistant>hello</s><user>and?</s><assistant>bye</s>"
    assert [s.text for s in segs if s.learn] == ["hello</s>", "bye</s>"]
    unstable = formats.template_render(lambda msgs, add_generation_prompt: f"{len(msgs)}" + "".join(m["content"] for m in msgs))
    with pytest.raises(formats.BadRecord, match="turn by turn"):
        unstable(msgs, "assistant")


# ---- sources ----------------------------------------------------------------------------------------


def test_sources_list_in_order_fingerprint_and_report_the_first_bad_record(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", TEXT[:3])
    write_jsonl(tmp_path / "a.jsonl", QA[:3])
    (tmp_path / "notes.md").write_text("ignored")
    src = sources.list_source(str(tmp_path))
    assert [Path(u.uri).name for u in src.units] == ["a.jsonl", "b.jsonl"] and src.files == 2
    assert sources.list_source(str(tmp_path)).fingerprint == src.fingerprint
    write_jsonl(tmp_path / "b.jsonl", TEXT[:4])
    assert sources.list_source(str(tmp_path)).fingerprint != src.fingerprint  # a changed source is noticed
    (tmp_path / "c.jsonl").write_text("{not json}\n")
    assert sources.first_problem(sources.list_source(str(tmp_path / "c.jsonl"))) == f"{tmp_path / 'c.jsonl'}:1: not valid JSON (Expecting property name enclosed in double quotes)"
    with pytest.raises(InputError, match="no such file"):
        sources.list_source(str(tmp_path / "gone.jsonl"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(InputError, match=r"unsupported file type '\.csv'"):
        sources.list_source(str(tmp_path / "d.csv"))


def test_parquet_rows_are_named_by_file_and_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["one doc here", None, "three"]}), tmp_path / "p.parquet", row_group_size=2)
    src = sources.list_source(str(tmp_path / "p.parquet"))
    assert [(u.group, u.first_row) for u in src.units] == [(0, 0), (1, 2)]
    rows = [r for u in src.units for r in sources.read_unit(u)]
    assert [w.rsplit(":", 1)[1] for w, _, _ in rows] == ["row 1", "row 2", "row 3"]
    with pytest.raises(formats.BadRecord, match="no 'text'"):
        formats.segments(json.loads(rows[1][1] or ""))  # the missing value is a bad record, named by its row


# ---- encode and pack -------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [TEXT, QA, TEXT[:40] + QA[:40]], ids=["text", "prompt-response", "mixed"])
def test_prepared_blocks_equal_the_in_driver_packing_bit_for_bit(tmp_path: Path, rows: list[dict[str, object]]) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    src = sources.list_source(str(path))
    tok = bpe_spec([t for r in rows for t in r.values() if isinstance(t, str)])
    written, counts = prepare_in_process(src, tok, tmp_path / "out", seq_len=16)
    m = Manifest(16, tuple(written), tok.identity(), "default", "assistant", {"spec": str(path)}, counts)  # type: ignore[arg-type]
    ids, labels = shards.Rows.open(str(tmp_path / "out"), m).take(np.arange(m.rows))
    from tokenizers import Tokenizer

    ref = RP.pack(sources.read_local(str(path)), T.encoder(Tokenizer.from_str(tok.tokenizer_json or "")), tok.eos_id, 16)
    assert np.array_equal(ids, ref.input_ids) and np.array_equal(labels, ref.labels)
    assert counts.records_used == len(rows) and counts.tokens == ref.input_ids.size  # type: ignore[attr-defined]


def test_messages_carry_the_loss_on_assistant_tokens_only(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": f"what is {i}?"}, {"role": "assistant", "content": f"it is {i}"}]} for i in range(50)]
    src = sources.list_source(str(write_jsonl(tmp_path / "chat.jsonl", rows)))
    tok = bpe_spec([s.text for r in rows for s in formats.segments(r)])
    from tokenizers import Tokenizer

    t = Tokenizer.from_str(tok.tokenizer_json or "")
    for loss_on in ("assistant", "all"):
        written, counts = prepare_in_process(src, tok, tmp_path / loss_on, seq_len=8, loss_on=loss_on)
        m = Manifest(8, tuple(written), tok.identity(), "default", loss_on, {}, counts)  # type: ignore[arg-type]
        ids, labels = shards.Rows.open(str(tmp_path / loss_on), m).take(np.arange(m.rows))
        learned = t.decode([int(x) for x, y in zip(ids.ravel(), labels.ravel()) if y != IGNORE], skip_special_tokens=False)
        if loss_on == "assistant":
            assert "what is" not in learned and "user" not in learned and "it is 7<|im_end|>" in learned
        else:
            assert (labels != IGNORE).all()


def test_bad_records_fail_with_where_or_are_skipped_and_counted(tmp_path: Path) -> None:
    lines = [json.dumps(TEXT[0]), "not json", json.dumps({"messages": [{"role": "bot", "content": "x"}]}), json.dumps(TEXT[1])]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines * 20) + "\n")
    src = sources.list_source(str(path))
    tok = bpe_spec([r["text"] for r in TEXT])
    with pytest.raises(InputError, match=r"mixed\.jsonl:2: not valid JSON") as e:
        prepare_in_process(src, tok, tmp_path / "fail", seq_len=8)
    assert "--on-bad-record skip" in (e.value.hint or "")
    _, counts = prepare_in_process(src, tok, tmp_path / "skip", seq_len=8, skip=True)
    assert (counts.records_read, counts.records_used, counts.records_skipped) == (80, 40, 40)  # type: ignore[attr-defined]
    assert counts.skipped == {"not valid JSON": 20, "turn N: unknown role": 20}  # type: ignore[attr-defined]
    assert counts.first_skipped[0] == f"{path}:2: not valid JSON (Expecting value)"  # type: ignore[attr-defined]


def test_long_documents_are_split_at_block_boundaries_and_counted(tmp_path: Path) -> None:
    rows = [{"text": " ".join(["word"] * 200)}, {"text": "short"}]
    src = sources.list_source(str(write_jsonl(tmp_path / "long.jsonl", rows)))
    written, counts = prepare_in_process(src, bpe_spec(["word short"] * 10), tmp_path / "out", seq_len=8)
    assert counts.split_documents == 1 and counts.tokens + counts.tail_tokens_dropped > 200  # type: ignore[attr-defined]
    assert sum(s.rows for s in written) == counts.tokens // 8  # type: ignore[attr-defined]


# ---- shards, manifest, index ------------------------------------------------------------------------


def small_dataset(tmp_path: Path) -> tuple[str, Manifest]:
    dest = tmp_path / "ds"
    dest.mkdir()
    ids = np.arange(10 * 4, dtype=np.int32).reshape(10, 4)
    parts = [shards.write_shard(str(dest), 0, ids[:6], -ids[:6]), shards.write_shard(str(dest), 1, ids[6:], -ids[6:])]
    m = Manifest(4, tuple(parts), {"name": "bpe-300", "sha256": "ab" * 32, "eos_id": 0, "vocab_size": 300}, "default", "assistant",
                 {"spec": "x", "fingerprint": "f"}, pipeline.Counts(records_read=10))
    return str(dest), m


def test_rows_are_read_by_index_across_shards_and_a_bad_checksum_is_refused_by_name(tmp_path: Path) -> None:
    dest, m = small_dataset(tmp_path)
    shards.verify(dest, m)
    a, b = shards.Rows.open(dest, m).take(np.array([7, 0, 5, 9]))
    assert a[:, 0].tolist() == [28, 0, 20, 36] and np.array_equal(b, -a)
    assert Manifest.from_json(m.to_json(), "m") == m
    raw = bytearray((tmp_path / "ds" / "shard-00001.bin").read_bytes())
    raw[0] ^= 1
    (tmp_path / "ds" / "shard-00001.bin").write_bytes(bytes(raw))
    with pytest.raises(InputError, match=r"shard shard-00001\.bin fails its checksum"):
        shards.verify(dest, m)
    (tmp_path / "ds" / "shard-00000.bin").unlink()
    with pytest.raises(InputError, match=r"shard shard-00000\.bin is missing"):
        shards.verify(dest, m)


def test_a_dataset_without_its_manifest_is_never_used_and_a_source_is_prepared_instead(tmp_path: Path) -> None:
    dest, m = small_dataset(tmp_path)
    assert shards.read_manifest(dest) is None  # shards written, manifest not yet: an interrupted prepare
    with pytest.raises(InputError, match="a dataset raydlc did not finish preparing"):
        dataset.plan(dest, out=None, storage_root=str(tmp_path), model_id="tiny", vocab=300, recipe=pipeline.Recipe(4, "assistant", "model", "fail"))
    shards.write_text(dest, "manifest.json", m.to_json())
    with pytest.raises(InputError, match=r"tokenizer\.json is missing \(the manifest names bpe-300"):  # checked whole, before Ray
        dataset.plan(dest, out=None, storage_root=str(tmp_path), model_id="tiny", vocab=300, recipe=pipeline.Recipe(4, "assistant", "model", "fail"))
    shards.write_text(dest, "tokenizer.json", "a stand-in")
    with pytest.raises(InputError, match="is not the tokenizer the manifest names"):
        dataset.plan(dest, out=None, storage_root=str(tmp_path), model_id="tiny", vocab=300, recipe=pipeline.Recipe(4, "assistant", "model", "fail"))
    m = replace(m, tokenizer={**m.tokenizer, "sha256": digest("a stand-in")})
    shards.write_text(dest, "manifest.json", m.to_json())
    p = dataset.plan(dest, out=None, storage_root=str(tmp_path), model_id="tiny", vocab=300, recipe=pipeline.Recipe(4, "assistant", "model", "fail"))
    assert p.source is None and p.existing == m
    (Path(dest) / "manifest.json").write_text('{"format": "raydlc-prepared/1"}')
    with pytest.raises(InputError, match="not a usable dataset manifest"):
        shards.read_manifest(dest)


def test_a_run_refuses_another_tokenizer_or_sequence_length_naming_both() -> None:
    m = Manifest(128, (), {"name": "org/model-a", "sha256": "a" * 64}, "model", "assistant", {}, pipeline.Counts())
    check_use(m, "ds", seq_len=128, tokenizer={"name": "org/model-a", "sha256": "a" * 64})
    with pytest.raises(InputError, match=r"tokenized by 'org/model-a'.*this model's tokenizer is 'org/model-b'"):
        check_use(m, "ds", seq_len=128, tokenizer={"name": "org/model-b", "sha256": "b" * 64})
    with pytest.raises(InputError, match="prepared with sequences of 128 tokens; this run asks --seq-len 64"):
        check_use(m, "ds", seq_len=64, tokenizer=None)


def test_reuse_needs_the_same_source_tokenizer_and_recipe(tmp_path: Path) -> None:
    src = sources.list_source(str(write_jsonl(tmp_path / "d.jsonl", TEXT[:5])))
    recipe = pipeline.Recipe(64, "assistant", "model", "fail")
    m = Manifest(64, (), {"name": "bpe-4096"}, "model", "assistant", {"spec": src.spec, "fingerprint": src.fingerprint}, pipeline.Counts())
    assert pipeline.matches(m, src, "bpe-4096", recipe)
    assert not pipeline.matches(m, src, "bpe-4096", pipeline.Recipe(32, "assistant", "model", "fail"))
    assert not pipeline.matches(m, src, "org/model", recipe)
    assert pipeline.matches(replace(m, chat_template="default"), src, "bpe-4096", recipe)  # the tokenizer has no template of its own
    assert not pipeline.matches(m, src, "bpe-4096", pipeline.Recipe(64, "assistant", "default", "fail"))
    write_jsonl(tmp_path / "d.jsonl", TEXT[:6])
    changed = sources.list_source(str(tmp_path / "d.jsonl"))
    assert not pipeline.matches(m, changed, "bpe-4096", recipe)
    assert pipeline.dataset_key(changed, "bpe-4096", recipe) != pipeline.dataset_key(src, "bpe-4096", recipe)


@pytest.mark.parametrize(("n", "world"), [(203, 4), (3433, 2), (50, 1), (10, 2)])
def test_the_split_by_index_is_the_in_driver_split(n: int, world: int) -> None:
    packed = RP.Packed(np.arange(n, dtype=np.int32).reshape(n, 1), np.zeros((n, 1), dtype=np.int32))
    ref = RP.split(packed, eval_fraction=0.05, world_size=world, seed=3)
    held = order.eval_rows(n, eval_fraction=0.05, world_size=world, seed=3)
    assert held.tolist() == ref.eval.input_ids.ravel().tolist()
    assert order.train_rows(np.arange(n - len(held)), held).tolist() == ref.train.input_ids.ravel().tolist()


def test_one_by_two_b_and_two_by_b_read_the_same_rows_and_resume_reads_the_same_step() -> None:
    held = order.eval_rows(1000, eval_fraction=0.05, world_size=2, seed=0)
    for step in (1, 7, 40):
        g = order.global_batch(step, 1000 - len(held), 8, seed=0)
        two = np.concatenate([order.train_rows(order.rank_slice(g, r, 2), held) for r in range(2)])
        assert np.array_equal(order.train_rows(order.rank_slice(g, 0, 1), held), two)
        assert not set(two.tolist()) & set(held.tolist())
