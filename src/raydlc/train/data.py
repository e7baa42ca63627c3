"""Training data in one process: the bundled corpus, the data order, and the in-driver packing.

Runs read prepared datasets (raydlc.data: Ray Data packs them, workers read rows by index);
`read_local`, `pack` and `split` are the in-driver path they replaced, kept as the reference the
prepared blocks are tested against bit for bit. `global_batch`/`rank_slice` depend on the step and
the global batch, not on the number of workers: 1 worker × 2B sequences and 2 workers × B see the
same tokens.

The bundled corpus is real English: the docstrings of the Python standard library, parsed
(never imported) from the running interpreter's source files, in a fixed order.
"""

from __future__ import annotations

import ast
import json
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydlc.errors import InputError

IGNORE = -100
BUNDLED = "bundled"
_SKIP_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__", "turtledemo"})
_MIN_DOC_CHARS = 40


@dataclass(frozen=True)
class Document:
    """One training example. `prompt` is context the loss ignores; `text` is learned."""

    text: str
    prompt: str = ""


# ---- sources -------------------------------------------------------------------------------


def bundled_corpus(max_chars: int = 2_000_000) -> list[Document]:
    """Docstrings of the standard library: real prose and code, present on every Python install."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts))
    docs: list[Document] = []
    seen: set[str] = set()
    total = 0
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < _MIN_DOC_CHARS or doc in seen:
                continue
            seen.add(doc)
            docs.append(Document(doc))
            total += len(doc)
            if total >= max_chars:
                return docs
    if not docs:  # pragma: no cover - a Python without its sources
        raise InputError(
            f"no standard-library sources under {root} to build the bundled corpus from",
            hint="pass --data with a .txt or .jsonl file",
        )
    return docs


def is_local(data: str) -> bool:
    """A path (existing or meant to be) rather than a Hugging Face dataset id."""
    p = Path(data).expanduser()
    return p.exists() or data.startswith((".", "/", "~")) or p.suffix.lower() in (".txt", ".jsonl", ".json") or "\\" in data


def read_local(path: str | Path) -> list[Document]:
    """A .txt/.jsonl file, or a directory of them; every problem names the file and line."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"--data {p}: no such file or directory", hint="pass a .txt/.jsonl file or a directory of them")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in (".txt", ".jsonl"))
        if not files:
            raise InputError(f"--data {p}: the directory holds no .txt or .jsonl files")
    else:
        files = [p]
    docs: list[Document] = []
    for f in files:
        docs.extend(_read_file(f))
    if not docs:
        raise InputError(f"--data {p}: no text in it", hint="the file(s) are empty or hold only whitespace")
    return docs


