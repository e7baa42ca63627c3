"""What a run produced: `raydlc generate` and `raydlc eval` (use cases in raydlc.api._evaluate; torch and
transformers load only when a command runs)."""

from __future__ import annotations

from pathlib import Path

import typer

from raydlc.cli.app import app, report
from raydlc.cli.options import JSON

EXPORT_ARG = typer.Argument(..., help="A run directory (./raydlc-out/run-…) or an export folder.")
PROMPT = typer.Option(None, "--prompt", help="A prompt.")
PROMPTS = typer.Option(None, "--prompts", help="A file of prompts: one per line, or JSON Lines with \"prompt\" (.jsonl).")
CHAT = typer.Option(False, "--chat", help="Put each prompt in a user turn of the export's chat template.")
DEVICE = typer.Option("auto", "--device", help="cpu, cuda (one GPU), or auto: a GPU when there is one.")


@app.command("generate")
def generate_cmd(
    export: str = EXPORT_ARG,
    prompt: str | None = PROMPT,
    prompts: Path | None = PROMPTS,
    chat: bool = CHAT,
    compare: str | None = typer.Option(None, "--compare", help="Also generate with this base (hub id or folder), or 'base': the run's own."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Most tokens generated per prompt."),
    temperature: float = typer.Option(0.0, "--temperature", help="0: greedy; above: sampled."),
    top_p: float = typer.Option(0.95, "--top-p", help="Nucleus sampling's share, when sampled."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    device: str = DEVICE,
    json_: bool = JSON,
) -> None:
    """Generate text locally with a run's export (its tokenizer and chat template), beside its base with --compare."""
    from raydlc.api._evaluate import generate
    from raydlc.views.evaluate import print_generated

    result = generate(export, prompt=prompt, prompts=prompts, chat=chat, compare=compare, max_new_tokens=max_new_tokens,
                      temperature=temperature, top_p=top_p, seed=seed, device=device)
    report(result, json_, lambda: print_generated(result.to_dict()))


@app.command("eval")
def eval_cmd(
    export: str = EXPORT_ARG,
    data: str | None = typer.Option(None, "--data", help="A prepared dataset to score instead of the run's held-out rows."),
    prompt: str | None = PROMPT,
    prompts: Path | None = PROMPTS,
    chat: bool = CHAT,
    tasks: str | None = typer.Option(None, "--tasks", help="lm-evaluation-harness tasks, comma-separated (needs lm-eval: the eval extra)."),
    include_path: str | None = typer.Option(None, "--include-path", help="lm-eval: a folder of task YAMLs (tasks on local files)."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="lm-eval: examples per task."),
    compare: str | None = typer.Option(None, "--compare", help="The base to compare with (hub id or folder); default: the run's own."),
    base: bool = typer.Option(True, "--base/--no-base", help="Evaluate the base beside the fine-tuned model."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="Most tokens generated per prompt."),
    device: str = DEVICE,
    json_: bool = JSON,
) -> None:
    """Held-out loss and perplexity, generations and lm-eval tasks of a run's export, beside its base."""
    from raydlc.api._evaluate import evaluate
    from raydlc.views.evaluate import print_evaluated

    result = evaluate(export, data=data, prompt=prompt, prompts=prompts, chat=chat, tasks=tasks, include_path=include_path, limit=limit,
                      compare=compare, base=base, max_new_tokens=max_new_tokens, device=device)
    report(result, json_, lambda: print_evaluated(result.to_dict()))
