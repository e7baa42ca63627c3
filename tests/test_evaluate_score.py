"""`raydlc eval`'s held-out loss is the training's eval loss: the same rows of a prepared dataset, the same
next-token cross-entropy over the label tokens (train.loop.loss_sum), packed documents masked as the run
masked them (data.documents), so its perplexity is exp(eval loss).
Without Ray: the dataset is written with the pipeline's own shard and manifest writers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.test_evaluate_export import SPEC, bpe_info

from raydlc.data.encode import IGNORE
from raydlc.data.manifest import Counts, Manifest
from raydlc.data.shards import NAME, write_shard, write_text
from raydlc.data.tokenizer import to_hf
from raydlc.evaluate import evaluation, exports
from raydlc.evaluate.generation import Sampling
from raydlc.train.checkpoint import save_hf
from raydlc.train.loop import loss_sum

ROWS, SEQ = 12, 24


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    from raydlc.facts.models import ModelSpec
    from raydlc.train.model import build_model

    tmp = tmp_path_factory.mktemp("score")
    info = bpe_info()
    model = build_model(ModelSpec(**{**SPEC.__dict__, "vocab_size": info.vocab_size}), seed=1).eval()
    save_hf(model.config, model.state_dict(), tmp / "export", tokenizer=to_hf(info, max_length=256))
    g = np.random.default_rng(0)
    ids = g.integers(0, info.vocab_size, (ROWS, SEQ)).astype(np.int32)
    labels = np.where(g.random((ROWS, SEQ)) < 0.3, IGNORE, ids).astype(np.int32)
    dest = str(tmp / "dataset")
    write_text(dest, "placeholder", "")  # makes the folder
    docs = np.cumsum(g.random((ROWS, SEQ)) < 0.15, axis=1).astype(np.int32)  # packed: a row holds several documents
    shard = write_shard(dest, 0, ids, labels, docs)
    m = Manifest(SEQ, (shard,), {"name": "bpe", "sha256": "0" * 64, "eos_id": info.eos_id, "vocab_size": info.vocab_size},
                 "default", "assistant", {"spec": "x"}, Counts())
    write_text(dest, NAME, m.to_json())
    return tmp / "export", Path(dest), model


def training_eval_loss(model: object, dest: Path, rows: list[int], *, masking: bool = True) -> float:
    """As the loop reads and scores its held-out rows (train.loop: documents.read, then loss_sum)."""
    from raydlc.data.documents import read
    from raydlc.data.shards import Rows, read_manifest

    x, y, d = read(Rows.open(str(dest), read_manifest(str(dest))), np.asarray(rows), masking=masking)
    with torch.no_grad():
        s, n = loss_sum(model, torch.as_tensor(x, dtype=torch.long), torch.as_tensor(y, dtype=torch.long),
                        None if d is None else torch.as_tensor(d))
    return float(s / n)


def test_held_out_perplexity_is_exp_of_the_training_eval_loss(made: tuple) -> None:
    out, dest, model = made
    rows = [1, 4, 7, 10]
    found = exports.locate(out)
    found = exports.Export(found.root, found.model_dir, found.adapter_dir, {"dataset": str(dest), "eval_rows": rows, "base": {"path": str(out)}})
    r = evaluation.evaluate(found, evaluation.Request(prompts=("def",), sampling=Sampling(max_new_tokens=2)))
    want = training_eval_loss(model, dest, rows)
    held = r["fine_tuned"]["held_out"]
    assert held["rows"] == 4 and math.isclose(held["loss"], want, rel_tol=1e-5)
    assert math.isclose(held["perplexity"], math.exp(want), rel_tol=1e-5)
    assert r["base"]["held_out"]["loss"] == held["loss"]  # the base named is the export itself
    assert r["generations"][0]["prompt"] == "def" and r["generations"][0]["base"] == r["generations"][0]["fine_tuned"]
    assert abs(want - training_eval_loss(model, dest, rows, masking=False)) > 1e-4  # the documents change the loss: the test can fail


def test_a_run_trained_without_document_masking_is_scored_without_it(made: tuple) -> None:
    out, dest, model = made
    rows = [0, 3, 5]
    found = exports.locate(out)
    found = exports.Export(found.root, found.model_dir, found.adapter_dir,
                           {"dataset": str(dest), "eval_rows": rows, "base": {"path": str(out)}, "document_masking": False})
    r = evaluation.evaluate(found, evaluation.Request(prompts=("def",), sampling=Sampling(max_new_tokens=1), base=False))
    assert math.isclose(r["fine_tuned"]["held_out"]["loss"], training_eval_loss(model, dest, rows, masking=False), rel_tol=1e-5)


def test_raydlc_eval_with_data_scores_its_first_rows(made: tuple, capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.cli import main

    out, dest, model = made
    assert main(["eval", str(out), "--data", str(dest), "--no-base", "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["base"] is None and doc["source"]["dataset"] == str(dest)
    assert math.isclose(doc["fine_tuned"]["held_out"]["loss"], training_eval_loss(model, dest, list(range(ROWS))), rel_tol=1e-5)
    assert main(["eval", str(out), "--no-base", "--prompt", "x", "--device", "cpu"]) == 2  # no run beside it, no --data
    assert "names no held-out data" in capsys.readouterr().err
