"""A LoRA run's products: the adapter in peft's saved format and the merged Hugging Face weights, written without peft.

The Ray Train image has no peft (tests/doubles/dlc_packages.json), so the format is written here as peft 0.21.2
writes it (tests/doubles/FIDELITY.md): `PeftModel.save_pretrained` puts `adapter_config.json` (the LoraConfig's
fields as JSON, `config.py` `PeftConfigMixin.save_pretrained`) and `adapter_model.safetensors` (metadata
`{"format": "pt"}`, contiguous tensors) in one folder; the tensors are keyed by the wrapped model's names,
`base_model.model.` + the HF module path + `.lora_A.weight` (r x in) / `.lora_B.weight` (out x r), the adapter name
("default") removed (`utils/save_and_load.py` `get_peft_model_state_dict`). Those are raydlc's own keys
(raydlc.train.lora's LoRALinear) behind that prefix, so the export is a rename, not a conversion.

Everything here is pure but `write`, which stages the export beside its folder and renames it into place, so a
failure leaves nothing behind and a rewrite (a restart that finishes again) replaces the earlier export whole.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.errors import LoRAExportError

if TYPE_CHECKING:
    from torch import Tensor

A_SUFFIX = ".lora_A.weight"
B_SUFFIX = ".lora_B.weight"
ADAPTER_SUFFIXES = (A_SUFFIX, B_SUFFIX)  # as raydlc.train.lora's, repeated so this module stands alone
PEFT_PREFIX = "base_model.model."  # peft's LoraModel (base_model) wrapping the HF model (model)
ADAPTER_DIR = "adapter"
BASE_DIR = "base"  # beside the adapter: the frozen base as a HF model, when it was built here (a built-in spec) and no hub holds it
CONFIG_NAME = "adapter_config.json"  # peft utils/constants.py CONFIG_NAME
WEIGHTS_NAME = "adapter_model.safetensors"  # peft utils/constants.py SAFETENSORS_WEIGHTS_NAME

_PAIR_HINT = "the state must be the model's full state dict with raydlc.train.lora's adapters (lora_A and lora_B beside each adapted weight)"


def split(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(base, adapters): the HF model's own keys, and the lora_A/lora_B weights, so each half is saved its own way."""
    base, adapters = {}, {}
    for key, value in state.items():
        (adapters if key.endswith(ADAPTER_SUFFIXES) else base)[key] = value
    return base, adapters


