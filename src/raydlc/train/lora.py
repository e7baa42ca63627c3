"""LoRA written here (issue 36), not peft: peft is not in the Ray Train image's package set, and
FSDP2 needs the adapters in place on the meta device before `fully_shard` so each block's
adapters belong to its unit; a plain module swap does that with nothing to patch.

`LoRALinear` keeps the base layer's `weight` and `bias` Parameters under their own names, so the
Hugging Face keys, shard-by-shard pretrained loading and the seeded init read the base as
before; the adapters are two submodules, `lora_A` (r x in) and `lora_B` (out x r), whose
state-dict keys end in `ADAPTER_SUFFIXES`. B starts at zero, so a fresh adapter changes nothing;
A is drawn from a generator seeded by (seed, the module's state-dict name), so the values depend
on neither the number of ranks nor the units. The names and shapes are those peft saves behind its
`base_model.model.` prefix, so the export (train.lora_export) is a rename, not a conversion.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from raydlc.facts.models import LORA_DEFAULT_TARGETS

ADAPTER_SUFFIXES = (".lora_A.weight", ".lora_B.weight")
WRAPPER_PREFIX = "_checkpoint_wrapped_module."  # what activation checkpointing inserts into parameter names


def is_adapter_key(name: str) -> bool:
    """Whether a state-dict key (or parameter name) is a LoRA adapter's."""
    return name.endswith(ADAPTER_SUFFIXES)


def state_name(name: str) -> str:
    """A parameter or module name as the state dict spells it: without the activation-checkpointing wrapper."""
    return name.replace(WRAPPER_PREFIX, "")


def adapter_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Only the adapter entries of a state dict: what a LoRA checkpoint holds of the model."""
    return {k: v for k, v in state.items() if is_adapter_key(k)}


def default_alpha(rank: int, alpha: float | None) -> float:
    """LORA_ALPHA, blank = 2 x rank (a scaling of 2, the common choice)."""
    return float(alpha) if alpha is not None else 2.0 * rank


def lora_scaling(rank: int, alpha: float, rslora: bool = False) -> float:
    """The update's scale: alpha / r, or with rsLoRA (LORA_RSLORA; Kalajdzievski 2023, peft's `use_rslora`) alpha / sqrt(r),
    which keeps the update's size from shrinking as the rank grows (rank 64 and above)."""
    return alpha / (math.sqrt(rank) if rslora else rank)


class LoRALinear(nn.Linear):
    """y = x W^T + b + scaling * B(A(dropout(x))): the frozen base plus a trained low-rank update (`lora_scaling`)."""

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float, dropout: float, rslora: bool = False) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: the base's own Parameters are reused, not allocated
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        device = base.weight.device
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, device=device, dtype=torch.float32)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, device=device, dtype=torch.float32)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.rank, self.scaling = rank, lora_scaling(rank, alpha, rslora)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        a = self.lora_A.weight
        update = self.lora_B(self.lora_A(self.dropout(x).to(a.dtype)))
        return out + (update * self.scaling).to(out.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, scaling={self.scaling:g}"


def apply_lora(model: nn.Module, *, rank: int, alpha: float, dropout: float, targets: Sequence[str], seed: int, rslora: bool = False,
               target_regex: str | None = None, modules_to_save: Sequence[str] = ()) -> list[str]:
    """Replace every nn.Linear whose attribute name is in `targets` (or, with `target_regex`, whose full
    state-dict name the pattern matches whole: peft's `re.fullmatch` of a string `target_modules`) with a
    LoRALinear (on any device, meta included), freeze every other parameter, and return the replaced modules' names.

    On a materialised model the adapters are initialised here (`init_adapters`); on the meta
    device that is the builder's job after `to_empty`.
    """
    chosen = _chooser(model, targets, target_regex)
    replaced: list[str] = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if isinstance(child, nn.Linear) and not isinstance(child, LoRALinear) and chosen(child_name, state_name(full)):
                setattr(parent, child_name, LoRALinear(child, rank=rank, alpha=alpha, dropout=dropout, rslora=rslora))
                replaced.append(full)
    saved = saved_parameters(model, modules_to_save)
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter_key(name) or state_name(name) in saved)
    if replaced and not any(p.is_meta for p in model.parameters()):
        with torch.no_grad():
            init_adapters(model, seed=seed)
    return [state_name(n) for n in replaced]


def _chooser(model: nn.Module, targets: Sequence[str], target_regex: str | None) -> Any:
    """(attribute name, full name) -> adapt it?  A pattern that also matches something other than a block's projection
    (an embedding, the head, a block) is refused: peft would adapt (or fail on) that module too, and the planner and the
    export count projections only."""
    if target_regex is None:
        wanted = set(targets)
        return lambda attr, _full: attr in wanted
    pattern = re.compile(target_regex)
    projections = {t for family in LORA_DEFAULT_TARGETS.values() for t in family}
    for name, module in model.named_modules():
        key = state_name(name)
        if name and pattern.fullmatch(key) and not (isinstance(module, nn.Linear) and key.rpartition(".")[2] in projections):
            from raydlc.errors import TrainError

            raise TrainError(f"LORA_TARGET_REGEX {target_regex!r} matches {key} ({type(module).__name__}), which is not a block's projection: "
                             "LoRA adapts q/k/v/o/gate/up/down_proj only", hint="narrow the pattern, e.g. .*\\.(q|v)_proj")
    return lambda _attr, full: pattern.fullmatch(full) is not None


