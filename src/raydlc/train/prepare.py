"""What the driver prepares before any worker starts: the model's source, the prepared dataset and
its tokenizer, the storage and the checkpoint to continue.

`Prepared` (train.runspec) holds facts about the inputs, none of the settings: those are resolved
once, into the RunSpec (train.resolve). Every bad input that needs no Ray fails in `check`, before
Ray starts; the dataset is prepared (or found) with Ray Data in `prepare`, before any worker: the
rules are train.resolve's, checked on the step as requested; `resolve` checks them again on the
step Ray's grant decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc import storage
from raydlc.errors import CheckpointError, InputError
from raydlc.train.runspec import Prepared, RunTarget

if TYPE_CHECKING:
    from raydlc.config import TrainConfig
    from raydlc.data.dataset import DatasetPlan
    from raydlc.facts.models import ModelSpec
    from raydlc.train.checkpoint import Manifest

DEFAULT_OUT = "raydlc-out"


def new_run_name() -> str:
    t = time.time()
    return time.strftime("run-%Y%m%d-%H%M%S", time.gmtime(t)) + f"-{int(t * 1e6) % 1_000_000:06d}"


@dataclass(frozen=True)
class Checked:
    """What the driver found before Ray starts: the model's source, the storage, the checkpoint, the data's plan."""

    builtin: str | None
    model: ModelSpec | None
    root: str
    resume_from: str | None
    manifest: Manifest | None
    plan: DatasetPlan
    world: int
    skipped: tuple[str, ...] = ()  # checkpoints newer than the one resumed from, and why each is not whole


def check(train: TrainConfig, where: RunTarget | None = None, *, workers: int | None = None) -> Checked:
    """Every input problem that needs no Ray: raises `InputError`/`CheckpointError`.

    `workers` is the world size the eval split is made for, when NUM_WORKERS=0 was resolved from
    the cluster's GPUs. A local Ray is one node, so there the layout is checked now, before Ray
    starts.
    """
    from raydlc.data import dataset
    from raydlc.data.pipeline import Recipe
    from raydlc.train import resolve as R

    world = train.num_workers if workers is None else workers
    R.check_request(train, world)
    builtin, model = R.model_source(train)
    check_lora(train, model)
    if where is not None and where.local:
        R.plan_layout(train, [world], model=model, instance_type=None)
        R.run_budget(train, where, 1, started_at=0.0, now=0.0)  # a budget with no price fails here, before Ray starts
    root = storage.resolve(train.storage_path or DEFAULT_OUT)
    resume_from, manifest, skipped = _resume_checkpoint(train, root)
    vocab = min(model.vocab_size, 4096) if builtin and model else 0
    recipe = Recipe(train.seq_len, train.loss_on, train.chat_template, train.on_bad_record)
    plan = dataset.plan(train.data, out=None, storage_root=root, model_id=train.model_id, vocab=vocab, recipe=recipe)
    _check_bound(train, plan, world)
    return Checked(builtin, model, root, resume_from, manifest, plan, world, skipped)


def check_lora(train: TrainConfig, model: ModelSpec | None) -> None:
    """LoRA settings that would change nothing: given with LoRA off (LORA_RANK 0), or a rank above a targeted
    projection's smaller side (beyond min(in, out) the update is no longer low-rank, only bigger)."""
    if train.lora_rank == 0:
        given = [n for n, v in (("LORA_ALPHA", train.lora_alpha), ("LORA_TARGETS", train.lora_targets), ("LORA_TARGET_REGEX", train.lora_target_regex),
                                ("LORA_MODULES_TO_SAVE", train.lora_modules_to_save),
                                ("LORA_DROPOUT", train.lora_dropout or None), ("LORA_MERGE", None if train.lora_merge else False)) if v is not None]
        if given:
            raise InputError(f"{', '.join(given)} given while LORA_RANK is 0 (LoRA off, full fine-tuning): they would change nothing",
                             hint="set --lora-rank N to train LoRA adapters, or drop those settings")
        return
    if train.lora_targets and train.lora_target_regex:
        raise InputError("LORA_TARGETS and LORA_TARGET_REGEX both given: the adapter has one target_modules, a list or a pattern",
                         hint="keep one of them")
    if model is None:
        return
    modules = {k.rpartition(".")[0] for k in model.tensor_shapes()}
    unknown = [n for n in train.lora_modules_to_save_list if not any(m == n or m.endswith("." + n) for m in modules)]
    if unknown:
        raise InputError(f"LORA_MODULES_TO_SAVE {unknown[0]!r} names no module of {model.name}",
                         hint="name modules such as embed_tokens or lm_head (the embedding and the head)")
    from raydlc.facts.models import lora_targets_of

    shapes = model.projections()
    targets = lora_targets_of(model, train.lora_targets_list, train.lora_target_regex)
    if not targets:
        raise InputError(f"LORA_TARGET_REGEX {train.lora_target_regex!r} matches no projection of {model.name} (matched whole against "
                         "names such as model.layers.0.self_attn.q_proj)", hint="e.g. .*\\.layers\\.[0-3]\\..*_proj")
    smallest, name = min((min(shapes[t]), t) for t in targets if t in shapes)
    if train.lora_rank > smallest:
        raise InputError(f"--lora-rank {train.lora_rank} is above {name}'s smaller side ({smallest}) in {model.name}: "
                         f"a rank past min(in, out) is no longer low-rank", hint=f"use --lora-rank {smallest} or less")


