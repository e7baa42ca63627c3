"""Preparing a dataset: Ray Data reads and tokenizes over every CPU Ray has; one ordered reader packs.

The pipeline is `from_items(units) -> flat_map(read a unit) -> map_batches(encode)`, with Ray
Data's `preserve_order`: its output comes in the source's order whatever the number of CPUs,
so the packing (concatenate with EOS, cut into blocks, drop the tail) is deterministic and equal
to the in-driver packing. The packer holds at most one shard before it writes it to the
destination (a local folder, a shared file system or s3://); the manifest is written last.
The tokenizer is loaded once per worker process (encode's cache).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydlc.data import shards as S
from raydlc.data.corpus import BUNDLED
from raydlc.data.encode import IGNORE, TokenizerSpec, digest, encode_batch
from raydlc.data.manifest import FORMAT, NAME, TOKENIZER_FILE, Counts, Manifest, Shard
from raydlc.data.sources import Source, Unit, read_unit, sample_texts
from raydlc.edges.storage import filesystem
from raydlc.errors import InputError

BATCH_ROWS = 512  # records per encode call
BUNDLED_PARTS = 8  # the bundled corpus is one source, read in this many parallel parts
MAX_EXAMPLES = 5  # skipped records named in the manifest

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Recipe:
    """Everything the blocks are a function of, beside the source's content."""

    seq_len: int
    loss_on: str
    chat_template: str
    on_bad_record: str


def source_key(spec: str) -> str:
    """The source as the key knows it: a local path made absolute, so `data prepare X` and `train --data ./X`
    (which resolves it) name the same dataset."""
    from raydlc import storage

    return spec if spec == BUNDLED or storage.is_uri(spec) else storage.resolve(spec)


def dataset_key(source: Source, tokenizer_name: str, recipe: Recipe) -> str:
    """The folder name a run prepares into and finds again: same source, tokenizer, recipe and shard format, same key."""
    text = json.dumps([source_key(source.spec), source.fingerprint, tokenizer_name, recipe.seq_len, recipe.loss_on, recipe.chat_template, recipe.on_bad_record,
                       FORMAT])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def matches(m: Manifest, source: Source, tok_name: str, recipe: Recipe) -> bool:
    """An existing dataset can be reused: the same source (unchanged), tokenizer and recipe, in this format
    (an older one, without document boundaries, is prepared again).

    The manifest names the template used: `default` also answers a request for the model's own
    when the (same) tokenizer has none.
    """
    template_ok = m.chat_template in (recipe.chat_template, "default")
    return template_ok and m.format == FORMAT and (m.source.get("fingerprint"), source_key(str(m.source.get("spec"))), m.tokenizer.get("name"), m.seq_len, m.loss_on) == (
        source.fingerprint, source_key(source.spec), tok_name, recipe.seq_len, recipe.loss_on
    )


def trained_tokenizer(source: Source, vocab: int) -> TokenizerSpec:
    """A byte-level BPE trained in the driver on the source's first characters (a built-in spec has none)."""
    from raydlc.data.tokenizer import EOS, train_bpe

    texts = sample_texts(source)
    if not texts:
        raise InputError(f"--data {source.spec}: no usable record to train a tokenizer on", hint="check the records' fields")
    tok = train_bpe(texts, vocab)
    serialized = tok.to_str()
    return TokenizerSpec(f"bpe-{vocab}", digest(serialized), tok.token_to_id(EOS), tok.get_vocab_size(), tokenizer_json=serialized)


def model_tokenizer(model_id: str, chat_template: str) -> TokenizerSpec:
    """The model's own tokenizer, by the hash of its serialized form and chat template."""
    from raydlc.data.tokenizer import load_pretrained_tokenizer

    hf = load_pretrained_tokenizer(model_id)
    if hf.eos_token_id is None:
        raise InputError(f"the tokenizer of {model_id!r} has no EOS token", hint="use a causal-LM tokenizer")
    template = getattr(hf, "chat_template", None) if chat_template == "model" else None
    return TokenizerSpec(model_id, digest(hf.backend_tokenizer.to_str(), template), int(hf.eos_token_id), len(hf),
                         pretrained=model_id, template="model" if template else "default")


# ---- the pipeline ---------------------------------------------------------------------------------


def _read(unit: dict[str, Any]) -> list[dict[str, str]]:
    return [{"where": w, "record": r or "", "error": e or ""} for w, r, e in read_unit(Unit(**unit))]


def _dataset(source: Source) -> Any:
    """The source's rows as a Ray Dataset: a task per unit; the bundled corpus (2 MB, made here) in parts."""
    import ray

    if source.spec == BUNDLED:
        rows = _read(source.units[0].to_dict())
        return ray.data.from_items(rows, override_num_blocks=BUNDLED_PARTS)
    units = [u.to_dict() for u in source.units]
    return ray.data.from_items(units, override_num_blocks=len(units)).flat_map(_read)


