"""Next-token cross-entropy over the vocabulary in chunks of tokens: the full logits never exist.

At real sequence lengths the logits are the largest activation of a large-vocabulary model
(2048 tokens x 152,064 entries x 4 B = 1.25 GB per sequence in fp32, plus the bf16 copy and
the gradient). `ChunkedCrossEntropy` computes the head's matmul and the loss `chunk` tokens at
a time, keeps only the head's input for backward, and in backward recomputes each chunk's
logits to form its gradient: one more head matmul per step for a peak of one chunk's logits.
Identical to `F.cross_entropy` on the full fp32 logits up to summation order (tests/test_train_loss.py).

The head is the model's own `lm_head` module, so FSDP2's hooks on it (and on the grouped
`[norm, lm_head]` unit) run as for the plain head: `ChunkedHead` replaces it with the same
parameter, and computes the loss in its forward while `targets` gives it the labels.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from raydlc.data.encode import IGNORE


def chunk_loss(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One chunk's summed cross-entropy: the head's matmul, the fp32 logits, the loss."""
    return F.cross_entropy((h @ weight.t()).float(), y, ignore_index=IGNORE, reduction="sum")


def chunk_logit_grad(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """One chunk's gradient of the summed loss with respect to its logits (softmax minus the
    one-hot target, zero on ignored tokens, times the incoming gradient), in the hidden states' dtype."""
    g = torch.softmax((h @ weight.t()).float(), dim=-1)
    g[torch.arange(len(y), device=y.device), y.clamp(min=0)] -= 1.0
    g.mul_(((y != IGNORE).to(g.dtype) * grad)[:, None])
    return g.to(h.dtype)


@functools.cache
def compiled() -> tuple[Any, Any]:
    """`chunk_loss` and `chunk_logit_grad` compiled whole (fullgraph): the fp32 logits, softmax and
    cross-entropy fuse into few kernels instead of an elementwise chain over chunk x vocabulary entries."""
    return torch.compile(chunk_loss, fullgraph=True, dynamic=False), torch.compile(chunk_logit_grad, fullgraph=True, dynamic=False)


class ChunkedCrossEntropy(torch.autograd.Function):
    """sum over tokens of CE(hidden @ weight.T, labels), `chunk` tokens at a time, in fp32.

    The gradient of the head's weight is accumulated chunk by chunk in the weight's own dtype
    (what autograd's single matmul would produce, rounded once per chunk instead of once).
    With `compile`, each chunk's loss and logit gradient run compiled (`compiled`).
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int, compile: bool = False) -> torch.Tensor:
        loss_fn = compiled()[0] if compile else chunk_loss
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            total = total + loss_fn(hidden[s : s + chunk], weight, labels[s : s + chunk])  # one chunk's logits at a time
        ctx.save_for_backward(hidden, weight, labels)
        ctx.chunk, ctx.compile = chunk, compile
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, labels = ctx.saved_tensors
        chunk = ctx.chunk
        grad_fn = compiled()[1] if ctx.compile else chunk_logit_grad
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None  # a frozen head (LoRA): no V x h matmul
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            g = grad_fn(h, weight, labels[s : s + chunk], grad)
            grad_hidden[s : s + chunk] = g @ weight
            if grad_weight is not None:
                grad_weight.addmm_(g.t(), h)
            del g
        return grad_hidden, grad_weight, None, None, None


class ChunkedHead(nn.Linear):
    """The LM head: a plain linear layer, or, inside `targets(...)`, the summed chunked loss.

    transformers' causal LMs call `lm_head(hidden_states)` and return whatever it gives as
    `logits`; given targets, this returns the summed next-token loss of the hidden states
    (a 0-d fp32 tensor) instead, computed inside the head's forward so that FSDP2 gathers the
    weight and reduces its gradient exactly as for the plain head.
    """

    chunk: int = 0
    compile: bool = False
    labels: torch.Tensor | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.labels is None:
            return super().forward(hidden)
        y = self.labels[:, 1:].reshape(-1)
        h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
        return ChunkedCrossEntropy.apply(h, self.weight, y, self.chunk, self.compile)


def use_chunked_loss(model: nn.Module, chunk: int, *, compile: bool = False) -> nn.Module:
    """Give `model` a `ChunkedHead` of `chunk` tokens (before FSDP): the same weight parameter, so a
    tied head stays the embedding and state-dict keys, checkpoints and the export do not change."""
    old = model.lm_head  # type: ignore[attr-defined]
    if not isinstance(old, ChunkedHead):
        old.__class__ = ChunkedHead
    old.chunk, old.compile = chunk, compile
    return model


def head_of(model: nn.Module) -> ChunkedHead | None:
    head = getattr(model, "lm_head", None)
    return head if isinstance(head, ChunkedHead) and head.chunk > 0 else None


@contextlib.contextmanager
def targets(head: ChunkedHead, labels: torch.Tensor) -> Iterator[None]:
    """For one forward: the head returns the summed loss of `labels` instead of logits."""
    head.labels = labels
    try:
        yield
    finally:
        head.labels = None
