"""The loss plot, the evaluation and the model card as steps of the run's end (train.ending registers them, in
this order).

Each takes the `RunEnd` (the run's settings `spec` and its `summary` so far) and returns what it adds to the
summary. `evaluation` runs only with EVAL_AFTER=true: the same evaluation as `raydlc eval`, as one Ray task on one
GPU worker (a CPU one on a CPU cluster) of the cluster the run used, its results under `evaluation`. `card` always
writes the export's `README.md` and `raydlc_run.json` (the base and the held-out rows `raydlc eval` reads), after
the evaluation so that the card shows it; `loss_plot` draws `loss.png` first, so that the card embeds a copy of it
(`export/loss.png`, referenced relatively: the export uploaded on its own keeps its card whole).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from raydlc import storage
from raydlc.evaluate import card as cards
from raydlc.evaluate.exports import PROVENANCE, BuildBuiltin

CARD = "README.md"
PLOT = "loss.png"  # the card's copy of the loss plot, beside it in the export


class End(Protocol):  # train.ending.RunEnd, by shape (evaluate sits below train)
    @property
    def spec(self) -> Any: ...
    @property
    def summary(self) -> Mapping[str, Any]: ...


def export_path(end: End) -> str:
    return str(end.summary.get("export") or storage.join(end.spec.run_dir, "export"))


def base_of(spec: Any) -> dict[str, Any]:
    """Where the run's base is: a built-in spec's seeded init (under LoRA, the `base/` folder the export wrote),
    else the pretrained model's id or folder."""
    if spec.spec is None:
        return {"path": spec.train.model_id}
    if spec.train.lora_rank > 0:
        return {"path": f"{spec.run_dir.rstrip('/')}/export/base"}
    return {"builtin": spec.spec, "seed": spec.train.seed}


def provenance(end: End) -> dict[str, Any]:
    """What `raydlc eval` needs of the run and no Hub file says: the base, the dataset and its held-out rows."""
    from raydlc.data.order import eval_rows
    from raydlc.data.shards import read_manifest

    spec, s = end.spec, end.summary
    dest = s.get("dataset")
    m = read_manifest(str(dest)) if dest else None
    rows = eval_rows(m.rows, eval_fraction=spec.train.eval_fraction, world_size=spec.mesh.world_size, seed=spec.train.seed).tolist() if m else []
    return {"run_name": spec.run_name, "model": spec.train.model_id, "base": base_of(spec), "dataset": dest, "eval_rows": rows,
            "eval_loss": s.get("eval_loss"), "document_masking": spec.train.document_masking, "seq_len": spec.train.seq_len, "chat_template": spec.tokenizer.template,
            "data_digest": spec.data_digest}


def loss_plot(end: End) -> dict[str, Any]:
    """The run's end's first step: `loss.png` beside the metrics (`plot`), or `plot_note` saying why not.
    Imported here: the module names matplotlib, which the image that loads this one has not (tests/test_dlc_env.py)."""
    from raydlc.evaluate.plot import with_plot

    drawn = with_plot({**end.summary, "run_dir": end.summary.get("run_dir") or end.spec.run_dir})
    return {"plot": drawn.get("plot"), "plot_note": drawn.get("plot_note")}


