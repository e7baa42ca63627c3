"""The plan for a person: memory per component for FSDP and HSDP, per-step traffic and time, the choice."""

from __future__ import annotations

from typing import Any

from raydlc.planner import GB, TrainingPlan


def print_plan(p: TrainingPlan, console: Any) -> None:
    """Tables for people: memory by component for both strategies, then time and the recommendation."""
    from rich.table import Table

    def gb(n: float) -> str:
        return f"{n / GB:.2f} GB"

    lay = p.layout
    console.print(
        f"[bold]{p.model}[/] ({p.params:,} parameters), {p.policy}, {lay['nodes']} x {lay['gpus_per_node']} "
        f"{lay['gpu_name']} ({gb(p.gpu_memory_bytes)}), {lay['network_gbps']:g} Gb/s "
        f"{'EFA' if lay['efa'] else 'TCP'}, seq {p.seq_len}"
    )
    asked = getattr(p, "asked", None)
    if asked is not None:
        console.print(f"asked: {asked_line(asked)}", highlight=False)
    shown = (f"micro-batch {p.micro_batch}{f' x {p.grad_accum} accumulated' if p.grad_accum > 1 else ''}, "
             f"activation checkpointing {ac_word(p.activation_checkpointing)}")
    console.print(f"figures below: {shown}" + (" (the planner's choice where not asked)" if asked is not None else ""), highlight=False)
    if p.lora.get("rank"):
        console.print(f"LoRA rank {p.lora['rank']} on {', '.join(p.lora['targets'])}: {p.lora['adapter_params']:,} adapter parameters "
                      f"({p.lora['trained_fraction']:.2%}) trained, the base frozen in bf16")
    mem = Table(title="per-GPU memory")
    mem.add_column("component")
    for s in p.strategies.values():
        mem.add_column(f"{s.strategy} (shard {s.shard_size}" + (f", sync {s.sync})" if p.grad_accum > 1 else ")"), justify="right")
    for key in p.per_gpu_bytes:
        mem.add_row(key, *(gb(s.per_gpu_bytes[key]) for s in p.strategies.values()))
    mem.add_row("fits", *("yes" if s.fits else "[red]no[/]" for s in p.strategies.values()))
    mem.add_row("largest micro-batch", *(str(s.max_micro_batch) for s in p.strategies.values()))
    console.print(mem)
    step = Table(title="per step")
    step.add_column("")
    for s in p.strategies.values():
        step.add_column(s.strategy, justify="right")
    rows = [
        ("received per GPU", lambda s: gb(s.traffic_bytes_per_step["per_gpu"])),
        ("across the network per node", lambda s: gb(s.traffic_bytes_per_step["cross_node_per_node"])),
        ("compute", lambda s: f"{s.step_time_s['compute']:.3f} s"),
        ("step (EFA)", lambda s: f"{s.step_time_s['efa']['estimate']:.3f} s ({s.step_time_s['efa']['bound']})"),
        ("step (TCP)", lambda s: f"{s.step_time_s['tcp']['estimate']:.3f} s ({s.step_time_s['tcp']['bound']})"),
        ("tokens/s", lambda s: f"{s.step_time_s['tokens_per_s']:,.0f}"),
    ]
    for label, fn in rows:
        step.add_row(label, *(fn(s) for s in p.strategies.values()))
    console.print(step)
    print_recommendation(p.recommendation, console)
    if (src := p.assumptions.get("mfu_source")) is not None:
        console.print(f"MFU {p.assumptions['mfu_used']:g} on {lay['gpu_name']} ({'compiled' if p.assumptions.get('compile') else 'eager'}), "
                      f"[italic]{src['kind']}[/]: {src['source']}", highlight=False)
    prices = getattr(p, "prices", None)
    if prices:
        from raydlc.capacity.prices import GpuPrices

        console.print(GpuPrices.from_dict(prices).line(), highlight=False)


def ac_word(ac: Any) -> str:
    """How a line shows ACTIVATION_CHECKPOINTING: on (full), off, or selective."""
    return "selective" if ac == "selective" else ("on" if ac else "off")


def asked_line(asked: dict[str, Any]) -> str:
    """What the caller set, each setting left unset named as the planner's to choose."""
    mb, accum, ac = asked.get("micro_batch"), asked.get("grad_accum"), asked.get("activation_checkpointing")
    return ", ".join((
        f"micro-batch {mb}" if mb is not None else "micro-batch: the planner's choice",
        f"{accum} accumulated" if accum is not None else "accumulation: the planner's choice",
        "activation checkpointing: the planner's choice" if ac is None else f"activation checkpointing {ac_word(ac)}",
    ))


def print_recommendation(r: dict[str, Any], console: Any) -> None:
    """The chosen layout and why; when nothing fits only why: a "micro-batch 0, ~0 tokens/s" layout is no recommendation."""
    if r["micro_batch"] == 0:
        console.print(f"[bold red]nothing recommended:[/] {r['reason']}; {r['micro_batch_reason']}")
        return
    accum = f" x {r['grad_accum']} accumulated (sync {r['sync']})" if r["grad_accum"] > 1 else ""
    console.print(
        f"[bold]recommended:[/] {r['strategy']}, micro-batch {r['micro_batch']}{accum}, "
        f"~{r['tokens_per_s']:,.0f} tokens/s (global batch at most {r['max_global_batch']:,} tokens)"
    )
    console.print(f"  why: {r['reason']}; micro-batch: {r['micro_batch_reason']}")
