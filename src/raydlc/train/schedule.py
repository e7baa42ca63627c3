"""The learning rate of each optimizer step: linear warm-up, then cosine (the default), linear or constant decay.

A pure function of the step and the run's settings, never of state: a resumed run (the same STEPS) continues the
uninterrupted run's sequence exactly, with nothing to checkpoint. Decay runs from the end of warm-up to STEPS, down
to LEARNING_RATE x MIN_LR_RATIO; resumed with another STEPS, the decay is stretched to the new end from there.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raydlc.config import TrainConfig


def warmup_steps(train: TrainConfig) -> int:
    """Warm-up length: WARMUP_RATIO x STEPS (rounded up) when the ratio is set, else WARMUP_STEPS."""
    if train.warmup_ratio is not None:
        return math.ceil(train.warmup_ratio * train.steps)
    return train.warmup_steps


def factor(step: int, *, steps: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """The share of the base rate at optimizer step `step` (1-based) of `steps`."""
    if warmup > 0 and step < warmup:
        return step / warmup
    if schedule == "constant":
        return 1.0
    span = steps - warmup
    progress = min(1.0, max(0.0, (step - warmup) / span)) if span > 0 else 1.0
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return min_ratio + (1.0 - min_ratio) * shape


def lr_at(step: int, train: TrainConfig) -> float:
    """The learning rate of optimizer step `step` (1-based) under `train`'s schedule."""
    return train.learning_rate * factor(step, steps=train.steps, warmup=warmup_steps(train), schedule=train.lr_schedule,
                                        min_ratio=train.min_lr_ratio)
