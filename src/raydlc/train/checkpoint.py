"""Sharded checkpoints (torch.distributed.checkpoint) with a manifest, and the HF export.

Ray Train merges every rank's staged directory into one checkpoint directory in storage, but
the merge is not atomic: a lost upload leaves a directory that looks plausible. So rank 0
writes `raydlc_checkpoint.json` listing every file of every rank with its size and SHA-256,
and `verify` checks all of it before a single tensor is read. A directory without the
manifest, or with a file missing, short or altered, is refused with `CheckpointError`.

A checkpoint holds model + optimizer (DCP shards), and per rank the step (the data
position: the order is a pure function of it) plus RNG states and the metrics so far. Under
LoRA the model part is the adapters only (`model_state`): the frozen base is rebuilt from its
seeded init or the pretrained weights on resume, so a checkpoint is a few percent of a full one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from raydlc import records
from raydlc.errors import CheckpointError

if TYPE_CHECKING:
    import torch
    from torch import nn

MANIFEST = "raydlc_checkpoint.json"
FORMAT = 1
_NAME = re.compile(r"^checkpoint_(\d+)$")
# The files a raydlc checkpoint holds: DCP's metadata and one shard file per rank, and one extras file per rank.
_OURS = re.compile(r"^(\.metadata|__\d+_\d+\.distcp|extra_rank\d+\.pt)$")
# Where checkpoints may come from, said once for every refusal: a checkpoint is read as data, never run.
_DATA_HINT = "resume only from checkpoints raydlc wrote (docs/training.md#where-checkpoints-may-come-from)"


def dir_name(step: int) -> str:
    return f"checkpoint_{step:06d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_digests(directory: Path) -> dict[str, dict[str, Any]]:
    return {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST}


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    files: dict[str, dict[str, Any]]
    meta: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "step": self.step, "world_size": self.world_size, "files": self.files, "meta": self.meta}, indent=1)


class _ManifestFile(records.Record):
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class _ManifestDoc(records.Record):
    format: Literal[1]  # FORMAT
    step: int = Field(ge=0)
    world_size: int = Field(ge=1)
    files: dict[str, _ManifestFile]
    meta: dict[str, Any] = Field(default_factory=dict)


def read_manifest(d: Path) -> Manifest:
    """The manifest of checkpoint `d`, its files not yet checked (`verify` does)."""
    hint = "resume from an earlier checkpoint (--resume-from DIR), or start without --resume"
    mpath = d / MANIFEST
    inner = sorted(c.name for c in d.iterdir() if c.name.startswith("checkpoint_") and c.is_dir()) if not mpath.is_file() else []
    if inner:  # --resume-from the run, not one of its checkpoints
        raise CheckpointError(f"{d} is a run folder, not a checkpoint: pass a checkpoint_* in it, or use --resume",
                              hint=f"e.g. --resume-from {d / inner[-1]}")
    if not mpath.is_file():
        raise CheckpointError(f"checkpoint {d} is partial: it has no {MANIFEST} (the save did not complete)", hint=hint)
    try:
        doc = records.read_json(mpath, _ManifestDoc)
    except records.RecordError as e:
        raise CheckpointError(f"checkpoint {d}: unreadable manifest {MANIFEST}: {e}", hint=hint) from e
    return Manifest(doc.step, doc.world_size, {k: f.model_dump() for k, f in doc.files.items()}, dict(doc.meta))


def verify(directory: str | Path, *, hashes: bool = True) -> Manifest:
    """The manifest of a complete, intact checkpoint; anything else raises `CheckpointError`.
    Without `hashes` only names and sizes are checked: enough to tell a save cut short."""
    d = Path(directory)
    hint = "resume from an earlier checkpoint (--resume-from DIR), or start without --resume"
    if not d.is_dir():
        raise CheckpointError(f"checkpoint {d} does not exist or is not a directory", hint=hint)
    m = read_manifest(d)
    if ".metadata" not in m.files:
        raise CheckpointError(f"checkpoint {d}: the manifest lists no DCP .metadata", hint=hint)
    _check_names(d, m)
    for name, want in sorted(m.files.items()):
        p = d / name
        if not p.is_file():
            raise CheckpointError(f"checkpoint {d} is partial: {name} is missing", hint=hint)
        size = p.stat().st_size
        if size != want["size"]:
            raise CheckpointError(f"checkpoint {d} is corrupt: {name} has {size} bytes, the manifest says {want['size']}", hint=hint)
        if hashes and _sha256(p) != want["sha256"]:
            raise CheckpointError(f"checkpoint {d} is corrupt: {name} does not match its SHA-256 in the manifest", hint=hint)
    if hashes:
        check_data(d, m)
    return m


def _check_names(where: str | Path, m: Manifest) -> None:
    """A manifest listing files raydlc never writes is not raydlc's: refused before anything is read."""
    foreign = sorted(n for n in m.files if not _OURS.match(n))
    if foreign:
        raise CheckpointError(f"checkpoint {where} was not written by raydlc: its manifest lists {', '.join(foreign[:3])}", hint=_DATA_HINT)