def _write(end: End, files: Mapping[str, str | bytes]) -> str:
    """Files into the export, local or in object storage alike (edges.storage.publish)."""
    from raydlc.edges.storage import publish

    where = export_path(end)
    with tempfile.TemporaryDirectory(prefix="raydlc-card-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data if isinstance(data, bytes) else data.encode())
        publish(Path(tmp), where)
    return where


def evaluate_task(export: str, prov: Mapping[str, Any], device: str, build: BuildBuiltin | None) -> dict[str, Any]:
    """On the worker: the export (downloaded when it is in object storage), evaluated beside its base."""
    from raydlc.evaluate import evaluation, exports

    with tempfile.TemporaryDirectory(prefix="raydlc-eval-") as tmp:
        local = export
        if storage.is_uri(export):
            from raydlc.edges.storage import download

            local = str(download(export, Path(tmp) / "export"))
        found = exports.locate(local)
        base = dict(prov.get("base") or {})
        if str(base.get("path", "")).startswith(export.rstrip("/") + "/"):  # the export's own base/, downloaded with it
            base["path"] = str(Path(local) / str(base["path"])[len(export.rstrip("/")) + 1:])
        found = exports.Export(found.root, found.model_dir, found.adapter_dir, {**prov, "base": base})
        return evaluation.evaluate(found, evaluation.Request(device=device), build=build)


def evaluation(end: End, *, build: BuildBuiltin | None = None) -> dict[str, Any]:
    """EVAL_AFTER: one Ray task on one GPU (or CPU) worker evaluates the export; its results join the summary."""
    if not getattr(end.spec.train, "eval_after", False):
        return {}
    import ray

    gpu = bool(end.spec.use_gpu)
    task = ray.remote(num_gpus=1 if gpu else 0, num_cpus=1, max_retries=0)(evaluate_task)
    result = ray.get(task.remote(export_path(end), provenance(end), "cuda" if gpu else "cpu", build))
    return {"evaluation": result}


def card_facts(end: End, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The card's facts from the run's settings, summary and metrics."""
    from raydlc.facts.models import looks_like_path

    spec, s, t = end.spec, end.summary, end.spec.train
    lora = None
    if t.lora_rank > 0:
        adapter = storage.join(export_path(end), "adapter", "adapter_config.json")
        conf = _read_json(adapter)
        targets = conf.get("target_modules") or []
        lora = {"rank": t.lora_rank, "alpha": conf.get("lora_alpha", t.lora_alpha),
                "targets": [targets] if isinstance(targets, str) else targets}  # a LORA_TARGET_REGEX pattern is one string
    pretrained = spec.spec is None
    base = base_of(spec)
    return {
        "run_name": spec.run_name, "model": t.model_id, "export": export_path(end),
        "base_hub_id": t.model_id if pretrained and not looks_like_path(t.model_id) else None,
        "adapter_base": base.get("path") or t.model_id, "lora": lora, "merged": t.lora_merge,
        "chat_template": True, "chat_template_name": "the model's own" if spec.tokenizer.template == "model" else "raydlc default (ChatML-style im_start and im_end turns)",
        "data_digest": spec.data_digest, "steps": s.get("steps"), "seq_len": t.seq_len, "global_batch": spec.global_batch,
        "micro_batch": t.batch_size, "grad_accum": t.grad_accum, "learning_rate": t.learning_rate, "warmup_steps": t.warmup_steps,
        "weight_decay": t.weight_decay, "precision": "bf16" if spec.bf16 else "fp32", "seed": t.seed, "loss_on": t.loss_on,
        "epochs": round(spec.global_batch * int(s.get("steps") or 0) / s["train_sequences"], 3) if s.get("train_sequences") else None,
        "workers": spec.mesh.world_size, "nodes": spec.mesh.nodes, "sharding": spec.mesh.sharding, "mesh": list(spec.mesh.shape),
        "use_gpu": spec.use_gpu, "wall_s": s.get("wall_s"), "tokens_per_s": s.get("tokens_per_s"),
        "loss_points": cards.loss_points(records), "evaluation": s.get("evaluation"),
    }


def _read_json(path: str) -> dict[str, Any]:
    from raydlc.edges.storage import read_text

    try:
        return dict(json.loads(read_text(path)))
    except (OSError, ValueError):
        return {}


def _records(end: End) -> list[dict[str, Any]]:
    from raydlc.edges.storage import read_text

    metrics = end.summary.get("metrics")
    try:
        return [json.loads(line) for line in read_text(str(metrics)).splitlines() if line.strip()] if metrics else []
    except (OSError, ValueError):
        return []


def _plot_png(end: End) -> bytes | None:
    """The loss plot the first step drew (a local path or a URI), or None: a card without it is still a card."""
    from raydlc.edges.storage import read_bytes
    from raydlc.errors import RaydlcError

    plot = end.summary.get("plot")
    try:
        return read_bytes(str(plot)) if plot else None
    except (OSError, RaydlcError):
        return None


def card(end: End) -> dict[str, Any]:
    """The export's README.md (the model card), raydlc_run.json, and the loss plot it shows (`loss.png`)."""
    png = _plot_png(end)
    facts = {**card_facts(end, _records(end)), "plot": PLOT if png else None}
    files: dict[str, str | bytes] = {CARD: cards.render(facts), PROVENANCE: json.dumps(provenance(end), indent=1)}
    if png:
        files[PLOT] = png
    where = _write(end, files)
    return {"model_card": storage.join(where, CARD)}