def saved_modules(model: nn.Module, names: Sequence[str]) -> dict[str, nn.Module]:
    """LORA_MODULES_TO_SAVE's modules by full state-dict name, matched as peft matches `modules_to_save` (the whole name,
    or its last parts: `lm_head`, `embed_tokens`); a name that matches no module is refused naming the field."""
    found: dict[str, nn.Module] = {}
    for wanted in names:
        hits = {state_name(n): m for n, m in model.named_modules() if n and (state_name(n) == wanted or state_name(n).endswith("." + wanted))}
        if not hits or any(isinstance(m, LoRALinear) for m in hits.values()):
            from raydlc.errors import TrainError

            why = "is a LoRA target too (peft never adapts a module it saves whole)" if hits else "names no module of the model"
            raise TrainError(f"LORA_MODULES_TO_SAVE {wanted!r} {why}", hint="name modules such as embed_tokens or lm_head, outside the LoRA targets")
        found |= hits
    return found


def saved_parameters(model: nn.Module, names: Sequence[str]) -> set[str]:
    """The state-dict names of the parameters LORA_MODULES_TO_SAVE trains in full (a tied head's is the embedding's)."""
    if not names:
        return set()
    ids = {id(p) for m in saved_modules(model, names).values() for p in m.parameters()}
    return {state_name(n) for n, p in model.named_parameters(remove_duplicate=False) if id(p) in ids}


def is_trained_key(name: str, saved: set[str]) -> bool:
    """Whether a LoRA run trains (and so checkpoints) this state-dict key: an adapter's, or a saved module's."""
    return is_adapter_key(name) or state_name(name) in saved


def init_adapters(model: nn.Module, *, seed: int) -> None:
    """A: kaiming-uniform(a=sqrt(5)) (nn.Linear's own init) from a generator seeded by (seed, the
    module's state-dict name); B: zeros. Writes each rank's shard only (FSDP2 shards dim 0)."""
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            key = state_name(name)
            _fill_a(module.lora_A.weight, seed=(seed * 1_000_003 + zlib.crc32(key.encode())) % (1 << 63))
            _local(module.lora_B.weight).zero_()


def _fill_a(p: Any, *, seed: int) -> None:
    """The local rows of A drawn whole (r x in, small) on the CPU: the same values on any number of ranks."""
    rows, fan_in = p.shape
    bound = 1.0 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)): gain sqrt(1/3) x sqrt(3 / fan_in)
    gen = torch.Generator().manual_seed(seed)
    whole = torch.empty((rows, fan_in), dtype=torch.float32).uniform_(-bound, bound, generator=gen)
    local = _local(p)
    first = row_offset(p)
    local.copy_(whole[first : first + local.shape[0]].to(local.dtype))


def row_offset(p: Any) -> int:
    """The first row of this rank's shard of a DTensor (FSDP2 shards dim 0); 0 for a plain tensor."""
    if not hasattr(p, "device_mesh"):
        return 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return int(offset[0]) if len(offset) else 0


def _local(p: Any) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def targets_of(config: Any, chosen: Sequence[str] = ()) -> tuple[str, ...]:
    """LORA_TARGETS as chosen, else the family's default (facts.models.LORA_DEFAULT_TARGETS; all seven projections)."""
    if chosen:
        return tuple(chosen)
    family = str(getattr(config, "model_type", ""))
    return LORA_DEFAULT_TARGETS.get(family) or next(iter(LORA_DEFAULT_TARGETS.values()))


def with_lora(model: nn.Module, *, rank: int, alpha: float, dropout: float, targets: Sequence[str], seed: int,
              base_dtype: torch.dtype | None = None, rslora: bool = False, target_regex: str | None = None,
              modules_to_save: Sequence[str] = ()) -> nn.Module:
    """The builder's step before `fully_shard`: the frozen base's parameters stored in `base_dtype`
    (bf16 compute: never upcast, half the bytes of fp32 master weights), then the fp32 adapters.
    LORA_MODULES_TO_SAVE's modules stay fp32 like the adapters: AdamW updates them. Buffers (RoPE's frequencies) keep their dtype."""
    saved = saved_parameters(model, modules_to_save)
    if base_dtype is not None:
        for name, p in model.named_parameters():
            if state_name(name) not in saved:
                p.data = p.data.to(base_dtype)
    if not apply_lora(model, rank=rank, alpha=alpha, dropout=dropout, targets=targets, seed=seed, rslora=rslora, target_regex=target_regex,
                      modules_to_save=modules_to_save):
        from raydlc.errors import TrainError

        if target_regex is not None:
            raise TrainError(f"LORA_TARGET_REGEX {target_regex!r} matches no linear layer of the model (matched whole against names "
                             "such as model.layers.0.self_attn.q_proj), so nothing would train", hint="e.g. .*\\.layers\\.[0-3]\\..*_proj")
        raise TrainError(f"LORA_TARGETS {','.join(targets)}: no linear layer of the model has one of these names, so nothing would train",
                         hint="name projections the model has (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)")
    return model


def adapted_targets(model: nn.Module) -> list[str]:
    """The attribute names (q_proj, …) of the model's LoRALinear layers, in first-seen order."""
    names = [n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    return list(dict.fromkeys(names))
