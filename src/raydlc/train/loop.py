"""The per-worker program Ray Train's TorchTrainer runs, in named parts: build, step, evaluate,
checkpoint, finalize. `run_loop` strings them together; the benchmark times `train_step` itself.
When a step is followed by a read, an eval, a report or a checkpoint is train.cadence's answer;
tests inject faults as step hooks (train.faults), never as branches here.

The loss is normalised by the global number of target tokens of the whole optimizer step (an
all-reduce of one count, before any forward), so the gradient equals the gradient of the global
mean whatever the number of ranks and micro-batches: 1 worker with batch 2B, 2 workers with
batch B and 2 workers with 2 accumulated micro-batches of B/2 take the same steps. Which
gradient collectives run on which micro-batch is FSDP2's switches (`Trainer.sync`).

On a GPU nothing is read back to the host between reads: losses, norms and token counts stay
on the device, and the loop reads them (one copy) every `report_every` steps and at evals and
checkpoints. Ray's report is a barrier with a cost, so metrics go up at those steps too;
progress goes to the driver through an actor (not a barrier), at most once a second and at
each report. On a CPU a read costs nothing, so every step is read at once.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from raydlc.train.runspec import RunSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from raydlc.config import TrainConfig
    from raydlc.train.layout import Mesh


PROGRESS_EVERY_S = 1.0  # rank 0 posts progress at most this often, and at every report and eval


def batch_fingerprint(indices: np.ndarray) -> str:
    """A short digest of a global batch's block indices; equal digests mean the same data order."""
    return hashlib.sha256(np.asarray(indices, dtype=np.int64).tobytes()).hexdigest()[:16]


# ---- sessions: what the launcher provides -----------------------------------------------------


class RaySession:
    """Ray Train's view of the worker: ranks, the restored checkpoint, report (a barrier), progress."""

    def __init__(self, progress: Any = None) -> None:
        import ray.train

        ctx = ray.train.get_context()
        self.rank, self.world, self.local_world = ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_world_size()
        self._progress = progress

    def device(self) -> Any:
        import ray.train.torch

        return ray.train.torch.get_device()

    def node(self) -> str:
        """This worker's node: its IP and Ray node id."""
        import ray

        return f"{ray.util.get_node_ip_address()} ({ray.get_runtime_context().get_node_id()[:12]})"

    def fetch(self, data: Any) -> Any:
        import ray

        return ray.get(data) if isinstance(data, ray.ObjectRef) else data

    def restored(self) -> Any:
        """A context manager yielding the local dir of the checkpoint to restart from, or None."""
        import contextlib

        import ray.train

        ck = ray.train.get_checkpoint()
        return ck.as_directory() if ck is not None else contextlib.nullcontext(None)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None, name: str | None = None, *, wait: bool = False) -> None:
        """Ray's report (a barrier); a checkpoint directory is Ray's from here: it uploads it in its
        own thread, deletes the local copy, then registers it (CheckpointConfig.num_to_keep prunes
        the oldest). Reports without a checkpoint go the same way so that they do not wait behind
        an upload (Ray processes reports in order). `wait`: upload here (Ray's SYNC mode), after the reports before it."""
        import ray.train

        ck = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir is not None else None
        mode = ray.train.CheckpointUploadMode.SYNC if wait else ray.train.CheckpointUploadMode.ASYNC
        ray.train.report(metrics, checkpoint=ck, checkpoint_dir_name=name, checkpoint_upload_mode=mode)

    def preemption(self) -> Any:
        """Collective (a barrier across the workers): Ray Train's drain notice for this worker group, or None (train.preempt)."""
        import ray.train

        return ray.train.get_preemption_info()

    def progress(self, records: list[dict[str, Any]], *, wait: bool = False) -> None:
        """Rank 0's new records to the driver's mailbox: fire and forget, except with `wait`,
        which returns once everything posted so far has arrived (calls from one caller keep order)."""
        if self._progress is None or not (records or wait):
            return
        ref = self._progress.put.remote(records)
        if wait:
            import ray

            ray.get(ref)

    def beat(self, record: dict[str, Any]) -> str | None:
        """A heartbeat to the driver's mailbox (train.heartbeat); the answer is what the driver asks for now."""
        if self._progress is None:
            return None
        import ray

        return ray.get(self._progress.beat.remote(record), timeout=30)


class TorchrunSession:
    """The same loop under plain torchrun (the benchmark's baseline): env ranks, local storage."""

    def __init__(self, run_dir: str, keep: int = 0) -> None:
        import torch.distributed as dist

        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.keep = keep  # CHECKPOINT_KEEP: the newest checkpoints kept in run_dir; 0 = all
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        self.run_dir = run_dir
        if not dist.is_initialized():
            import torch

            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")

    def device(self) -> Any:
        import torch

        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))

    def node(self) -> str:
        import socket

        return socket.gethostname()

    def fetch(self, data: Any) -> Any:
        return data

    def restored(self) -> Any:
        import contextlib

        return contextlib.nullcontext(None)

    def preemption(self) -> None:
        """No drain notices without Ray."""
        return None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None, name: str | None = None, *, wait: bool = False) -> None:
        """Copies the checkpoint in place (always complete on return, so `wait` changes nothing)."""
        import torch.distributed as dist

        from raydlc.train.checkpoint import prune

        if checkpoint_dir is not None and name is not None:
            shutil.copytree(checkpoint_dir, Path(self.run_dir) / name, dirs_exist_ok=True)
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
        dist.barrier()
        if checkpoint_dir is not None and int(os.environ.get("LOCAL_RANK", "0")) == 0:  # each node its own run_dir
            prune(Path(self.run_dir), self.keep)

    def progress(self, records: list[dict[str, Any]], *, wait: bool = False) -> None:
        pass

    def beat(self, record: dict[str, Any]) -> str | None:
        return None


