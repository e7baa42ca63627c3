"""What the planner may turn on when a workload fits nowhere as given, cheapest first, and the first set that fits.

Activation checkpointing, when free, is searched beside the layout (`recommend(checkpointing=...)`):
the fastest wins, and it is a need only when nothing fits without it.
"""

from __future__ import annotations

from typing import Any

from raydlc.planner.model import AC_SEARCH, DEFAULT_ASSUMPTIONS, DEFAULT_LOSS_CHUNK, REDUCE_BYTES, Assumptions, Layout, Workload
from raydlc.planner.search import Recommendation, recommend

# What `plan` may turn on when the workload as given fits nowhere, cheapest first, with its price.
REMEDIES: dict[str, tuple[Any, str]] = {
    "loss_chunk": (DEFAULT_LOSS_CHUNK, f"the chunked cross-entropy (LOSS_CHUNK={DEFAULT_LOSS_CHUNK}): one more head matmul per step for one chunk's logits instead of the sequence's"),
    "activation_checkpointing": (True, "activation checkpointing (ACTIVATION_CHECKPOINTING=selective or full): each block's forward "
                                       "runs again in backward, all of it (full, ~1/3 more compute) or its cheap ops and every other matmul (selective)"),
    "reduce_dtype": ("bf16", "gradient reduction in bf16 (REDUCE_DTYPE=bf16): no fp32 copy of each unit's gradient and half the reduce-scatter bytes, "
                             "but every cross-rank sum is rounded to bf16's 8-bit mantissa (fp32 is exact to 24 bits)"),
}


def _remedy_sets(w: Workload, free: tuple[str, ...]) -> list[dict[str, Any]]:
    """Changes to try, in order: none, then the chunked loss and checkpointing, and bf16 reduction only after both."""
    def needed(name: str) -> bool:
        value = REMEDIES[name][0]
        if name == "reduce_dtype":
            return name in free and w.precision.reduce != REDUCE_BYTES[value]
        return name in free and getattr(w, name) != value

    out: list[dict[str, Any]] = []
    for reduce in (False, True):
        for ac in (False, True):
            for chunk in (False, True):
                names = [n for n, on in (("loss_chunk", chunk), ("activation_checkpointing", ac), ("reduce_dtype", reduce)) if on]
                if all(needed(n) for n in names):
                    out.append({n: REMEDIES[n][0] for n in names})
    return out


def fitting(w: Workload, layout: Layout, free: tuple[str, ...] = (), a: Assumptions = DEFAULT_ASSUMPTIONS) -> tuple[Workload, Recommendation, dict[str, Any]]:
    """The workload with the first of `REMEDIES` (among those `free` to change) that makes a layout fit,
    its recommendation, and the changes made ({} when it fits as given or nothing helps)."""
    first: tuple[Workload, Recommendation] | None = None
    searched = "activation_checkpointing" in free
    rest = tuple(n for n in free if n != "activation_checkpointing")
    for changes in _remedy_sets(w, rest):
        tried = w.at(**changes)
        rec = recommend(tried, layout, checkpointing=AC_SEARCH if searched else None, assumptions=a)
        first = first or (tried, rec)
        if rec.best is not None:
            if rec.best.activation_checkpointing != tried.activation_checkpointing:
                tried = tried.at(activation_checkpointing=rec.best.activation_checkpointing)
                if not any(c.fits and not c.activation_checkpointing for c in rec.candidates):
                    changes = changes | {"activation_checkpointing": rec.best.activation_checkpointing}
            return tried, rec, changes
    assert first is not None
    return first[0], first[1], {}
