"""The per-worker program Ray Train's TorchTrainer runs, in named parts: build, step, evaluate,
checkpoint, finalize. `run_loop` strings them together; the benchmark times `train_step` itself.

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
from typing import TYPE_CHECKING, Any

import numpy as np

from raydlc.train.runspec import RunSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from raydlc.config import TrainConfig
    from raydlc.train.layout import Mesh


PROGRESS_EVERY_S = 1.0  # rank 0 posts progress at most this often, and at every report and eval


def lr_at(step: int, base: float, warmup: int) -> float:
    """Linear warmup, then constant: independent of the total steps, so --resume with more steps is exact."""
    return base * min(1.0, step / warmup) if warmup > 0 else base


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

    def fetch(self, data: Any) -> Any:
        import ray

        return ray.get(data) if isinstance(data, ray.ObjectRef) else data

    def restored(self) -> Any:
        """A context manager yielding the local dir of the checkpoint to restart from, or None."""
        import contextlib

        import ray.train

        ck = ray.train.get_checkpoint()
        return ck.as_directory() if ck is not None else contextlib.nullcontext(None)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None, name: str | None = None) -> None:
        import ray.train

        if checkpoint_dir is None:
            ray.train.report(metrics)
        else:
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(checkpoint_dir), checkpoint_dir_name=name)

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

    def __init__(self, run_dir: str) -> None:
        import torch.distributed as dist

        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        self.run_dir = run_dir
        if not dist.is_initialized():
            import torch

            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")

    def device(self) -> Any:
        import torch

        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))

    def fetch(self, data: Any) -> Any:
        return data

    def restored(self) -> Any:
        import contextlib

        return contextlib.nullcontext(None)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None, name: str | None = None) -> None:
        import torch.distributed as dist

        if checkpoint_dir is not None and name is not None:
            shutil.copytree(checkpoint_dir, Path(self.run_dir) / name, dirs_exist_ok=True)
        dist.barrier()

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
    """FSDP2's reduce_dtype for REDUCE_DTYPE: None where it is the parameters' own (fp32 without bf16 compute)."""
    import torch

    if name == "bf16":
        return torch.bfloat16
    return torch.float32 if bf16 else None


def make_optimizer(model: nn.Module, settings: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (β2 0.95), fused on CUDA; the learning rate is set by `train_step` each step."""
    import torch

    return torch.optim.AdamW(
        model.parameters(),
        lr=settings.learning_rate,
        betas=(0.9, 0.95),
        weight_decay=settings.weight_decay,
        fused=True if device.type == "cuda" else None,
    )