# ---- build -------------------------------------------------------------------------------------


@dataclass
class Trainer:
    """One worker's built state: the sharded model, its optimizer, and where it runs."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    world: int
    mesh: Any  # torch's DeviceMesh
    settings: TrainConfig
    sync: str = "every"  # every | once | all-reduce-once: when accumulated gradients are reduced


def reduce_dtype(name: str, bf16: bool) -> torch.dtype | None:
    """FSDP2's reduce_dtype for REDUCE_DTYPE: None where it is the parameters' own (fp32 without bf16 compute).
    `auto` reaches here only where no planner chose (a local run): fp32."""
    import torch

    if name == "bf16":
        return torch.bfloat16
    return torch.float32 if bf16 else None


def make_optimizer(model: nn.Module, settings: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (β2 0.95), fused on every device: the fused kernel takes `found_inf`, which skips a
    non-finite step on the device (`optimizer_step`); the learning rate is set by `train_step` each step.
    Only trainable parameters: under LoRA the frozen base carries no moments."""
    import torch

    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],  # under LoRA the adapters only: the frozen base has no state
        lr=settings.learning_rate,
        betas=(0.9, 0.95),
        weight_decay=settings.weight_decay,
        fused=True,
    )


def build(settings: TrainConfig, *, spec: str | None, mesh: Mesh, device: torch.device, bf16: bool) -> Trainer:
    """Model (a built-in spec at random init, or pretrained weights; either way built on the meta
    device, sharded by FSDP2, then filled shard by shard), FSDP2 over the planned mesh, optimizer.

    Needs the process group: the mesh is built over it.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from raydlc.facts.models import get_spec
    from raydlc.planner import default_sync
    from raydlc.train.loss import use_chunked_loss
    from raydlc.train.model import apply_fsdp, build_random_sharded
    from raydlc.train.weights import build_sharded

    torch.manual_seed(settings.seed)
    np.random.seed(settings.seed)
    device_mesh = init_device_mesh(device.type, mesh.shape, mesh_dim_names=mesh.dim_names)

    def shard(model: nn.Module) -> nn.Module:
        if settings.lora_rank > 0:  # on the meta device, before fully_shard: each block's adapters in its unit
            model = add_lora(model, settings, bf16=bf16)
        return apply_fsdp(
            use_chunked_loss(model, settings.loss_chunk, compile=bool(settings.compile)) if settings.loss_chunk > 0 else model,
            mesh=device_mesh,
            param_dtype=torch.bfloat16 if bf16 else None,
            reduce_dtype=reduce_dtype(settings.reduce_dtype, bf16),
            activation_checkpointing=settings.activation_checkpointing,
            compile=bool(settings.compile),
        )

    if spec:
        model = build_random_sharded(get_spec(spec), device=device, shard=shard, seed=settings.seed)
    else:
        model = build_sharded(settings.model_id, device=device, shard=shard, log=dist.get_rank() == 0)
    if settings.lora_rank > 0:
        from raydlc.train.lora import init_adapters

        with torch.no_grad():
            init_adapters(model, seed=settings.seed)  # after the base (seeded or pretrained): A seeded by name, B zeros
    accum = settings.grad_accum if isinstance(settings.grad_accum, int) else 1
    sync = default_sync(mesh.sharding, accum) if settings.grad_sync == "auto" else settings.grad_sync
    return Trainer(model, make_optimizer(model, settings, device), device, mesh.world_size, device_mesh, settings, sync)


def add_lora(model: nn.Module, settings: TrainConfig, *, bf16: bool) -> nn.Module:
    """LORA_RANK > 0: adapters on LORA_TARGETS (or the family's), the base frozen and, with bf16
    compute, stored in bf16 (the adapters stay fp32: the only weights AdamW updates)."""
    import torch

    from raydlc.train.lora import default_alpha, targets_of, with_lora

    return with_lora(
        model, rank=settings.lora_rank, alpha=default_alpha(settings.lora_rank, settings.lora_alpha), dropout=settings.lora_dropout,
        targets=targets_of(model.config, settings.lora_targets_list), seed=settings.seed, base_dtype=torch.bfloat16 if bf16 else None,
        rslora=settings.lora_rslora, target_regex=settings.lora_target_regex, modules_to_save=settings.lora_modules_to_save_list,
    )


# ---- step --------------------------------------------------------------------------------------


@dataclass
class StepOutput:
    """Device tensors: reading them is the caller's host sync, not the step's."""

    loss: torch.Tensor  # the global mean over target tokens (float64)
    grad_norm: torch.Tensor
    tokens: torch.Tensor  # target tokens in the global batch
    skipped: torch.Tensor  # True: the loss or the gradient norm was not finite, and AdamW left the weights alone


Batch = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor | None"]  # ids, labels, documents (data.documents; None: unmasked)


def to_batch(ids: np.ndarray, labels: np.ndarray, device: torch.device, docs: np.ndarray | None = None) -> Batch:
    """On CUDA through pinned memory without blocking: a pageable copy would wait for the GPU."""
    import torch

    def move(x: np.ndarray) -> torch.Tensor:
        if device.type != "cuda":
            return torch.as_tensor(x, dtype=torch.long, device=device)
        return torch.as_tensor(x, dtype=torch.long).pin_memory().to(device, non_blocking=True)

    return move(ids), move(labels), None if docs is None else move(docs)


def micro_batches(ids: np.ndarray, labels: np.ndarray, rows: np.ndarray, micro_batch: int, device: torch.device,
                  docs: np.ndarray | None = None) -> list[Batch]:
    """A rank's share of the global batch (`rows`) cut into consecutive micro-batches.

    The global batch of a step does not depend on how it is cut, so N micro-batches of B and
    one of N x B read the same sequences.
    """
    return [to_batch(ids[part], labels[part], device, None if docs is None else docs[part])
            for part in (rows[i : i + micro_batch] for i in range(0, len(rows), micro_batch))]


def causal_masks(model: nn.Module) -> dict[str, None] | None:
    """Packed blocks need only the plain causal mask, which SDPA applies itself when given none.

    Handed `None`, transformers builds the mask and first looks for packed sequences in the
    position ids with a `.all()` that waits for the GPU on every forward; a ready mask mapping
    (what `generate` passes) skips that. Only for models that take a mapping per layer type (Qwen2
    does, Llama does not) and whose layers all attend fully: a sliding window needs its mask built.
    """
    kinds = getattr(model.config, "layer_types", None)
    return {"full_attention": None} if kinds and all(k == "full_attention" for k in kinds) else None


def loss_sum(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, docs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross-entropy (fp32) and the number of target tokens it covers: chunked
    inside the head (train.loss) when the model has a `ChunkedHead`, else over the full logits.
    With `docs`, each token attends within its own document (data.documents)."""
    import torch.nn.functional as F

    from raydlc.data.documents import model_inputs
    from raydlc.data.encode import IGNORE
    from raydlc.train.loss import head_of, targets

    y = labels[:, 1:]
    head = head_of(model)
    inputs = {"attention_mask": causal_masks(model)} if docs is None else model_inputs(model, docs)
    if head is not None:
        with targets(head, labels):
            return model(input_ids=ids, **inputs).logits, (y != IGNORE).sum()
    logits = model(input_ids=ids, **inputs).logits[:, :-1]
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=IGNORE, reduction="sum")
    return total, (y != IGNORE).sum()