def prepare(
    train: TrainConfig, where: RunTarget | None = None, *, workers: int | None = None, checked: Checked | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> Prepared:
    """Check, then prepare (or find) the dataset with Ray Data on the Ray this run uses, and split it by index."""
    from raydlc.data import dataset
    from raydlc.data.tokenizer import TokenizerInfo
    from raydlc.edges import ray_runtime
    from raydlc.train import resolve as R

    c = checked or check(train, where, workers=workers)
    if on_progress is not None:
        for why in c.skipped:
            on_progress({"stage": "notice", "text": why})
    address, log, env = (where.address, where.log_to_driver, where.env) if where is not None else (None, True, {})
    with dataset.writing(c.plan), ray_runtime.connected(address, workers=c.world, log_to_driver=log, env=env):
        made = dataset.make(c.plan, on_progress=None if on_progress is None else lambda r: on_progress({"stage": "preparing", **r}))
    if on_progress is not None and train.document_masking and not made.manifest.documents:
        on_progress({"stage": "notice", "text": f"{made.dest} was prepared before documents were recorded: each block is one document "
                                                 "(no document masking); prepare it again to mask"})
    t = made.tokenizer
    info = TokenizerInfo(eos_id=t.eos_id, vocab_size=t.vocab_size, tokenizer_json=t.tokenizer_json, pretrained=t.pretrained,
                         template=t.template)
    R.check_tokenizer(info, c.model)
    data = dataset.TrainData.of(made, eval_fraction=train.eval_fraction, world_size=c.world, seed=train.seed)
    p = Prepared(
        c.builtin, c.model, data, info, c.root, train.run_name or new_run_name(), c.resume_from, data.n_train, data.n_eval, data.digest,
        c.manifest.meta if c.manifest is not None and c.resume_from is not None else None, made.reused,
        c.manifest.step if c.manifest is not None and c.resume_from is not None else None,
    )
    R.check_data(train if workers is None else train.updated(num_workers=c.world), p)
    return p


def _check_bound(train: TrainConfig, plan: DatasetPlan, world: int) -> None:
    """Data that cannot give one global batch is refused before Ray: by its rows when prepared, else by
    the most rows its bytes can give (a tokenizer trained here)."""
    from raydlc.train import resolve as R

    need = R.global_sequences(train.updated(num_workers=world)) + world
    if plan.existing is not None:
        most = plan.existing.rows
    elif plan.vocab and plan.source is not None and plan.source.max_tokens() is not None:
        most = int(plan.source.max_tokens() or 0) // train.seq_len
    else:
        return
    if most < need:
        raise InputError(
            f"the data gives at most {most} sequences of {train.seq_len} tokens; this run needs at least {need} "
            f"(one global batch of {need - world} plus one eval sequence per worker)",
            hint="add data, or lower --seq-len, the batch size, GRAD_ACCUM or --workers",
        )


def _resume_checkpoint(train: TrainConfig, root: str) -> tuple[str | None, Manifest | None, tuple[str, ...]]:
    """The checkpoint to continue from, its manifest and why newer ones were passed over, checked
    before any worker starts.

    `--resume-from` names one checkpoint: anything wrong with it is refused. `--resume` takes the
    newest whole one, passing over saves cut short. Local checkpoints are verified in full;
    remote ones (s3://…) by manifest and sizes here, and by SHA-256 on each worker after its download.
    """
    from raydlc.train import checkpoint as C

    if train.resume_from:
        if not storage.is_uri(train.resume_from) and Path(train.resume_from, C.MANIFEST).is_file():  # nothing to train: said first
            _check_left(train, train.resume_from, C.read_manifest(Path(train.resume_from)))
        path, manifest = C.verified(train.resume_from)
        _check_left(train, path, manifest)
        return path, manifest, ()
    if not train.resume:
        return None, None, ()
    found = C.newest_intact(root, run=train.run_name)
    if found is None:
        where = f"in run {train.run_name} under {root}" if train.run_name else f"under {root}"
        raise CheckpointError(f"--resume: no checkpoint {where}", hint="run once without --resume, or pass --out (and --run-name) where the earlier run wrote")
    _check_left(train, found.path, found.manifest)
    return found.path, found.manifest, tuple(f"--resume passes over {why}" for why in found.skipped)


def _check_left(train: TrainConfig, path: str, manifest: Manifest) -> None:
    """A checkpoint past STEPS leaves nothing to train: said, not run as if it had trained."""
    if manifest.step > train.steps:
        raise InputError(f"checkpoint {path} is at step {manifest.step}, past --steps {train.steps}: nothing to train",
                         hint=f"pass --steps above {manifest.step} to train on from it")
