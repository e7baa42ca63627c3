"""The per-worker program Ray Train's TorchTrainer runs, in named parts: build, step, evaluate,
checkpoint, finalize. `run_loop` strings them together; the benchmark times `train_step` itself.

The loss is normalised by the global number of target tokens (an all-reduce of one count per
step), so the gradient equals the gradient of the global mean whatever the number of ranks:
1 worker with batch 2B and 2 workers with batch B take the same steps. Ray's report is a
barrier with a cost, so metrics go up every `report_every` steps and with each checkpoint;
progress goes to the driver every step through an actor, which is not a barrier.
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
    from raydlc.train.model import apply_fsdp, build_model
    from raydlc.train.weights import build_sharded

    torch.manual_seed(settings.seed)
    np.random.seed(settings.seed)
    device_mesh = init_device_mesh(device.type, mesh.shape, mesh_dim_names=mesh.dim_names)

    def shard(model: nn.Module) -> nn.Module:
        return apply_fsdp(
            model,
            mesh=device_mesh,
            param_dtype=torch.bfloat16 if bf16 else None,
            reduce_dtype=torch.float32 if bf16 else None,
            activation_checkpointing=settings.activation_checkpointing,
            compile=settings.compile,
        )

    if spec:
        model = shard(build_model(get_spec(spec), device=device, seed=settings.seed))
    else:
        model = build_sharded(settings.model_id, device=device, shard=shard, log=dist.get_rank() == 0)
    return Trainer(model, make_optimizer(model, settings, device), device, mesh.world_size, device_mesh, settings)


# ---- step --------------------------------------------------------------------------------------


@dataclass
class StepOutput:
    """Device tensors: reading them is the caller's host sync, not the step's."""

    loss: torch.Tensor  # the global mean over target tokens (float64)
    grad_norm: torch.Tensor
    tokens: torch.Tensor  # target tokens in the global batch


def to_batch(ids: np.ndarray, labels: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    return torch.as_tensor(ids, dtype=torch.long, device=device), torch.as_tensor(labels, dtype=torch.long, device=device)


def loss_sum(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross-entropy (fp32) and the number of target tokens it covers."""
    import torch.nn.functional as F

    from raydlc.train.data import IGNORE

    y = labels[:, 1:]
    logits = model(input_ids=ids).logits[:, :-1]
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=IGNORE, reduction="sum")
    return total, (y != IGNORE).sum()