def target_tokens(t: Trainer, batches: list[Batch]) -> torch.Tensor:
    """Target tokens of the global batch (every rank's, every micro-batch's): the loss's denominator.

    Known from the labels before any forward, so each micro-batch's backward can be scaled right.
    """
    import torch
    import torch.distributed as dist

    from raydlc.data.encode import IGNORE

    n = torch.stack([(b[1][:, 1:] != IGNORE).sum() for b in batches]).sum()  # b: (ids, labels[, documents])
    dist.all_reduce(n)
    return n


def forward_backward(t: Trainer, batch: Batch, n_global: torch.Tensor) -> torch.Tensor:
    """One micro-batch's forward and backward, scaled so the gradients add up to those of the
    global token mean (FSDP averages gradients over ranks, hence the `world` factor); returns its
    summed loss. Gradient accumulation is this, once per micro-batch, before one optimizer step."""
    total, _ = loss_sum(t.model, *batch)
    (total * t.world / n_global.clamp(min=1)).backward()
    return total.detach()


def optimizer_step(t: Trainer, lr: float, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip the global gradient norm, apply AdamW at `lr`, clear the gradients; returns the norm and
    whether the step was skipped.

    A step whose global loss or gradient norm is not finite leaves the weights, the moments and
    the step count as they were: the fused AdamW kernel reads `found_inf` on the device and skips
    itself (the path torch's GradScaler uses), so the guard costs no host sync. Both values are
    global (the norm over every shard, the loss all-reduced), so every rank skips alike.
    """
    import torch

    grad_norm = torch.nn.utils.clip_grad_norm_(t.model.parameters(), t.settings.max_grad_norm)
    norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    skipped = ~(torch.isfinite(norm) & torch.isfinite(loss))
    for g in t.optimizer.param_groups:
        g["lr"] = lr
    t.optimizer.found_inf = skipped.float()  # type: ignore[attr-defined]
    t.optimizer.step()
    t.optimizer.zero_grad(set_to_none=True)
    return norm, skipped


def gradient_sync(t: Trainer, last: bool) -> None:
    """FSDP2's own switches for the micro-batch about to run: `once` holds every reduction (and
    the unsharded gradients) until the last; `all-reduce-once` (HSDP) reduce-scatters inside
    the shard group each time and all-reduces across replicas on the last only."""
    if t.sync == "once":
        t.model.set_requires_gradient_sync(last)  # type: ignore[operator]
    elif t.sync == "all-reduce-once":
        t.model.set_requires_all_reduce(last)  # type: ignore[operator]


def train_step(t: Trainer, batches: list[Batch], lr: float) -> StepOutput:
    """The product's training step: forward and backward of each micro-batch, clip, AdamW unless
    the step is not finite; no host sync inside."""
    import torch.distributed as dist

    n_global = target_tokens(t, batches)
    totals = []
    for i, batch in enumerate(batches):
        if len(batches) > 1:
            gradient_sync(t, last=i == len(batches) - 1)
        totals.append(forward_backward(t, batch, n_global).double())
    total = totals[0] if len(totals) == 1 else sum(totals[1:], totals[0])
    dist.all_reduce(total)
    norm, skipped = optimizer_step(t, lr, total)
    return StepOutput(loss=total / n_global.clamp(min=1), grad_norm=norm, tokens=n_global, skipped=skipped)


@dataclass
class Unread:
    """Steps run since the last read: their outputs stay on the device until `read` copies them at once."""

    steps: list[tuple[int, float, str, StepOutput]]
    started: float  # perf_counter at the start of the first of them

    def read(self, *, tokens_per_step: int, device: torch.device) -> list[dict[str, Any]]:
        """The steps' records; their step time is the window's wall time shared out evenly."""
        import torch

        from raydlc.train import metrics as mx

        values = torch.stack([torch.stack([o.loss.double(), o.grad_norm.double(), o.skipped.double()]) for _, _, _, o in self.steps]).tolist()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = (time.perf_counter() - self.started) / len(self.steps)
        now, peak, reserved = time.time(), mx.peak_memory_mb(), mx.peak_reserved_mb()
        return [
            {
                "step": step,
                "loss": loss,
                "lr": lr,
                "grad_norm": norm,
                "tokens": tokens_per_step,
                "step_time_s": dt,
                "time": now,
                "tokens_per_s": tokens_per_step / dt,
                "peak_mem_mb": peak,
                "peak_reserved_mb": reserved,
                "data": fingerprint,
                "skipped": bool(skipped),
            }
            for (step, lr, fingerprint, _), (loss, norm, skipped) in zip(self.steps, values)
        ]


# ---- evaluate ----------------------------------------------------------------------------------


def evaluate(t: Trainer, ids: np.ndarray, labels: np.ndarray, *, rank: int, batch_size: int, docs: np.ndarray | None = None) -> float:
    """Mean eval loss over every rank's equal share of the held-out sequences."""
    import torch
    import torch.distributed as dist

    from raydlc.data.order import eval_slice

    t.model.eval()
    idx = eval_slice(len(ids), rank, t.world)
    tot = torch.zeros(2, dtype=torch.float64, device=t.device)
    with torch.no_grad():
        for i in range(0, len(idx), batch_size):
            part = idx[i : i + batch_size]
            s, n = loss_sum(t.model, *to_batch(ids[part], labels[part], t.device, None if docs is None else docs[part]))
            tot += torch.stack([s.double(), n.double()])
    dist.all_reduce(tot)
    t.model.train()
    return float(tot[0] / tot[1])


# ---- checkpoint --------------------------------------------------------------------------------


def restore(t: Trainer, run: RunSpec, session: Any, rank: int) -> tuple[int, list[dict[str, Any]], bool]:
    """(step to continue after, metrics so far, whether from Ray's own checkpoint): Ray's restart checkpoint first, else RESUME_FROM."""
    from raydlc.train import checkpoint as ckpt

    source: str | None = None
    extra: dict[str, Any] = {}
    with session.restored() as d:
        if d is not None:
            extra = ckpt.load(d, t.model, t.optimizer, rank=rank, lora=run.train.lora_meta())
            source = str(d)
    from_ray = source is not None
    if source is None and run.resume_from:
        extra = ckpt.load(run.resume_from, t.model, t.optimizer, rank=rank, lora=run.train.lora_meta())
        source = run.resume_from
    if source is None:
        return 0, [], False
    ckpt.set_rng_state(extra["rng"])
    if rank == 0:
        print(f"[raydlc] resumed at step {int(extra['step'])} from {source}", flush=True)
    return int(extra["step"]), list(extra.get("history", [])), from_ray


@dataclass
class Pending:
    """A checkpoint being written: its staging directory, the future of this rank's file digests,
    and what goes up to Ray with it once it is whole."""

    step: int
    directory: Path
    digests: Any  # concurrent.futures.Future[dict]: the write, then the hashes
    metrics: dict[str, Any]


class Saver:
    """Asynchronous checkpoints at the cadence's steps (train.checkpoint.start / seal).

    A save stages the shards to host memory and returns; DCP writes and a thread hashes while
    the loop trains on. The checkpoint is sealed (manifest) and reported to Ray (which uploads it
    in the background and keeps CHECKPOINT_KEEP of them) at the first read after every rank's
    write is done, and at the latest before the next save and at the end. `slowest_s` is the
    longest the loop waited for one save (the budget holds twice that back for the last one).
    """

    def __init__(self, session: Any, rank: int, meta: dict[str, Any], on_sealed: Any = None) -> None:
        import torch.distributed as dist

        from raydlc.train.checkpoint import sweep_staging

        self.session, self.rank, self.meta = session, rank, meta  # meta: what a checkpoint must match to be continued
        self.on_sealed = on_sealed  # called with each step whose checkpoint went to Ray (the trackers' event)
        self.group = dist.new_group(backend="gloo")  # DCP's own: its writer thread's collectives
        sweep_staging()  # what workers ended mid-save left on this node
        self.pending: Pending | None = None
        self.slowest_s = 0.0
        self.last_step: int | None = None  # the step of the last checkpoint this attempt handed to Ray
        self._waited = 0.0
        self.staging: Any = None  # the run's cached (on a GPU pinned) host copy (train.checkpoint.stager), made at the first save

    def save(self, t: Trainer, *, step: int, history: list[dict[str, Any]], metrics: dict[str, Any], beat: Any) -> None:
        """Collective: finish the previous save, then start this one."""
        from raydlc.train import checkpoint as ckpt

        self.finish(t, beat=beat)
        beat.phase = f"checkpoint of step {step}"
        began = time.perf_counter()
        staging = Path(tempfile.mkdtemp(prefix=ckpt.staging_prefix("ckpt", self.rank)))
        extra = {"history": list(history)} if self.rank == 0 else {}  # the run's records, stored once: every rank restores rank 0's
        if self.staging is None:
            self.staging = ckpt.stager(cuda=t.device.type == "cuda")
        try:
            digests = ckpt.start(staging, t.model, t.optimizer, step=step, rank=self.rank, extra=extra, group=self.group, staging=self.staging)
        except BaseException:  # a failed save (a full disk) leaves no staging folder behind
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.pending = Pending(step, staging, digests, metrics)
        self._waited = time.perf_counter() - began

    def poll(self, t: Trainer, beat: Any) -> None:
        """Collective, at each read: seal and report the pending checkpoint if every rank's write is
        done (one scalar all-reduce while a save is pending; reads already wait for the device)."""
        if self.pending is not None and not agreed(not self.pending.digests.done(), t.device):
            self.finish(t, beat=beat)

    def finish(self, t: Trainer, *, beat: Any, wait: bool = False) -> None:
        """Collective: wait for the pending save's write and hashes, write its manifest, hand it to Ray;
        with `wait` (a drain notice) the report returns once the checkpoint is uploaded, not in the background."""
        from raydlc.train import checkpoint as ckpt

        p, self.pending = self.pending, None
        if p is None:
            return
        beat.phase = f"checkpoint of step {p.step}: finishing"
        began = time.perf_counter()
        ckpt.seal(p.directory, p.digests.result(), step=p.step, rank=self.rank, world_size=t.world, meta=self.meta)
        self.session.report(p.metrics, str(p.directory), ckpt.dir_name(p.step), wait=wait)  # the session owns the directory from here
        self.slowest_s = max(self.slowest_s, self._waited + time.perf_counter() - began)
        self.last_step = p.step
        if self.on_sealed is not None:
            self.on_sealed(p.step)

    def abandon(self) -> None:
        """Drop the pending save unreported (a reclaim deadline too short to finish it): its writer thread runs
        on into a staging directory nothing reads; the restart resumes from the last checkpoint reported.
        Its host copy goes with it (a later save stages afresh), so no save reuses a buffer still being written."""
        self.pending, self.staging = None, None

def settle(watch: Any, saver: Saver, t: Trainer, beat: Any, start_step: int) -> None:
    """Collective, on the notice's step only: whether the checkpoint of this step fits in the reclaim window
    (train.preempt.decide, on each rank's clock and slowest save), one all-reduce so that every rank takes the
    same decision. Too short: no save starts; a save in flight goes to Ray if its write is done, else it is
    dropped; the restart resumes from the last checkpoint handed to Ray (or the one this attempt started from)."""
    from dataclasses import replace

    from raydlc.train.preempt import decide

    assert watch.notice is not None
    d = decide(watch.notice.deadline_s, time.time(), saver.slowest_s)
    too_short = agreed(not d.save, t.device)
    if too_short:
        saver.poll(t, beat)
        saver.abandon()
    watch.settle(replace(d, save=not too_short), resume_from=saver.last_step if saver.last_step is not None else start_step)


# ---- finalize ----------------------------------------------------------------------------------


def save_again(saver: Saver, t: Trainer, s: TrainConfig, history: list[dict[str, Any]], *, step: int, beat: Any) -> None:
    """RESUME_FROM a checkpoint of the last step trains nothing, and Ray's result is the metrics of the run's
    newest checkpoint: the run saves that step again as its own, so that its summary and checkpoint are not empty."""
    from raydlc.train import metrics as mx

    metrics = mx.report(history, step=step, every=s.report_every, mesh_shape=list(t.mesh.shape), last=True)
    saver.save(t, step=step, history=history, metrics=metrics, beat=beat)


def finalize(t: Trainer, run: RunSpec, history: list[dict[str, Any]], *, rank: int, stopped: dict[str, Any] | None = None) -> None:
    """Export, metrics, summary and the run's settings into the run directory; then drop the FSDP state.
    The loss plot is the driver's to draw from the metrics at the run's end (raydlc.evaluate.plot): the image has no matplotlib.

    The export and the metrics files are the run's products; a restart after the last
    checkpoint lands here directly (no steps left) and writes them again, identically.
    """
    import torch
    import torch.distributed as dist

    from raydlc.data.tokenizer import to_hf
    from raydlc.edges.storage import publish
    from raydlc.train import checkpoint as ckpt
    from raydlc.train import metrics as mx

    tok = to_hf(run.tokenizer, max_length=getattr(t.model.config, "max_position_embeddings", None) or run.train.seq_len) if rank == 0 else None
    with tempfile.TemporaryDirectory(prefix=ckpt.staging_prefix("export", rank)) as tmp:
        out = Path(tmp)
        ckpt.export_hf(t.model, out / "export", rank=rank, tokenizer=tok, dtype=torch.bfloat16 if run.bf16 else torch.float32,
                       lora=lora_export_settings(t.model, run))
        if rank == 0:
            mx.write_jsonl(history, out / "metrics.jsonl")
            (out / "summary.json").write_text(json.dumps({**mx.summarize(history), **(stopped or {})}, indent=1))
            (out / "run.json").write_text(run.model_dump_json(indent=1))  # the settings as this worker validated them
            publish(out, run.run_dir)
    # bf16 on gloo aborts at exit unless every rank drops its FSDP state before the group goes.
    t.model = t.optimizer = None  # type: ignore[assignment]
    gc.collect()
    dist.barrier()


def lora_export_settings(model: nn.Module, run: RunSpec) -> dict[str, Any] | None:
    """What the export needs to write a LoRA run's adapter (and merged model); None for full fine-tuning."""
    from raydlc.train.lora import adapted_targets, default_alpha, saved_parameters
    from raydlc.train.lora_export import BASE_DIR

    s = run.train
    if s.lora_rank == 0:
        return None
    return {"rank": s.lora_rank, "alpha": default_alpha(s.lora_rank, s.lora_alpha), "dropout": s.lora_dropout,
            "targets": adapted_targets(model), "base_model": s.model_id, "merge": s.lora_merge, "rslora": s.lora_rslora,
            "target_regex": s.lora_target_regex, "modules_to_save": sorted(saved_parameters(model, s.lora_modules_to_save_list)),
            "base_dir": f"{run.run_dir.rstrip('/')}/export/{BASE_DIR}" if run.spec is not None else None}


# ---- stopping: the budget ------------------------------------------------------------------------


def agreed(flag: bool, device: torch.device) -> bool:
    """True on every rank when it is true on any: ranks stop at the same step (each reads its own clock)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def budget_stop(clock: Any, step: int, history: list[dict[str, Any]], *, checkpoint_s: float, device: torch.device, rank: int) -> dict[str, Any] | None:
    """After `step`, whether the budget (a train.budget.BudgetClock) ends the run here, agreed by every rank: why, or None."""
    if not agreed(clock.must_stop(step, history, now=time.time(), perf=time.perf_counter(), checkpoint_s=checkpoint_s), device):
        return None
    stopped = clock.stopped(step, time.time())
    if rank == 0:
        print(f"[raydlc] {stopped['stop_reason']}", flush=True)
    return stopped


def check_finite(history: list[dict[str, Any]], limit: int, checkpoint_every: int = 0) -> None:
    """Raise when the last `limit` steps read were all skipped (a non-finite loss or gradient norm).

    Called at each read, so on a GPU the run notices at the read after the limit (up to
    REPORT_EVERY steps later): those steps were skipped on the device and changed no weight, so
    nothing waits for the host in between. Every rank reads the same global flags and raises alike.
    """
    from raydlc.errors import TrainError
    from raydlc.train.metrics import skipped_in_a_row

    run = skipped_in_a_row(history)
    if len(run) >= limit:
        raise TrainError(
            f"{len(run)} steps in a row had a non-finite loss or gradient norm (steps {run[0]} to {run[-1]}): the run stops at step {run[-1]}",
            hint=f"{resume_advice(run[0], checkpoint_every)}; lower LEARNING_RATE or MAX_GRAD_NORM, or check the data",
        )


def resume_advice(first_bad: int, checkpoint_every: int) -> str:
    """Which checkpoint to resume from after non-finite steps from `first_bad` on: step `first_bad - 1`'s update made the
    weights that blew up (it was finite itself), so the newest safe checkpoint is one of step `first_bad - 2` or earlier."""
    from raydlc.train.checkpoint import dir_name

    safe = first_bad - 2
    newest = safe - safe % checkpoint_every if checkpoint_every > 0 and safe > 0 else 0
    if newest <= 0:
        return f"no checkpoint before step {first_bad - 1} holds weights known to be good: start again rather than resume"
    return (f"the weights after step {first_bad - 1} are already suspect (its update led to the non-finite step {first_bad}): "
            f"resume with RESUME_FROM=<run dir>/{dir_name(newest)} (step {newest}) or an earlier checkpoint, not a later one")


# ---- the loop ----------------------------------------------------------------------------------


class StepHooks(Protocol):
    """What runs at the start of every step beside the training: nothing in a real run; tests and
    drills pass faults this way (train.faults), so the loop holds no branch for them."""

    def before_step(self, step: int, *, rank: int, resumed: bool) -> None: ...


class NoHooks:
    def before_step(self, step: int, *, rank: int, resumed: bool) -> None:
        pass


@dataclass(frozen=True)
class RankData:
    """This rank's view of the prepared dataset: the rows by index, the held-out rows and their sequences."""

    view: Any  # data.dataset.TrainData
    rows: Any  # its open rows (`take`)
    held: np.ndarray
    eval_ids: np.ndarray
    eval_labels: np.ndarray
    eval_docs: np.ndarray | None = None  # with document masking (data.documents)


def heartbeat(run: RunSpec, session: Any, rank: int, device: torch.device) -> Any:
    """Each rank's heartbeat thread while the stall guard is on (STALL_MINUTES > 0), else its fields alone."""
    from raydlc.train.heartbeat import Heartbeat, Quiet
    from raydlc.train.stall import StallGuard

    guard = StallGuard.of(run.train.stall_minutes, run.train.stall_first_minutes)
    return Heartbeat(session, rank=rank, every_s=guard.beat_every_s(), device=device) if guard.on else Quiet()


def train_func(config: dict[str, Any]) -> None:
    """Ray Train's entry point: the RunSpec as JSON, where the prepared dataset is, the progress mailbox."""
    run = RunSpec.from_wire(config["run"])
    run_loop(run, RaySession(config.get("progress")), config["data"], hooks=run.faults)


def run_loop(run: RunSpec, session: Any, data: Any, hooks: StepHooks | None = None) -> None:
    """The worker's run: its device, its view of the prepared data, then the loop under the rank's heartbeat."""
    import torch

    from raydlc.data import documents
    from raydlc.data.dataset import TrainData
    from raydlc.train.layout import check_nodes, check_placement

    rank = session.rank
    check_placement(run.mesh, world_size=session.world, local_world_size=session.local_world)
    nodes = reported_nodes(session)
    check_nodes(run.mesh, nodes)
    use_gpu = torch.cuda.is_available() and run.use_gpu
    if use_gpu:
        device = session.device()
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    # The prepared dataset by index: this rank reads its own rows of each step, and the eval rows once.
    view = TrainData.from_dict(session.fetch(data))
    rows, held = view.open(), np.asarray(view.eval_rows, dtype=np.int64)
    eval_ids, eval_labels, eval_docs = documents.read(rows, held, masking=run.train.document_masking)

    with heartbeat(run, session, rank, device) as beat:
        _train(run, session, RankData(view, rows, held, eval_ids, eval_labels, eval_docs), device, beat, hooks or NoHooks(), nodes=nodes)


def device_name(device: torch.device) -> str | None:
    """The CUDA device's name (what MFU's peak is looked up by); None on a CPU."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def reported_nodes(session: Any) -> list[str]:
    """Collective: every rank's node, by rank (each rank reports its own; train.layout.check_nodes judges)."""
    import torch.distributed as dist

    nodes: list[str | None] = [None] * session.world
    dist.all_gather_object(nodes, session.node())
    return [str(n) for n in nodes]


def run_step(t: Trainer, run: RunSpec, data: RankData, step: int, *, rank: int, world: int) -> tuple[float, str, StepOutput]:
    """One optimizer step on this rank's rows of the step's global batch: its learning rate, the batch's fingerprint, its outputs."""
    from raydlc.data import documents
    from raydlc.data.order import global_batch, rank_slice, train_rows
    from raydlc.train.schedule import lr_at

    s = run.train
    lr = lr_at(step, s)
    gidx = global_batch(step, data.view.n_train, run.global_batch, s.seed)
    ids, labels, docs = documents.read(data.rows, train_rows(rank_slice(gidx, rank, world), data.held), masking=s.document_masking)
    return lr, batch_fingerprint(gidx), train_step(t, micro_batches(ids, labels, np.arange(len(ids)), s.batch_size, t.device, docs), lr)


def on_nodes(nodes: list[str] | tuple[str, ...]) -> str | None:
    """The attempt's nodes (every rank's, train.loop.reported_nodes) as one name for the resume record: distinct, in rank order."""
    return ", ".join(dict.fromkeys(nodes)) or None


def _train(run: RunSpec, session: Any, data: RankData, device: torch.device, beat: Any, hooks: StepHooks,
           nodes: list[str] | tuple[str, ...] = ()) -> None:
    """Build, restore, then step until STEPS or the budget; what follows a step is the cadence's (train.cadence).
    `nodes`: where this attempt's ranks run, named in the resume record (jobs.restarts: "resumed from N on <node>")."""
    from raydlc.planner.budget import BudgetClock
    from raydlc.train import metrics as mx
    from raydlc.train import tracking
    from raydlc.train.cadence import Cadence
    from raydlc.train.preempt import PreemptionWatch

    s, rank = run.train, session.rank
    beat.phase = "building the model"
    t = build(s, spec=run.spec, mesh=run.mesh, device=device, bf16=run.bf16)
    attend_within_documents(t, s, data, device)
    start_step, history, from_ray = restore(t, run, session, rank)
    if rank == 0 and start_step > 0:
        session.progress([{"step": start_step, "resumed": True, "node": on_nodes(nodes)}])  # a restart, or --resume: the driver says so
    track = tracking.start(run, rank, start_step=start_step, history=history, restarted=from_ray, device_name=device_name(device))
    cadence = Cadence.of(s, gpu=device.type == "cuda")
    watch = PreemptionWatch(session, steps=s.steps)  # drain notices (a Spot reclaim): asked at the same steps on every rank
    progress, saver = mx.Progress(session, on=rank == 0, every_s=PROGRESS_EVERY_S), Saver(session, rank, run.checkpoint_meta(), track.checkpoint)
    t.model.train()
    unread: Unread | None = None  # steps whose device values the loop has not read yet
    stopped: dict[str, Any] | None = None  # why the loop ended before STEPS (the budget)
    clock = BudgetClock(run.budget, cadence.read_every, start_step, time.perf_counter()) if run.budget is not None else None
    beat.step, beat.phase = start_step, "training"
    for step in range(start_step + 1, s.steps + 1):
        beat.entered, beat.phase = step, f"step {step}"
        hooks.before_step(step, rank=rank, resumed=start_step > 0)
        unread = unread or Unread([], time.perf_counter())
        unread.steps.append((step, *run_step(t, run, data, step, rank=rank, world=session.world)))
        beat.step, beat.completed = step, beat.completed + 1
        if clock is not None and cadence.asks_budget(step):
            stopped = budget_stop(clock, step, history, checkpoint_s=saver.slowest_s, device=device, rank=rank)
        noticed = watch.noticed(step, stopping=stopped is not None)
        if noticed and watch.decision is None:
            track.event(step, "preemption_notice", "a drain notice: this step is the attempt's last")
            settle(watch, saver, t, beat, start_step)
        due = cadence.due(step, stopping=stopped is not None, preempted=noticed, save_on_notice=watch.saves)
        if not due.read:
            continue
        new = read_due(t, run, data, unread, history, step=step, validate=due.validate, rank=rank)
        unread = None
        progress.add(new, now=due.report or due.validate)
        track.records(new)
        saver.poll(t, beat)
        if due.report:
            metrics = mx.report(history, step=step, every=s.report_every, mesh_shape=list(t.mesh.shape), last=due.last,
                                stopped={**(stopped or {}), **track.summary()} or None)
            if due.save:
                saver.save(t, step=step, history=history, metrics=metrics, beat=beat)
            else:
                session.report(metrics)
        if due.last:
            break
    if start_step >= s.steps and not from_ray:
        save_again(saver, t, s, history, step=start_step, beat=beat)
    end_attempt(t, run, history, saver=saver, progress=progress, track=track, watch=watch, beat=beat, rank=rank, stopped=stopped)


def attend_within_documents(t: Trainer, s: Any, data: RankData, device: torch.device) -> None:
    """Swap in document-masked attention before the first forward compiles the blocks; only when some
    batch carries document bounds (packed training rows, or the held-out documents), else SDPA stays."""
    if data.eval_docs is not None or (s.document_masking and data.view.documents):
        from raydlc.data.documents import use_flex

        use_flex(t.model, device, compile=bool(s.compile))


def read_due(t: Trainer, run: RunSpec, data: RankData, unread: Unread, history: list[dict[str, Any]], *, step: int,
             validate: bool, rank: int) -> list[dict[str, Any]]:
    """The unread steps' device values into `history` (checked finite), with an eval loss when one is due: the new records."""
    s, first_new = run.train, len(history)
    history.extend(unread.read(tokens_per_step=run.global_batch * s.seq_len, device=t.device))
    check_finite(history, s.max_nonfinite_steps, s.checkpoint_every)
    if validate:
        history.append({"step": step, "eval_loss": evaluate(t, data.eval_ids, data.eval_labels, rank=rank, batch_size=s.batch_size, docs=data.eval_docs)})
    return history[first_new:]


def end_attempt(t: Trainer, run: RunSpec, history: list[dict[str, Any]], *, saver: Saver, progress: Any, track: Any, watch: Any,
                beat: Any, rank: int, stopped: dict[str, Any] | None) -> None:
    """The last save landed, progress and trackers flushed, a drain notice held to its end, then the run's products."""
    saver.finish(t, beat=beat, wait=watch.notice is not None)
    progress.flush()
    track.close()
    watch.hold(beat, rank=rank)  # after a drain notice: until Ray Train ends the attempt (it restarts from this checkpoint)
    beat.phase = "finishing: export"
    finalize(t, run, history, rank=rank, stopped=stopped)
