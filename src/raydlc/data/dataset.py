"""A run's dataset, decided before Ray starts and made (or found again) once Ray is up.

`plan` looks at what `--data` names without starting anything: a prepared dataset (it has a
manifest), or a source to prepare into `--out` (`data prepare`) or into the run's storage under
`datasets/<key>`, where a matching dataset already there is reused: same source fingerprint,
tokenizer and recipe. `make` runs the Ray Data preparation where needed, checks the manifest and
every shard's checksum, and returns the dataset with its tokenizer. `TrainData` is what a
worker receives: where the rows are and which are eval, never the rows themselves.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raydlc import storage
from raydlc.data import shards as S
from raydlc.data.corpus import BUNDLED
from raydlc.data.encode import TokenizerSpec
from raydlc.data.manifest import TOKENIZER_FILE, Manifest, check_use
from raydlc.data.order import eval_rows
from raydlc.data.pipeline import ProgressFn, Recipe, dataset_key, matches, model_tokenizer, run, trained_tokenizer
from raydlc.data.sources import Source, first_problem, list_source, refuse_hub
from raydlc.edges.storage import filesystem, read_text
from raydlc.errors import InputError

DATASETS = "datasets"


@dataclass(frozen=True)
class DatasetPlan:
    """What `make` will do, decided before Ray starts: where the dataset goes, from which source, or which one is used as it is."""

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


def plan(data: str | None, *, out: str | None, storage_root: str, model_id: str, vocab: int, recipe: Recipe) -> DatasetPlan:
    """What preparing will do; every problem found without Ray is an `InputError` now."""
    refuse_hub(data)
    found = S.read_manifest(data) if data is not None else None
    if data is not None and found is None:
        refuse_unfinished(data, "--data")
    if data is not None and found is not None:
        if out is not None:
            raise InputError(f"{data} is already a prepared dataset", hint=f"train on it: raydlc train --data {data}")
        check_use(found, data, seq_len=recipe.seq_len, tokenizer=None)
        check_recipe(found, data, recipe)
        check_whole(data, found)
        return DatasetPlan(data, recipe, model_id, vocab, None, found)
    source = list_source(data)
    if recipe.on_bad_record == "fail" and (problem := first_problem(source)):
        raise InputError(f"--data {problem}", hint="fix the record, or pass --on-bad-record skip to count and leave it out")
    p = DatasetPlan("", recipe, model_id, vocab, source, None)
    dest = out or storage.join(storage_root, DATASETS, dataset_key(source, p.tokenizer_name, recipe))
    found = _manifest_or_none(dest)
    if found is not None and matches(found, source, p.tokenizer_name, recipe):
        return DatasetPlan(dest, recipe, model_id, vocab, source, found)
    check_dest(dest, source, "--out" if out is not None else "the dataset folder")
    return DatasetPlan(dest, recipe, model_id, vocab, source, None)


# ---- where a dataset is written: only into a folder raydlc made, by one writer at a time -----------

LOCK = ".raydlc-dataset.lock"  # the one writer holds it; it stays behind as the sign that raydlc writes here
_OURS = re.compile(r"(manifest\.json(\.part)?|tokenizer\.json|shard-\d{5}\.bin|\.raydlc-dataset\.lock)")


def _manifest_or_none(dest: str) -> Manifest | None:
    """The manifest at `dest` when it is a usable one of raydlc's; a foreign or broken one is None."""
    try:
        return S.read_manifest(dest)
    except InputError:
        return None