def build(settings: TrainConfig, *, spec: str | None, mesh: Mesh, device: torch.device, bf16: bool) -> Trainer:
    """Model (a built-in spec at random init, or pretrained weights loaded shard by shard after
    FSDP2 has sharded the meta-device model), FSDP2 over the planned mesh, optimizer.

    Needs the process group: the mesh is built over it.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from raydlc.models import get_spec
    from raydlc.plan import default_sync
    from raydlc.train.loss import use_chunked_loss
    from raydlc.train.model import apply_fsdp, build_model
    from raydlc.train.weights import build_sharded

    torch.manual_seed(settings.seed)
    np.random.seed(settings.seed)
    device_mesh = init_device_mesh(device.type, mesh.shape, mesh_dim_names=mesh.dim_names)

    def shard(model: nn.Module) -> nn.Module:
        return apply_fsdp(
            use_chunked_loss(model, settings.loss_chunk) if settings.loss_chunk > 0 else model,
            mesh=device_mesh,
            param_dtype=torch.bfloat16 if bf16 else None,
            reduce_dtype=reduce_dtype(settings.reduce_dtype, bf16),
            activation_checkpointing=settings.activation_checkpointing,
            compile=settings.compile,
        )

    if spec:
        model = shard(build_model(get_spec(spec), device=device, seed=settings.seed))
    else:
        model = build_sharded(settings.model_id, device=device, shard=shard, log=dist.get_rank() == 0)
    accum = settings.grad_accum if isinstance(settings.grad_accum, int) else 1
    sync = default_sync(mesh.sharding, accum) if settings.grad_sync == "auto" else settings.grad_sync
    return Trainer(model, make_optimizer(model, settings, device), device, mesh.world_size, device_mesh, settings, sync)


# ---- step --------------------------------------------------------------------------------------


@dataclass
class StepOutput:
    """Device tensors: reading them is the caller's host sync, not the step's."""

    loss: torch.Tensor  # the global mean over target tokens (float64)
    grad_norm: torch.Tensor
    tokens: torch.Tensor  # target tokens in the global batch


Batch = tuple["torch.Tensor", "torch.Tensor"]


def to_batch(ids: np.ndarray, labels: np.ndarray, device: torch.device) -> Batch:
    """On CUDA through pinned memory without blocking: a pageable copy would wait for the GPU."""
    import torch

    if device.type != "cuda":
        return torch.as_tensor(ids, dtype=torch.long, device=device), torch.as_tensor(labels, dtype=torch.long, device=device)
    a, b = (torch.as_tensor(x, dtype=torch.long).pin_memory() for x in (ids, labels))
    return a.to(device, non_blocking=True), b.to(device, non_blocking=True)


def micro_batches(ids: np.ndarray, labels: np.ndarray, rows: np.ndarray, micro_batch: int, device: torch.device) -> list[Batch]:
    """A rank's share of the global batch (`rows`) cut into consecutive micro-batches.

    The global batch of a step does not depend on how it is cut, so N micro-batches of B and
    one of N x B read the same sequences.
    """
    return [to_batch(ids[rows[i : i + micro_batch]], labels[rows[i : i + micro_batch]], device) for i in range(0, len(rows), micro_batch)]


def causal_masks(model: nn.Module) -> dict[str, None] | None:
    """Packed blocks need only the plain causal mask, which SDPA applies itself when given none.

    Handed `None`, transformers builds the mask and first looks for packed sequences in the
    position ids with a `.all()` that waits for the GPU on every forward; a ready mask mapping
    (what `generate` passes) skips that. Only for models that take a mapping per layer type (Qwen2
    does, Llama does not) and whose layers all attend fully: a sliding window needs its mask built.
    """
    kinds = getattr(model.config, "layer_types", None)
    return {"full_attention": None} if kinds and all(k == "full_attention" for k in kinds) else None


def loss_sum(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross-entropy (fp32) and the number of target tokens it covers: chunked
    inside the head (train.loss) when the model has a `ChunkedHead`, else over the full logits."""
    import torch.nn.functional as F

    from raydlc.train.data import IGNORE
    from raydlc.train.loss import head_of, targets

    y = labels[:, 1:]
    head = head_of(model)
    if head is not None:
        with targets(head, labels):
            return model(input_ids=ids, attention_mask=causal_masks(model)).logits, (y != IGNORE).sum()
    logits = model(input_ids=ids, attention_mask=causal_masks(model)).logits[:, :-1]
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=IGNORE, reduction="sum")
    return total, (y != IGNORE).sum()


def target_tokens(t: Trainer, batches: list[Batch]) -> torch.Tensor:
    """Target tokens of the global batch (every rank's, every micro-batch's): the loss's denominator.

    Known from the labels before any forward, so each micro-batch's backward can be scaled right.
    """
    import torch
    import torch.distributed as dist

    from raydlc.train.data import IGNORE

    n = torch.stack([(labels[:, 1:] != IGNORE).sum() for _, labels in batches]).sum()
    dist.all_reduce(n)
    return n


def forward_backward(t: Trainer, batch: Batch, n_global: torch.Tensor) -> torch.Tensor:
    """One micro-batch's forward and backward, scaled so the gradients add up to those of the
    global token mean (FSDP averages gradients over ranks, hence the `world` factor); returns its
    summed loss. Gradient accumulation is this, once per micro-batch, before one optimizer step."""
    total, _ = loss_sum(t.model, *batch)
    (total * t.world / n_global.clamp(min=1)).backward()
    return total.detach()


def optimizer_step(t: Trainer, lr: float) -> torch.Tensor:
    """Clip the global gradient norm, apply AdamW at `lr`, clear the gradients; returns the norm."""
    import torch

    grad_norm = torch.nn.utils.clip_grad_norm_(t.model.parameters(), t.settings.max_grad_norm)
    for g in t.optimizer.param_groups:
        g["lr"] = lr
    t.optimizer.step()
    t.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def gradient_sync(t: Trainer, last: bool) -> None:
    """FSDP2's own switches for the micro-batch about to run: `once` holds every reduction (and
    the unsharded gradients) until the last; `all-reduce-once` (HSDP) reduce-scatters inside
    the shard group each time and all-reduces across replicas on the last only."""
    if t.sync == "once":
        t.model.set_requires_gradient_sync(last)  # type: ignore[operator]
    elif t.sync == "all-reduce-once":
        t.model.set_requires_all_reduce(last)  # type: ignore[operator]


