"""lm-evaluation-harness tasks on a loaded model, when lm-eval is installed (the `eval` extra).

Its tasks read their data from the Hub on a real machine; `include_path` adds a folder of task YAMLs (a task on
local files: `dataset_path: json`, `dataset_kwargs: {data_files: …}`). The model is handed over loaded (lm-eval's
`HFLM(pretrained=<model>, tokenizer=…)`), so the figures are those of the very weights `raydlc eval` scores.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

from raydlc.errors import InputError


def available() -> bool:
    try:
        return importlib.util.find_spec("lm_eval") is not None
    except (ImportError, ValueError):
        return False


def metrics_of(results: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """lm-eval's `results` ({task: {"acc,none": 0.5, "acc_stderr,none": …, "alias": …}}) as {task: {metric: value}}."""
    out: dict[str, dict[str, float]] = {}
    for task, values in results.items():
        out[task] = {k.split(",")[0]: float(v) for k, v in values.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool) and "_stderr" not in k}
    return out


def run(model: Any, tok: Any, tasks: Sequence[str], *, include_path: str | None = None, limit: int | None = None) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} of lm-eval's `simple_evaluate` on this model."""
    if not available():
        raise InputError("--tasks needs lm-evaluation-harness, which is not installed here", hint="pip install 'raydlc[eval]'")
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if manager is None or any(t not in manager.all_tasks for t in tasks):  # indexing lm-eval's own thousands of tasks takes a while
        manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise InputError(f"--tasks: lm-eval knows no task {', '.join(unknown)}", hint="lm-eval ls tasks lists them; --include-path adds a folder of task YAMLs")
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=1, device=str(next(model.parameters()).device))
    res = simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit, log_samples=False)
    return metrics_of((res or {}).get("results", {}))