def check_data(d: Path, m: Manifest) -> None:
    """Every pickled part of a local checkpoint (DCP's .metadata, each rank's extras) read as plain data:
    one that names anything else (a pickle's code) is refused here, before DCP or torch unpickles it.
    The shards are checked against the .metadata too: a manifest that agrees with cut files cannot hide them."""
    for name in sorted(m.files):
        if name.startswith("extra_rank"):
            load_extra(d, d / name)
    _check_shards(d, m, read_metadata(d))


_CORRUPT_HINT = "the checkpoint's files do not hold what it says: resume from an earlier checkpoint (--resume-from DIR), or start without --resume"


def _check_shards(d: Path, m: Manifest, metadata: Any) -> None:
    """Every tensor DCP's .metadata places in a shard lies inside a file the manifest lists, by its real size."""
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        name, end = getattr(info, "relative_path", None), getattr(info, "offset", 0) + getattr(info, "length", 0)
        if not isinstance(name, str) or name not in m.files:
            raise CheckpointError(f"checkpoint {d} is corrupt: its .metadata places data in {name}, which the manifest does not list",
                                  hint=_CORRUPT_HINT)
        size = (d / name).stat().st_size
        if end > size:
            raise CheckpointError(f"checkpoint {d} is corrupt: {name} has {size} bytes, its .metadata places data up to byte {end}",
                                  hint=_CORRUPT_HINT)


def _first_line(e: BaseException) -> str:
    """An exception as `Type: its first sentence`, cut to 200 characters: a library's words inside raydlc's one line.
    An unpickling error is named only: torch's weights-only refusal goes on to suggest weights_only=False."""
    import pickle

    text = (str(e).strip().splitlines() or [""])[0].split(". ")[0]
    return f"{type(e).__name__}: {text[:200]}" if text and not isinstance(e, pickle.UnpicklingError) else type(e).__name__


def verify_remote(uri: str) -> Manifest:
    """A checkpoint in remote storage, checked without downloading it: the manifest and every
    file's size. The SHA-256s are checked by each worker after its download (`load`)."""
    from raydlc import storage
    from raydlc.edges.storage import file_sizes, read_text

    hint = "resume from an earlier checkpoint (RESUME_FROM), or start without --resume"
    try:
        raw = json.loads(read_text(storage.join(uri, MANIFEST)))
        m = Manifest(int(raw["step"]), int(raw["world_size"]), dict(raw["files"]), dict(raw.get("meta", {})))
        sizes = file_sizes(uri)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {uri} is partial or unreadable: {e}", hint=hint) from e
    for name, want in sorted(m.files.items()):
        if name not in sizes:
            raise CheckpointError(f"checkpoint {uri} is partial: {name} is missing", hint=hint)
        if sizes[name] != want["size"]:
            raise CheckpointError(f"checkpoint {uri} is corrupt: {name} has {sizes[name]} bytes, the manifest says {want['size']}", hint=hint)
    return m


def verified(path: str, *, hashes: bool = True) -> tuple[str, Manifest]:
    """(the checkpoint's path as workers will read it, its manifest): local ones resolved and checked
    in full (or by sizes without `hashes`), remote ones by manifest and sizes."""
    from raydlc import storage

    if storage.is_uri(path):
        return path, verify_remote(path)
    local = str(Path(path).expanduser().resolve())
    return local, verify(local, hashes=hashes)