def train_step(t: Trainer, batches: list[Batch], lr: float) -> StepOutput:
    """The product's training step: forward and backward of each micro-batch, clip, AdamW; no host sync inside."""
    import torch.distributed as dist

    n_global = target_tokens(t, batches)
    totals = []
    for i, batch in enumerate(batches):
        if len(batches) > 1:
            gradient_sync(t, last=i == len(batches) - 1)
        totals.append(forward_backward(t, batch, n_global).double())
    total = totals[0] if len(totals) == 1 else sum(totals[1:], totals[0])
    grad_norm = optimizer_step(t, lr)
    dist.all_reduce(total)
    norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    return StepOutput(loss=total / n_global.clamp(min=1), grad_norm=norm, tokens=n_global)


@dataclass
class Unread:
    """Steps run since the last read: their outputs stay on the device until `read` copies them at once."""

    steps: list[tuple[int, float, str, StepOutput]]
    started: float  # perf_counter at the start of the first of them

    def read(self, *, tokens_per_step: int, device: torch.device) -> list[dict[str, Any]]:
        """The steps' records; their step time is the window's wall time shared out evenly."""
        import torch

        from raydlc.train import metrics as mx

        values = torch.stack([torch.stack([o.loss.double(), o.grad_norm.double()]) for _, _, _, o in self.steps]).tolist()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = (time.perf_counter() - self.started) / len(self.steps)
        now, peak = time.time(), mx.peak_memory_mb()
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
                "data": fingerprint,
            }
            for (step, lr, fingerprint, _), (loss, norm) in zip(self.steps, values)
        ]


# ---- evaluate ----------------------------------------------------------------------------------


def evaluate(t: Trainer, ids: np.ndarray, labels: np.ndarray, *, rank: int, batch_size: int) -> float:
    """Mean eval loss over every rank's equal share of the held-out sequences."""
    import torch
    import torch.distributed as dist

    from raydlc.train.data import eval_slice

    t.model.eval()
    idx = eval_slice(len(ids), rank, t.world)
    tot = torch.zeros(2, dtype=torch.float64, device=t.device)
    with torch.no_grad():
        for i in range(0, len(idx), batch_size):
            part = idx[i : i + batch_size]
            s, n = loss_sum(t.model, *to_batch(ids[part], labels[part], t.device))
            tot += torch.stack([s.double(), n.double()])
    dist.all_reduce(tot)
    t.model.train()
    return float(tot[0] / tot[1])


# ---- checkpoint --------------------------------------------------------------------------------


def restore(t: Trainer, run: RunSpec, session: Any, rank: int) -> tuple[int, list[dict[str, Any]]]:
    """(step to continue after, metrics so far): Ray's restart checkpoint first, else RESUME_FROM."""
    from raydlc.train import checkpoint as ckpt

    source: str | None = None
    extra: dict[str, Any] = {}
    with session.restored() as d:
        if d is not None:
            extra = ckpt.load(d, t.model, t.optimizer, rank=rank)
            source = str(d)
    if source is None and run.resume_from:
        extra = ckpt.load(run.resume_from, t.model, t.optimizer, rank=rank)
        source = run.resume_from
    if source is None:
        return 0, []
    ckpt.set_rng_state(extra["rng"])
    if rank == 0:
        print(f"[raydlc] resumed at step {int(extra['step'])} from {source}", flush=True)
    return int(extra["step"]), list(extra.get("history", []))


def save_checkpoint(t: Trainer, session: Any, *, step: int, rank: int, history: list[dict[str, Any]], meta: dict[str, Any], metrics: dict[str, Any]) -> None:
    """Collective: every rank stages its shards, then one report registers them as one checkpoint."""
    from raydlc.train import checkpoint as ckpt

    with tempfile.TemporaryDirectory(prefix=f"raydlc-ckpt-r{rank}-") as tmp:
        ckpt.save(Path(tmp), t.model, t.optimizer, step=step, rank=rank, world_size=t.world, extra={"history": history}, meta=meta)
        session.report(metrics, tmp, ckpt.dir_name(step))


# ---- finalize ----------------------------------------------------------------------------------


