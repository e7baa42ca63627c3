"""What the driver prepares before any worker starts: the model's source, the packed data and its
tokenizer, the storage and the checkpoint to continue.

`Prepared` holds facts about the inputs, none of the settings: those are resolved once, into the
RunSpec (train.resolve). Every bad input fails here with its own message, before Ray starts a
worker: the rules are train.resolve's, checked on the step as requested; `resolve` checks them
again on the step Ray's grant decides.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc import storage
from raydlc.errors import CheckpointError, InputError

if TYPE_CHECKING:
    from raydlc.config import TrainConfig
    from raydlc.models import ModelSpec
    from raydlc.train.checkpoint import Manifest
    from raydlc.train.launch import Target
    from raydlc.train.tokenizer import TokenizerInfo

DEFAULT_OUT = "raydlc-out"


def new_run_name() -> str:
    t = time.time()
    return time.strftime("run-%Y%m%d-%H%M%S", time.gmtime(t)) + f"-{int(t * 1e6) % 1_000_000:06d}"


@dataclass(frozen=True)
class Prepared:
    """The driver's facts about a run's inputs, made once and passed on unchanged."""

    builtin: str | None  # a built-in spec (random init), or None: from_pretrained(MODEL_ID)
    model: ModelSpec | None  # the architecture, when known
    arrays: dict[str, Any]  # the packed train and eval blocks, for Ray's object store
    tokenizer: TokenizerInfo
    storage: str  # STORAGE_PATH, resolved
    run_name: str
    resume_from: str | None
    n_train: int
    n_eval: int
    data_digest: str
    resume_meta: dict[str, Any] | None = None


def prepare(train: TrainConfig, where: Target | None = None, *, workers: int | None = None) -> Prepared:
    """Check and build everything the workers need; raises `InputError`/`CheckpointError`.

    `workers` is the world size the eval split is made for, when NUM_WORKERS=0 was resolved from
    the cluster's GPUs. A local Ray is one node, so there the layout is checked now, before Ray
    starts.
    """
    from raydlc.train import data as D
    from raydlc.train import resolve as R
    from raydlc.train import tokenizer as T

    world = train.num_workers if workers is None else workers
    R.check_request(train, world)
    builtin, model = R.model_source(train)
    if where is not None and where.local:
        R.plan_layout(train, [world], model=model, instance_type=None)
    root = storage.resolve(train.storage_path or DEFAULT_OUT)
    resume_from, manifest = _resume_checkpoint(train, root)

    docs = D.load_documents(train.data)
    vocab = min(model.vocab_size, 4096) if builtin and model else 0
    info, tok = T.for_model(train.model_id, [d.text for d in docs], vocab, has_own=builtin is None)
    R.check_tokenizer(info, model)
    packed = D.pack(docs, T.encoder(tok), info.eos_id, train.seq_len)
    if len(packed) == 0:
        raise InputError(f"--data gives fewer than {train.seq_len} tokens: not one sequence", hint="add text or lower --seq-len")
    s = D.split(packed, eval_fraction=train.eval_fraction, world_size=world, seed=train.seed)
    arrays = {
        "train_input_ids": s.train.input_ids,
        "train_labels": s.train.labels,
        "eval_input_ids": s.eval.input_ids,
        "eval_labels": s.eval.labels,
    }
    p = Prepared(
        builtin, model, arrays, info, root, train.run_name or new_run_name(), resume_from, len(s.train), len(s.eval), _digest(arrays),
        manifest.meta if manifest is not None and resume_from is not None else None,
    )
    R.check_data(train if workers is None else train.updated(num_workers=world), p)
    return p


def _digest(arrays: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(arrays[k].tobytes())
    return h.hexdigest()[:16]


def _resume_checkpoint(train: TrainConfig, root: str) -> tuple[str | None, Manifest | None]:
    """The checkpoint to continue from and its manifest, checked before any worker starts.

    Local checkpoints are verified in full; remote ones (s3://…) by manifest and sizes here,
    and by SHA-256 on each worker after its download.
    """
    from raydlc.train import checkpoint as C

    def checked(path: str) -> tuple[str, Manifest]:
        if storage.is_uri(path):
            return path, C.verify_remote(path)
        local = str(Path(path).expanduser().resolve())
        return local, C.verify(local)

    if train.resume_from:
        return checked(train.resume_from)
    if not train.resume:
        return None, None
    found = C.latest(root)
    if found is None:
        raise CheckpointError(f"--resume: no checkpoint under {root}", hint="run once without --resume, or pass --out where the earlier run wrote")
    return checked(found)
