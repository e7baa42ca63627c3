#!/usr/bin/env python
"""Training efficiency on one GPU: raydlc's own training step against the reference's loop, and the roofline.

The reference's published run trains at batch 1 x 128 tokens, which leaves a modern GPU almost
idle. Whether raydlc finishes fine-tuning sooner and cheaper is a question of tokens/s and model
FLOPs utilisation (MFU) on real hardware, so this script measures both loops side by side in one
process, on the same architecture and seed, and checks that both really train (finite losses
that fall on a fixed batch) before it reports a figure.

    python benchmarks/gpu_efficiency.py                       # CUDA GPU, Qwen2.5-1.5B, all variants
    python benchmarks/gpu_efficiency.py --smoke               # CPU, tiny model, seconds
    python benchmarks/gpu_efficiency.py --out figures.json    # also every figure as JSON

The last line is always `raydlc/reference tokens/s: X.XX, raydlc MFU: Y.Y%` (raydlc's fastest
row). A non-finite loss ends the run with exit 1; so does a loss that does not fall, after the
table has been printed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.errors import InputError, RaydlcError, TrainError

if TYPE_CHECKING:
    import torch

    from raydlc.config import TrainConfig
    from raydlc.facts.models import ModelSpec

REFERENCE_BATCH, REFERENCE_SEQ, REFERENCE_LR = 1, 128, 2e-5
FSDP1_MIN_PARAMS = int(1e7)
VARIANTS: dict[str, tuple[bool, bool]] = {"compile": (True, False), "ac": (False, True), "compile+ac": (True, True)}
LAST_LINE = "raydlc/reference tokens/s: {ratio:.2f}, raydlc MFU: {mfu:.1f}%"


@dataclass(frozen=True)
class Settings:
    model: str
    device: str
    steps: int
    warmup: int
    variants: list[str]
    batch: int | None
    seq: int | None
    max_seq: int
    max_batch: int
    lr: float
    matmul_n: int
    out: Path | None
    smoke: bool


@dataclass(frozen=True)
class Shape:
    batch: int
    seq: int
    how: str
    trials: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LoopResult:
    name: str
    loop: str
    batch: int
    seq: int
    compile: bool
    activation_checkpointing: bool
    step_times_s: list[float]
    losses: list[float]
    peak_memory_gib: float | None
    memory_kind: str
    shape_how: str = "fixed"
    probe: list[dict[str, Any]] = field(default_factory=list)
    backed_off: int = 0


# ---- pure figures --------------------------------------------------------------------------


def parse_variants(text: str) -> list[str]:
    """`all`, `none`, or a comma list of compile, ac, compile+ac: the raydlc rows beyond the plain one."""
    text = text.strip().lower()
    if text in ("", "none"):
        return []
    if text == "all":
        return list(VARIANTS)
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise InputError(f"unknown variant(s) {', '.join(unknown)} in --variants", hint=f"use all, none or a comma list of {', '.join(VARIANTS)}")
    return list(dict.fromkeys(names))


def median_step_s(step_times_s: list[float]) -> float:
    return statistics.median(step_times_s)


def model_tflop_per_token(params: int) -> float:
    """6·N: forward and backward matmuls per token; attention scores are not counted (PaLM's MFU)."""
    return 6 * params / 1e12


def attention_tflop_per_token(spec: ModelSpec, seq: int) -> float:
    """Causal attention scores and values, forward and backward: 12·L·h·S halved for the mask."""
    return 6 * spec.num_layers * spec.hidden_size * seq / 1e12


def mfu(params: int, tokens_per_s: float, peak_tflops: float) -> float:
    return model_tflop_per_token(params) * tokens_per_s / peak_tflops


def check_losses(name: str, losses: list[float]) -> bool:
    """Raise on a non-finite loss; say whether the last quarter's mean is below the first's.

    The batch is fixed and repeated, so a loop that trains must lower its loss on it.
    """
    bad = [i for i, x in enumerate(losses) if not math.isfinite(x)]
    if bad:
        raise TrainError(
            f"{name}: non-finite loss at timed step {bad[0]} ({losses[bad[0]]})",
            hint="a NaN/inf loss means the loop is broken; no throughput figure is reported for it",
        )
    if len(losses) < 4:
        raise InputError(f"{name}: {len(losses)} timed steps cannot show a falling loss", hint="use --steps 4 or more")
    q = len(losses) // 4
    return statistics.fmean(losses[-q:]) < statistics.fmean(losses[:q])


def probe_shape(fits: Callable[[int, int], bool], *, max_seq: int, max_batch: int, min_seq: int = 128) -> Shape:
    """The largest micro-batch at the longest sequence (≤ max_seq) that fits: halve the sequence
    until one row fits, double the batch until it does not, then try halfway back."""
    trials: list[dict[str, Any]] = []

    def attempt(b: int, s: int) -> bool:
        ok = fits(b, s)
        trials.append({"batch": b, "seq": s, "fits": ok})
        return ok

    seq = max_seq
    while not attempt(1, seq):
        if seq // 2 < min_seq:
            raise TrainError(
                f"not even one sequence of {seq} tokens fits in memory",
                hint="use a smaller model, or --batch/--seq to measure a shape by hand",
            )
        seq //= 2
    batch = 1
    while batch * 2 <= max_batch and attempt(batch * 2, seq):
        batch *= 2
    middle = batch + batch // 2
    if batch > 1 and batch * 2 <= max_batch and middle > batch and attempt(middle, seq):
        batch = middle
    return Shape(batch, seq, "probe", trials)


def row_figures(r: LoopResult, *, params: int, spec: ModelSpec, peak_tflops: float, matmul_tflops: float) -> dict[str, Any]:
    step = median_step_s(r.step_times_s)
    tps = r.batch * r.seq / step
    q = max(1, len(r.losses) // 4)
    return {
        "name": r.name,
        "loop": r.loop,
        "batch": r.batch,
        "seq": r.seq,
        "tokens_per_step": r.batch * r.seq,
        "compile": r.compile,
        "activation_checkpointing": r.activation_checkpointing,
        "timed_steps": len(r.step_times_s),
        "step_time_median_s": step,
        "step_time_min_s": min(r.step_times_s),
        "step_time_max_s": max(r.step_times_s),
        "tokens_per_s": tps,
        "mfu": mfu(params, tps, peak_tflops),
        "mfu_vs_measured_matmul": mfu(params, tps, matmul_tflops),
        "mfu_with_attention": (model_tflop_per_token(params) + attention_tflop_per_token(spec, r.seq)) * tps / peak_tflops,
        "peak_memory_gib": r.peak_memory_gib,
        "memory_kind": r.memory_kind,
        "loss_first": r.losses[0],
        "loss_last": r.losses[-1],
        "loss_first_quarter_mean": statistics.fmean(r.losses[:q]),
        "loss_last_quarter_mean": statistics.fmean(r.losses[-q:]),
        "loss_falls": check_losses(r.name, r.losses),
        "shape_from": r.shape_how,
        "probe": r.probe,
        "backed_off": r.backed_off,
        "step_times_s": r.step_times_s,
        "losses": r.losses,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """raydlc's fastest row against the reference row: the figures of the last line."""
    ref = next(r for r in rows if r["loop"] == "reference")
    best = max((r for r in rows if r["loop"] == "raydlc"), key=lambda r: r["tokens_per_s"])
    return {
        "reference": ref["name"],
        "raydlc_best": best["name"],
        "speedup_tokens_per_s": best["tokens_per_s"] / ref["tokens_per_s"],
        "raydlc_mfu": best["mfu"],
        "reference_mfu": ref["mfu"],
    }


def last_line(s: dict[str, Any]) -> str:
    return LAST_LINE.format(ratio=s["speedup_tokens_per_s"], mfu=100 * s["raydlc_mfu"])


def format_table(report: dict[str, Any]) -> str:
    hw = report["hardware"]
    head = [
        f"device: {hw['device_name']} ({hw['device']}), peak bf16 {hw['peak_tflops']:.1f} TFLOP/s ({hw['peak_source']}), "
        f"measured matmul {hw['matmul_tflops']:.1f} TFLOP/s",
        f"model: {report['model']['name']}, {report['model']['params']:,} params, random init; "
        f"median over {report['settings']['steps']} timed steps after {report['settings']['warmup']} warm-up",
    ]
    cols = ["loop", "batch x seq", "step ms", "tokens/s", "MFU", "MFU/matmul", "peak mem GiB", "loss first->last", "falls"]
    lines = []
    for r in report["rows"]:
        mem = "n/a" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.2f}" + (" rss" if r["memory_kind"] == "rss" else "")
        lines.append(
            [
                r["name"],
                f"{r['batch']} x {r['seq']}",
                f"{1000 * r['step_time_median_s']:.1f}",
                f"{r['tokens_per_s']:,.0f}",
                f"{100 * r['mfu']:.1f}%",
                f"{100 * r['mfu_vs_measured_matmul']:.1f}%",
                mem,
                f"{r['loss_first']:.3f}->{r['loss_last']:.3f}",
                "yes" if r["loss_falls"] else "NO",
            ]
        )
    widths = [max(len(c), *(len(l[i]) for l in lines)) for i, c in enumerate(cols)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in (0, 1) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([*head, fmt(cols), rule, *(fmt(l) for l in lines)])


# ---- edges: torch, the process group, the GPU ---------------------------------------------


_T0 = time.monotonic()


def log(message: str) -> None:
    """Progress on stderr, each finished row included, so a run cut short still leaves figures."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def release(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@contextlib.contextmanager
def process_group(device: str) -> Iterator[None]:
    """A world-size-1 group so FSDP1 and FSDP2 run exactly as they would on a cluster."""
    import torch
    import torch.distributed as dist

    cuda = device == "cuda"
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        device_id=torch.device("cuda", torch.cuda.current_device()) if cuda else None,
    )
    try:
        yield
    finally:
        release(device)
        dist.barrier()
        dist.destroy_process_group()


class StepClock:
    """Step boundaries as CUDA events, so timing never stalls the GPU; wall clock on CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            import torch

            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def intervals_s(self) -> list[float]:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def reset_memory(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_memory(device: str) -> tuple[float | None, str]:
    """CUDA's high-water mark of allocated memory; on CPU the process's resident set now."""
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30, "cuda_max_allocated"
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20, "rss"
    except OSError:
        pass
    return None, "n/a"


def measure_matmul_tflops(device: str, n: int, iters: int = 20) -> float:
    """A large bf16 matmul's rate: the roofline this GPU actually reaches today."""
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    clock = StepClock(device)
    if device == "cuda":
        torch.cuda.synchronize()
    clock.mark()
    for _ in range(iters):
        a @ b
    clock.mark()
    seconds = clock.intervals_s()[0]
    del a, b
    release(device)
    return 2 * n**3 * iters / seconds / 1e12


def fixed_batch(spec: ModelSpec, batch: int, seq: int, device: str) -> torch.Tensor:
    """Random token ids, drawn once and repeated, so a loop that trains must lower its loss."""
    import torch

    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, spec.vocab_size, (batch, seq), generator=g).to(device)


def assert_finite(name: str, losses: list[float]) -> None:
    bad = [x for x in losses if not math.isfinite(x)]
    if bad:
        raise TrainError(f"{name}: non-finite loss during warm-up ({bad[0]})", hint="the loop is broken; nothing is timed")


def reference_loop(spec: ModelSpec, cfg: Settings) -> LoopResult:
    """The reference's loop as published: HF model in bf16, FSDP1 wrapped by size, plain AdamW,
    batch 1 x 128, `loss.item()` every step. (Its per-step `ray.train.report`, ~1 s each, is left out.)"""
    import functools

    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    from raydlc.train.model import build_model

    device = cfg.device
    model = build_model(spec, device=device, dtype=torch.bfloat16, seed=0)
    model = FullyShardedDataParallel(
        model,
        auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=FSDP1_MIN_PARAMS),
        device_id=torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device("cpu"),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=REFERENCE_LR)
    ids = fixed_batch(spec, REFERENCE_BATCH, REFERENCE_SEQ, device)
    clock = StepClock(device)
    losses: list[float] = []
    reset_memory(device)
    for step in range(cfg.warmup + cfg.steps):
        if step == cfg.warmup:
            assert_finite("reference", losses)
            losses.clear()
            clock.mark()
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step >= cfg.warmup:
            clock.mark()
    times = clock.intervals_s()
    mem, kind = peak_memory(device)
    del model, opt, loss
    return LoopResult("reference (FSDP1, bs1x128)", "reference", REFERENCE_BATCH, REFERENCE_SEQ, False, False, times, losses, mem, kind)


def product_settings(spec: ModelSpec, cfg: Settings, *, batch: int, seq: int, compile: bool, ac: bool) -> TrainConfig:
    """The product's settings for one row: its defaults (AdamW β2 0.95, weight decay, clipping at
    1.0, warm-up), bf16 compute, and the variant's compile/activation checkpointing."""
    from raydlc.config import TrainConfig

    return TrainConfig(
        model_id=spec.name, learning_rate=cfg.lr, batch_size=batch, seq_len=seq, num_workers=1,
        bf16=True, compile=compile, activation_checkpointing=ac,
    )


def raydlc_loop(
    spec: ModelSpec, cfg: Settings, *, batch: int, seq: int, compile: bool, ac: bool, steps: int, warmup: int
) -> LoopResult:
    """raydlc's own training step, `raydlc.train.loop.train_step`, on a model built by the
    product's `build`: FSDP2 per decoder block, bf16 compute with fp32 master weights and fp32
    gradient reduction, AdamW (fused on CUDA) with the product's clipping and warm-up. The
    step keeps its loss on the device; only the loop around it (not timed here) reads it. A step
    the finite guard skipped counts as a NaN loss: its weights did not move, so its loss proves nothing."""
    import torch

    from raydlc.train import loop as product
    from raydlc.train.layout import plan_mesh
    from raydlc.train.schedule import lr_at

    device = torch.device(cfg.device, torch.cuda.current_device()) if cfg.device == "cuda" else torch.device("cpu")
    settings = product_settings(spec, cfg, batch=batch, seq=seq, compile=compile, ac=ac)
    t = product.build(settings, spec=spec.name, mesh=plan_mesh("fsdp", [1]), device=device, bf16=True)
    ids = fixed_batch(spec, batch, seq, cfg.device)
    clock = StepClock(cfg.device)
    losses: list[torch.Tensor] = []
    reset_memory(cfg.device)
    for step in range(warmup + steps):
        if step == warmup:
            if losses:
                assert_finite("raydlc", torch.stack(losses).float().tolist())
            losses.clear()
            clock.mark()
        out = product.train_step(t, [(ids, ids)], lr_at(step + 1, settings))
        losses.append(torch.where(out.skipped, torch.full_like(out.loss, float("nan")), out.loss))
        if step >= warmup:
            clock.mark()
    times = clock.intervals_s()
    values = torch.stack(losses).float().tolist()
    mem, kind = peak_memory(cfg.device)
    del t, out, losses
    if compile:
        torch._dynamo.reset()
    name = "raydlc (FSDP2" + (", compile" if compile else "") + (", AC" if ac else "") + ")"
    return LoopResult(name, "raydlc", batch, seq, compile, ac, times, values, mem, kind)


def is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def fits_on_device(spec: ModelSpec, cfg: Settings, *, ac: bool) -> Callable[[int, int], bool]:
    """Two real steps (the second holds optimizer state during backward): the peak is reached."""
    if cfg.device != "cuda":
        # CPU memory has no OOM to find (the machine swaps or kills): the caps are the answer.
        return lambda batch, seq: True

    def fits(batch: int, seq: int) -> bool:
        ok = True
        try:
            raydlc_loop(spec, cfg, batch=batch, seq=seq, compile=False, ac=ac, steps=2, warmup=0)
        except Exception as e:
            if not is_oom(e):
                raise
            ok = False
        release(cfg.device)
        log(f"probe{' with AC' if ac else ''} {batch} x {seq}: {'fits' if ok else 'out of memory'}")
        return ok

    return fits


def choose_shape(spec: ModelSpec, cfg: Settings, *, ac: bool) -> Shape:
    """Where the micro-batch and sequence come from; swap in the planner here once it exists."""
    if cfg.batch and cfg.seq:
        return Shape(cfg.batch, cfg.seq, "flags")
    max_seq = min(cfg.seq or cfg.max_seq, spec.max_position_embeddings)
    shape = probe_shape(fits_on_device(spec, cfg, ac=ac), max_seq=max_seq, max_batch=cfg.batch or cfg.max_batch, min_seq=min(128, max_seq))
    how = "probe" if cfg.device == "cuda" else "caps (CPU: no OOM to probe)"
    return Shape(shape.batch, shape.seq, how, shape.trials)


def timed_raydlc(spec: ModelSpec, cfg: Settings, shape: Shape, *, compile: bool, ac: bool) -> LoopResult:
    """The measured run; an OOM at the probed edge (fragmentation, compile) halves the batch."""
    batch, backed_off = shape.batch, 0
    while True:
        try:
            r = raydlc_loop(spec, cfg, batch=batch, seq=shape.seq, compile=compile, ac=ac, steps=cfg.steps, warmup=cfg.warmup)
            break
        except Exception as e:
            if not is_oom(e) or batch == 1:
                raise
        release(cfg.device)
        log(f"out of memory at {batch} x {shape.seq} in the timed run: halving the batch")
        batch, backed_off = batch // 2, backed_off + 1
    r.shape_how, r.probe, r.backed_off = shape.how, shape.trials, backed_off
    return r


# ---- the run -------------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def hardware(device: str, matmul_n: int) -> dict[str, Any]:
    import torch

    from raydlc.facts.instances import gpu_for_device_name

    name = torch.cuda.get_device_name() if device == "cuda" else cpu_name()
    matmul = measure_matmul_tflops(device, matmul_n)
    gpu = gpu_for_device_name(name) if device == "cuda" else None
    peak, source = (gpu.bf16_tflops, f"table: {gpu.name}") if gpu else (matmul, "measured matmul (no table entry)")
    return {"device": device, "device_name": name, "peak_tflops": peak, "peak_source": source, "matmul_tflops": matmul, "matmul_n": matmul_n}


def run(cfg: Settings) -> dict[str, Any]:
    import torch

    from raydlc.facts.models import get_spec

    spec = get_spec(cfg.model)
    threads = torch.get_num_threads()
    if cfg.device == "cuda":
        torch.cuda.set_device(0)
    elif cfg.smoke:
        # The smoke run checks the script, not the CPU: one thread keeps it quick on a shared machine.
        torch.set_num_threads(1)
    try:
        return measure(spec, cfg)
    finally:
        torch.set_num_threads(threads)


def measure(spec: ModelSpec, cfg: Settings) -> dict[str, Any]:
    import torch

    from raydlc.facts.models import spec_dict

    hw = hardware(cfg.device, cfg.matmul_n)
    log(f"{hw['device_name']}: measured bf16 matmul {hw['matmul_tflops']:.1f} TFLOP/s; peak {hw['peak_tflops']:.1f} ({hw['peak_source']})")
    params = spec.param_count()
    rows: list[dict[str, Any]] = []

    def record(r: LoopResult) -> None:
        row = row_figures(r, params=params, spec=spec, peak_tflops=hw["peak_tflops"], matmul_tflops=hw["matmul_tflops"])
        rows.append(row)
        log(
            f"{row['name']} {row['batch']} x {row['seq']}: {1000 * row['step_time_median_s']:.1f} ms/step, "
            f"{row['tokens_per_s']:,.0f} tokens/s, MFU {100 * row['mfu']:.1f}%, loss {row['loss_first']:.3f}->{row['loss_last']:.3f}"
        )

    with process_group(cfg.device):
        record(reference_loop(spec, cfg))
    release(cfg.device)
    shapes: dict[bool, Shape] = {}
    failed: list[dict[str, str]] = []
    for variant in ["plain", *cfg.variants]:
        compile, ac = VARIANTS.get(variant, (False, False))
        try:
            with process_group(cfg.device):
                if ac not in shapes:
                    shapes[ac] = choose_shape(spec, cfg, ac=ac)
                    log(f"shape{' with AC' if ac else ''}: {shapes[ac].batch} x {shapes[ac].seq} ({shapes[ac].how})")
                record(timed_raydlc(spec, cfg, shapes[ac], compile=compile, ac=ac))
        except RaydlcError:
            raise
        except Exception as e:
            if variant == "plain":
                raise
            failed.append({"variant": variant, "error": f"{type(e).__name__}: {e}"[:1000]})
            log(f"variant {variant} failed: {failed[-1]['error']}")
            if compile:
                torch._dynamo.reset()
        release(cfg.device)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        import transformers

        versions["transformers"] = transformers.__version__
    except ImportError:
        pass
    return {
        "hardware": hw,
        "model": spec_dict(spec),
        "settings": settings,
        "versions": versions,
        "rows": rows,
        "failed_variants": failed,
        "summary": summary(rows),
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Written whole or not at all."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_args(argv: list[str] | None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU, 8 timed steps: checks the script, not a GPU")
    p.add_argument("--model", default=None, help="model spec (default qwen2.5-1.5b; tiny with --smoke)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default=None, help="default: cuda if present (cpu with --smoke)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per loop (default 30; 8 with --smoke)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5; 2 with --smoke)")
    p.add_argument("--variants", default=None, help="raydlc rows beyond plain FSDP2: all, none, or compile,ac,compile+ac (default all; ac with --smoke)")
    p.add_argument("--batch", type=int, default=None, help="raydlc micro-batch; with --seq skips the probe")
    p.add_argument("--seq", type=int, default=None, help="raydlc sequence length; with --batch skips the probe")
    p.add_argument("--max-seq", type=int, default=None, help="longest sequence the probe tries (default 4096; 128 with --smoke)")
    p.add_argument("--max-batch", type=int, default=None, help="largest micro-batch the probe tries (default 64; 2 with --smoke)")
    p.add_argument("--lr", type=float, default=REFERENCE_LR, help="raydlc's learning rate (LEARNING_RATE; the reference's is fixed at 2e-5)")
    p.add_argument("--out", type=Path, default=None, help="write every figure as JSON to this file")
    a = p.parse_args(argv)

    smoke = a.smoke
    if a.device in (None, "auto"):
        import torch

        device = "cpu" if smoke and a.device is None else ("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = a.device
    model = a.model or ("tiny" if smoke else "qwen2.5-1.5b")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda but no CUDA GPU is visible", hint="run on a GPU machine, or use --smoke on CPU")
    elif model != "tiny":
        raise InputError(f"{model} is too large to benchmark on a CPU (no CUDA GPU in use)", hint="use --smoke (the tiny model on CPU)")
    steps = a.steps if a.steps is not None else (8 if smoke else 30)
    warmup = a.warmup if a.warmup is not None else (2 if smoke else 5)
    if steps < (4 if smoke else 20):
        raise InputError(f"--steps {steps} is too few for a median", hint="use at least 20 timed steps (4 with --smoke)")
    if warmup < 1:
        raise InputError("--warmup must be at least 1: the first step allocates and compiles", hint="use --warmup 1 or more")
    for flag, v in (("--batch", a.batch), ("--seq", a.seq), ("--max-seq", a.max_seq), ("--max-batch", a.max_batch)):
        if v is not None and v < 1:
            raise InputError(f"{flag} must be positive, got {v}", hint=f"leave {flag} out to use the default")
    if a.out is not None and not a.out.parent.is_dir():
        raise InputError(f"--out {a.out}: folder {a.out.parent} does not exist", hint="create it first, or write elsewhere")
    if not (a.lr > 0 and math.isfinite(a.lr)):
        raise InputError(f"--lr must be a positive number, got {a.lr}", hint="leave --lr out to use 2e-5")
    return Settings(
        model=model,
        device=device,
        steps=steps,
        warmup=warmup,
        variants=parse_variants(a.variants if a.variants is not None else ("ac" if smoke else "all")),
        batch=a.batch,
        seq=a.seq,
        max_seq=a.max_seq or (128 if smoke else 4096),
        max_batch=a.max_batch or (2 if smoke else 64),
        lr=a.lr,
        matmul_n=8192 if device == "cuda" else 512,
        out=a.out,
        smoke=smoke,
    )


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", message=".*switching to use `NO_SHARD`.*")
    try:
        cfg = parse_args(argv)
        report = run(cfg)
        print(format_table(report))
        if cfg.out is not None:
            write_json(cfg.out, report)
        falling = [r["name"] for r in report["rows"] if not r["loss_falls"]]
        if falling:
            raise TrainError(
                f"loss did not fall over the timed steps for: {', '.join(falling)}",
                hint="both loops train on one repeated batch, so a working loop must lower its loss",
            )
        for f in report["failed_variants"]:
            print(f"variant {f['variant']} failed: {f['error'].splitlines()[0]}")
        print(last_line(report["summary"]))
        if report["failed_variants"]:
            names = ", ".join(f["variant"] for f in report["failed_variants"])
            print(f"error: variant(s) {names} failed; the other rows stand", file=sys.stderr)
            return 1
        return 0
    except RaydlcError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