def finalize(t: Trainer, run: RunSpec, history: list[dict[str, Any]], *, rank: int, stopped: dict[str, Any] | None = None) -> None:
    """Export, metrics, plot, summary and the run's settings into the run directory; then drop the FSDP state.

    The export and the metrics files are the run's products; a restart after the last
    checkpoint lands here directly (no steps left) and writes them again, identically.
    """
    import torch
    import torch.distributed as dist

    from raydlc import storage
    from raydlc.train import checkpoint as ckpt
    from raydlc.train import metrics as mx
    from raydlc.train.tokenizer import to_hf

    tok = to_hf(run.tokenizer) if rank == 0 else None
    with tempfile.TemporaryDirectory(prefix="raydlc-export-") as tmp:
        out = Path(tmp)
        ckpt.export_hf(t.model, out / "export", rank=rank, tokenizer=tok, dtype=torch.bfloat16 if run.bf16 else torch.float32)
        if rank == 0:
            mx.write_jsonl(history, out / "metrics.jsonl")
            mx.plot(history, out / "loss.png", title=f"{run.train.model_id}: {t.world} worker(s), global batch {run.global_batch} x {run.train.seq_len}")
            (out / "summary.json").write_text(json.dumps({**mx.summarize(history), **(stopped or {})}, indent=1))
            (out / "run.json").write_text(run.model_dump_json(indent=1))  # the settings as this worker validated them
            storage.publish(out, run.run_dir)
    # bf16 on gloo aborts at exit unless every rank drops its FSDP state before the group goes.
    t.model = t.optimizer = None  # type: ignore[assignment]
    gc.collect()
    dist.barrier()


# ---- stopping: the budget, and the stall guard's test hook ---------------------------------------


def agreed(flag: bool, device: torch.device) -> bool:
    """True on every rank when it is true on any: ranks stop at the same step (each reads its own clock)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def injected_hang(rank: int, step: int) -> None:
    """Test-only (RunSpec.hang, never a setting): this rank stops making progress, as a rank stuck outside a collective."""
    print(f"[raydlc] injected hang: rank {rank} stops at step {step}", flush=True)
    while True:
        time.sleep(3600)


def heartbeat(run: RunSpec, session: Any, rank: int, device: torch.device) -> Any:
    """Each rank's heartbeat thread while the stall guard is on (STALL_MINUTES > 0), else nothing."""
    import contextlib

    from raydlc.train.heartbeat import Heartbeat
    from raydlc.train.stall import StallGuard

    guard = StallGuard.of(run.train.stall_minutes, run.train.stall_first_minutes)
    return Heartbeat(session, rank=rank, every_s=guard.beat_every_s(), device=device) if guard.on else contextlib.nullcontext(None)


# ---- the loop ----------------------------------------------------------------------------------


def train_func(config: dict[str, Any]) -> None:
    """Ray Train's entry point: the RunSpec as JSON, where the prepared dataset is, the progress mailbox."""
    run_loop(RunSpec.from_wire(config["run"]), RaySession(config.get("progress")), config["data"])


def run_loop(run: RunSpec, session: Any, data: Any) -> None:
    """The worker's run: its device, its view of the prepared data, then the loop under the rank's heartbeat."""
    import torch

    from raydlc.data.dataset import TrainData
    from raydlc.train.layout import check_placement

    rank = session.rank
    check_placement(run.mesh, world_size=session.world, local_world_size=session.local_world)
    use_gpu = torch.cuda.is_available() and run.use_gpu
    if use_gpu:
        device = session.device()
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    # The prepared dataset by index: this rank reads its own rows of each step, and the eval rows once.
    view = TrainData.from_dict(session.fetch(data))
    rows, held = view.open(), np.asarray(view.eval_rows, dtype=np.int64)
    eval_ids, eval_labels = rows.take(held)

    with heartbeat(run, session, rank, device) as beat:
        _train(run, session, view, rows, held, eval_ids, eval_labels, device, beat)


