"""The phases of benchmarks/gpu_check.sh: one phase per call, each row written the moment it is measured.

    torchrun --standalone --nproc-per-node=1 benchmarks/gpu_check_phases.py PHASE --out OUTDIR [--toy] [--gpu h200]
    python benchmarks/gpu_check_phases.py table --out OUTDIR

Phases (the order gpu_check.sh runs them, by value): `nccl`, `throughput`, `memory`, `l4`,
`precision`, `lora`. Each runs the product's own code (`raydlc.train.loop`: `TorchrunSession` for the
process group and device, `build` + `train_step` for the model and its step, `loss_sum` and the
chunked head for the loss) and puts the planner's prediction for the same shape beside each
measured figure. Rows go to OUTDIR/results.json (rewritten whole after each row, so a phase
killed midway leaves every row it finished) and OUTDIR/summary.md (the table, regenerated after
each row). `--toy` is the CPU dry run: the tiny spec, short sequences, gloo, the same code paths.
A figure that cannot be measured here (CUDA memory on a CPU, an API this torch lacks) is a row
with status `skipped` and its reason, never a made-up number.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

PHASES = ("nccl", "throughput", "memory", "l4", "precision", "lora")
LORA_RANK = 16  # the rank of docs/lora.md's tables
GIB = 2**30
L4_BYTES = 24 * 10**9  # the cap of the L4 rows: an L4's 24 GB


@dataclass(frozen=True)
class Size:
    """What a phase runs at: the real shapes on a GPU, toy ones for the CPU dry run."""

    toy: bool
    gpu: str
    models: tuple[str, ...]
    seq: int
    warmup: int
    steps: int
    precision_steps: int
    precision_model: str
    precision_micro_batch: int


def size_for(toy: bool, gpu: str) -> Size:
    if toy:
        return Size(True, gpu, ("tiny", "tiny-2l", "tiny-7b-shape"), 64, 1, 2, 8, "tiny", 2)
    return Size(False, gpu, ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b-fit"), 2048, 2, 5, 30, "qwen2.5-0.5b", 4)


# ---- results: one JSON, one table, rewritten after every row -------------------------------------


def _load(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return {"rows": []}


def add_row(out: Path, row: dict[str, Any]) -> None:
    """Append one row to results.json (atomically: written beside, then renamed) and redo summary.md."""
    doc = _load(out)
    doc["rows"].append(row)
    tmp = out / ".results.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, out / "results.json")
    write_table(out, doc)
    print(f"row {row.get('phase')}/{row.get('name')}: {row.get('status')}", flush=True)


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}{unit}" if abs(v) < 100 else f"{v:,.0f}{unit}"
    return f"{v}{unit}"


COLUMNS = ("phase", "name", "status", "measured", "planner", "ratio", "note")


def table_lines(doc: dict[str, Any]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in doc["rows"]:
        m, p = r.get("measured"), r.get("planned")
        ratio = m / p if isinstance(m, (int, float)) and isinstance(p, (int, float)) and p else None
        cells = [r.get("phase"), r.get("name"), r.get("status"), _fmt(m, r.get("unit", "")), _fmt(p, r.get("unit", "")),
                 _fmt(ratio), str(r.get("note", "")).replace("|", "/").replace("\n", " ")[:160]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def write_table(out: Path, doc: dict[str, Any]) -> None:
    head = [
        "# GPU check (benchmarks/gpu_check.sh)", "",
        "measured beside the planner's prediction for the same shape; ratio = measured / planner.", "",
    ]
    (out / "summary.md").write_text("\n".join(head + table_lines(doc)) + "\n")


# ---- the product's code under torchrun ------------------------------------------------------------


def register_shapes(toy: bool, gpu: str) -> None:
    """Specs the rows name that are not built in: a 7B of the layer count that fits the GPU, toy stand-ins."""
    from raydlc.facts.models import SPECS

    tiny = SPECS["tiny"]
    SPECS["tiny-2l"] = replace(tiny, name="tiny-2l", num_layers=2)
    SPECS["tiny-7b-shape"] = replace(tiny, name="tiny-7b-shape", num_layers=1, hidden_size=512, num_heads=8,
                                     num_kv_heads=2, intermediate_size=1376)
    if not toy:
        layers = layers_that_fit("qwen2.5-7b", gpu, seq=2048)
        SPECS["qwen2.5-7b-fit"] = replace(SPECS["qwen2.5-7b"], name="qwen2.5-7b-fit", num_layers=layers)


def layers_that_fit(model: str, gpu: str, *, seq: int, headroom: float = 0.8) -> int:
    """The most decoder layers whose planned total at micro-batch 1 stays under `headroom` of the GPU."""
    from raydlc import planner
    from raydlc.facts.models import get_spec

    spec = get_spec(model)
    layout = planner.layout_for(1, 1, gpu=gpu, network_gbps=100)
    for n in range(spec.num_layers, 0, -1):
        w = planner.Workload(replace(spec, num_layers=n), seq_len=seq, micro_batch=1, grad_accum=1, policy="bf16-mixed")
        if planner.memory_bytes(w, 1)["total"] <= headroom * planner.gpu_capacity(layout):
            return n
    return 1


def planned(model: str, gpu: str, *, seq: int, micro_batch: int | None = None, fp32: bool = False, lora_rank: int = 0,
            compile: bool = True) -> dict[str, Any]:
    """The planner on one GPU: its micro-batch (unless given), step time, tokens/s, MFU and per-term bytes
    (LoRA on a frozen base when `lora_rank` > 0), for a compiled or an eager run: an eager row is compared
    with the eager prediction (the planner's MFU / its compile factor), never the compiled one."""
    from raydlc import planner
    from raydlc.facts.models import get_spec
    from raydlc.planner.model import flops_per_step

    spec = get_spec(model)
    layout = planner.layout_for(1, 1, gpu=gpu, network_gbps=100)
    policy = "fp32" if fp32 else "bf16-mixed"
    if micro_batch is None:
        auto = planner.plan(planner.Workload(spec, seq_len=seq, grad_accum="auto", policy=policy, lora_rank=lora_rank, compile=compile), layout)
        micro_batch = auto.micro_batch
    w = planner.Workload(spec, seq_len=seq, micro_batch=micro_batch, grad_accum=1, policy=policy, lora_rank=lora_rank, compile=compile)
    p = planner.plan(w, layout)
    w = w.at(activation_checkpointing=p.activation_checkpointing)
    return {
        "micro_batch": micro_batch, "fits": p.fits, "step_time_s": p.step_time_s["estimate"],
        "tokens_per_s": p.step_time_s["tokens_per_s"], "mfu": p.assumptions["mfu_used"], "bytes": dict(p.per_gpu_bytes),
        "capacity_bytes": p.gpu_memory_bytes, "params": spec.param_count(), "layers": spec.num_layers,
        "adapter_params": spec.lora_params(lora_rank, None) if lora_rank else 0, "compile": compile,
        "flops_per_token": flops_per_step(w) / w.tokens,  # the planner's formula: 6N (8N recomputed) + attention + the head again
    }


class Skip(Exception):
    """A row this tree cannot measure, for the reason given: `skipped`, never a made-up number."""


class Phase:
    """One phase's process: the session (process group, device) and a row writer that never loses a row."""

    def __init__(self, name: str, out: Path, size: Size) -> None:
        import torch

        from raydlc.train.loop import TorchrunSession

        self.name, self.out, self.size = name, out, size
        self.session = TorchrunSession(str(out))
        self.cuda = torch.cuda.is_available()
        self.device = self.session.device() if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        self.torch = torch.__version__

    def row(self, name: str, status: str, **fields: Any) -> None:
        add_row(self.out, {"phase": self.name, "name": name, "status": status, "torch": self.torch, "toy": self.size.toy, **fields})

    def guarded(self, name: str, fn: Callable[[], None]) -> None:
        """Run one row's work; an API this torch lacks is `skipped` with the reason, any other failure `error`."""
        try:
            fn()
        except Skip as e:
            self.row(name, "skipped", note=str(e))
        except (AttributeError, ImportError, NotImplementedError, TypeError) as e:
            self.row(name, "skipped", note=f"needs a newer torch than {self.torch}? {type(e).__name__}: {e}")
        except Exception as e:
            traceback.print_exc()
            self.row(name, "error", note=f"{type(e).__name__}: {e}"[:300])
        finally:
            release(self.cuda)


def release(cuda: bool) -> None:
    import gc

    import torch

    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def memory(cuda: bool) -> dict[str, float | None]:
    import torch

    if not cuda:
        return {"peak_allocated_gib": None, "peak_reserved_gib": None}
    return {"peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB, "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB}


def reset_peaks(cuda: bool) -> None:
    import torch

    if cuda:
        torch.cuda.reset_peak_memory_stats()


def trainer(ph: Phase, model: str, *, micro_batch: int, compile: bool, bf16: bool = True, lr: float = 2e-5, lora_rank: int = 0) -> Any:
    from raydlc.config import TrainConfig
    from raydlc.train import loop as product
    from raydlc.train.layout import plan_mesh

    settings = TrainConfig(model_id=model, learning_rate=lr, batch_size=micro_batch, seq_len=ph.size.seq, num_workers=1,
                           bf16=bf16, compile=compile, checkpoint_every=0, lora_rank=lora_rank)
    return product.build(settings, spec=model, mesh=plan_mesh("fsdp", [1]), device=ph.device, bf16=bf16)


def fixed_ids(vocab: int, batch: int, seq: int, device: Any, seed: int = 0) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)


