"""Fault injection for tests and drills, never a setting: a rank that dies, stops, or computes NaN at a given step.

A fault is the loop's step hook (train.loop.StepHooks): the test passes it in
(`RunTarget(faults=Crash(rank=1, step=5))`), it travels to every worker inside the RunSpec, validated
like the rest of it, and the loop calls `before_step` at the start of each step. The loop itself
holds no branch for it. Every fault acts in the first attempt only: a restart resumes from a
checkpoint and passes the step by, which is what the restart tests check.
"""

from __future__ import annotations

import os
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    step: int

    def before_step(self, step: int, *, rank: int, resumed: bool) -> None:
        if not resumed and step == self.step and rank == self.rank:
            self.act()

    def act(self) -> None:
        raise NotImplementedError


class Crash(_Fault):
    """`rank` exits at `step` of the first attempt, as a worker process that dies."""

    kind: Literal["crash"] = "crash"

    def act(self) -> None:
        print(f"[raydlc] injected failure: rank {self.rank} exits at step {self.step}", flush=True)
        os._exit(1)


class Hang(_Fault):
    """`rank` stops making progress at `step` of the first attempt: the stall guard's test."""

    kind: Literal["hang"] = "hang"

    def act(self) -> None:
        injected_hang(self.rank, self.step)


def injected_hang(rank: int, step: int) -> None:
    """This rank stops making progress, as a rank stuck outside a collective (its name is what the stall evidence shows)."""
    print(f"[raydlc] injected hang: rank {rank} stops at step {step}", flush=True)
    while True:
        time.sleep(3600)


class NonFinite(_Fault):
    """`rank`'s forward gives NaN from `step` for `steps` steps of the first attempt: the finite guard's test.

    A global forward hook (torch's `register_module_forward_hook`) multiplies the token embeddings'
    output by NaN while the model trains, so the loss and every gradient are NaN; the next step's
    hook call outside the window removes it. Evaluation (the model in eval mode) is left alone.
    """

    kind: Literal["nonfinite"] = "nonfinite"
    steps: int = 1

    def before_step(self, step: int, *, rank: int, resumed: bool) -> None:
        on = not resumed and rank == self.rank and self.step <= step < self.step + self.steps
        if on and not _POISON:
            print(f"[raydlc] injected NaN: rank {self.rank}, steps {self.step} to {self.step + self.steps - 1}", flush=True)
            _POISON.append(_poison_embeddings())
        elif not on and _POISON:
            _POISON.pop().remove()


_POISON: list[Any] = []  # the armed hook's handle, while a NonFinite window is open


def _poison_embeddings() -> Any:
    import torch
    from torch import nn

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        if isinstance(module, nn.Embedding) and module.training:
            return output * float("nan")
        return None

    return torch.nn.modules.module.register_module_forward_hook(hook)


Fault = Annotated[Crash | Hang | NonFinite, Field(discriminator="kind")]
