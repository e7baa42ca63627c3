"""The `data` use cases: prepare a dataset once (Ray Data) and look inside one, as `raydlc data prepare|show` do."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from raydlc.api._config import CALLABLE, PATH, argument, load
from raydlc.config import flags

# The settings `data prepare` takes: the model (its tokenizer), the block length and what carries the loss.
OPTIONS = [flags.option(env) for env in ("MODEL_ID", "SEQ_LEN", "LOSS_ON", "ON_BAD_RECORD", "CHAT_TEMPLATE")]


@dataclass(frozen=True)
class PreparedDataset:
    """A prepared (or found again) dataset and its manifest; `to_dict()` is `raydlc data prepare --json`."""

    dest: str
    reused: bool
    rows: int
    seq_len: int
    tokens: int
    loss_share: float  # of the tokens in the blocks, the share that carries the loss
    records_per_s: float | None  # None when reused
    tokens_per_s: float | None
    wall_s: float
    manifest: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DatasetShown:
    """A prepared dataset's manifest, token counts and decoded examples; `to_dict()` is `raydlc data show --json`."""

    dest: str
    rows: int
    tokens: int
    loss_tokens: int
    loss_share: float
    examples: list[str]  # decoded blocks; the parts without loss between ⟦ and ⟧
    manifest: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def data_prepare(
    source: str | None,
    *,
    out: str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | None = None,
    settings: Mapping[str, Any] | None = None,
    address: str | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    **named: Any,
) -> PreparedDataset:
    """Turn documents into packed blocks with a manifest, with Ray Data over every CPU Ray has.

    `source` is a .jsonl/.parquet/.txt file, a directory of them or an s3:// prefix (None: the
    bundled corpus); records hold `text`, `prompt`/`response` (or `completion`), `messages` or
    ShareGPT `conversations`. `out` is where the shards and manifest go (default: under
    `--out`/STORAGE_PATH in `datasets/<key>`, where `raydlc train --data SOURCE` finds it again).
    The keyword arguments are `raydlc data prepare`'s flags (`model`, `seq_len`, `loss_on`,
    `on_bad_record`, `chat_template`), with the local-run defaults; `address` joins a running
    Ray cluster. `on_progress` receives `{"records", "tokens", "elapsed_s"}` as batches are packed.

    Example:
        >>> # slow: it starts a local Ray for Ray Data
        >>> import json, pathlib, tempfile
        >>> import raydlc.api as api
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> rows = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
        ...                       {"role": "assistant", "content": f"{2 * i}."}]} for i in range(400)]
        >>> _ = (d / "chat.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
        >>> ds = api.data_prepare(str(d / "chat.jsonl"), out=str(d / "prepared"), seq_len=64)
        >>> ds.reused, ds.seq_len, ds.manifest["counts"]["records_used"], 0 < ds.loss_share < 0.5
        (False, 64, 400, True)
    """
    from raydlc import storage
    from raydlc.data import dataset
    from raydlc.data.pipeline import Recipe
    from raydlc.edges import ray_runtime
    from raydlc.errors import InputError
    from raydlc.train import launch
    from raydlc.train import resolve as R
    from raydlc.train.prepare import DEFAULT_OUT

    argument("source", source, PATH, "a path or s3:// URI of the documents (None: the bundled corpus)")
    argument("out", out, PATH, "a folder path or s3:// URI")
    argument("address", address, (str,), "a Ray head's host:port as text")
    argument("on_progress", on_progress, CALLABLE, "a function taking each progress record (a dict)")
    if source is not None and not os.fspath(source).strip():
        raise InputError("SOURCE is empty: it names the documents to prepare",
                         hint="give a .jsonl/.parquet/.txt file, a folder of them, an s3:// prefix, or 'bundled'")
    if out is not None and not os.fspath(out).strip():
        raise InputError("--out is empty: it names the folder the dataset is written to", hint="e.g. --out prepared")
    if address:  # Ray reads the token from the same places: a token no header can carry fails here, unshown
        from raydlc.jobs.targets import address_token

        address_token()
    cfg = load(config, settings, **flags.named_settings(OPTIONS, named, caller="data_prepare"))
    request = launch.settings(cfg, local=True)
    R.check_seq_len(request.seq_len)  # prepared blocks of one token would be refused by `train` later
    builtin, model = R.model_source(request)
    vocab = min(model.vocab_size, 4096) if builtin and model else 0
    recipe = Recipe(request.seq_len, request.loss_on, request.chat_template, request.on_bad_record)
    root = storage.resolve(request.storage_path or DEFAULT_OUT)
    target = None if out is None else storage.resolve(os.fspath(out))
    if target is not None and (why := storage.uri_problem(target)):  # before the source is read
        raise InputError(f"--out {target}: {why}")
    plan = dataset.plan(source, out=target, storage_root=root, model_id=request.model_id, vocab=vocab, recipe=recipe)
    t0 = time.perf_counter()
    with dataset.writing(plan), ray_runtime.connected(address, log_to_driver=False):
        made = dataset.make(plan, on_progress=on_progress)
    wall = time.perf_counter() - t0
    m, c = made.manifest, made.manifest.counts
    fresh = not made.reused
    return PreparedDataset(
        made.dest, made.reused, m.rows, m.seq_len, c.tokens, c.loss_tokens / max(c.tokens, 1),
        c.records_read / wall if fresh else None, (c.tokens + c.tail_tokens_dropped) / wall if fresh else None, wall, m.to_dict(),
    )