# One loop on purpose: its cadences (read, eval, report, checkpoint, the budget) share the step's locals; split, they would pass a dozen values around.
def _train(run: RunSpec, session: Any, view: Any, rows: Any, held: np.ndarray, eval_ids: np.ndarray, eval_labels: np.ndarray,
           device: torch.device, beat: Any) -> None:
    from raydlc.data.index import train_rows
    from raydlc.train import budget as bx
    from raydlc.train import metrics as mx
    from raydlc.train.data import global_batch, rank_slice

    s = run.train
    rank, world = session.rank, session.world
    steps, batch, seq_len = s.steps, s.batch_size, s.seq_len
    global_size = run.global_batch
    if beat is not None:
        beat.phase = "building the model"
    t = build(s, spec=run.spec, mesh=run.mesh, device=device, bf16=run.bf16)
    start_step, history = restore(t, run, session, rank)
    if rank == 0 and start_step > 0:
        session.progress([{"step": start_step, "resumed": True}])  # a restart after a failure, or --resume: the driver says so
    report_every = s.report_every
    eval_every = s.eval_every or s.checkpoint_every
    meta = run.checkpoint_meta()
    mesh_shape = list(t.mesh.shape)

    t.model.train()
    # A read copies device values to the host and waits for the GPU: on a GPU only when the loop
    # has to report anyway; on a CPU there is nothing to wait for, so every step.
    read_every = report_every if device.type == "cuda" else 1
    unread: Unread | None = None
    unposted: list[dict[str, Any]] = []  # rank 0's records not yet sent to the driver: at most one post a second
    posted = time.monotonic()
    stopped: dict[str, Any] | None = None  # why the loop ended before STEPS (the budget)
    began, ckpt_s = time.perf_counter(), 0.0
    if beat is not None:
        beat.step, beat.phase = start_step, "training"
    for step in range(start_step + 1, steps + 1):
        if run.crash and start_step == 0 and step == run.crash.step and rank == run.crash.rank:
            print(f"[raydlc] injected failure: rank {rank} exits at step {step}", flush=True)
            os._exit(1)
        if beat is not None:
            beat.entered, beat.phase = step, f"step {step}"
        if run.hang and start_step == 0 and step == run.hang.step and rank == run.hang.rank:
            injected_hang(rank, step)
        if unread is None:
            unread = Unread([], time.perf_counter())
        lr = lr_at(step, s.learning_rate, s.warmup_steps)
        gidx = global_batch(step, view.n_train, global_size, s.seed)
        ids, labels = rows.take(train_rows(rank_slice(gidx, rank, world), held))
        out = train_step(t, micro_batches(ids, labels, np.arange(len(ids)), batch, device), lr)
        unread.steps.append((step, lr, batch_fingerprint(gidx), out))
        if beat is not None:
            beat.step, beat.completed = step, beat.completed + 1
        # The budget is asked where the loop reads anyway (every step on a CPU, every REPORT_EVERY on a GPU: the
        # agreement is a host sync), looking ahead as many steps as until the next read, at the last read's step time.
        if run.budget is not None and step < steps and step % read_every == 0:
            per_step = next((r["step_time_s"] for r in reversed(history) if "step_time_s" in r), (time.perf_counter() - began) / (step - start_step))
            if agreed(run.budget.must_stop(time.time(), step_s=per_step * read_every, checkpoint_s=ckpt_s), device):
                spent = run.budget.spent(time.time())
                stopped = {"stopped_by": "budget", "stop_reason": bx.stop_reason(run.budget, step=step, spent_usd=spent)}
                if rank == 0:
                    print(f"[raydlc] {stopped['stop_reason']}", flush=True)
        last = step == steps or stopped is not None
        is_ckpt = last or (s.checkpoint_every > 0 and step % s.checkpoint_every == 0)
        is_eval = last or (eval_every > 0 and step % eval_every == 0)
        is_report = is_ckpt or step % report_every == 0
        if not (is_report or is_eval or step % read_every == 0):
            continue
        first_new = len(history)
        history.extend(unread.read(tokens_per_step=global_size * seq_len, device=device))
        unread = None
        rec = history[-1]
        if is_eval:
            history.append({"step": step, "eval_loss": evaluate(t, eval_ids, eval_labels, rank=rank, batch_size=batch)})
        if rank == 0:
            unposted += history[first_new:]
            if is_report or is_eval or time.monotonic() - posted >= PROGRESS_EVERY_S:
                session.progress(unposted)
                unposted, posted = [], time.monotonic()
        if is_report:
            window = [r for r in history if "loss" in r][-report_every:]
            metrics = {
                "step": step,
                "loss": rec["loss"],
                "tokens_per_s": sum(r["tokens"] for r in window) / sum(r["step_time_s"] for r in window),
                "step_time_s": sum(r["step_time_s"] for r in window) / len(window),
                "peak_mem_mb": rec["peak_mem_mb"],
                "mesh_shape": mesh_shape,
            }
            if last:
                metrics.update({f"summary_{k}": v for k, v in {**mx.summarize(history), **(stopped or {})}.items() if v is not None})
            if is_ckpt:
                if beat is not None:
                    beat.phase = f"checkpoint of step {step}"
                saving = time.perf_counter()
                save_checkpoint(t, session, step=step, rank=rank, history=history, meta=meta, metrics=metrics)
                ckpt_s = max(ckpt_s, time.perf_counter() - saving)
            else:
                session.report(metrics)
        if last:
            break

    if rank == 0:
        session.progress(unposted, wait=True)
    if beat is not None:
        beat.phase = "finishing: export"
    finalize(t, run, history, rank=rank, stopped=stopped)