def target_tokens(t: Trainer, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Target tokens of the global batch (every rank's, every micro-batch's): the loss's denominator.

    Known from the labels before any forward, so each micro-batch's backward can be scaled right.
    """
    import torch
    import torch.distributed as dist

    from raydlc.train.data import IGNORE

    n = torch.stack([(labels[:, 1:] != IGNORE).sum() for _, labels in batches]).sum()
    dist.all_reduce(n)
    return n


def forward_backward(t: Trainer, batch: tuple[torch.Tensor, torch.Tensor], n_global: torch.Tensor) -> torch.Tensor:
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


def train_step(t: Trainer, batch: tuple[torch.Tensor, torch.Tensor], lr: float) -> StepOutput:
    """The product's training step: forward, backward, clip, AdamW; no host sync inside."""
    import torch.distributed as dist

    n_global = target_tokens(t, [batch])
    total = forward_backward(t, batch, n_global).double()
    grad_norm = optimizer_step(t, lr)
    dist.all_reduce(total)
    return StepOutput(loss=total / n_global.clamp(min=1), grad_norm=grad_norm, tokens=n_global)


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


def finalize(t: Trainer, run: RunSpec, history: list[dict[str, Any]], *, rank: int) -> None:
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
            (out / "summary.json").write_text(json.dumps(mx.summarize(history), indent=1))
            (out / "run.json").write_text(run.model_dump_json(indent=1))  # the settings as this worker validated them
            storage.publish(out, run.run_dir)
    # bf16 on gloo aborts at exit unless every rank drops its FSDP state before the group goes.
    t.model = t.optimizer = None  # type: ignore[assignment]
    gc.collect()
    dist.barrier()


# ---- the loop ----------------------------------------------------------------------------------


def train_func(config: dict[str, Any]) -> None:
    """Ray Train's entry point: the RunSpec as JSON, the data's object ref, the progress mailbox."""
    run_loop(RunSpec.from_wire(config["run"]), RaySession(config.get("progress")), config["data"])


def run_loop(run: RunSpec, session: Any, data: Any) -> None:
    import torch

    from raydlc.train import metrics as mx
    from raydlc.train.data import global_batch, rank_slice
    from raydlc.train.layout import check_placement

    s = run.train
    rank, world = session.rank, session.world
    check_placement(run.mesh, world_size=world, local_world_size=session.local_world)
    use_gpu = torch.cuda.is_available() and run.use_gpu
    if use_gpu:
        device = session.device()
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    steps, batch, seq_len = s.steps, s.batch_size, s.seq_len
    global_size = run.global_batch

    arrays = session.fetch(data)
    train_ids, train_labels = arrays["train_input_ids"], arrays["train_labels"]
    eval_ids, eval_labels = arrays["eval_input_ids"], arrays["eval_labels"]

    t = build(s, spec=run.spec, mesh=run.mesh, device=device, bf16=run.bf16)
    start_step, history = restore(t, run, session, rank)
    report_every = s.report_every
    eval_every = s.eval_every or s.checkpoint_every
    meta = run.checkpoint_meta()
    mesh_shape = list(t.mesh.shape)

    t.model.train()
    for step in range(start_step + 1, steps + 1):
        if run.crash and start_step == 0 and step == run.crash.step and rank == run.crash.rank:
            print(f"[raydlc] injected failure: rank {rank} exits at step {step}", flush=True)
            os._exit(1)
        t0 = time.perf_counter()
        lr = lr_at(step, s.learning_rate, s.warmup_steps)
        gidx = global_batch(step, len(train_ids), global_size, s.seed)
        mine = rank_slice(gidx, rank, world)
        out = train_step(t, to_batch(train_ids[mine], train_labels[mine], device), lr)
        loss = float(out.loss)
        if use_gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rec: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": float(out.grad_norm.full_tensor() if hasattr(out.grad_norm, "full_tensor") else out.grad_norm),
            "tokens": global_size * seq_len,
            "step_time_s": dt,
            "time": time.time(),
            "tokens_per_s": global_size * seq_len / dt,
            "peak_mem_mb": mx.peak_memory_mb(),
            "data": batch_fingerprint(gidx),
        }
        first_new = len(history)
        history.append(rec)
        last = step == steps
        is_ckpt = last or (s.checkpoint_every > 0 and step % s.checkpoint_every == 0)
        if last or (eval_every > 0 and step % eval_every == 0):
            history.append({"step": step, "eval_loss": evaluate(t, eval_ids, eval_labels, rank=rank, batch_size=batch)})
        if rank == 0:
            session.progress(history[first_new:])
        if is_ckpt or step % report_every == 0:
            window = [r for r in history if "loss" in r][-report_every:]
            metrics = {
                "step": step,
                "loss": loss,
                "tokens_per_s": sum(r["tokens"] for r in window) / sum(r["step_time_s"] for r in window),
                "step_time_s": sum(r["step_time_s"] for r in window) / len(window),
                "peak_mem_mb": rec["peak_mem_mb"],
                "mesh_shape": mesh_shape,
            }
            if last:
                metrics.update({f"summary_{k}": v for k, v in mx.summarize(history).items() if v is not None})
            if is_ckpt:
                save_checkpoint(t, session, step=step, rank=rank, history=history, meta=meta, metrics=metrics)
            else:
                session.report(metrics)

    if rank == 0:
        session.progress([], wait=True)
    finalize(t, run, history, rank=rank)
