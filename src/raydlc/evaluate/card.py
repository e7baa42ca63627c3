"""The export's model card (`README.md`): the Hub's metadata block, then what ran and how to load it.

Pure: `facts` (a plain dict the run's end assembles from its settings and summary, `ending.card_facts`) in, Markdown
out. The metadata are the Hub's model-card fields (huggingface_hub `ModelCardData`): `base_model` only when it is a
hub id (a built-in spec or a local folder is no repository), `library_name` (peft for an adapter alone),
`datasets` as the data's fingerprint (the run read a prepared dataset, not a Hub dataset), `pipeline_tag`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

LOSS_POINTS = 8  # rows of the loss table: the curve as text, beside the plot (or in its place where none was drawn)


def metadata(facts: Mapping[str, Any]) -> dict[str, Any]:
    lora = facts.get("lora")
    meta: dict[str, Any] = {}
    if facts.get("base_hub_id"):
        meta["base_model"] = facts["base_hub_id"]
    meta["library_name"] = "peft" if lora and not facts.get("merged") else "transformers"
    meta["tags"] = ["raydlc", "ray-train", "fsdp2", "text-generation", *(["lora"] if lora else []),
                    *(["chat"] if facts.get("chat_template") else [])]
    meta["datasets"] = [f"raydlc-data-{facts['data_digest'][:16]}"] if facts.get("data_digest") else []
    meta["pipeline_tag"] = "text-generation"
    return meta


def _front(meta: Mapping[str, Any]) -> str:
    """YAML front matter; every value written as JSON, which YAML reads as is (no yaml dependency in the image)."""
    return "---\n" + "".join(f"{k}: {json.dumps(v)}\n" for k, v in meta.items()) + "---\n"


def _table(rows: Sequence[tuple[str, Any]], head: tuple[str, str] = ("setting", "value")) -> str:
    lines = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    lines += [f"| {k} | {v if v is not None else '—'} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def loss_points(records: Sequence[Mapping[str, Any]], n: int = LOSS_POINTS) -> list[tuple[int, float | None, float | None]]:
    """(step, train loss, eval loss at that step) at about `n` evenly spaced steps, the last one always among them."""
    steps = [r for r in records if "loss" in r]
    evals = {int(r["step"]): r["eval_loss"] for r in records if "eval_loss" in r}
    if not steps:
        return []
    picks = sorted({round(i * (len(steps) - 1) / max(1, n - 1)) for i in range(n)})
    return [(int(steps[i]["step"]), steps[i]["loss"], evals.get(int(steps[i]["step"]))) for i in picks]


def _fmt(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, float) else ("—" if x is None else str(x))


def _eval_section(ev: Mapping[str, Any] | None) -> str:
    if not ev:
        return "Not evaluated after training (EVAL_AFTER=false); run `raydlc eval <run>`.\n"
    rows = ["| | fine-tuned | base |", "|---|---|---|"]
    ft, base = ev.get("fine_tuned") or {}, ev.get("base") or {}
    for key in ("loss", "perplexity"):
        rows.append(f"| held-out {key} | {_fmt((ft.get('held_out') or {}).get(key))} | {_fmt((base.get('held_out') or {}).get(key))} |")
    for task, metrics in sorted((ft.get("tasks") or {}).items()):
        for m, v in sorted(metrics.items()):
            rows.append(f"| {task} {m} | {_fmt(v)} | {_fmt(((base.get('tasks') or {}).get(task) or {}).get(m))} |")
    text = "\n".join(rows) + "\n"
    for g in ev.get("generations") or []:
        text += f"\n**Prompt:** {g['prompt']}\n\n- fine-tuned: {g['fine_tuned']!r}\n" + (f"- base: {g['base']!r}\n" if g.get("base") is not None else "")
    return text


def _usage(facts: Mapping[str, Any]) -> str:
    """How to load it, full and adapter, with the paths the export names."""
    where = facts.get("export") or "EXPORT"
    out = ("```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
           f"tok = AutoTokenizer.from_pretrained({where!r})\nmodel = AutoModelForCausalLM.from_pretrained({where!r})\n")
    if facts.get("chat_template"):
        out += 'text = tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True)\n'
    out += "```\n"
    if facts.get("lora"):
        base = facts.get("adapter_base") or "BASE"
        out += ("\nThe LoRA adapter alone, on its base:\n\n```python\nfrom peft import PeftModel\nfrom transformers import AutoModelForCausalLM\n\n"
                f"base = AutoModelForCausalLM.from_pretrained({base!r})\nmodel = PeftModel.from_pretrained(base, {where + '/adapter'!r})\n```\n")
    out += f"\nOr with raydlc: `raydlc generate {where} --prompt \"…\" --chat` and `raydlc eval {where}`.\n"
    return out


def render(facts: Mapping[str, Any]) -> str:
    """The whole README.md."""
    lora = facts.get("lora") or {}
    hyper = [("model", facts.get("model")), ("steps", facts.get("steps")), ("sequence length", facts.get("seq_len")),
             ("global batch (sequences)", facts.get("global_batch")), ("micro-batch", facts.get("micro_batch")),
             ("gradient accumulation", facts.get("grad_accum")), ("learning rate", facts.get("learning_rate")),
             ("warm-up steps", facts.get("warmup_steps")), ("weight decay", facts.get("weight_decay")), ("precision", facts.get("precision")),
             ("seed", facts.get("seed")), ("loss on", facts.get("loss_on")), ("chat template", facts.get("chat_template_name")),
             ("epochs seen", facts.get("epochs"))]
    if lora:
        hyper += [("LoRA rank", lora.get("rank")), ("LoRA alpha", lora.get("alpha")), ("LoRA targets", ", ".join(lora.get("targets") or []))]
    layout = [("workers (ranks)", facts.get("workers")), ("nodes", facts.get("nodes")), ("sharding", facts.get("sharding")),
              ("mesh", facts.get("mesh")), ("GPUs", facts.get("use_gpu")), ("wall time (s)", _fmt(facts.get("wall_s"))),
              ("tokens/s", _fmt(facts.get("tokens_per_s")))]
    points = facts.get("loss_points") or []
    loss = "| step | train loss | eval loss |\n|---|---|---|\n" + "".join(f"| {s} | {_fmt(a)} | {_fmt(b)} |\n" for s, a, b in points)
    if facts.get("plot"):
        loss = f"![training loss]({facts['plot']})\n\n" + loss
    return (_front(metadata(facts))
            + f"\n# {facts.get('run_name') or 'raydlc fine-tune'}\n\n"
            + f"A fine-tune of `{facts.get('model')}` made with raydlc (Ray Train + FSDP2)"
            + (" with LoRA" if lora else "") + ".\n\n"
            + "## Training hyperparameters\n\n" + _table(hyper)
            + "\n## Cluster and layout\n\n" + _table(layout)
            + "\n## Training loss\n\n" + loss
            + "\n## Evaluation\n\n" + _eval_section(facts.get("evaluation"))
            + "\n## How to load it\n\n" + _usage(facts))