def check_dest(dest: str, source: Source, flag: str) -> None:
    """`dest` may receive a dataset: a new or empty folder, or one raydlc prepared (its manifest or lock
    says so), not the source, and writable; checked before Ray starts, each refusal naming the path."""
    if storage.is_uri(dest):
        return
    from raydlc.edges.files import check_output_dir

    p = Path(dest)
    src = None if source.spec == BUNDLED or storage.is_uri(source.spec) else Path(source.spec).expanduser().resolve()
    if src is not None and (p == src or p in src.parents):
        raise InputError(f"{flag} {dest}: {'is the source itself' if p == src else 'holds the source'}; the dataset goes elsewhere",
                         hint="pass a new folder, e.g. --out prepared")
    if p.exists() and not p.is_dir():
        raise InputError(f"{flag} {dest}: exists and is not a directory", hint="pass a new or empty folder")
    names = sorted(os.listdir(p)) if p.is_dir() else []
    foreign = [n for n in names if not _OURS.fullmatch(n)]
    ours = LOCK in names or ("manifest.json" in names and _manifest_or_none(dest) is not None)
    if foreign or (names and not ours):
        shown = ", ".join((foreign or names)[:3]) + (", …" if len(foreign or names) > 3 else "")
        raise InputError(f"{flag} {dest}: holds files raydlc did not write ({shown}); a dataset is written only into a new or empty folder",
                         hint="pass a new folder, e.g. --out prepared")
    check_output_dir(p, flag)


def refuse_unfinished(data: str, flag: str) -> None:
    """A folder raydlc was preparing a dataset in and did not finish (no manifest yet) is named as such."""
    if storage.is_uri(data) or not Path(data).is_dir():
        return
    names = set(os.listdir(data))
    if LOCK in names or any(_OURS.fullmatch(n) and n.startswith("shard-") for n in names):
        raise InputError(f"{flag} {data}: a dataset raydlc did not finish preparing (no manifest.json: interrupted, or being written now)",
                         hint=f"prepare it again: raydlc data prepare SOURCE --out {data}")


@contextmanager
def writing(p: DatasetPlan) -> Iterator[None]:
    """Hold the dataset folder's lock while `make` writes it: a second writer is refused at once, naming the
    folder. A folder made here and left holding nothing but the lock is removed when the block fails."""
    if p.existing is not None or storage.is_uri(p.dest):
        yield
        return
    from filelock import FileLock, Timeout

    d = Path(p.dest)
    missing = [a for a in (d, *d.parents) if not a.exists()]  # made here, and removed again if the block fails
    made = bool(missing)
    d.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(d / LOCK))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise InputError(f"{p.dest}: another raydlc is preparing a dataset there now (it holds {LOCK})",
                         hint="wait for it to finish; the same dataset is then found and reused") from None
    try:
        yield
    except BaseException:
        if made and set(os.listdir(d)) <= {LOCK}:
            lock.release()
            shutil.rmtree(d, ignore_errors=True)
            for a in missing[1:]:
                with suppress(OSError):
                    a.rmdir()  # only when empty
        raise
    finally:
        if lock.is_locked:
            lock.release()


def check_recipe(m: Manifest, where: str, recipe: Recipe) -> None:
    """A prepared dataset's tokens and loss mask are fixed: LOSS_ON or CHAT_TEMPLATE asked (set to other than its
    default) and other than the dataset was prepared with is refused, not silently ignored."""
    from raydlc.config import FIELDS

    for name, flag, asked, made in (("LOSS_ON", "--loss-on", recipe.loss_on, m.loss_on),
                                    ("CHAT_TEMPLATE", "--chat-template", recipe.chat_template, m.chat_template)):
        if asked != FIELDS[name].default and asked != made:
            raise InputError(f"--data {where} was prepared with {flag} {made}; this run asks {flag} {asked}, which a prepared "
                             "dataset cannot change (its tokens and loss mask are made)",
                             hint=f"prepare the source again: raydlc data prepare SOURCE {flag} {asked}, and train on that")


