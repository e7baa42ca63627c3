#!/usr/bin/env python
"""The LoRA tables of docs/lora.md, generated from the planner (`raydlc.api.plan`, the arithmetic `raydlc plan` prints).

    python scripts/lora_tables.py           # print them
    python scripts/lora_tables.py --write   # put them into docs/lora.md, between its markers

For every registry model (raydlc.facts.models, but the `tiny` toy) and one node type per GPU family
(g5, g6, g6e: the 4-GPU 12xlarge; p4d, p5: the 8-GPU 24xlarge/48xlarge), the fewest nodes on which
LoRA rank 16 fits and the fewest on which full fine-tuning fits, at seq 2048; then per family the
memory per GPU, the recommended layout, tokens/s and the On-Demand price per million tokens of each.
Planner figures, not timings: the recommendation may turn on activation checkpointing, the chunked
loss and bf16 reduction, as `raydlc plan` does when nothing fits. tests/test_docs.py checks that
docs/lora.md holds exactly what this prints, so a planner change is one run of this script.
Settings come from the defaults only: RAYDLC_* variables and a raydlc.yaml are ignored.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docgen import DOCS, write_block
from raydlc.facts.instances import INSTANCE_TYPES
from raydlc.facts.models import SPECS

PAGE = DOCS / "lora.md"
BLOCK = "lora-tables"
# One node type per GPU family: the 4-GPU size of the PCIe families (the smallest with EFA), the 8-GPU p4d/p5.
FAMILIES = {"g5": "g5.12xlarge", "g6": "g6.12xlarge", "g6e": "g6e.12xlarge", "p4d": "p4d.24xlarge", "p5": "p5.48xlarge"}
RANK, SEQ_LEN, MAX_NODES = 16, 2048, 16
MODELS = tuple(name for name in SPECS if name != "tiny")


@dataclass(frozen=True)
class Fit:
    """The smallest cluster of one node type that holds one model, and the planner's figures for it."""

    nodes: int
    plan: dict[str, Any]

    @property
    def rec(self) -> dict[str, Any]:
        return self.plan["recommendation"]


@cache
def smallest(model: str, instance_type: str, lora_rank: int) -> Fit | None:
    """The fewest nodes of `instance_type` (up to MAX_NODES) on which a layout fits; None when none does."""
    import raydlc.api as api

    for nodes in range(1, MAX_NODES + 1):
        p = api.plan(model=model, nodes=nodes, instance_type=instance_type, seq_len=SEQ_LEN, lora_rank=lora_rank).to_dict()
        if p["recommendation"]["micro_batch"] > 0:
            return Fit(nodes, p)
    return None


def gb(n: float) -> str:
    return f"{n / 1e9:.1f}"


def nodes_cell(fit: Fit | None) -> str:
    return f"> {MAX_NODES}" if fit is None else str(fit.nodes)


def family_header(family: str) -> str:
    t = INSTANCE_TYPES[FAMILIES[family]]
    return f"{family} ({t.gpus} × {t.gpu_model.name})" if t.gpu_model else family


def smallest_table() -> list[str]:
    """Model by family: nodes for LoRA rank 16, then for full fine-tuning."""
    head = "| model | parameters | LoRA r16 adapters | " + " | ".join(family_header(f) for f in FAMILIES) + " |"
    lines = [head, "|---|---:|---:|" + "---:|" * len(FAMILIES)]
    for model in MODELS:
        spec = SPECS[model]
        cells = [f"{nodes_cell(smallest(model, t, RANK))} · {nodes_cell(smallest(model, t, 0))}" for t in FAMILIES.values()]
        lines.append(f"| {model} | {spec.param_count() / 1e9:.1f} B | {spec.lora_params(RANK, None) / 1e6:.1f} M | " + " | ".join(cells) + " |")
    return lines