def candidates(storage_path: str | Path, run: str | None = None) -> list[str]:
    """The checkpoints of run `run` under `storage_path` (a path or a URI), or of the newest run that has
    any, highest step first. Runs are ordered by their recorded start (train.runfolder), never by name.
    `--resume` continues that run, never an older one in its place."""
    from raydlc import storage
    from raydlc.edges.storage import list_dirs
    from raydlc.train.runfolder import newest_first

    root = str(storage_path)
    for name in [run] if run is not None else newest_first(root, list_dirs(root)):
        steps = sorted(((int(m.group(1)), d) for d in list_dirs(storage.join(root, name)) if (m := _NAME.match(d))), reverse=True)
        if steps:
            found = [storage.join(root, name, d) for _step, d in steps]
            return [f if storage.is_uri(f) else str(Path(f)) for f in found]
    return []


def newest_run(storage_path: str) -> str | None:
    """The run `--resume` continues when no --run-name is given: the newest by recorded start that has a checkpoint."""
    found = candidates(storage_path)
    return found[0].rstrip("/").rsplit("/", 2)[-2] if found else None


@dataclass(frozen=True)
class Intact:
    """The newest checkpoint that is whole, and why each newer one was passed over."""

    path: str
    manifest: Manifest
    skipped: tuple[str, ...]


def newest_intact(storage_path: str | Path, *, hashes: bool = True, run: str | None = None) -> Intact | None:
    """What `--resume` continues from: a save cut short (Ctrl-C or a lost node during Ray's upload,
    where every rank copies its own files into the one directory, nothing atomic) leaves the
    manifest beside a short or missing shard, and is passed over. None when there is no checkpoint;
    `CheckpointError` (the newest one's) when none of the newest run's checkpoints is whole."""
    skipped: list[str] = []
    first: CheckpointError | None = None
    for path in candidates(storage_path, run):
        try:
            where, manifest = verified(path, hashes=hashes)
        except CheckpointError as e:
            first = first or e
            skipped.append(e.message)
            continue
        return Intact(where, manifest, tuple(skipped))
    if first is not None:
        raise first
    return None


# ---- staging folders in the temp directory -----------------------------------------------------------
#
# A save stages its shards in the temp directory before Ray takes them, and the export is assembled
# there before it is published. A worker ended mid-save (Ctrl-C, a lost node: Ray kills it) leaves
# its staging folder behind, up to a checkpoint's size. Each folder's name carries its PID, so the
# next worker on that node, and a local run's driver at its end, remove those whose process is gone.

STAGING = ("raydlc-ckpt-", "raydlc-export-", "raydlc-resume-")


def staging_prefix(kind: str, rank: int | None = None) -> str:
    """`raydlc-ckpt-r0-p1234-`: the rank (when one) and the PID of the process whose folder it is."""
    return f"raydlc-{kind}-" + (f"r{rank}-" if rank is not None else "") + f"p{os.getpid()}-"


_STAGED = re.compile(r"^raydlc-(?:ckpt|export|resume)-(?:r\d+-)?p(\d+)-")


