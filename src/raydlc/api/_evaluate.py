"""The `generate` and `eval` use cases: what a run produced, looked at locally (CPU, or one GPU), beside its base."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raydlc.errors import InputError


@dataclass(frozen=True)
class GenerateResult:
    """Each prompt's completion by the fine-tuned model (and by `base` with --compare); `to_dict()` is `--json`."""

    export: str
    base: str | None
    chat: bool
    sampling: dict[str, Any]
    outputs: list[dict[str, Any]] = field(default_factory=list)  # {prompt, fine_tuned, base}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        from raydlc.views.evaluate import print_generated
        from raydlc.views.text import rendered

        return rendered(lambda console: print_generated(self.to_dict(), console))


@dataclass(frozen=True)
class EvalResult:
    """The held-out loss and perplexity, generations and lm-eval tasks, fine-tuned beside base; `to_dict()` is `--json`."""

    export: str
    base_name: str | None
    source: dict[str, Any]
    fine_tuned: dict[str, Any]
    base: dict[str, Any] | None
    generations: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        from raydlc.views.evaluate import print_evaluated
        from raydlc.views.text import rendered

        return rendered(lambda console: print_evaluated(self.to_dict(), console))


def read_prompts(prompt: str | None, prompts: str | os.PathLike[str] | None) -> list[str]:
    """`prompt`, or the file's prompts: one per line, or JSON Lines with a "prompt" field (.jsonl)."""
    if prompt is not None and prompts is not None:
        raise InputError("--prompt and --prompts are exclusive", hint="give one prompt, or a file of them")
    if prompts is None:
        return [prompt] if prompt is not None else []
    path = Path(prompts)
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except OSError as e:
        raise InputError(f"--prompts {prompts}: {e.strerror or e}") from None
    if path.suffix == ".jsonl":
        try:
            return [str(json.loads(ln)["prompt"]) for ln in lines]
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"--prompts {prompts}: every line must be a JSON object with a \"prompt\" ({type(e).__name__}: {e})") from None
    if not lines:
        raise InputError(f"--prompts {prompts}: no prompt in the file")
    return lines


def _device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _sampling(max_new_tokens: int, temperature: float, top_p: float, seed: int) -> Any:
    from raydlc.evaluate.generation import Sampling

    if max_new_tokens < 1 or temperature < 0 or not 0 < top_p <= 1:
        raise InputError("--max-new-tokens must be at least 1, --temperature at least 0 (0 = greedy), --top-p in (0, 1]")
    return Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)


def load_adapter(base: Any, adapter: Path) -> Any:
    """A LoRA-only export (LORA_MERGE=false) on its base, with peft."""
    try:
        from peft import PeftModel
    except ImportError:
        raise InputError(f"{adapter} is a LoRA adapter alone, and peft is not installed here",
                         hint="pip install peft, or train with --merge (the default) for a merged model") from None
    return PeftModel.from_pretrained(base, str(adapter))


def generate(export: str | os.PathLike[str], *, prompt: str | None = None, prompts: str | os.PathLike[str] | None = None,
             chat: bool = False, compare: str | None = None, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 0.95,
             seed: int = 0, device: str = "auto") -> GenerateResult:
    """Generate from a run's export (or an export folder) with its tokenizer and, with `chat`, its chat template;
    greedy unless `temperature` > 0. `compare`: a base model (hub id or folder, or `base` for the run's own) whose
    completions of the same prompts come beside.

    Example:
        >>> import tempfile
        >>> import raydlc.api as api
        >>> run = api.train(steps=3, seq_len=32, batch_size=2, workers=1, out=tempfile.mkdtemp(), log_to_driver=False)  # slow
        >>> result = api.generate(run.run_dir, prompt="Return the", max_new_tokens=8, compare="base", device="cpu")
        >>> [sorted(o) for o in result.outputs], result.base
        ([['base', 'fine_tuned', 'prompt']], 'tiny (seeded init)')
    """
    from raydlc.evaluate import exports, generation
    from raydlc.train.model import build_builtin

    found = exports.locate(export)
    texts = read_prompts(prompt, prompts)
    if not texts:
        raise InputError("nothing to generate from", hint='give --prompt "…" or --prompts FILE')
    s, dev = _sampling(max_new_tokens, temperature, top_p, seed), _device(device)
    tok = exports.load_tokenizer(found)
    tuned = generation.generate(exports.load_model(found, device=dev, build=build_builtin, load_adapter=load_adapter), tok, texts, chat=chat, sampling=s)
    base_out: list[str] | None = None
    base_name = None
    if compare is not None:
        base = exports.load_base(found, device=dev, build=build_builtin, override=None if compare == "base" else compare)
        if base is None:
            raise InputError(f"{found.root}: the export names no base to compare with", hint="name one: --compare MODEL_DIR")
        base_out = generation.generate(base, tok, texts, chat=chat, sampling=s)
        b = {"path": compare} if compare != "base" else (found.base or {})
        base_name = str(b.get("path") or f"{b.get('builtin')} (seeded init)")
    outputs = [{"prompt": p, "fine_tuned": t, "base": base_out[i] if base_out is not None else None} for i, (p, t) in enumerate(zip(texts, tuned))]
    return GenerateResult(str(found.root), base_name, chat, asdict(s), outputs)


def evaluate(export: str | os.PathLike[str], *, data: str | None = None, prompt: str | None = None,
             prompts: str | os.PathLike[str] | None = None, chat: bool = False, tasks: str | None = None, include_path: str | None = None,
             limit: int | None = None, compare: str | None = None, base: bool = True, max_new_tokens: int = 32,
             device: str = "auto") -> EvalResult:
    """Evaluate a run's export beside its base: the loss and perplexity on the run's held-out rows (or the first rows
    of the prepared dataset `data`), the prompts' greedy generations (default: the start of two held-out rows), and
    lm-evaluation-harness `tasks` (comma-separated; `include_path`: a folder of task YAMLs) when lm-eval is installed.

    Example:
        >>> import math, tempfile
        >>> import raydlc.api as api
        >>> run = api.train(steps=6, seq_len=32, batch_size=2, workers=1, out=tempfile.mkdtemp(), log_to_driver=False)  # slow
        >>> result = api.evaluate(run.run_dir, max_new_tokens=8, device="cpu")
        >>> held = result.fine_tuned["held_out"]
        >>> abs(held["perplexity"] / math.exp(run.eval_loss) - 1) < 1e-3, held["perplexity"] < result.base["held_out"]["perplexity"]
        (True, True)
    """
    from raydlc.evaluate import evaluation, exports
    from raydlc.train.model import build_builtin

    found = exports.locate(export)
    wanted = [t.strip() for t in (tasks or "").split(",") if t.strip()]
    if wanted:
        from raydlc.evaluate import harness

        if not harness.available():
            raise InputError("--tasks needs lm-evaluation-harness, which is not installed here", hint="pip install 'raydlc[eval]'")
    request = evaluation.Request(data=data, prompts=tuple(read_prompts(prompt, prompts)), chat=chat, tasks=tuple(wanted),
                                 include_path=include_path, limit=limit, compare=None if compare == "base" else compare, base=base,
                                 sampling=_sampling(max_new_tokens, 0.0, 1.0, 0), device=_device(device))
    return EvalResult(**evaluation.evaluate(found, request, build=build_builtin, load_adapter=load_adapter))