def run(source: Source, tok: TokenizerSpec, dest: str, recipe: Recipe, *, on_progress: ProgressFn | None = None) -> Manifest:
    """Prepare `source` into `dest` on the Ray this process is connected to; returns the written manifest."""
    import ray

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    S.remove(dest, NAME)  # an older dataset here is never mixed with this one: no manifest until the end
    fs, root = filesystem(dest)
    fs.create_dir(root, recursive=True)
    ds = _dataset(source).map_batches(encode_batch, fn_kwargs={"spec_json": json.dumps(tok.to_dict()), "loss_on": recipe.loss_on},
                        batch_size=BATCH_ROWS, batch_format="numpy")
    packer = Packer(dest, recipe.seq_len, skip=recipe.on_bad_record == "skip")
    t0 = time.perf_counter()
    # Ray Data's plan and timing lines are Ray's logs, not the user's output; and with the progress bars off (raydlc
    # shows its own progress) its progress module warns that they are off (Ray 2.58 ray/data/_internal/progress).
    quiet = {logging.getLogger("ray.data"): logging.WARNING, logging.getLogger("ray.data._internal.progress"): logging.ERROR}
    levels = {log: log.level for log in quiet}
    for log, level in quiet.items():
        log.setLevel(level)
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2):
            packer.add(batch)
            if on_progress is not None:
                on_progress({"records": packer.read, "tokens": packer.tokens + packer.pending, "elapsed_s": time.perf_counter() - t0})
    finally:
        for log, level in levels.items():
            log.setLevel(level)
    counts, written = packer.finish()
    if not written:
        raise InputError(f"--data {source.spec} gives fewer than {recipe.seq_len} tokens: not one sequence", hint="add text or lower --seq-len")
    if tok.tokenizer_json is not None:
        S.write_text(dest, TOKENIZER_FILE, tok.tokenizer_json)
    m = Manifest(recipe.seq_len, tuple(written), tok.identity(), tok.template, recipe.loss_on,
                 {"spec": source.spec, "fingerprint": source.fingerprint, "files": source.files}, counts)
    S.write_text(dest, NAME + ".part", m.to_json())
    fs.move(f"{root}/{NAME}.part", f"{root}/{NAME}")
    return m


def _reason(error: str) -> str:
    """A skipped record's reason without its particulars: counts group by it."""
    return re.sub(r"\d+", "N", re.sub(r" \(.*\)$|'[^']*'", "", error)).strip()


class Packer:
    """The ordered token stream cut into `seq_len` blocks, written a shard at a time."""

    def __init__(self, dest: str, seq_len: int, *, skip: bool) -> None:
        self.dest, self.seq_len, self.skip = dest, seq_len, skip
        self.per_shard = max(1, S.SHARD_TOKENS // seq_len) * seq_len
        self.ids: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []
        self.docs: list[np.ndarray] = []  # each token's record, counted over the whole stream
        self.records = 0
        self.pending = 0
        self.read = self.used = self.tokens = self.loss_tokens = self.split = 0
        self.skipped: dict[str, int] = {}
        self.examples: list[str] = []
        self.shards: list[Shard] = []

    def add(self, batch: Any) -> None:
        import pyarrow.compute as pc

        errors = batch["error"].to_pylist()
        self.read += len(errors)
        for where, err in zip(batch["where"].to_pylist(), errors):
            if not err:
                continue
            if not self.skip:
                raise InputError(f"--data {where}: {err}", hint="fix the record, or pass --on-bad-record skip to count and leave it out")
            self.skipped[_reason(err)] = self.skipped.get(_reason(err), 0) + 1
            if len(self.examples) < MAX_EXAMPLES:
                self.examples.append(f"{where}: {err}")
        lengths = pc.list_value_length(batch["ids"]).to_numpy(zero_copy_only=False)
        self.used += int(np.count_nonzero(lengths))
        self.split += int(np.count_nonzero(lengths > self.seq_len))
        ids = pc.list_flatten(batch["ids"]).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        labels = pc.list_flatten(batch["labels"]).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        self.ids.append(ids)
        self.labels.append(labels)
        self.docs.append(np.repeat(np.arange(self.records, self.records + len(lengths), dtype=np.int64), lengths))
        self.records += len(lengths)
        self.pending += len(ids)
        while self.pending >= self.per_shard:
            self._flush(self.per_shard)

    def _flush(self, n: int) -> None:
        ids, labels, docs = np.concatenate(self.ids), np.concatenate(self.labels), np.concatenate(self.docs)
        head_ids, head_labels, head_docs = (a[:n].reshape(-1, self.seq_len) for a in (ids, labels, docs))
        self.shards.append(S.write_shard(self.dest, len(self.shards), head_ids, head_labels, head_docs - head_docs[:, :1]))
        self.tokens += n
        self.loss_tokens += int(np.count_nonzero(head_labels != IGNORE))
        self.ids, self.labels, self.docs, self.pending = [ids[n:]], [labels[n:]], [docs[n:]], len(ids) - n

    def finish(self) -> tuple[Counts, list[Shard]]:
        full = self.pending - self.pending % self.seq_len
        if full:
            self._flush(full)
        counts = Counts(self.read, self.used, self.read - self.used, dict(sorted(self.skipped.items())), self.examples,
                        self.tokens, self.loss_tokens, self.split, self.pending)
        return counts, self.shards
