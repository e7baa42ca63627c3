"""An export as the tools read it: where its model, adapter, base and provenance are, and loading them.

A run directory holds `export/`; an export holds a full Hugging Face model (a full fine-tune, or LoRA's merged
weights), `adapter/` (LoRA, peft's format) and, for a LoRA run on a built-in spec, `base/`. raydlc writes
`raydlc_run.json` beside the card: the base it started from and the held-out rows it evaluated on, which is what
`raydlc eval` and `--compare` need and nothing on the Hub says.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydlc.errors import InputError

PROVENANCE = "raydlc_run.json"
ADAPTER = "adapter"  # as train.lora_export.ADAPTER_DIR
ADAPTER_CONFIG = "adapter_config.json"

# A built-in spec's seeded random init, built by the caller's function (train.model.build_model over facts.models).
BuildBuiltin = Callable[[str, int], Any]


@dataclass(frozen=True)
class Export:
    """One export on disk: `model_dir` (a full HF model) or only `adapter_dir`, and what raydlc recorded of the run."""

    root: Path
    model_dir: Path | None
    adapter_dir: Path | None
    run: Mapping[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> Mapping[str, Any] | None:
        """The base the run started from: {"path": hub id or folder} or {"builtin": spec, "seed": n}; None: unknown."""
        b = self.run.get("base")
        if b:
            return b
        if self.adapter_dir is not None:
            named = json.loads((self.adapter_dir / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
            return {"path": named} if named else None
        return None


def locate(path: str | Path) -> Export:
    """A run directory (its `export/`) or an export folder; anything else is one clear error."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise InputError(f"{path}: no such directory", hint="name a run directory (./raydlc-out/run-…) or its export folder")
    root = p / "export" if (p / "export").is_dir() and not (p / "config.json").is_file() else p
    model_dir = root if (root / "config.json").is_file() else None
    adapter = root / ADAPTER if (root / ADAPTER / ADAPTER_CONFIG).is_file() else (root if (root / ADAPTER_CONFIG).is_file() else None)
    if model_dir is None and adapter is None:
        raise InputError(f"{path}: neither a run directory with an export nor an export (no config.json, no {ADAPTER}/{ADAPTER_CONFIG})",
                         hint="a run writes its export when it ends: run raydlc train first, or name <run>/export")
    prov = root / PROVENANCE
    run = json.loads(prov.read_text()) if prov.is_file() else {}
    return Export(root, model_dir, adapter, run)


def load_tokenizer(export: Export) -> Any:
    from transformers import AutoTokenizer

    for where in (export.model_dir, export.adapter_dir, _base_dir(export)):
        if where is not None and ((where / "tokenizer.json").is_file() or (where / "tokenizer_config.json").is_file()):
            return AutoTokenizer.from_pretrained(str(where))
    raise InputError(f"{export.root}: no tokenizer in the export", hint="export again with a raydlc that writes one")


def _base_dir(export: Export) -> Path | None:
    b = export.base or {}
    p = Path(str(b.get("path", ""))) if b.get("path") else None
    return p if p is not None and p.is_dir() else None


# A LoRA adapter on its loaded base (peft, where installed: the image has none, so the caller hands it in).
LoadAdapter = Callable[[Any, Path], Any]


def load_model(export: Export, *, device: str = "cpu", dtype: Any = None, build: BuildBuiltin | None = None,
               load_adapter: LoadAdapter | None = None) -> Any:
    """The fine-tuned model, eval mode: the full/merged weights, else the base with the adapter (`load_adapter`)."""
    from transformers import AutoModelForCausalLM

    if export.model_dir is not None:
        return AutoModelForCausalLM.from_pretrained(str(export.model_dir), dtype=dtype or "auto").to(device).eval()
    assert export.adapter_dir is not None
    if load_adapter is None:
        raise InputError(f"{export.root} holds only a LoRA adapter, and no adapter loader (peft) is at hand here",
                         hint="pip install peft and run raydlc eval locally, or train with --merge (the default) for a merged model")
    base = load_base(export, device=device, dtype=dtype, build=build)
    if base is None:
        raise InputError(f"{export.adapter_dir}: the adapter names no base that can be loaded")
    return load_adapter(base, export.adapter_dir).to(device).eval()


def load_base(export: Export, *, device: str = "cpu", dtype: Any = None, build: BuildBuiltin | None = None,
              override: str | None = None) -> Any | None:
    """The model the run started from (or `override`, a hub id or folder): None when it is a built-in spec and
    no `build` is given. A hub id needs the network or the local hub cache."""
    from transformers import AutoModelForCausalLM

    b: Mapping[str, Any] = {"path": override} if override else (export.base or {})
    if b.get("builtin"):
        return None if build is None else build(str(b["builtin"]), int(b.get("seed", 0))).to(device).eval()
    if not b.get("path"):
        return None
    from raydlc.facts.models import model_dir

    where = model_dir(str(b["path"]))
    try:
        return AutoModelForCausalLM.from_pretrained(str(where or b["path"]), dtype=dtype or "auto").to(device).eval()
    except OSError as e:
        raise InputError(f"cannot load the base {b['path']!r}: {str(e).splitlines()[0]}",
                         hint="name a local model folder with --compare, or set HF_HUB_OFFLINE=1 with the model in the hub cache") from e