def sweep_staging(tmp: str | Path | None = None, *, wait_s: float = 0.0) -> list[Path]:
    """Remove the staging folders of processes that are gone (waiting up to `wait_s` for them to go); returns them."""
    import shutil
    import tempfile

    root = Path(tmp or tempfile.gettempdir())
    try:
        found = [(p, int(m.group(1))) for p in root.iterdir() if (m := _STAGED.match(p.name)) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    deadline = time.monotonic() + wait_s
    while any(_alive(pid) for _p, pid in found) and time.monotonic() < deadline:
        time.sleep(0.1)
    gone = [p for p, pid in found if not _alive(pid)]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, not ours to judge
        return True
    try:  # a zombie (ended, not yet reaped by its parent) is gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


# ---- inside the workers ------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, step: int, rank: int, world_size: int, extra: dict[str, Any], meta: dict[str, Any]) -> None:
    """Collective: every rank writes its shards into its own staging `directory`; rank 0 adds the manifest.

    Staging directories may be different folders (or machines); the manifest lists the union
    of what all ranks wrote, gathered over the process group. The blocking form of `start` + `seal`.
    """
    import torch.distributed.checkpoint as dcp

    directory.mkdir(parents=True, exist_ok=True)
    msd, osd = model_state(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, storage_writer=dcp.FileSystemWriter(str(directory), single_file_per_rank=True))
    _save_extra(directory, step=step, rank=rank, extra=extra)
    seal(directory, file_digests(directory), step=step, rank=rank, world_size=world_size, meta=meta)


def model_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model and optimizer state a checkpoint holds; under LoRA the model's is the adapters
    only (by key: torch's `ignore_frozen_params` alone would still save a tied head)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from raydlc.train.lora import is_adapter_key, is_trained_key, state_name

    msd, osd = get_state_dict(model, optimizer)
    if not any(is_adapter_key(k) for k in msd):
        return msd, osd
    saved = {state_name(n) for n, p in model.named_parameters() if p.requires_grad and not is_adapter_key(n)}  # a tied head once
    return {k: v for k, v in msd.items() if is_trained_key(k, saved)}, osd  # the adapters and LORA_MODULES_TO_SAVE's weights


def lora_differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """How a checkpoint's LoRA settings (its manifest's meta) differ from this run's (`TrainConfig.lora_meta`),
    as `lora_rank: checkpoint 8, now 4`; a checkpoint from before LoRA counts as rank 0."""
    rank_then, rank_now = int(saved.get("lora_rank", 0)), int(now.get("lora_rank", 0))
    if rank_then != rank_now:
        return [f"lora_rank: checkpoint {rank_then}, now {rank_now}"]
    found = [f"{k}: checkpoint {saved.get(k)}, now {now[k]}" for k in ("lora_alpha", "lora_targets") if k in now and saved.get(k) != now[k]]
    for k in ("lora_target_regex", "lora_modules_to_save"):  # absent: targets chosen by name (LORA_TARGETS), no module saved whole
        if saved.get(k) != now.get(k):
            found.append(f"{k}: checkpoint {saved.get(k)}, now {now.get(k)}")
    rs_then, rs_now = bool(saved.get("lora_rslora", False)), bool(now.get("lora_rslora", False))  # absent: off
    return found + ([f"lora_rslora: checkpoint {rs_then}, now {rs_now}"] if rs_then != rs_now else [])


def _save_extra(directory: Path, *, step: int, rank: int, extra: dict[str, Any]) -> None:
    import torch

    torch.save({"step": step, "rank": rank, "rng": rng_state(), **extra}, directory / f"extra_rank{rank}.pt")


def stager(cuda: bool) -> Any:
    """The host copy every asynchronous save of a run stages into, kept from one save to the next.

    DCP's default for `async_save` makes a fresh, unpinned copy of every shard on each save (a
    new StateDictStager per call): on a 2.8 GB checkpoint that allocation was 13.3 s of a 15.5 s
    blocking save. DefaultStager's StateDictStager caches a host storage per device storage
    (torch 2.13 `_state_dict_stager.py`), so from the second save on staging is one copy into
    memory already there; on a GPU that memory is pinned and the copy non-blocking on the
    current stream, then synchronized (torchtitan's `async_with_pinned_mem`). Staging stays
    synchronous: the loop's next update must not race the copy. One save is pending at a time
    (the Saver finishes the previous one first), so a reused buffer is never still being written.
    """
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=cuda))


def start(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, step: int, rank: int, extra: dict[str, Any], group: Any,
          staging: Any = None) -> Future[dict[str, Any]]:
    """Collective: the start of an asynchronous save; a future of this rank's file digests.

    DCP's `async_save` copies this rank's shards to host memory now (the only part the loop
    waits for; into `staging`, the run's cached stager, when given), then writes them in a thread,
    coordinating the ranks over `group`: a gloo group of its own, so the thread's collectives never
    interleave with the training's. A second thread waits for the write and hashes the files, so
    the manifest's SHA-256s cost the loop nothing. Training may change the weights as soon as this
    returns. `seal` finishes the checkpoint.
    """
    import torch.distributed.checkpoint as dcp

    directory.mkdir(parents=True, exist_ok=True)
    _save_extra(directory, step=step, rank=rank, extra=extra)
    msd, osd = model_state(model, optimizer)
    written = dcp.async_save({"model": msd, "optim": osd}, storage_writer=dcp.FileSystemWriter(str(directory), single_file_per_rank=True),
                             process_group=group, async_stager=staging)
    return _HASHER.submit(lambda: (written.result(), file_digests(directory))[1])


_HASHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raydlc-ckpt-hash")  # waits for each write, then hashes its files


def seal(directory: Path, mine: dict[str, Any], *, step: int, rank: int, world_size: int, meta: dict[str, Any]) -> None:
    """Collective: gather every rank's file digests; rank 0 writes the manifest (atomically: a
    directory without it is partial). Call once every rank's files are written."""
    import torch.distributed as dist

    gathered: list[dict[str, Any] | None] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        files: dict[str, dict[str, Any]] = {}
        for part in gathered:
            files.update(part or {})
        manifest = Manifest(step=step, world_size=world_size, files=files, meta={**meta, "saved_at": time.time()})
        tmp = directory / (MANIFEST + ".tmp")
        tmp.write_text(manifest.to_json())
        os.replace(tmp, directory / MANIFEST)


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (with a manifest) directly under
    `root`; never one without a manifest (it may still be arriving). Returns what it deleted.
    For storage raydlc writes itself (torchrun); under Ray Train, CheckpointConfig.num_to_keep."""
    import shutil

    done = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and (p / MANIFEST).is_file())
    old = [p for _, p in done[:-keep]] if keep > 0 else []
    for p in old:
        shutil.rmtree(p)
    return old


def load(directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int, lora: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Verify, then load model + optimizer shards (resharding if the world size changed) and this rank's extras.

    A URI (s3://…) is downloaded to a local folder first, then verified like any other. `lora`:
    this run's LoRA settings (`TrainConfig.lora_meta`); a checkpoint written with others is refused
    naming the field, before any tensor is read.
    """
    import tempfile

    from raydlc import storage
    from raydlc.edges.storage import download

    if storage.is_uri(str(directory)):
        with tempfile.TemporaryDirectory(prefix=staging_prefix("resume", rank)) as tmp:
            return _load_local(download(str(directory), Path(tmp)), model, optimizer, rank=rank, lora=lora)
    return _load_local(Path(directory), model, optimizer, rank=rank, lora=lora)


def _load_local(d: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, rank: int, lora: Mapping[str, Any] | None = None) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    m = verify(d)
    diff = lora_differences(m.meta, lora) if lora is not None else []
    if diff:
        raise CheckpointError(f"checkpoint {d} was written with other LoRA settings ({'; '.join(diff)})",
                              hint="resume with the checkpoint's LORA_RANK, LORA_ALPHA and LORA_TARGETS (or LORA_TARGET_REGEX), or start without --resume")
    msd, osd = model_state(model, optimizer)
    state = {"model": msd, "optim": osd}
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=data_reader(d), planner=data_planner(d))
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:  # a shard garbled behind a manifest that agrees with it: torch's words, in raydlc's line
        cause = _rank_failure(e)
        if isinstance(cause, CheckpointError):
            raise cause from e
        shards = ", ".join(sorted(n for n in m.files if n.endswith(".distcp"))[:4])
        raise CheckpointError(f"checkpoint {d} is corrupt: its shards ({shards}) cannot be read ({_first_line(cause)})",
                              hint=_CORRUPT_HINT) from e
    partial = any(p.requires_grad is False for p in model.parameters())  # LoRA: the adapters only; the base stays as built
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=StateDictOptions(strict=not partial))
    extra_path = d / f"extra_rank{rank}.pt"
    if not extra_path.exists():  # a different world size: RNG of rank 0 is as good as any
        extra_path = d / "extra_rank0.pt"
    extra = _read_extra(d, extra_path, m.step)
    if "history" not in extra and extra_path.name != "extra_rank0.pt":  # stored once, by rank 0 (older checkpoints: by every rank)
        extra["history"] = _read_extra(d, d / "extra_rank0.pt", m.step).get("history", [])
    return extra


