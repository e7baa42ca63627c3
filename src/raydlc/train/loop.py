"""`train_func`: the per-worker loop Ray Train's TorchTrainer runs, on CPUs here and GPUs there.

The loss is normalised by the global number of target tokens (an all-reduce of one count per
step), so the gradient equals the gradient of the global mean whatever the number of ranks:
1 worker with batch 2B and 2 workers with batch B take the same steps. Ray's report is a
barrier with a cost, so metrics go up every `report_every` steps and with each checkpoint.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def lr_at(step: int, base: float, warmup: int) -> float:
    """Linear warmup, then constant: independent of the total steps, so --resume with more steps is exact."""
    return base * min(1.0, step / warmup) if warmup > 0 else base


def batch_fingerprint(indices: np.ndarray) -> str:
    """A short digest of a global batch's block indices; equal digests mean the same data order."""
    return hashlib.sha256(np.asarray(indices, dtype=np.int64).tobytes()).hexdigest()[:16]


def publish(local: Path, dest: str) -> None:
    """Copy a finished local folder to the run directory (a path, or a URI such as s3://)."""
    if "://" in dest:
        import pyarrow.fs

        fs, path = pyarrow.fs.FileSystem.from_uri(dest)
        fs.create_dir(path, recursive=True)
        pyarrow.fs.copy_files(str(local), path, destination_filesystem=fs)
    else:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copytree(local, dest, dirs_exist_ok=True)


class RaySession:
    """Ray Train's view of the worker: ranks, the restored checkpoint, and report (a barrier)."""

    def __init__(self) -> None:
        import ray.train

        ctx = ray.train.get_context()
        self.rank, self.world, self.local_world = ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_world_size()

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


def train_func(config: dict[str, Any]) -> None:
    """Ray Train's entry point."""
    run_loop(config, RaySession())


