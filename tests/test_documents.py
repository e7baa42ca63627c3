"""Document masking (data.documents): the packer records each token's document in the shards, and a
packed block's per-token losses through the loop's loss path are each document's alone.
A dataset of the older shard format still reads, as one document per block."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raydlc.data import documents as D
from raydlc.data import pipeline, shards
from raydlc.data.encode import IGNORE, _table
from raydlc.data.manifest import FORMAT, OLD_FORMAT, Counts, Manifest
from raydlc.facts.models import ModelSpec
from raydlc.train.loop import loss_sum, micro_batches, to_batch
from raydlc.train.loss import use_chunked_loss
from raydlc.train.model import build_model

SPEC = ModelSpec("docs", 64, 2, 4, 2, 172, 503, False, max_position_embeddings=512)  # grouped-query attention: 4 heads, 2 KV
TOK = {"name": "bpe-503", "sha256": "ab" * 32, "eos_id": 2, "vocab_size": 503}


def records(lengths: list[int], seed: int = 0, *, prompt: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
    """Records as encode makes them: ids ending in EOS; the first half of each a prompt (no loss) unless `prompt` is off."""
    g = np.random.default_rng(seed)
    out = []
    for n in lengths:
        ids = np.append(g.integers(3, SPEC.vocab_size, n - 1), TOK["eos_id"]).astype(np.int32)
        labels = ids.copy()
        labels[: n // 2 if prompt else 0] = IGNORE
        out.append((ids, labels))
    return out


def pack(dest: str, recs: list[tuple[np.ndarray, np.ndarray]], seq_len: int) -> tuple[Manifest, list[Counts]]:
    """The packer over one batch of these records, and the manifest a prepare would write."""
    packer = pipeline.Packer(dest, seq_len, skip=False)
    packer.add(_table([f"r{i}" for i in range(len(recs))], [""] * len(recs), [a for a, _ in recs], [b for _, b in recs]))
    counts, written = packer.finish()
    return Manifest(seq_len, tuple(written), TOK, "default", "assistant", {"spec": "x", "fingerprint": "f"}, counts), [counts]


def token_losses(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, docs: torch.Tensor | None) -> torch.Tensor:
    """Each position's next-token loss (0 where ignored), with the inputs the loop gives the model."""
    inputs = {} if docs is None else D.model_inputs(model, docs)
    with torch.no_grad():
        logits = model(input_ids=ids, **inputs).logits[:, :-1].float()
    return F.cross_entropy(logits.transpose(1, 2), labels[:, 1:], ignore_index=IGNORE, reduction="none")


def test_the_packer_records_each_tokens_document_and_the_shards_read_them_back(tmp_path) -> None:
    recs = records([5, 9, 3, 12, 4])  # 33 tokens: blocks of 8 cut records 2 and 4; the tail (1 token) is dropped
    m, _ = pack(str(tmp_path), recs, 8)
    assert m.format == FORMAT and m.documents and m.planes == 3 and m.rows == 4
    assert all(s.bytes == s.rows * 3 * 8 * 4 for s in m.shards)
    again = Manifest.from_json(m.to_json(), "m")
    assert again == m
    shards.verify(str(tmp_path), again)
    ids, labels, docs = shards.Rows.open(str(tmp_path), again).take_documents(np.arange(4))
    stream = np.concatenate([a for a, _ in recs])
    assert np.array_equal(ids.reshape(-1), stream[:32]) and np.array_equal(labels.reshape(-1), np.concatenate([b for _, b in recs])[:32])
    # each record's tokens share a document; a row counts from 0, so a record cut by a block is document 0 of the next
    assert docs.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1], [0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1]]
    assert np.array_equal(shards.Rows.open(str(tmp_path), again).take(np.arange(4))[0], ids)