def _read_extra(d: Path, path: Path, step: int) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(f"checkpoint {d} has no {path.name}", hint="the checkpoint is incomplete: resume from an earlier one")
    extra = load_extra(d, path)
    if int(extra["step"]) != step:
        raise CheckpointError(f"checkpoint {d}: {path.name} is for step {extra['step']}, the manifest for {step}")
    return extra


# ---- reading a checkpoint as data ------------------------------------------------------------------
#
# A checkpoint is data, never code: torch.load runs with weights_only=True (tensors, containers,
# numbers, strings, and numpy's RNG array allow-listed, as torch's docs show), and DCP's `.metadata`
# (a pickle that DCP would read with pickle.load) goes through an unpickler that knows only DCP's
# own metadata classes. A pickle naming anything else is refused before it runs.

_META_MODULES = ("torch.distributed.checkpoint.metadata",)
_META_NAMES = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "Path"),
}


def _metadata_unpickler(f: Any, where: Path) -> Any:
    import pickle

    import torch

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if module in _META_MODULES or (module, name) in _META_NAMES:
                found = super().find_class(module, name)
                if isinstance(found, type) or (module, name) in _META_NAMES:
                    return found
            elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
            raise CheckpointError(f"checkpoint {where}: .metadata names {module}.{name}, which is not DCP's metadata; "
                                  "refused unread (a checkpoint is data, never code)", hint=_DATA_HINT)

    return Unpickler(f)


def read_metadata(d: Path) -> Any:
    """DCP's `.metadata` of checkpoint `d`, read by the allow-listing unpickler (`CheckpointError` otherwise)."""
    import pickle

    try:
        with (d / ".metadata").open("rb") as f:
            return _metadata_unpickler(f, d).load()
    except CheckpointError:
        raise
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as e:
        raise CheckpointError(f"checkpoint {d}: unreadable .metadata ({type(e).__name__}: {e})", hint=_DATA_HINT) from e


def data_reader(d: Path) -> Any:
    """DCP's file reader, its metadata read as data (`read_metadata`): DCP's own would pickle.load it."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(FileSystemReader):  # type: ignore[misc]
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("rank") is not None:  # raydlc writes one metadata file; another is not ours
                raise CheckpointError(f"checkpoint {d}: per-rank metadata is not raydlc's", hint=_DATA_HINT)
            metadata = read_metadata(d)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(str(d))


def _rank_failure(e: BaseException) -> BaseException:
    """The error behind DCP's CheckpointException (which wraps each rank's, traceback and all), else `e`."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))  # (the exception, its traceback summary)
        return first[0] if isinstance(first, tuple) and first and isinstance(first[0], BaseException) else e
    return e


def data_planner(d: Path) -> Any:
    """DCP's load planner, its non-tensor items read as data: DCP's own `load_bytes` unpickles a
    shard's bytes with torch.load, weights_only off (torch 2.13's DefaultLoadPlanner). Each is read with weights_only=True and handed
    on re-saved, so what DCP unpickles is only what that data-only read produced."""
    import io
    import pickle

    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class Planner(DefaultLoadPlanner):  # type: ignore[misc]
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                obj = torch.load(value, weights_only=True)
            except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as e:
                raise CheckpointError(f"checkpoint {d}: {read_item.dest_index.fqn} in its shards is not plain data ({type(e).__name__}) "
                                      "and is refused unread (a checkpoint is data, never code)", hint=_DATA_HINT) from e
            plain = io.BytesIO()
            torch.save(obj, plain)
            plain.seek(0)
            super().load_bytes(read_item, plain)

    return Planner()