def make(p: DatasetPlan, *, on_progress: ProgressFn | None = None) -> Made:
    """The dataset (prepared now on the connected Ray, or found) and its tokenizer, checked for this run."""
    if p.existing is None:
        assert p.source is not None
        tok = trained_tokenizer(p.source, p.vocab) if p.vocab else model_tokenizer(p.model_id, p.recipe.chat_template)
        return Made(p.dest, run(p.source, tok, p.dest, p.recipe, on_progress=on_progress), tok, False)
    m = p.existing
    if p.source is not None:  # found again under the run's storage: checked here (a named dataset was, in `plan`)
        check_use(m, p.dest, seq_len=p.recipe.seq_len, tokenizer=None)
        check_whole(p.dest, m)
    if p.vocab:
        tok = _dataset_tokenizer(p.dest, m)
    else:
        tok = model_tokenizer(p.model_id, p.recipe.chat_template)
        check_use(m, p.dest, seq_len=p.recipe.seq_len, tokenizer=tok.identity())
    return Made(p.dest, m, tok, True)


_TRAINED = re.compile(r"bpe-\d+")  # the name of a tokenizer trained for the dataset (pipeline.trained_tokenizer)


def check_whole(dest: str, m: Manifest) -> None:
    """The dataset is all there: every shard by size and checksum, and the tokenizer trained for it (a name that
    is no model's: without its tokenizer.json it would be looked up on the Hub), by its checksum."""
    S.verify(dest, m)
    if _TRAINED.fullmatch(str(m.tokenizer.get("name"))):
        _dataset_tokenizer(dest, m)


def _dataset_tokenizer(dest: str, m: Manifest) -> TokenizerSpec:
    """The tokenizer a built-in spec trains with: the one trained for the dataset, or the model's it was made with."""
    import pyarrow.fs as pafs

    from raydlc.data.encode import digest

    fs, root = filesystem(dest)
    t = m.tokenizer
    if fs.get_file_info(f"{root}/{TOKENIZER_FILE}").type != pafs.FileType.File:
        if _TRAINED.fullmatch(str(t["name"])):
            raise InputError(f"--data {dest}: {TOKENIZER_FILE} is missing (the manifest names {t['name']}, the tokenizer trained for this dataset)",
                             hint="prepare the dataset again")
        return TokenizerSpec(t["name"], t["sha256"], t["eos_id"], t["vocab_size"], pretrained=t["name"], template=m.chat_template)
    text = read_text(storage.join(dest, TOKENIZER_FILE))
    if digest(text) != t["sha256"]:
        raise InputError(f"--data {dest}: {TOKENIZER_FILE} is not the tokenizer the manifest names (sha256 differs)", hint="prepare the dataset again")
    return TokenizerSpec(t["name"], t["sha256"], t["eos_id"], t["vocab_size"], tokenizer_json=text)


def tokenizer_of(dest: str, m: Manifest) -> Any:
    """Something with `decode(ids)` for the dataset's tokens: its own tokenizer.json, or the model's."""
    t = _dataset_tokenizer(dest, m)
    if t.tokenizer_json is not None:
        from tokenizers import Tokenizer

        return Tokenizer.from_str(t.tokenizer_json)
    from raydlc.data.tokenizer import load_pretrained_tokenizer

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
    documents: bool = True  # the shards record each token's document (False: a dataset of the older format)

    @classmethod
    def of(cls, made: Made, *, eval_fraction: float, world_size: int, seed: int) -> TrainData:
        m = made.manifest
        held = eval_rows(m.rows, eval_fraction=eval_fraction, world_size=world_size, seed=seed)
        return cls(made.dest, m.seq_len, tuple(s.rows for s in m.shards), tuple(s.name for s in m.shards), tuple(held.tolist()), m.digest, m.documents)

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
        return S.Rows(self.dest, list(self.shard_rows), list(self.shard_names), self.seq_len, 3 if self.documents else 2)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainData:
        return cls(d["dest"], int(d["seq_len"]), tuple(d["shard_rows"]), tuple(d["shard_names"]), tuple(d["eval_rows"]), d["digest"],
                   bool(d.get("documents", True)))
