"""COMPILE: each decoder block compiled whole (fullgraph, no graph break) on Qwen2 and Llama, the
chunked loss compiled, and the compiled model's loss and gradients those of the eager one within
fp32 tolerance. One process (gloo, world size 1), CPU; the compile counters are dynamo's own."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tests.test_train_step import world_of_one

from raydlc.facts.models import ModelSpec, get_spec
from raydlc.train import loop as L
from raydlc.train.loss import use_chunked_loss
from raydlc.train.model import apply_fsdp, build_model

TINY_QWEN = replace(get_spec("tiny"), num_layers=2)
TINY_LLAMA = replace(get_spec("llama-3.2-1b"), name="tiny-llama", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                     intermediate_size=256, vocab_size=512, max_position_embeddings=256)


def loss_and_grads(spec: ModelSpec, *, compile: bool, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = apply_fsdp(use_chunked_loss(build_model(spec, seed=0), 8, compile=compile), compile=compile)
    total, n = L.loss_sum(model, ids, ids)
    (total / n).backward()
    grads = {k: p.grad.full_tensor() for k, p in model.named_parameters()}
    return (total / n).detach(), grads


@pytest.mark.slow  # two compiles of a two-block model: minutes on a shared 2-core machine
@pytest.mark.parametrize("spec", [TINY_QWEN, TINY_LLAMA], ids=["qwen2", "llama"])
def test_each_block_compiles_to_one_graph_without_a_break_and_matches_eager(spec: ModelSpec) -> None:
    from torch._dynamo.utils import counters

    assert spec.architecture == ("qwen2" if spec is TINY_QWEN else "llama")
    ids = torch.randint(0, spec.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    counters.clear()
    with world_of_one():
        eager_loss, eager_grads = loss_and_grads(spec, compile=False, ids=ids)
        assert not counters["stats"]  # nothing compiled eagerly
        loss, grads = loss_and_grads(spec, compile=True, ids=ids)
    assert dict(counters["graph_break"]) == {}, dict(counters["graph_break"])
    # Frames dynamo compiled: each block's forward (the blocks share code: one graph, reused) and
    # the chunk loss; the chunk gradient runs in backward. A break would have raised (fullgraph).
    assert counters["stats"]["unique_graphs"] >= 2
    assert torch.allclose(loss, eager_loss, rtol=1e-5, atol=1e-6), (loss, eager_loss)
    assert grads.keys() == eager_grads.keys()
    for k, g in grads.items():
        assert torch.allclose(g, eager_grads[k], rtol=1e-4, atol=1e-6), k


def test_the_compiled_chunked_loss_and_its_gradient_equal_the_eager_ones() -> None:
    from raydlc.train.loss import ChunkedCrossEntropy

    gen = torch.Generator().manual_seed(2)
    h = torch.randn(37, 32, generator=gen, requires_grad=True)
    w = torch.randn(300, 32, generator=gen, requires_grad=True)
    y = torch.randint(0, 300, (37,), generator=gen)
    y[5] = -100
    out = {}
    for compile in (False, True):
        h.grad = w.grad = None
        loss = ChunkedCrossEntropy.apply(h, w, y, 16, compile)
        loss.backward()
        out[compile] = (loss.detach(), h.grad.clone(), w.grad.clone())
    for a, b in zip(out[False], out[True]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
