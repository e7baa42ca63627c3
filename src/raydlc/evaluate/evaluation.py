"""One evaluation of an export, beside its base: the held-out perplexity, the prompts' generations and, when
lm-evaluation-harness is installed, its tasks. The same function answers `raydlc eval` and the Ray task that
EVAL_AFTER starts after training (evaluate.ending)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from raydlc.evaluate import exports, generation, scoring
from raydlc.evaluate.exports import BuildBuiltin, Export

PROMPT_TOKENS = 16  # default prompts: the first tokens of held-out rows
DEFAULT_PROMPTS = 2


@dataclass(frozen=True)
class Request:
    """What to evaluate beyond the export: another base (`compare`), other data, prompts, harness tasks."""

    data: str | None = None  # a prepared dataset; None: the run's held-out rows (raydlc_run.json)
    prompts: Sequence[str] = ()
    chat: bool = False
    tasks: Sequence[str] = ()
    include_path: str | None = None  # lm-eval: a folder of task YAMLs (local data)
    limit: int | None = None  # lm-eval: examples per task
    compare: str | None = None  # a base to compare with, instead of the run's own
    base: bool = True  # evaluate the base too
    sampling: generation.Sampling = field(default_factory=generation.Sampling)
    device: str = "cpu"


def held_out(export: Export, data: str | None) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(ids, labels, documents, where from): `data`'s first rows, else the run's own eval rows, masked by
    document as the run trained (a record from before DOCUMENT_MASKING: on, its default)."""
    if data is not None:
        ids, labels, docs = scoring.rows_of(data, None)
        return ids, labels, docs, {"dataset": data, "rows": "first", "run_eval_loss": None}
    run = export.run
    if not run.get("dataset") or not run.get("eval_rows"):
        from raydlc.errors import InputError

        raise InputError(f"{export.root}: the export names no held-out data (no {exports.PROVENANCE} from a raydlc run)",
                         hint="pass --data DATASET (a prepared dataset, raydlc data prepare)")
    ids, labels, docs = scoring.rows_of(str(run["dataset"]), list(run["eval_rows"]), masking=bool(run.get("document_masking", True)))
    return ids, labels, docs, {"dataset": run["dataset"], "rows": "held out by the run", "run_eval_loss": run.get("eval_loss")}


def default_prompts(tok: Any, ids: Any, n: int = DEFAULT_PROMPTS) -> list[str]:
    return [tok.decode(list(row[:PROMPT_TOKENS]), skip_special_tokens=True) for row in ids[:n]]


def one(model: Any, tok: Any, rows: tuple[Any, Any, Any], prompts: Sequence[str], r: Request) -> dict[str, Any]:
    from raydlc.evaluate import harness

    out: dict[str, Any] = {"held_out": scoring.score(model, *rows).to_dict(),
                           "generations": generation.generate(model, tok, prompts, chat=r.chat, sampling=r.sampling)}
    if r.tasks:
        out["tasks"] = harness.run(model, tok, r.tasks, include_path=r.include_path, limit=r.limit)
    return out


def evaluate(export: Export, r: Request, *, build: BuildBuiltin | None = None, load_adapter: exports.LoadAdapter | None = None) -> dict[str, Any]:
    """The fine-tuned model and its base, side by side, as one JSON-ready dict."""
    tok = exports.load_tokenizer(export)
    ids, labels, docs, source = held_out(export, r.data)
    prompts = list(r.prompts) or default_prompts(tok, ids)
    model = exports.load_model(export, device=r.device, build=build, load_adapter=load_adapter)
    tuned = one(model, tok, (ids, labels, docs), prompts, r)
    del model
    base_model = exports.load_base(export, device=r.device, build=build, override=r.compare) if r.base else None
    base = one(base_model, tok, (ids, labels, docs), prompts, r) if base_model is not None else None
    b = {"path": r.compare} if r.compare else (export.base or {})
    return {
        "export": str(export.root),
        "base_name": b.get("path") or (f"{b['builtin']} (seeded init, seed {b.get('seed', 0)})" if b.get("builtin") else None),
        "source": source,
        "fine_tuned": {k: v for k, v in tuned.items() if k != "generations"},
        "base": None if base is None else {k: v for k, v in base.items() if k != "generations"},
        "generations": [{"prompt": p, "fine_tuned": g, "base": base["generations"][i] if base else None} for i, (p, g) in enumerate(zip(prompts, tuned["generations"]))],
    }
