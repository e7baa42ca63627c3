"""A run's dataset, decided before Ray starts and made (or found again) once Ray is up.

`plan` looks at what `--data` names without starting anything: a prepared dataset (it has a
manifest), or a source to prepare into `--out` (`data prepare`) or into the run's storage under
`datasets/<key>`, where a matching dataset already there is reused: same source fingerprint,
tokenizer and recipe. `make` runs the Ray Data preparation where needed, checks the manifest and
every shard's checksum, and returns the dataset with its tokenizer. `TrainData` is what a
worker receives: where the rows are and which are eval, never the rows themselves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from raydlc import storage
from raydlc.data import shards as S
from raydlc.data.encode import TokenizerSpec
from raydlc.data.index import eval_rows
from raydlc.data.manifest import TOKENIZER_FILE, Manifest, check_use
from raydlc.data.pipeline import ProgressFn, Recipe, dataset_key, matches, model_tokenizer, run, trained_tokenizer
from raydlc.data.sources import Source, first_problem, list_source
from raydlc.errors import InputError

DATASETS = "datasets"


@dataclass(frozen=True)
class Plan:
    dest: str
    recipe: Recipe
    model_id: str
    vocab: int  # > 0: a built-in spec, whose BPE of this size is trained on the source
    source: Source | None  # None: `dest` is a prepared dataset the user named
    existing: Manifest | None  # a dataset at `dest` that is used as it is

    @property
    def tokenizer_name(self) -> str:
        return f"bpe-{self.vocab}" if self.vocab else self.model_id


@dataclass(frozen=True)
class Made:
    dest: str
    manifest: Manifest
    tokenizer: TokenizerSpec
    reused: bool


def plan(data: str | None, *, out: str | None, storage_root: str, model_id: str, vocab: int, recipe: Recipe) -> Plan:
    """What preparing will do; every problem found without Ray is an `InputError` now."""
    found = S.read_manifest(data) if data is not None else None
    if data is not None and found is not None:
        if out is not None:
            raise InputError(f"{data} is already a prepared dataset", hint=f"train on it: raydlc train --data {data}")
        check_use(found, data, seq_len=recipe.seq_len, tokenizer=None)
        S.verify(data, found)
        return Plan(data, recipe, model_id, vocab, None, found)
    source = list_source(data)
    if recipe.on_bad_record == "fail" and (problem := first_problem(source)):
        raise InputError(f"--data {problem}", hint="fix the record, or pass --on-bad-record skip to count and leave it out")
    p = Plan("", recipe, model_id, vocab, source, None)
    dest = out or storage.join(storage_root, DATASETS, dataset_key(source, p.tokenizer_name, recipe))
    found = S.read_manifest(dest)
    return Plan(dest, recipe, model_id, vocab, source, found if found is not None and matches(found, source, p.tokenizer_name, recipe) else None)


def make(p: Plan, *, on_progress: ProgressFn | None = None) -> Made:
    """The dataset (prepared now on the connected Ray, or found) and its tokenizer, checked for this run."""
    if p.existing is None:
        assert p.source is not None
        tok = trained_tokenizer(p.source, p.vocab) if p.vocab else model_tokenizer(p.model_id, p.recipe.chat_template)
        return Made(p.dest, run(p.source, tok, p.dest, p.recipe, on_progress=on_progress), tok, False)
    m = p.existing
    if p.source is not None:  # found again under the run's storage: checked here (a named dataset was, in `plan`)
        check_use(m, p.dest, seq_len=p.recipe.seq_len, tokenizer=None)
        S.verify(p.dest, m)
    if p.vocab:
        tok = _dataset_tokenizer(p.dest, m)
    else:
        tok = model_tokenizer(p.model_id, p.recipe.chat_template)
        check_use(m, p.dest, seq_len=p.recipe.seq_len, tokenizer=tok.identity())
    return Made(p.dest, m, tok, True)


def _dataset_tokenizer(dest: str, m: Manifest) -> TokenizerSpec:
    """The tokenizer a built-in spec trains with: the one trained for the dataset, or the model's it was made with."""
    import pyarrow.fs as pafs

    from raydlc.data.encode import digest

    fs, root = storage.filesystem(dest)
    t = m.tokenizer
    if fs.get_file_info(f"{root}/{TOKENIZER_FILE}").type != pafs.FileType.File:
        return TokenizerSpec(t["name"], t["sha256"], t["eos_id"], t["vocab_size"], pretrained=t["name"], template=m.chat_template)
    text = storage.read_text(storage.join(dest, TOKENIZER_FILE))
    if digest(text) != t["sha256"]:
        raise InputError(f"--data {dest}: {TOKENIZER_FILE} is not the tokenizer the manifest names (sha256 differs)", hint="prepare the dataset again")
    return TokenizerSpec(t["name"], t["sha256"], t["eos_id"], t["vocab_size"], tokenizer_json=text)


def tokenizer_of(dest: str, m: Manifest) -> Any:
    """Something with `decode(ids)` for the dataset's tokens: its own tokenizer.json, or the model's."""
    t = _dataset_tokenizer(dest, m)
    if t.tokenizer_json is not None:
        from tokenizers import Tokenizer

        return Tokenizer.from_str(t.tokenizer_json)
    from raydlc.train.tokenizer import load_pretrained_tokenizer

    return load_pretrained_tokenizer(t.name)


@dataclass(frozen=True)
class TrainData:
    """A worker's view of the dataset: where the shards are, their rows, and the held-out rows."""

    dest: str
    seq_len: int
    shard_rows: tuple[int, ...]
    shard_names: tuple[str, ...]
    eval_rows: tuple[int, ...]
    digest: str

    @classmethod
    def of(cls, made: Made, *, eval_fraction: float, world_size: int, seed: int) -> TrainData:
        m = made.manifest
        held = eval_rows(m.rows, eval_fraction=eval_fraction, world_size=world_size, seed=seed)
        return cls(made.dest, m.seq_len, tuple(s.rows for s in m.shards), tuple(s.name for s in m.shards), tuple(held.tolist()), m.digest)

    @property
    def rows(self) -> int:
        return sum(self.shard_rows)

    @property
    def n_eval(self) -> int:
        return len(self.eval_rows)

    @property
    def n_train(self) -> int:
        return self.rows - self.n_eval

    def open(self) -> S.Rows:
        return S.Rows(self.dest, list(self.shard_rows), list(self.shard_names), self.seq_len)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainData:
        return cls(d["dest"], int(d["seq_len"]), tuple(d["shard_rows"]), tuple(d["shard_names"]), tuple(d["eval_rows"]), d["digest"])