def load_extra(d: Path, path: Path) -> dict[str, Any]:
    """A rank's extras (step, RNG states, the run's records) with torch.load(weights_only=True)."""
    import pickle
    import warnings

    import numpy as np
    import torch

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    allowed = [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]  # numpy's RNG state: an uint32 array
    try:
        with torch.serialization.safe_globals(allowed), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns of a foreign pickle protocol before refusing it: the refusal says enough
            extra = torch.load(path, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, TypeError, AttributeError) as e:
        named = re.search(r"GLOBAL ([\w.]+)", str(e))  # torch's weights-only refusal names what the pickle would call
        if named is None and not isinstance(e, pickle.UnpicklingError):  # cut short behind a manifest that agrees with it
            raise CheckpointError(f"checkpoint {d} is corrupt: {path.name} cannot be read as a torch file ({_first_line(e)})",
                                  hint=_CORRUPT_HINT) from e
        why = f"it names {named.group(1)}" if named else type(e).__name__  # the weights-only refusal: code and garble alike
        raise CheckpointError(f"checkpoint {d}: {path.name} is not plain data ({why}) and is refused unread "
                              "(a checkpoint is data, never code)", hint=_DATA_HINT) from e
    if not isinstance(extra, dict) or "step" not in extra:
        raise CheckpointError(f"checkpoint {d}: {path.name} is not a raydlc extras file", hint=_DATA_HINT)
    return extra


def export_hf(model: nn.Module, out_dir: Path, *, rank: int, tokenizer: Any, dtype: torch.dtype | None = None,
              lora: Mapping[str, Any] | None = None) -> None:
    """Collective: gather the full weights to rank 0 and write safetensors + config + tokenizer.

    `lora` (rank, alpha, dropout, targets, base_model, merge): the gathered state holds the
    adapters too; `lora_export.write` puts them in peft's format under `out_dir/adapter/` and,
    with merge, has `save_hf` write the merged model into `out_dir`.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return
    config = model.config  # type: ignore[attr-defined]

    def save_merged(state: dict[str, Any], where: Path) -> None:
        save_hf(config, state, where, tokenizer=tokenizer, dtype=dtype)

    if lora is None:
        save_merged(sd, out_dir)
        return
    from raydlc.train import lora_export

    lora_export.write(out_dir, sd, rank=lora["rank"], alpha=lora["alpha"], dropout=lora["dropout"], targets=lora["targets"],
                      base_model=lora.get("base_model"), merge=bool(lora.get("merge", True)), save_merged=save_merged,
                      rslora=bool(lora.get("rslora", False)), base_dir=lora.get("base_dir"), target_regex=lora.get("target_regex"),
                      modules_to_save=lora.get("modules_to_save", ()))


def save_hf(config: Any, sd: Mapping[str, Any], out_dir: Path, *, tokenizer: Any, dtype: torch.dtype | None = None) -> None:
    """A Hugging Face model directory (safetensors, config, generation config, tokenizer) from a full
    state dict of base keys: the export of a full fine-tune, and of LoRA's merged model."""
    import torch
    from transformers import AutoModelForCausalLM

    config = config.__class__.from_dict(config.to_dict())
    config.use_cache = True
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        config.eos_token_id = tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        config.bos_token_id = tokenizer.bos_token_id
    target = dtype or next(iter(sd.values())).dtype
    with torch.device("meta"):
        full = AutoModelForCausalLM.from_config(config, dtype=target)
    full.load_state_dict({k: v.to(target) for k, v in sd.items()}, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        full.tie_weights()
    missing = [n for n, p in full.named_parameters() if p.is_meta]
    if missing:
        raise CheckpointError(f"export: weights missing from the gathered state dict: {missing[:5]}")
    if full.generation_config is not None:
        full.generation_config.eos_token_id = _stop_ids(tokenizer, config.eos_token_id)
        full.generation_config.pad_token_id = config.pad_token_id
        full.generation_config.bos_token_id = config.bos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    full.save_pretrained(str(out_dir), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))


def _stop_ids(tokenizer: Any, eos: int | None) -> int | list[int] | None:
    """Where generation stops: EOS, and the end of a chat turn where the tokenizer has it as one token (Qwen's
    tokenizers do), so that a chat fine-tune's answer ends with its turn, as the Hub's chat models' configs say."""
    from raydlc.data.formats import END_OF_TURN

    if tokenizer is None or eos is None:
        return eos
    turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if isinstance(turn, int) and turn != eos and turn != tokenizer.unk_token_id and tokenizer.convert_ids_to_tokens(turn) == END_OF_TURN:
        return [eos, turn]
    return eos
