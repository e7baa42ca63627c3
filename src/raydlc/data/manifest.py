"""The prepared dataset's description, written last: a folder without one is never used.

It says what the blocks are (rows per shard, sequence length, each shard's SHA-256), what made
them (the tokenizer's name and hash, the chat template, which tokens carry the loss, the source
and its fingerprint) and what was read, skipped and why. `check_use` holds the rules a run
checks before it trains on a dataset. Pure: data in, data out.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from raydlc.errors import InputError

FORMAT = "raydlc-prepared/2"  # shards of [rows, 3, seq_len]: ids, labels, each token's document in its row
OLD_FORMAT = "raydlc-prepared/1"  # shards of [rows, 2, seq_len]: no document boundaries (read as one document per row)
NAME = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class Shard:
    name: str
    rows: int
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Counts:
    records_read: int = 0
    records_used: int = 0
    records_skipped: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> records
    first_skipped: list[str] = field(default_factory=list)  # the first few, with where
    tokens: int = 0  # in the blocks
    loss_tokens: int = 0  # of those, the ones that carry the loss
    split_documents: int = 0  # records longer than a block, cut at block boundaries
    tail_tokens_dropped: int = 0  # the last partial block's


@dataclass(frozen=True)
class Manifest:
    seq_len: int
    shards: tuple[Shard, ...]
    tokenizer: dict[str, Any]  # name, sha256, eos_id, vocab_size
    chat_template: str
    loss_on: str
    source: dict[str, Any]  # spec, fingerprint, files
    counts: Counts
    format: str = FORMAT

    @property
    def documents(self) -> bool:
        """Its shards record each token's document (this format); an older dataset's do not."""
        return self.format == FORMAT

    @property
    def planes(self) -> int:
        """Values per token in a shard: ids and labels, and the document where recorded."""
        return 3 if self.documents else 2

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def digest(self) -> str:
        """The blocks' identity (a checkpoint's data order is a function of it)."""
        import hashlib

        return hashlib.sha256("".join(s.sha256 for s in self.shards).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shards"] = [asdict(s) for s in self.shards]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        """Parsed and checked field by field; anything else is an `InputError` naming `where`."""
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("format") not in (FORMAT, OLD_FORMAT):
                raise ValueError(f"not a {FORMAT} manifest (format {doc.get('format') if isinstance(doc, dict) else None!r})")
            shards = tuple(Shard(**s) for s in doc["shards"])
            counts = Counts(**doc["counts"])
            m = cls(int(doc["seq_len"]), shards, dict(doc["tokenizer"]), str(doc["chat_template"]), str(doc["loss_on"]),
                    dict(doc["source"]), counts, str(doc["format"]))
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"{where}: not a usable dataset manifest ({e})", hint="prepare it again: raydlc data prepare SOURCE --out DEST") from e
        if not shards or any(s.rows < 1 or s.bytes != s.rows * m.planes * m.seq_len * 4 for s in shards):
            raise InputError(f"{where}: the shard list does not match its row counts", hint="prepare it again: raydlc data prepare SOURCE --out DEST")
        return m


def check_use(m: Manifest, where: str, *, seq_len: int, tokenizer: dict[str, Any] | None) -> None:
    """A run may train on this dataset: same sequence length, and the model's own tokenizer when it has one.

    `tokenizer` is the identity of the model's tokenizer, or None for a built-in spec, which
    takes the dataset's.
    """
    if m.seq_len != seq_len:
        raise InputError(f"--data {where} was prepared with sequences of {m.seq_len} tokens; this run asks --seq-len {seq_len}",
                         hint=f"pass --seq-len {m.seq_len}, or prepare it again with --seq-len {seq_len}")
    if tokenizer is not None and (tokenizer["name"], tokenizer["sha256"]) != (m.tokenizer.get("name"), m.tokenizer.get("sha256")):
        raise InputError(
            f"--data {where} was tokenized by {m.tokenizer.get('name')!r} (sha256 {str(m.tokenizer.get('sha256'))[:12]}), "
            f"this model's tokenizer is {tokenizer['name']!r} (sha256 {tokenizer['sha256'][:12]})",
            hint="prepare the data again for this model: raydlc data prepare SOURCE --model MODEL",
        )