def _read_file(f: Path) -> list[Document]:
    suffix = f.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise InputError(f"--data {f}: unsupported file type {suffix or '(none)'!r}", hint="use .txt (plain text) or .jsonl")
    try:
        text = f.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"--data {f}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise InputError(f"--data {f}: cannot read it ({e.strerror or e})") from e
    if not text.strip():
        raise InputError(f"--data {f}: the file is empty", hint="give it some text, or remove it")
    if suffix == ".txt":
        return [Document(text)]
    return [_jsonl_record(f, n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _jsonl_record(f: Path, n: int, line: str) -> Document:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"--data {f}:{n}: not valid JSON ({e.msg})") from e
    hint = 'each line must be {"text": ...} or {"prompt": ..., "response": ...} with string values'
    if not isinstance(rec, dict):
        raise InputError(f"--data {f}:{n}: expected a JSON object, got {type(rec).__name__}", hint=hint)
    if "prompt" in rec or "response" in rec:
        prompt, response = rec.get("prompt"), rec.get("response")
        if not isinstance(prompt, str) or not isinstance(response, str):
            missing = [k for k in ("prompt", "response") if not isinstance(rec.get(k), str)]
            raise InputError(f"--data {f}:{n}: field(s) {', '.join(missing)} missing or not a string", hint=hint)
        if not response.strip():
            raise InputError(f"--data {f}:{n}: empty response (nothing to learn)", hint=hint)
        return Document(response, prompt=prompt)
    if isinstance(rec.get("text"), str) and rec["text"].strip():
        return Document(rec["text"])
    raise InputError(f"--data {f}:{n}: no 'text' or 'prompt'/'response' fields (found {sorted(rec)})", hint=hint)


def read_hub(dataset_id: str, split: str = "train", max_docs: int | None = None) -> list[Document]:
    """A Hugging Face dataset, on the cluster; needs the `hf` extra and network."""
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as e:
        raise InputError(
            f"--data {dataset_id!r} is not a local file, and Hugging Face datasets are not installed",
            hint="install raydlc[hf] to read a dataset id, or pass a local .txt/.jsonl path",
        ) from e
    try:
        ds = datasets.load_dataset(dataset_id, split=split)
    except Exception as e:  # datasets raises many types for offline/unknown ids
        raise InputError(f"--data {dataset_id!r}: cannot load the dataset ({e})", hint="check the id and the network (HF_HUB_OFFLINE)") from e
    cols = set(ds.column_names)
    docs: list[Document] = []
    for i, rec in enumerate(ds):
        if max_docs is not None and i >= max_docs:
            break
        if {"prompt", "response"} <= cols:
            docs.append(Document(str(rec["response"]), prompt=str(rec["prompt"])))
        elif "text" in cols:
            docs.append(Document(str(rec["text"])))
        else:
            raise InputError(f"--data {dataset_id!r}: no 'text' or 'prompt'/'response' columns (has {sorted(cols)})")
    if not docs:
        raise InputError(f"--data {dataset_id!r}: the {split} split is empty")
    return docs


def load_documents(data: str | None) -> list[Document]:
    if data is None or data == BUNDLED:
        return bundled_corpus()
    return read_local(data) if is_local(data) else read_hub(data)


# ---- packing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Packed:
    """Fixed-length blocks; `labels` is `IGNORE` where the loss must not look (prompts)."""

    input_ids: np.ndarray  # [n, seq_len] int32
    labels: np.ndarray  # [n, seq_len] int32

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def take(self, idx: Sequence[int] | np.ndarray) -> Packed:
        idx = np.asarray(idx, dtype=np.int64)
        return Packed(self.input_ids[idx], self.labels[idx])


def pack(docs: Iterable[Document], encode: Callable[[list[str]], list[list[int]]], eos_id: int, seq_len: int) -> Packed:
    """Concatenate documents with EOS between them and cut into `seq_len` blocks (tail dropped)."""
    docs = list(docs)
    texts = [d.text for d in docs]
    prompts_idx = [i for i, d in enumerate(docs) if d.prompt]
    text_ids = encode(texts)
    prompt_ids = dict(zip(prompts_idx, encode([docs[i].prompt for i in prompts_idx]))) if prompts_idx else {}
    ids: list[int] = []
    labels: list[int] = []
    for i, t in enumerate(text_ids):
        p = prompt_ids.get(i, [])
        ids.extend(p)
        labels.extend([IGNORE] * len(p))
        ids.extend(t)
        labels.extend(t)
        ids.append(eos_id)
        labels.append(eos_id)
    n = len(ids) // seq_len
    a = np.asarray(ids[: n * seq_len], dtype=np.int32).reshape(n, seq_len)
    b = np.asarray(labels[: n * seq_len], dtype=np.int32).reshape(n, seq_len)
    return Packed(a, b)


@dataclass(frozen=True)
class Split:
    train: Packed
    eval: Packed


def split(packed: Packed, *, eval_fraction: float, world_size: int, seed: int, max_eval: int = 64) -> Split:
    """Hold out a deterministic random set of blocks; the eval set is a multiple of the world size."""
    n = len(packed)
    n_eval = min(max_eval, max(world_size, round(n * eval_fraction)))
    n_eval -= n_eval % world_size
    perm = np.random.default_rng(seed).permutation(n)
    return Split(train=packed.take(np.sort(perm[n_eval:])), eval=packed.take(np.sort(perm[:n_eval])))


def check_size(s: Split, *, global_batch: int, seq_len: int, world_size: int) -> None:
    """Enough blocks for one global batch and one eval block per rank, else a clear error."""
    check_count(n_train=len(s.train), n_eval=len(s.eval), global_batch=global_batch, seq_len=seq_len, world_size=world_size)


def check_count(*, n_train: int, n_eval: int, global_batch: int, seq_len: int, world_size: int) -> None:
    need = global_batch + world_size
    have = n_train + n_eval
    if n_train < global_batch or n_eval < world_size:
        raise InputError(
            f"the data gives {have} sequences of {seq_len} tokens; this run needs at least {need} "
            f"(one global batch of {global_batch} plus one eval sequence per worker)",
            hint="add data, or lower --seq-len, the batch size, GRAD_ACCUM or --workers",
        )


# ---- order and sharding ---------------------------------------------------------------------


def global_batch(step: int, n_train: int, global_size: int, seed: int) -> np.ndarray:
    """Block indices of optimizer step `step` (1-based): a fresh permutation each epoch.

    A pure function of the step, so a run resumed at step k reads exactly what an
    uninterrupted run reads at step k; the only data position to save is the step.
    """
    per_epoch = n_train // global_size
    epoch, within = divmod(step - 1, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n_train)
    return perm[within * global_size : (within + 1) * global_size]


def rank_slice(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank r's contiguous, disjoint share of a global batch."""
    if len(indices) % world_size:
        raise ValueError(f"global batch of {len(indices)} does not divide over {world_size} ranks")
    per = len(indices) // world_size
    return indices[rank * per : (rank + 1) * per]


def eval_slice(n_eval: int, rank: int, world_size: int) -> np.ndarray:
    """Every rank evaluates the same number of blocks (FSDP needs equal collective counts)."""
    per = n_eval // world_size
    return np.arange(rank * per, (rank + 1) * per)


def to_arrays(p: Packed) -> dict[str, Any]:
    return {"input_ids": p.input_ids, "labels": p.labels}