def timed_steps(ph: Phase, t: Any, ids: Any, *, warmup: int, steps: int) -> tuple[list[float], list[float]]:
    """Warm-up steps, then `steps` timed ones (wall clock after a device sync); the step times and losses."""
    import torch

    from raydlc.train import loop as product
    from raydlc.train.schedule import lr_at

    losses, times = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        out = product.train_step(t, [(ids, ids)], lr_at(i + 1, t.settings))
        if ph.cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        losses.append(float(out.loss))
    return times, losses


# ---- phases -----------------------------------------------------------------------------------------


def phase_nccl(ph: Phase) -> None:
    """The collectives the loop uses, on this device's backend: all-reduce and reduce-scatter in bf16 and fp32."""
    import torch
    import torch.distributed as dist

    backend = dist.get_backend()
    if dist.get_world_size() < 2:  # a collective over one rank moves nothing: no figure, only a reason
        ph.row("collectives", "skipped", note=f"world {dist.get_world_size()} on {backend}: NCCL is measured with 2 or more GPUs")
        return
    ph.row("process group", "ok", note=f"backend {backend}, world {dist.get_world_size()}, device {ph.device}")
    n = 1 << (24 if ph.cuda else 12)
    for op in ("all_reduce", "reduce_scatter"):
        for dtype in (torch.bfloat16, torch.float32):
            name = f"{op} {str(dtype).removeprefix('torch.')}"

            def one(op: str = op, dtype: Any = dtype, name: str = name) -> None:
                x = torch.ones(n, dtype=dtype, device=ph.device)
                t0 = time.perf_counter()
                if op == "all_reduce":
                    dist.all_reduce(x)
                    y = x
                else:
                    y = torch.empty(n // dist.get_world_size(), dtype=dtype, device=ph.device)
                    dist.reduce_scatter_tensor(y, x)
                if ph.cuda:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                err = float((y.float() - dist.get_world_size()).abs().max())
                ph.row(name, "ok" if err == 0 else "wrong", measured=round(dt * 1e3, 3), unit=" ms",
                       note=f"{n} elements, max error {err}")

            ph.guarded(name, one)


def throughput_order(size: Size) -> list[tuple[str, bool]]:
    """(model, compiled) in order of value: the 7B compiled first (the row the planner's cluster plans rest on), then the
    eager rows, then the other compiled ones. The dry run compiles one toy model: the code path, not the figure."""
    if size.toy:
        return [(size.models[0], True), *((m, False) for m in size.models)]
    return [(size.models[-1], True), *((m, False) for m in size.models), *((m, True) for m in size.models[:-1])]


def phase_throughput(ph: Phase) -> None:
    """tokens/s and MFU per model, at the planner's micro-batch (throughput_order); peak memory beside the planner's terms."""
    for model, compile in throughput_order(ph.size):
        name = f"{model} {'compiled' if compile else 'eager'}"
        ph.guarded(name, lambda model=model, compile=compile, name=name: _throughput_row(ph, model, compile, name))


def _throughput_row(ph: Phase, model: str, compile: bool, name: str) -> None:
    from raydlc.facts.instances import GPUS

    p, mb, t, times, losses = _at_planned_micro_batch(ph, model, name, compile=compile)
    step = sorted(times)[len(times) // 2]
    tps = mb * ph.size.seq / step
    peak = GPUS[ph.size.gpu].bf16_tflops * 1e12
    mfu_6n = 6 * p["params"] * tps / peak
    mfu = p["flops_per_token"] * tps / peak  # the planner's own count, so measured and planned MFU are the same quantity
    mem = memory(ph.cuda)
    b = p["bytes"]
    planned_gib = (b["total"] - b["overhead"]) / GIB
    del t
    note = (f"mb {mb} x seq {ph.size.seq}, {p['layers']} layers, median of {len(times)} steps {step:.3f}s (planner {p['step_time_s']:.3f}s); "
            f"MFU {mfu:.1%} by the planner's FLOPs, {mfu_6n:.1%} at 6N (planner {'compiled' if compile else 'eager'} {p['mfu']:.1%}); "
            f"loss {losses[0]:.3f}->{losses[-1]:.3f}")
    if ph.size.toy:
        note += "; toy: MFU against the GPU's peak means nothing on a CPU"
    ph.row(name, "ok", measured=round(tps, 1), planned=p["tokens_per_s"], unit=" tok/s", mfu=mfu, mfu_6n=mfu_6n, mfu_planned=p["mfu"],
           compile=compile, micro_batch=mb, seq=ph.size.seq, step_s=step, step_times_s=times, losses=losses, note=note,
           planned_bytes=b, planned_without_overhead_gib=planned_gib, **mem)
    if mem["peak_allocated_gib"] is not None:
        ph.row(f"{name} peak allocated", "ok", measured=round(mem["peak_allocated_gib"], 2), planned=round(planned_gib, 2), unit=" GiB",
               note=f"reserved {mem['peak_reserved_gib']:.2f} GiB; planner total with overhead {b['total'] / GIB:.2f} GiB")


def is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def _at_planned_micro_batch(
    ph: Phase, model: str, name: str, *, compile: bool, lora_rank: int = 0
) -> tuple[dict[str, Any], int, Any, list[float], list[float]]:
    """(plan, micro-batch, trainer, step times, losses) at the planner's micro-batch (2 on a toy).

    A micro-batch that does not fit is a finding (its `oom` row); then half of it is measured."""
    p = planned(model, ph.size.gpu, seq=ph.size.seq, lora_rank=lora_rank, compile=compile)
    mb = p["micro_batch"] if not ph.size.toy else 2
    if ph.size.toy:
        p = planned(model, ph.size.gpu, seq=ph.size.seq, micro_batch=mb, lora_rank=lora_rank, compile=compile)
    try:
        return (p, mb, *_measured(ph, model, mb, compile, lora_rank=lora_rank))
    except Exception as e:
        if not is_oom(e) or mb == 1:
            raise
        ph.row(f"{name} at the planner's micro-batch {mb}", "oom", note=f"out of memory: {str(e).splitlines()[0][:150]}", micro_batch=mb)
    release(ph.cuda)
    mb //= 2
    p = planned(model, ph.size.gpu, seq=ph.size.seq, micro_batch=mb, lora_rank=lora_rank, compile=compile)
    return (p, mb, *_measured(ph, model, mb, compile, lora_rank=lora_rank))


def _measured(ph: Phase, model: str, mb: int, compile: bool, lora_rank: int = 0) -> tuple[Any, list[float], list[float]]:
    from raydlc.facts.models import get_spec

    reset_peaks(ph.cuda)
    t = trainer(ph, model, micro_batch=mb, compile=compile, lora_rank=lora_rank)
    if lora_rank:
        check_lora(t.model)
    ids = fixed_ids(get_spec(model).vocab_size, mb, ph.size.seq, ph.device)
    times, losses = timed_steps(ph, t, ids, warmup=ph.size.warmup, steps=ph.size.steps)
    return t, times, losses


def phase_memory(ph: Phase) -> None:
    """Peaks per phase of a step (forward, backward, optimizer) of the 7B-shaped model vs the planner's terms."""
    import torch

    from raydlc.facts.models import get_spec
    from raydlc.train.loop import forward_backward, optimizer_step, target_tokens

    model = ph.size.models[-1]

    def run() -> None:
        p = planned(model, ph.size.gpu, seq=ph.size.seq, micro_batch=1)
        t = trainer(ph, model, micro_batch=1, compile=False)
        ids = fixed_ids(get_spec(model).vocab_size, 1, ph.size.seq, ph.device)
        b = p["bytes"]
        want = {"backward": b["total"] - b["overhead"], "optimizer": b["params"] + b["grads"] + b["optimizer"]}
        for _ in range(2):  # the second step has the optimizer state: its peaks are the steady ones
            peaks: dict[str, dict[str, float | None]] = {}
            reset_peaks(ph.cuda)
            n = target_tokens(t, [(ids, ids)])
            loss = forward_backward(t, (ids, ids), n)
            if ph.cuda:
                torch.cuda.synchronize()
            peaks["backward"] = memory(ph.cuda)
            reset_peaks(ph.cuda)
            optimizer_step(t, 1e-5, loss)
            if ph.cuda:
                torch.cuda.synchronize()
            peaks["optimizer"] = memory(ph.cuda)
        for stage in ("backward", "optimizer"):
            m = peaks[stage]
            status = "ok" if m["peak_allocated_gib"] is not None else "skipped"
            ph.row(f"{model} {stage} peak", status, unit=" GiB", planned=round(want[stage] / GIB, 2),
                   measured=None if m["peak_allocated_gib"] is None else round(m["peak_allocated_gib"], 2),
                   note=("reserved " + _fmt(m["peak_reserved_gib"], " GiB") if status == "ok" else "no CUDA: no allocator peaks (dry run)")
                   + "; planner terms (GiB): " + ", ".join(f"{k} {v / GIB:.2f}" for k, v in b.items() if v), **m)
        del t

    ph.guarded(f"{model} step phases", run)


def phase_l4(ph: Phase) -> None:
    """What the planner says fits an L4 at world size 1, run on this GPU capped to 24 GB."""
    import torch

    from raydlc.facts.models import get_spec

    for model in ph.size.models[:2]:
        name = f"{model} capped to 24 GB"

        def run(model: str = model, name: str = name) -> None:
            p = planned(model, "l4", seq=ph.size.seq)
            mb = p["micro_batch"] if not ph.size.toy else 2
            if not ph.cuda:
                ph.row(name, "skipped", planned=round((p["bytes"]["total"]) / GIB, 2), unit=" GiB",
                       note=f"no CUDA: set_per_process_memory_fraction needs a GPU (dry run); planner: fits {p['fits']} at mb {mb}")
                return
            total = torch.cuda.get_device_properties(ph.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, L4_BYTES / total), ph.device)
            try:
                reset_peaks(True)
                t = trainer(ph, model, micro_batch=mb, compile=False)
                ids = fixed_ids(get_spec(model).vocab_size, mb, ph.size.seq, ph.device)
                try:
                    timed_steps(ph, t, ids, warmup=1, steps=2)
                    fits, why = True, "ran 3 steps"
                except torch.OutOfMemoryError as e:
                    fits, why = False, f"out of memory: {str(e).splitlines()[0][:120]}"
                m = memory(True)
                del t
            finally:
                torch.cuda.set_per_process_memory_fraction(1.0, ph.device)
            agree = "agrees" if fits == p["fits"] else "DISAGREES"
            ph.row(name, "ok", measured=round(m["peak_allocated_gib"], 2), planned=round(p["bytes"]["total"] / GIB, 2), unit=" GiB",
                   fits=fits, planner_fits=p["fits"], micro_batch=mb,
                   note=f"mb {mb}: {why}; planner says fits={p['fits']} ({agree}); reserved {m['peak_reserved_gib']:.2f} GiB", **m)

        ph.guarded(name, run)


def phase_precision(ph: Phase) -> None:
    """bf16 vs fp32 loss over 30 steps (8 in the dry run), and the chunked loss's gradients vs the plain loss's."""
    ph.guarded("bf16 vs fp32 loss", lambda: _bf16_vs_fp32(ph))
    ph.guarded("chunked vs plain loss gradients", lambda: _chunked_vs_plain(ph))


def _bf16_vs_fp32(ph: Phase) -> None:
    from raydlc.facts.models import get_spec

    model, mb = ph.size.precision_model, ph.size.precision_micro_batch
    seq = min(ph.size.seq, 512)
    runs = {}
    for bf16 in (True, False):
        t = trainer(ph, model, micro_batch=mb, compile=False, bf16=bf16, lr=1e-4)
        ids = fixed_ids(get_spec(model).vocab_size, mb, seq, ph.device)
        _, runs[bf16] = timed_steps(ph, t, ids, warmup=0, steps=ph.size.precision_steps)
        del t
        release(ph.cuda)
    rel = [abs(a - b) / abs(b) for a, b in zip(runs[True], runs[False])]
    ph.row(f"{model} bf16 vs fp32 loss, {len(rel)} steps", "ok", measured=max(rel), unit="",
           note=f"max relative loss difference (mb {mb} x seq {seq}); final bf16 {runs[True][-1]:.4f} fp32 {runs[False][-1]:.4f}",
           losses_bf16=runs[True], losses_fp32=runs[False])


def _chunked_vs_plain(ph: Phase) -> None:
    import torch

    from raydlc.facts.models import get_spec
    from raydlc.train.loop import loss_sum
    from raydlc.train.loss import use_chunked_loss
    from raydlc.train.model import build_model

    spec = get_spec(ph.size.precision_model)
    seq = min(ph.size.seq, 512)
    ids = fixed_ids(spec.vocab_size, 2, seq, ph.device)
    grads = {}
    for chunk in (0, 128 if ph.size.toy else 1024):
        net = build_model(spec, device=ph.device, dtype=torch.bfloat16, seed=0)
        if chunk:
            use_chunked_loss(net, chunk)
        total, _ = loss_sum(net, ids, ids)
        total.backward()
        grads[chunk] = torch.cat([p.grad.float().flatten() for p in net.parameters() if p.grad is not None])
        del net
    a, b = grads[0].double(), grads[max(grads)].double()
    rel = float((a - b).norm() / b.norm())
    cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    ph.row(f"{spec.name} bf16 chunked vs plain loss gradients", "ok", measured=rel, unit="",
           note=f"relative L2 difference of all gradients, chunk {max(grads)}; cosine {cos:.6f}")


def phase_lora(ph: Phase) -> None:
    """LoRA rank 16 on the 7B-shaped model (eager): tokens/s and peak memory beside the planner's LoRA figures
    and the throughput phase's full fine-tune of the same model. The product's build applies the adapters
    (`raydlc.train.lora.apply_lora`, issue 36); a tree without it gets a skipped row saying so."""
    model = ph.size.models[-1]
    name = f"{model} LoRA r{LORA_RANK} eager"
    try:
        from raydlc.train.lora import apply_lora  # noqa: F401  (the contract's entry point: present or not)
    except ImportError as e:
        ph.row(name, "skipped", note=f"no LoRA in this tree (raydlc.train.lora.apply_lora: {e}); it lands with issue 36")
        return
    ph.guarded(name, lambda: _lora_row(ph, model, name))


def check_lora(net: Any) -> None:
    """The built model carries adapters and a frozen base, or the row would time a full fine-tune under LoRA's name."""
    from raydlc.train.lora import is_adapter_key

    trained = [n for n, p in net.named_parameters() if p.requires_grad]
    if not trained or not all(is_adapter_key(n) for n in trained):
        raise LoRANotApplied(f"the product's build trained {len(trained)} parameters, not adapters only "
                             f"(first: {trained[:2]}): TrainConfig.lora_rank is not applied in this tree")


class LoRANotApplied(Skip):
    """A tree with raydlc.train.lora whose build does not apply it yet: a skipped row, not an error."""


def _lora_row(ph: Phase, model: str, name: str) -> None:
    from raydlc.facts.instances import GPUS

    p, mb, t, times, losses = _at_planned_micro_batch(ph, model, name, compile=False, lora_rank=LORA_RANK)
    del t
    step = sorted(times)[len(times) // 2]
    tps = mb * ph.size.seq / step
    # The planner's LoRA FLOPs (assumptions.lora_flops): 4N for the frozen base, 6 per adapter parameter.
    mfu = (4 * p["params"] + 6 * p["adapter_params"]) * tps / (GPUS[ph.size.gpu].bf16_tflops * 1e12)
    mem = memory(ph.cuda)
    b = p["bytes"]
    planned_gib = (b["total"] - b["overhead"]) / GIB
    full = full_row(ph.out, f"{model} eager")
    beside = "no full fine-tune row (throughput phase) to compare"
    if full and full.get("measured"):
        beside = f"full fine-tune {full['measured']:,.0f} tok/s at mb {full.get('micro_batch')}: LoRA/full {tps / full['measured']:.2f}"
    note = (f"{beside}; mb {mb} x seq {ph.size.seq}, {p['layers']} layers, {p['adapter_params']:,} adapter params, median of {len(times)} "
            f"steps {step:.3f}s (planner {p['step_time_s']:.3f}s); MFU {mfu:.1%} at 4N+6A FLOPs/token; loss {losses[0]:.3f}->{losses[-1]:.3f}")
    ph.row(name, "ok", measured=round(tps, 1), planned=p["tokens_per_s"], unit=" tok/s", mfu=mfu, micro_batch=mb, seq=ph.size.seq,
           lora_rank=LORA_RANK, step_s=step, step_times_s=times, losses=losses, note=note, planned_bytes=b,
           planned_without_overhead_gib=planned_gib, full_tokens_per_s=full.get("measured") if full else None, **mem)
    if mem["peak_allocated_gib"] is not None:
        full_peak = full.get("peak_allocated_gib") if full else None
        ph.row(f"{name} peak allocated", "ok", measured=round(mem["peak_allocated_gib"], 2), planned=round(planned_gib, 2), unit=" GiB",
               note=f"full fine-tune peak {_fmt(full_peak, ' GiB')} at mb {full.get('micro_batch') if full else '-'}; "
               f"reserved {mem['peak_reserved_gib']:.2f} GiB; planner total with overhead {b['total'] / GIB:.2f} GiB")


def full_row(out: Path, name: str) -> dict[str, Any] | None:
    """The throughput phase's row of that name with status ok (the full fine-tune beside LoRA), if it ran."""
    return next((r for r in _load(out)["rows"] if r.get("name") == name and r.get("status") == "ok"), None)


def plan_fit(gpu: str, out: Path) -> bool:
    """The real (not toy) shapes the phases would run on `gpu`, planned: a row per throughput and LoRA shape with its
    planned bytes at the planner's micro-batch against the GPU's memory. Pure planner, no device: the dry run proves with
    it that a plan sized for, say, an 80 GB H100 fits 80 GB. True when every shape fits."""
    from raydlc.facts.instances import GPUS

    size = size_for(False, gpu)
    register_shapes(False, gpu)
    cap = GPUS[gpu].memory_gib * GIB
    ok = True
    shapes = [(m, c, 0) for m, c in throughput_order(size)] + [(size.models[-1], False, LORA_RANK)]
    for model, compile, rank in shapes:
        p = planned(model, gpu, seq=size.seq, compile=compile, lora_rank=rank)
        total = p["bytes"]["total"]
        fits = bool(p["fits"]) and total <= cap
        ok &= fits
        kind = f"LoRA r{rank}" if rank else ("compiled" if compile else "eager")
        add_row(out, {"phase": "fit", "name": f"{model} {kind}", "status": "ok" if fits else "too big", "gpu": gpu, "toy": False,
                      "measured": round(total / GIB, 2), "planned": round(cap / GIB, 2), "unit": " GiB", "micro_batch": p["micro_batch"],
                      "layers": p["layers"], "note": f"planned total at micro-batch {p['micro_batch']} vs {GPUS[gpu].name}'s {cap / GIB:.1f} GiB"})
    return ok


def detect_gpu() -> str | None:
    """The key of facts.instances.GPUS for this machine's GPU 0 (its name; its memory printed beside), or None."""
    import torch

    from raydlc.facts.instances import GPUS, gpu_for_device_name

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    model = gpu_for_device_name(props.name)
    key = next((k for k, g in GPUS.items() if g is model), None)
    print(f"GPU 0: {props.name}, {props.total_memory / GIB:.1f} GiB, {torch.cuda.device_count()} GPU(s): {key or 'unknown'}", file=sys.stderr)
    return key


RUN = {"nccl": phase_nccl, "throughput": phase_throughput, "memory": phase_memory, "l4": phase_l4, "precision": phase_precision,
       "lora": phase_lora}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=(*PHASES, "table", "fit", "detect"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--toy", action="store_true", help="the CPU dry run: tiny shapes, gloo")
    ap.add_argument("--gpu", default="h100", help="the GPU the planner plans for (a key of raydlc.facts.instances.GPUS)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.phase == "detect":
        key = detect_gpu()
        print(key or "")
        return 0 if key else 1
    if a.phase == "fit":
        return 0 if plan_fit(a.gpu, a.out) else 1
    if a.phase == "table":
        doc = _load(a.out)
        write_table(a.out, doc)
        print("\n".join(table_lines(doc)))
        return 0
    size = size_for(a.toy, a.gpu)
    register_shapes(a.toy, a.gpu)
    ph = Phase(a.phase, a.out, size)
    RUN[a.phase](ph)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
