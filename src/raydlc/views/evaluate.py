"""`raydlc generate` and `raydlc eval` for people: each prompt with its completions one under the other (long text
wraps, never a column squeezed at 80 characters), and the scores fine-tuned beside base in one table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.markup import escape


def _console(console: Any) -> Any:
    if console is not None:
        return console
    from raydlc.views.output import console as default

    return default


def _completions(outputs: Sequence[Mapping[str, Any]], base_name: str | None, c: Any) -> None:
    for o in outputs:
        c.print(f"[bold]prompt:[/] {escape(repr(o['prompt']))}", highlight=False)
        c.print(f"  [green]fine-tuned:[/] {escape(repr(o['fine_tuned']))}", highlight=False)
        if o.get("base") is not None:
            c.print(f"  [yellow]base:[/] {escape(repr(o['base']))}", highlight=False)
    if base_name:
        c.print(f"[dim]base: {escape(base_name)}[/]", highlight=False)


def print_generated(result: Mapping[str, Any], console: Any = None) -> None:
    c = _console(console)
    s = result["sampling"]
    how = "greedy" if not s["temperature"] else f"sampled (temperature {s['temperature']}, top-p {s['top_p']}, seed {s['seed']})"
    c.print(f"{escape(result['export'])}: {how}, up to {s['max_new_tokens']} new tokens" + (", chat template" if result["chat"] else ""), highlight=False)
    _completions(result["outputs"], result.get("base"), c)


def _f(x: Any) -> str:
    return "—" if x is None else (f"{x:.4f}" if isinstance(x, float) else str(x))


def score_rows(result: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(what, fine-tuned, base) rows: the held-out loss and perplexity, then each lm-eval task's metrics."""
    ft, base = result["fine_tuned"], result.get("base") or {}
    rows = [(f"held-out {k}", _f(ft["held_out"][k]), _f((base.get("held_out") or {}).get(k))) for k in ("loss", "perplexity", "tokens")]
    for task, metrics in sorted((ft.get("tasks") or {}).items()):
        for m, v in sorted(metrics.items()):
            rows.append((f"{task} {m}", _f(v), _f(((base.get("tasks") or {}).get(task) or {}).get(m))))
    return rows


def print_evaluated(result: Mapping[str, Any], console: Any = None) -> None:
    from rich.table import Table

    c = _console(console)
    src = result["source"]
    c.print(f"{escape(result['export'])}: {escape(str(src['dataset']))} ({src['rows']})", highlight=False)
    table = Table(show_edge=False)
    table.add_column("")
    table.add_column("fine-tuned", justify="right")
    table.add_column("base", justify="right")
    for row in score_rows(result):
        table.add_row(*row)
    c.print(table)
    if src.get("run_eval_loss") is not None:
        c.print(f"[dim]the run's own last eval loss: {src['run_eval_loss']:.4f}[/]", highlight=False)
    _completions(result["generations"], result.get("base_name"), c)