def run_loop(config: dict[str, Any], session: Any) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from raydlc.train import checkpoint as ckpt
    from raydlc.train import metrics as mx
    from raydlc.train.data import IGNORE, eval_slice, global_batch, rank_slice
    from raydlc.train.launch import mesh_shape
    from raydlc.train.model import apply_fsdp, build_model, get_spec, load_pretrained
    from raydlc.train.tokenizer import TokenizerInfo, to_hf

    rank, world, local_world = session.rank, session.world, session.local_world
    use_gpu = torch.cuda.is_available() and config.get("use_gpu", False)
    if use_gpu:
        device = session.device()
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    seed = int(config["seed"])
    steps, batch, seq_len = int(config["steps"]), int(config["batch_size"]), int(config["seq_len"])
    global_size = batch * world
    bf16 = bool(config["bf16"])

    data = session.fetch(config["data"])
    train_ids, train_labels = data["train_input_ids"], data["train_labels"]
    eval_ids, eval_labels = data["eval_input_ids"], data["eval_labels"]

    torch.manual_seed(seed)
    np.random.seed(seed)
    if config.get("spec"):
        model = build_model(get_spec(config["spec"]), device=device, seed=seed)
    else:
        model = load_pretrained(config["model"]).to(device)
    shape = mesh_shape(config["sharding"], world, local_world, config.get("hsdp_replicas"))
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    apply_fsdp(
        model,
        mesh=mesh,
        param_dtype=torch.bfloat16 if bf16 else None,
        reduce_dtype=torch.float32 if bf16 else None,
        activation_checkpointing=bool(config.get("activation_checkpointing")),
    )
    base_lr = float(config["learning_rate"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=base_lr, betas=(0.9, 0.95), weight_decay=float(config.get("weight_decay", 0.0)))

    history: list[dict[str, Any]] = []
    start_step = 0
    source: str | None = None
    with session.restored() as d:
        if d is not None:
            extra = ckpt.load(d, model, optimizer, rank=rank)
            source = str(d)
    if source is None and config.get("resume_from"):
        extra = ckpt.load(config["resume_from"], model, optimizer, rank=rank)
        source = str(config["resume_from"])
    if source is not None:
        start_step = int(extra["step"])
        history = list(extra.get("history", []))
        ckpt.set_rng_state(extra["rng"])
        if rank == 0:
            print(f"[raydlc] resumed at step {start_step} from {source}", flush=True)

    report_every = max(1, int(config["report_every"]))
    checkpoint_every = int(config["checkpoint_every"])
    eval_every = int(config.get("eval_every") or checkpoint_every)
    max_grad_norm = float(config.get("max_grad_norm", 1.0))
    crash = config.get("crash")
    progress = Path(config["progress_path"]) if config.get("progress_path") and rank == 0 else None
    run_dir = str(config["run_dir"])
    meta = {"model": config["model"], "spec": config.get("spec"), "seq_len": seq_len, "global_batch": global_size, "seed": seed, "data": config.get("data_digest")}

    def loss_parts(ids: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.as_tensor(ids, dtype=torch.long, device=device)
        y = torch.as_tensor(labels, dtype=torch.long, device=device)[:, 1:]
        logits = model(input_ids=x).logits[:, :-1]
        loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=IGNORE, reduction="sum")
        return loss_sum, (y != IGNORE).sum()

    def evaluate() -> float:
        model.eval()
        idx = eval_slice(len(eval_ids), rank, world)
        tot = torch.zeros(2, dtype=torch.float64, device=device)
        with torch.no_grad():
            for i in range(0, len(idx), batch):
                part = idx[i : i + batch]
                s, n = loss_parts(eval_ids[part], eval_labels[part])
                tot += torch.stack([s.double(), n.double()])
        dist.all_reduce(tot)
        model.train()
        return float(tot[0] / tot[1])

    def save_and_report(step: int, metrics: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory(prefix=f"raydlc-ckpt-r{rank}-") as tmp:
            ckpt.save(Path(tmp), model, optimizer, step=step, rank=rank, world_size=world, extra={"history": history}, meta=meta)
            session.report(metrics, tmp, ckpt.dir_name(step))

    model.train()
    for step in range(start_step + 1, steps + 1):
        if crash and start_step == 0 and step == int(crash["step"]) and rank == int(crash["rank"]):
            print(f"[raydlc] injected failure: rank {rank} exits at step {step}", flush=True)
            os._exit(1)
        t0 = time.perf_counter()
        lr = lr_at(step, base_lr, int(config.get("warmup_steps", 0)))
        for g in optimizer.param_groups:
            g["lr"] = lr
        gidx = global_batch(step, len(train_ids), global_size, seed)
        mine = rank_slice(gidx, rank, world)
        loss_sum, n_tok = loss_parts(train_ids[mine], train_labels[mine])
        n_global = n_tok.detach().clone()
        dist.all_reduce(n_global)
        (loss_sum * world / n_global.clamp(min=1)).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total = loss_sum.detach().double()
        dist.all_reduce(total)
        loss = float(total / n_global.clamp(min=1))
        if use_gpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rec: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm),
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
        is_ckpt = last or (checkpoint_every > 0 and step % checkpoint_every == 0)
        if last or (eval_every > 0 and step % eval_every == 0):
            history.append({"step": step, "eval_loss": evaluate()})
        if progress is not None:
            try:
                progress.parent.mkdir(parents=True, exist_ok=True)
                with progress.open("a") as f:
                    f.write("".join(json.dumps(r) + "\n" for r in history[first_new:]))
            except OSError:  # a display aid only; never a reason to fail a run
                progress = None
        if is_ckpt or step % report_every == 0:
            window = [r for r in history if "loss" in r][-report_every:]
            metrics = {
                "step": step,
                "loss": loss,
                "tokens_per_s": sum(r["tokens"] for r in window) / sum(r["step_time_s"] for r in window),
                "step_time_s": sum(r["step_time_s"] for r in window) / len(window),
                "peak_mem_mb": rec["peak_mem_mb"],
            }
            if last:
                metrics.update({f"summary_{k}": v for k, v in mx.summarize(history).items() if v is not None})
            if is_ckpt:
                save_and_report(step, metrics)
            else:
                session.report(metrics)

    # The export and the metrics files are the run's products; a restart after the last
    # checkpoint lands here directly (empty loop) and writes them again, identically.
    tok = to_hf(TokenizerInfo(**config["tokenizer"])) if rank == 0 else None
    with tempfile.TemporaryDirectory(prefix="raydlc-export-") as tmp:
        out = Path(tmp)
        ckpt.export_hf(model, out / "export", rank=rank, tokenizer=tok, dtype=torch.bfloat16 if bf16 else torch.float32)
        if rank == 0:
            mx.write_jsonl(history, out / "metrics.jsonl")
            mx.plot(history, out / "loss.png", title=f"{config['model']}: {world} worker(s), global batch {global_size} x {seq_len}")
            (out / "summary.json").write_text(json.dumps(mx.summarize(history), indent=1))
            publish(out, run_dir)
    # bf16 on gloo aborts at exit unless every rank drops its FSDP state before the group goes.
    model = optimizer = None
    gc.collect()
    dist.barrier()
