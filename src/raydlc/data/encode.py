"""Records to token ids and labels, the same way in every Ray Data worker.

`TokenizerSpec` is what a worker needs to build the tokenizer once (a JSON string trained in
the driver, or the model's own by id) and what the manifest records of it (name and hash).
Each segment is encoded on its own, without special tokens, and every record ends in EOS, which
carries the loss; labels are `IGNORE` where a segment does not. The `text` and
`prompt`/`response` results equal the in-driver reference packing (tests/reference_packing.py) bit for bit.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from raydlc.data.formats import DEFAULT_TEMPLATE, BadRecord, LossOn, Renderer, default_render, segments, template_render

IGNORE = -100


@dataclass(frozen=True)
class TokenizerSpec:
    name: str  # the model id, or "bpe-<vocab> trained on <source>" when trained here
    sha256: str  # of the tokenizer's serialized form (and its chat template)
    eos_id: int
    vocab_size: int
    tokenizer_json: str | None = None  # trained here: travels inline, and is written beside the shards
    pretrained: str | None = None  # the model's own tokenizer, loaded by id or directory
    template: str = DEFAULT_TEMPLATE  # "default", or "model": the tokenizer's own chat template

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def identity(self) -> dict[str, Any]:
        """What the manifest keeps and a run compares."""
        return {"name": self.name, "sha256": self.sha256, "eos_id": self.eos_id, "vocab_size": self.vocab_size}


def digest(serialized: str, template: str | None = None) -> str:
    return hashlib.sha256((serialized + "\0" + (template or "")).encode()).hexdigest()


@functools.lru_cache(maxsize=4)
def _load(spec_json: str) -> tuple[Any, Renderer]:
    """The backend tokenizer and the chat renderer, once per worker process."""
    spec = TokenizerSpec(**json.loads(spec_json))
    if spec.tokenizer_json is not None:
        from tokenizers import Tokenizer

        return Tokenizer.from_str(spec.tokenizer_json), default_render
    from raydlc.data.tokenizer import load_pretrained_tokenizer

    assert spec.pretrained is not None
    hf = load_pretrained_tokenizer(spec.pretrained)
    if spec.template == "model" and getattr(hf, "chat_template", None):
        return hf.backend_tokenizer, template_render(functools.partial(hf.apply_chat_template, tokenize=False))
    return hf.backend_tokenizer, default_render


def encode_batch(batch: dict[str, Any], *, spec_json: str, loss_on: LossOn) -> dict[str, Any]:
    """A Ray Data batch of (where, record, error) rows to the same rows with `ids` and `labels`.

    A record that cannot be used keeps empty ids and gains its `error`; the packer reports or skips it.
    """
    tok, render = _load(spec_json)
    eos = TokenizerSpec(**json.loads(spec_json)).eos_id
    wheres, records, errors = list(batch["where"]), list(batch["record"]), [str(e) for e in batch["error"]]
    segs: list[list[tuple[str, bool]]] = []
    for i, rec in enumerate(records):
        if errors[i]:
            segs.append([])
            continue
        try:
            segs.append([(s.text, s.learn) for s in segments(json.loads(rec), loss_on=loss_on, render=render)])
        except BadRecord as e:
            errors[i] = str(e)
            segs.append([])
    texts = [t for row in segs for t, _ in row]
    encoded = iter(e.ids for e in tok.encode_batch(texts, add_special_tokens=False)) if texts else iter(())
    ids: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for row, err in zip(segs, errors):
        if err:
            ids.append(np.zeros(0, np.int32))
            labels.append(np.zeros(0, np.int32))
            continue
        parts = [(np.asarray(next(encoded), np.int32), learn) for _, learn in row]
        a = np.concatenate([p for p, _ in parts] + [np.asarray([eos], np.int32)])
        b = np.concatenate([p if learn else np.full(len(p), IGNORE, np.int32) for p, learn in parts] + [np.asarray([eos], np.int32)])
        ids.append(a)
        labels.append(b)
    return _table(wheres, errors, ids, labels)


def _table(wheres: list[str], errors: list[str], ids: list[np.ndarray], labels: list[np.ndarray]) -> Any:
    """Arrow list columns: ragged rows without pickling, flattened by the packer in one call."""
    import pyarrow as pa

    offsets = np.zeros(len(ids) + 1, np.int32)
    np.cumsum([len(a) for a in ids], out=offsets[1:])
    flat_ids = np.concatenate(ids) if ids else np.zeros(0, np.int32)
    flat_labels = np.concatenate(labels) if labels else np.zeros(0, np.int32)
    return pa.table({
        "where": pa.array(wheres, pa.string()),
        "error": pa.array(errors, pa.string()),
        "ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat_ids)),
        "labels": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat_labels)),
    })