def memory_split(b: dict[str, int]) -> tuple[int, int, int]:
    """The recommended layout's per-GPU bytes at its peak phase as three: the weights (own shard + a gathered
    block), the trained state (gradients, optimizer, master copies, reduce buffers), activations and logits
    (0 where the optimizer step is the peak: they are freed by then); `overhead` is in the total only."""
    weights = b["params"] + b["unsharded_params"]
    trained = b["optimizer"] + b["fp32_master"] + b["grads"] + b["unsharded_grads"] + b["reduce_buffer"] + b["accumulated_grads"]
    return weights, trained, b["activations"] + b["logits"]


def layout_cell(r: dict[str, Any]) -> str:
    accum = f" × {r['grad_accum']} ({r['sync']})" if r["grad_accum"] > 1 else ""
    return f"{r['strategy']} mb {r['micro_batch']}{accum}{', SAC' if r['activation_checkpointing'] == 'selective' else (', AC' if r['activation_checkpointing'] else '')}"


def family_row(model: str, kind: str, fit: Fit | None) -> str:
    if fit is None:
        return f"| {model} | {kind} | > {MAX_NODES} | | | | | | | |"
    r = fit.rec
    weights, trained, acts = memory_split(r["per_gpu_bytes_itemised"])
    usd_h = fit.plan["prices"]["on_demand_usd_per_hour"]
    per_m = "" if usd_h is None else f"{usd_h / (r['tokens_per_s'] * 3600) * 1e6:,.2f}"
    return (f"| {model} | {kind} | {fit.nodes} | {gb(weights)} | {trained / 1e9:.2f} | {gb(acts)} | {gb(r['per_gpu_bytes'])} | "
            f"{layout_cell(r)} | {r['tokens_per_s']:,.0f} | {per_m} |")


def family_table(family: str) -> list[str]:
    """Per model, LoRA rank 16 and full fine-tuning on their smallest clusters of this family."""
    t = INSTANCE_TYPES[FAMILIES[family]]
    gpu = t.gpu_model
    title = f"#### {t.name}: {t.gpus} × {gpu.name if gpu else '?'} ({gpu.memory_gib if gpu else 0:g} GiB), {t.network_gbps:g} Gb/s"
    head = ("| model | fine-tune | nodes | weights GB/GPU | trained state GB/GPU | activations GB/GPU | total GB/GPU | "
            "layout | tokens/s | $ per M tokens |")
    lines = [title, "", head, "|---|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for model in MODELS:
        lines.append(family_row(model, f"LoRA r{RANK}", smallest(model, t.name, RANK)))
        lines.append(family_row(model, "full", smallest(model, t.name, 0)))
    return lines


def tables() -> str:
    """Everything between the markers of docs/lora.md."""
    parts = [
        f"Nodes in the smallest cluster that holds each model at seq {SEQ_LEN}: LoRA rank {RANK} (all seven projections) · "
        f"full fine-tuning; > {MAX_NODES}: none up to {MAX_NODES} nodes.",
        "",
        *smallest_table(),
        "",
        "Per family, each on its smallest cluster: per-GPU memory at the step's peak (weights: the base's own shard plus one "
        "gathered block; trained state: gradients, AdamW, fp32 copies; activations with logits, 0 where the optimizer step "
        "is the peak; the total adds the fixed overhead), "
        "the recommended layout (mb = micro-batch per GPU, AC = activation checkpointing, SAC = selective), planned tokens/s and the "
        "On-Demand list price per million tokens.",
    ]
    for family in FAMILIES:
        parts += ["", *family_table(family)]
    return "\n".join(parts)


def defaults_only() -> str:
    """The tables are the defaults' plans: drop RAYDLC_* variables and plan from an empty folder (no raydlc.yaml)."""
    for k in [k for k in os.environ if k.startswith("RAYDLC_")]:
        del os.environ[k]
    with tempfile.TemporaryDirectory(prefix="lora-tables-") as empty:
        here = os.getcwd()
        os.chdir(empty)
        try:
            return tables()
        finally:
            os.chdir(here)


if __name__ == "__main__":
    text = defaults_only()
    if sys.argv[1:] == ["--write"]:
        print(f"{PAGE}: {'updated' if write_block(PAGE, BLOCK, 'scripts/lora_tables.py', text) else 'unchanged'}")
    else:
        print(text)