def test_a_dataset_of_the_older_format_reads_as_one_document_per_block_and_is_not_reused_for_a_new_prepare(tmp_path) -> None:
    ids = np.arange(3 * 8, dtype=np.int32).reshape(3, 8) + 3
    block = np.stack([ids, ids], axis=1).astype("<i4").tobytes()  # what raydlc-prepared/1 wrote: ids and labels only
    (tmp_path / "shard-00000.bin").write_bytes(block)
    import hashlib

    doc = {"format": OLD_FORMAT, "seq_len": 8, "shards": [{"name": "shard-00000.bin", "rows": 3, "sha256": hashlib.sha256(block).hexdigest(),
           "bytes": len(block)}], "tokenizer": TOK, "chat_template": "default", "loss_on": "assistant", "source": {"spec": "x", "fingerprint": "f"},
           "counts": {}}
    old = Manifest.from_json(json.dumps(doc), "old")
    assert (old.documents, old.planes) == (False, 2)
    shards.verify(str(tmp_path), old)
    a, b, docs = shards.Rows.open(str(tmp_path), old).take_documents(np.array([2, 0]))
    assert docs is None and a.tolist() == [list(range(19, 27)), list(range(3, 11))] and np.array_equal(a, b)
    assert D.read(shards.Rows.open(str(tmp_path), old), np.array([1]), masking=True)[2] is None  # one document: the plain causal path
    recipe = pipeline.Recipe(8, "assistant", "default", "fail")
    src = type("S", (), {"spec": "x", "fingerprint": "f"})()
    assert not pipeline.matches(old, src, "bpe-503", recipe)  # type: ignore[arg-type]  # prepared again, never mixed in
    from dataclasses import replace

    assert pipeline.matches(replace(old, format=FORMAT), src, "bpe-503", recipe)  # type: ignore[arg-type]
    doc["shards"][0]["bytes"] = 3 * 3 * 8 * 4  # a /1 manifest claiming /2's shard size is refused
    with pytest.raises(Exception, match="does not match its row counts"):
        Manifest.from_json(json.dumps(doc), "old")


def test_positions_restart_at_each_document_and_the_mask_is_causal_within_one() -> None:
    docs = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 0, 0, 0, 0, 0, 0, 0]])
    assert D.positions(docs).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], list(range(8))]
    dense = D.dense_mask(docs)
    mod = D.document_causal(docs)
    brute = torch.tensor([[[bool(mod(b, 0, torch.tensor(q), torch.tensor(k))) for k in range(8)] for q in range(8)] for b in range(2)])
    assert torch.equal(dense[:, 0], brute)
    assert dense[0, 0, 4].tolist() == [False, False, False, True, True, False, False, False]
    assert torch.equal(dense[1, 0], torch.ones(8, 8, dtype=torch.bool).tril())
    assert D.starts(docs.numpy()).tolist()[0] == [False, False, False, True, False, True, False, False]


