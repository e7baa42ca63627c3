"""Live tensor bytes through a step, measured where no allocator reports them (CPU, gloo).

`LiveBytes` is a `TorchDispatchMode`: every storage an op creates (not a view of or a write into its inputs) is followed until it is freed
(or resized away, as FSDP2 does with its unsharded parameters), and after every op the bytes
alive are summed: in all, and split into what the planner itemises, the model's unsharded
parameters (FSDP2 registers them on the module while they are gathered) and their gradients.
`phase` names the part of the step a peak belongs to. A measuring tool for the planner's
tests and benchmarks; nothing in a training run uses it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _storages(tensors: Any) -> Iterator[torch.UntypedStorage]:
    for t in tensors:
        if isinstance(t, torch.Tensor) and not hasattr(t, "to_local") and t.device.type != "meta":
            yield t.untyped_storage()


class LiveBytes(TorchDispatchMode):
    """Peaks (bytes) per phase of: everything allocated under the mode, and `model`'s unsharded parameters and gradients."""

    def __init__(self, model: nn.Module | None = None) -> None:
        super().__init__()
        self.model = model
        self._live: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self.phase = "setup"
        self.peaks: dict[str, dict[str, int]] = {}

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before

    def _follow(self, out: Any, inputs: Any) -> None:
        """Follow the new storages among an op's outputs (a view or an in-place result is an input's)."""
        given = {s.data_ptr() for s in _storages(tree_flatten(inputs)[0])}
        for s in _storages(tree_flatten(out)[0]):
            key = id(s)
            if key not in self._live and s.data_ptr() not in given:
                self._live[key] = weakref.ref(s, lambda _r, k=key: self._live.pop(k, None))

    def unsharded(self) -> tuple[int, int]:
        """Bytes of the model's registered plain (gathered) parameters and of their gradients."""
        if self.model is None:
            return 0, 0
        params = grads = 0
        seen: set[int] = set()
        for p in self.model.parameters():
            if hasattr(p, "to_local"):
                continue
            s = p.untyped_storage()
            if s.data_ptr() not in seen and s.nbytes():
                seen.add(s.data_ptr())
                params += s.nbytes()
            if p.grad is not None and not hasattr(p.grad, "to_local"):
                grads += p.grad.untyped_storage().nbytes()
        return params, grads

    def sample(self) -> None:
        alive = self.allocated()
        params, grads = self.unsharded()
        peak = self.peaks.setdefault(self.phase, {"allocated": 0, "unsharded_params": 0, "unsharded_grads": 0})
        peak["allocated"] = max(peak["allocated"], alive)
        peak["unsharded_params"] = max(peak["unsharded_params"], params)
        peak["unsharded_grads"] = max(peak["unsharded_grads"], grads)

    def allocated(self) -> int:
        """Bytes alive now of what was allocated under the mode."""
        seen: set[int] = set()
        total = 0
        for ref in list(self._live.values()):
            s = ref()
            if s is not None and s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
        return total

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._follow(out, (args, kwargs))
        self.sample()
        return out

    def peak(self, key: str = "allocated") -> int:
        return max((p[key] for p in self.peaks.values()), default=0)