def pairs(adapters: Mapping[str, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
    """Module path -> (A, B); an A without its B (or the reverse) is an error naming the key, not a silent skip."""
    modules = sorted({k.removesuffix(A_SUFFIX).removesuffix(B_SUFFIX) for k in adapters})
    out = {}
    for m in modules:
        a, b = adapters.get(m + A_SUFFIX), adapters.get(m + B_SUFFIX)
        if a is None or b is None:
            have, lacks = (m + A_SUFFIX, m + B_SUFFIX) if b is None else (m + B_SUFFIX, m + A_SUFFIX)
            raise LoRAExportError(f"LoRA export: {have} has no pair ({lacks} is missing)", hint=_PAIR_HINT)
        out[m] = (a, b)
    return out


def _check_shapes(module: str, a: Tensor, b: Tensor, w: Tensor | None) -> None:
    """A is r x in, B is out x r, W is out x in: anything else would merge (or load in peft) into the wrong weight."""
    key = module + ".weight"
    if w is None:
        raise LoRAExportError(f"LoRA export: {module}{A_SUFFIX} adapts {key}, which is not in the state", hint=_PAIR_HINT)
    if a.dim() != 2 or b.dim() != 2 or w.dim() != 2:
        raise LoRAExportError(f"LoRA export: {module}: lora_A {tuple(a.shape)}, lora_B {tuple(b.shape)} and {key} {tuple(w.shape)} must be matrices")
    if a.shape[0] != b.shape[1] or tuple(w.shape) != (b.shape[0], a.shape[1]):
        raise LoRAExportError(
            f"LoRA export: {module}: lora_A {tuple(a.shape)} x lora_B {tuple(b.shape)} does not fit {key} {tuple(w.shape)}",
            hint="lora_A is rank x in_features, lora_B is out_features x rank, the base weight out_features x in_features")


def merged(state: Mapping[str, Tensor], *, scaling: float) -> dict[str, Tensor]:
    """The base keys only, each adapted weight W + scaling · (B @ A): a plain HF state dict with the adapters folded in.

    Computed in fp32 and cast back to W's dtype (a bf16 W gets one rounding, not one per term); unadapted tensors are
    passed through as they are (a tied embedding stays one tensor).
    """
    import torch

    base, adapters = split(state)
    out = dict(base)
    for module, (a, b) in pairs(adapters).items():
        w = base.get(module + ".weight")
        _check_shapes(module, a, b, w)
        assert w is not None
        out[module + ".weight"] = torch.addmm(w.float(), b.float(), a.float(), alpha=scaling).to(w.dtype)
    return out


def peft_adapter_state(adapters: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """peft's saved keys (`base_model.model.` + ours), on the CPU and contiguous (safetensors writes no views)."""
    stray = [k for k in adapters if not k.endswith(ADAPTER_SUFFIXES)]
    if stray:
        raise LoRAExportError(f"LoRA export: {stray[0]} is not an adapter weight", hint="pass split(state)[1]")
    return {PEFT_PREFIX + k: v.detach().to("cpu").contiguous() for k, v in adapters.items()}


def adapter_config(*, rank: int, alpha: float, dropout: float, targets: Sequence[str], base_model: str | None,
                   rslora: bool = False, target_regex: str | None = None, modules_to_save: Sequence[str] = ()) -> dict[str, Any]:
    """peft's LoraConfig as saved (`PeftConfigMixin.save_pretrained`): LoRA (rsLoRA with `rslora`: peft's `use_rslora`,
    scaling alpha / sqrt(r)) on a causal LM, the fields peft 0.17+ reads; those left out take LoraConfig's defaults,
    which are what raydlc trains (no DoRA, no bias). With `target_regex`, `target_modules` is that string, which peft
    matches whole against each module's full name (`tuners_utils.check_target_module_exists`, `re.fullmatch`)."""
    _check_hyper(rank=rank, alpha=alpha, dropout=dropout, targets=targets, target_regex=target_regex)
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "revision": None,
        "inference_mode": True,
        "r": rank,
        "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,
        "lora_dropout": dropout,
        "target_modules": target_regex if target_regex is not None else sorted(set(targets)),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": bool(rslora),
        "use_dora": False,
        "lora_bias": False,
        "init_lora_weights": True,
        "modules_to_save": saved_module_names(modules_to_save) or None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def saved_module_names(keys: Sequence[str]) -> list[str]:
    """peft's `modules_to_save` of the saved parameters' keys: each module's last name (embed_tokens, lm_head), which peft
    matches as `(^|.*\\.)name($|\\..*)` against module names (`tuners_utils.check_target_module_exists`)."""
    return sorted({k.rpartition(".")[0].rpartition(".")[2] for k in keys})


def saved_tensors(state: Mapping[str, Tensor], keys: Sequence[str]) -> dict[str, Tensor]:
    """LORA_MODULES_TO_SAVE's trained weights under peft's saved keys, `base_model.model.<module>.<param>` (the
    ModulesToSaveWrapper's `modules_to_save.default.` removed, `utils/save_and_load.py`); a tied head is saved under
    both names, since peft wraps (and loads) the embedding and the head apart."""
    missing = [k for k in keys if k not in state]
    if missing:
        raise LoRAExportError(f"LoRA export: {missing[0]} (LORA_MODULES_TO_SAVE) is not in the state", hint=_PAIR_HINT)
    return {PEFT_PREFIX + k: state[k].detach().to("cpu").clone() for k in keys}  # a copy each: safetensors refuses shared memory


def _check_hyper(*, rank: int, alpha: float, dropout: float, targets: Sequence[str], target_regex: str | None = None) -> None:
    """The run's settings, again at the export: a bad one would write a config peft loads into a different model."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoRAExportError(f"LoRA export: rank {rank!r} is not a LoRA rank (1 or more)", hint="LORA_RANK=0 is full fine-tuning, which has no adapter")
    if not alpha > 0:
        raise LoRAExportError(f"LoRA export: alpha {alpha!r} must be positive")
    if not 0 <= dropout < 1:
        raise LoRAExportError(f"LoRA export: dropout {dropout!r} must be in [0, 1)")
    if target_regex is not None:
        try:
            re.compile(target_regex)
        except re.error as e:
            raise LoRAExportError(f"LoRA export: target pattern {target_regex!r} is not a regular expression ({e})") from None
    elif isinstance(targets, str) or not targets or any(not t or "." in t for t in targets):
        raise LoRAExportError(f"LoRA export: targets {targets!r} must be module names such as q_proj")


def checked_adapters(state: Mapping[str, Tensor], *, rank: int, targets: Sequence[str], target_regex: str | None = None) -> dict[str, Tensor]:
    """The adapters, once every one has its pair, its base weight, the run's rank and a target's name (or a module the
    pattern matches whole): what peft needs to load the file with no missing or unexpected key (it adapts every Linear
    target_modules names, or every module its string matches)."""
    base, adapters = split(state)
    if not adapters:
        raise LoRAExportError("LoRA export: the state holds no adapter weights (no key ends in .lora_A.weight)", hint=_PAIR_HINT)
    found = pairs(adapters)
    chosen = _targeted(targets, target_regex)
    bare = [k for k in base if k.endswith(".weight") and chosen(k.removesuffix(".weight")) and k.removesuffix(".weight") not in found]
    if bare:
        raise LoRAExportError(f"LoRA export: {bare[0]} is a target's weight with no adapter beside it ({len(bare)} such)",
                              hint="peft adapts every module named in target_modules; the run's adapters must cover them all")
    for module, (a, b) in found.items():
        _check_shapes(module, a, b, base.get(module + ".weight"))
        if a.shape[0] != rank:
            raise LoRAExportError(f"LoRA export: {module}{A_SUFFIX} has rank {a.shape[0]}, the run's rank is {rank}")
        if not chosen(module):
            among = f"the pattern {target_regex!r} does not match it whole" if target_regex is not None else f"which is not among the targets {sorted(targets)}"
            raise LoRAExportError(f"LoRA export: {module}{A_SUFFIX} adapts {module.rpartition('.')[2]}, {among}",
                                  hint="peft adapts only the modules target_modules names (or its string matches); the run's LORA_TARGETS must name it")
    return adapters


def _targeted(targets: Sequence[str], target_regex: str | None) -> Callable[[str], bool]:
    """Whether peft adapts the module of this full name: its last part in the list, or the whole name matched by the string."""
    if target_regex is not None:
        pattern = re.compile(target_regex)
        return lambda module: pattern.fullmatch(module) is not None
    return lambda module: module.rpartition(".")[2] in targets


def write(out_dir: Path, state: Mapping[str, Tensor], *, rank: int, alpha: float, dropout: float, targets: Sequence[str],
          base_model: str | None, merge: bool, save_merged: Callable[[dict[str, Tensor], Path], None], rslora: bool = False,
          base_dir: str | None = None, target_regex: str | None = None, modules_to_save: Sequence[str] = ()) -> None:
    """`out_dir/adapter/` (peft's two files) and, if `merge`, the merged weights handed to `save_merged(weights, folder)`,
    which writes the HF model and tokenizer into that folder (it is `out_dir` once renamed).

    `base_dir`: where `out_dir/base/` will be once published (a built-in spec's base exists nowhere else): the frozen
    base is written there too, and the adapter names it as its `base_model_name_or_path`, so peft's
    `AutoPeftModelForCausalLM` (or `PeftModel.from_pretrained` on it) loads the adapter from its own export.

    Everything is checked and merged before the disk is touched; the files go into a folder beside `out_dir` that
    is renamed into place at the end, so on any error (here or in `save_merged`) nothing is left.
    """
    config = adapter_config(rank=rank, alpha=alpha, dropout=dropout, targets=targets, base_model=base_dir or base_model, rslora=rslora,
                            target_regex=target_regex, modules_to_save=modules_to_save)
    tensors = peft_adapter_state(checked_adapters(state, rank=rank, targets=targets, target_regex=target_regex)) | saved_tensors(state, modules_to_save)
    weights = merged(state, scaling=alpha / (math.sqrt(rank) if rslora else rank)) if merge else None
    _refuse_foreign(out_dir)
    with _staged(out_dir) as folder:
        _write_adapter(folder / ADAPTER_DIR, tensors, config)
        if weights is not None:
            save_merged(weights, folder)
        if base_dir is not None:
            save_merged(split(state)[0], folder / BASE_DIR)


def _write_adapter(folder: Path, tensors: dict[str, Tensor], config: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})


def _refuse_foreign(out_dir: Path) -> None:
    """An existing `out_dir` is replaced only if it is empty or an earlier export (it has adapter/adapter_config.json):
    a folder of someone else's files is never deleted."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if out_dir.is_dir() and not out_dir.is_symlink() and (not any(out_dir.iterdir()) or (out_dir / ADAPTER_DIR / CONFIG_NAME).is_file()):
        return
    raise LoRAExportError(f"LoRA export: {out_dir} exists and is not an earlier export (no {ADAPTER_DIR}/{CONFIG_NAME} in it)",
                          hint="choose an empty or new folder; raydlc replaces only its own exports")


@contextmanager
def _staged(out_dir: Path) -> Iterator[Path]:
    """A fresh folder beside `out_dir`, renamed to it on success (an earlier export moved aside, then removed);
    removed on failure, with any parent folders this call created."""
    created = _make_parents(out_dir.parent)
    try:
        folder = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    except BaseException:
        _remove(created)
        raise
    try:
        yield folder
        _swap(folder, out_dir)
    except BaseException:
        _remove(folder)
        _remove(created)
        raise


def _swap(folder: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        os.replace(folder, out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    os.replace(out_dir, old / "x")
    os.replace(folder, out_dir)
    shutil.rmtree(old)


def _make_parents(path: Path) -> Path | None:
    """Create `path` and its missing ancestors; the topmost one created (None if it existed), so a failure can undo it."""
    top = None
    for p in reversed([path, *path.parents]):
        if not p.exists():
            top = p
            break
    path.mkdir(parents=True, exist_ok=True)
    return top


def _remove(path: Path | None) -> None:
    if path is not None and path.exists():
        shutil.rmtree(path, ignore_errors=True)