def data_show(dest: str | os.PathLike[str], *, examples: int = 3) -> DatasetShown:
    """A prepared dataset's manifest, its token count, the share that carries the loss, and decoded blocks.

    The shards' checksums are verified first; in each example the tokens without loss are
    shown between ⟦ and ⟧.

    Example:
        >>> # slow: it prepares the bundled corpus on a local Ray first
        >>> import tempfile
        >>> import raydlc.api as api
        >>> d = tempfile.mkdtemp()
        >>> _ = api.data_prepare(None, out=d + "/bundled", seq_len=64)
        >>> shown = api.data_show(d + "/bundled")
        >>> shown.loss_share, len(shown.examples), shown.manifest["source"]["spec"]
        (1.0, 3, 'bundled')
    """
    from raydlc.data import dataset
    from raydlc.data import shards as S
    from raydlc.data.sources import refuse_hub
    from raydlc.errors import InputError

    argument("dest", dest, PATH, "a prepared dataset's folder path or s3:// URI", optional=False)
    argument("examples", examples, (int,), "a whole number of blocks to decode")
    where = os.fspath(dest)
    if not where.strip():
        raise InputError("DEST is empty: it names the prepared dataset to show", hint="give its folder or s3:// prefix, e.g. raydlc data show raydlc-out/datasets/<key>")
    refuse_hub(where)
    m = S.read_manifest(where)
    if m is None:
        dataset.refuse_unfinished(where, "data show")
        if os.path.isfile(where):
            raise InputError(f"{where} is a file, not a prepared dataset (a folder with manifest.json)",
                             hint=f"prepare it first: raydlc data prepare {where} --out DEST, then: raydlc data show DEST")
        raise InputError(f"{where}: no prepared dataset here (no manifest.json)", hint=f"prepare one: raydlc data prepare SOURCE --out {where}")
    dataset.check_whole(where, m)
    tok = dataset.tokenizer_of(where, m)
    rows = S.Rows.open(where, m)
    picks = [int(i) for i in sorted({0, len(rows) // 2, len(rows) - 1})][:examples]
    ids, labels = rows.take(picks)
    c = m.counts
    return DatasetShown(where, m.rows, c.tokens, c.loss_tokens, c.loss_tokens / max(c.tokens, 1),
                        [_decoded(tok, a, b) for a, b in zip(ids, labels)], m.to_dict())


def _decoded(tok: Any, ids: Any, labels: Any) -> str:
    """A block as text, its runs without loss between ⟦ and ⟧."""
    from raydlc.data.encode import IGNORE

    out: list[str] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or (labels[i] == IGNORE) != (labels[start] == IGNORE):
            text = tok.decode([int(t) for t in ids[start:i]], skip_special_tokens=False)
            out.append(f"⟦{text}⟧" if labels[start] == IGNORE else text)
            start = i
    return "".join(out)


# Introspection shows every flag as a keyword argument, though the function takes them as **named.
data_prepare.__signature__ = inspect.signature(data_prepare).replace(  # type: ignore[attr-defined]
    parameters=[p for p in inspect.signature(data_prepare).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    + flags.signature(OPTIONS)
)