@pytest.mark.parametrize("chunk", [0, 5])  # the plain loss over full logits, and the chunked head
def test_two_documents_packed_in_one_block_give_each_ones_loss_alone(tmp_path, chunk: int) -> None:
    """The issue's test: per token, through the shards, `documents.read`, `to_batch` and `loss_sum`, in fp32."""
    recs = records([11, 13], seed=1)
    m, _ = pack(str(tmp_path), recs, 24)  # exactly one block: [A (11) | B (13)]
    rows = shards.Rows.open(str(tmp_path), m)
    ids, labels, docs = D.read(rows, np.array([0]), masking=True)
    assert docs is not None and docs.tolist() == [[0] * 11 + [1] * 13] and labels[0, 11] == IGNORE  # B's first token: no loss
    model = build_model(SPEC, seed=0).eval()
    if chunk:
        use_chunked_loss(model, chunk)
    packed = to_batch(ids, labels, torch.device("cpu"), docs)
    alone = [to_batch(a[None], b[None], torch.device("cpu")) for a, b in recs]
    plain = build_model(SPEC, seed=0).eval()
    per_token = token_losses(plain, packed[0], packed[1], packed[2])[0]
    each = [token_losses(plain, x, y, None)[0] for x, y, _ in alone]
    torch.testing.assert_close(per_token[:10], each[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(per_token[11:], each[1], rtol=0, atol=2e-6)
    assert per_token[10] == 0  # A's EOS predicting B's first token: not a target
    with torch.no_grad():
        total, n = loss_sum(model, *packed)
        parts = [loss_sum(model, *b) for b in alone]
    assert int(n) == sum(int(k) for _, k in parts) == int((labels[:, 1:] != IGNORE).sum())
    assert total.item() == pytest.approx(sum(s.item() for s, _ in parts), rel=1e-6)
    # without the documents, B sees A: its losses differ (the test can fail)
    unmasked = token_losses(plain, packed[0], packed[1], None)[0]
    assert (unmasked[11:] - each[1]).abs().max() > 1e-3


def test_flex_attention_gives_the_dense_masks_loss_on_cpu() -> None:
    """FlexAttention's BlockMask (the CUDA-with-COMPILE form) runs forward on CPU in torch 2.13 (eager): the same loss as
    SDPA's mask. Its backward raises on CPU ("FlexAttention does not support backward on CPU"): a GPU run checks that."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, SPEC.vocab_size, (2, 32), generator=g)
    labels = ids.clone()
    docs = torch.tensor([[0] * 9 + [1] * 15 + [2] * 8, [0] * 32])
    labels[torch.from_numpy(D.starts(docs.numpy()))] = IGNORE
    dense, flex = build_model(SPEC, seed=0), build_model(SPEC, seed=0)
    assert not D.use_flex(flex, torch.device("cpu"), compile=True)  # the loop switches on CUDA with COMPILE only
    flex.config._attn_implementation = D.FLEX
    assert type(D.model_inputs(flex, docs)["attention_mask"]).__name__ == "BlockMask"
    with torch.no_grad():
        (a, n), (b, k) = loss_sum(dense, ids, labels, docs), loss_sum(flex, ids, labels, docs)
        per_dense, per_flex = token_losses(dense, ids, labels, docs), token_losses(flex, ids, labels, docs)
    assert int(n) == int(k) and b.item() == pytest.approx(a.item(), rel=1e-6)
    torch.testing.assert_close(per_flex, per_dense, rtol=0, atol=2e-6)


def test_micro_batches_carry_each_rows_documents() -> None:
    ids = np.arange(4 * 6).reshape(4, 6)
    docs = np.array([[0, 0, 1, 1, 1, 1]] * 4) * np.arange(1, 5)[:, None]
    got = micro_batches(ids, ids, np.array([3, 1, 0, 2]), 3, torch.device("cpu"), docs)
    assert [b[2].tolist() for b in got] == [docs[[3, 1, 0]].tolist(), docs[[2]].tolist()]
    assert all(b[2] is None for b in micro_batches(ids, ids, np.arange(4), 2, torch.device("cpu")))


def test_the_loops_step_reads_the_documents_and_leaves_each_documents_first_token_out(tmp_path) -> None:
    """`run_step` on a real Trainer (FSDP2, a world of one) and the shards: with DOCUMENT_MASKING the step's target
    tokens are the unmasked ones less each later document's first token; off, every one counts."""
    import types

    from tests.test_train_cadence import one_worker
    from tests.test_train_step import trainer, world_of_one

    from raydlc.data.order import global_batch
    from raydlc.train import loop as L

    recs = records([5, 9, 7, 12, 6, 10, 8, 11, 4, 13, 9, 7, 12, 5], seed=2, prompt=False)  # 118 tokens: 7 blocks of 16
    m, _ = pack(str(tmp_path), recs, 16)
    rows, held = shards.Rows.open(str(tmp_path), m), np.zeros(0, dtype=np.int64)
    data = L.RankData(types.SimpleNamespace(n_train=m.rows, documents=True), rows, held, *rows.take(held))
    counted = {}
    for masking in (True, False):
        run = one_worker(steps=1, document_masking=masking)
        with world_of_one():
            t = trainer(1, "every")
            _, _, out = L.run_step(t, run, data, 1, rank=0, world=1)
        counted[masking] = int(out.tokens)
        assert np.isfinite(float(out.loss))
    picked = global_batch(1, m.rows, run.global_batch, run.train.seed)
    _, labels, docs = rows.take_documents(picked)
    starts_learned = int((D.starts(docs) & (labels != IGNORE))[:, 1:].sum())
    assert starts_learned > 0 and counted[False] == int((labels[:, 1:] != IGNORE).sum())
    assert counted[True] == counted[False] - starts_learned
