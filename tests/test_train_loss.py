"""The chunked cross-entropy (train.loss) against the plain one, and the memory it takes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from raydlc import planner
from raydlc.data.encode import IGNORE
from raydlc.facts.models import ModelSpec
from raydlc.train.loop import loss_sum
from raydlc.train.loss import ChunkedCrossEntropy, use_chunked_loss
from raydlc.train.memprobe import LiveBytes
from raydlc.train.model import build_model

SPEC = ModelSpec("loss", 64, 2, 4, 2, 172, 5003, False, max_position_embeddings=512)


def _inputs(dtype: torch.dtype, tokens: int = 300, vocab: int = 5003, hidden: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) * 0.1).to(dtype).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), generator=g)
    y[::7] = IGNORE
    return h, w, y


@pytest.mark.parametrize("chunk", [7, 64, 128, 300, 4096])
def test_chunked_loss_and_gradients_equal_the_plain_ones_in_fp32(chunk: int) -> None:
    h, w, y = _inputs(torch.float32)
    plain = F.cross_entropy((h @ w.t()).float(), y, ignore_index=IGNORE, reduction="sum")
    gh, gw = torch.autograd.grad(plain * 0.37, (h, w))
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    chunked = ChunkedCrossEntropy.apply(h2, w2, y, chunk)
    ch, cw = torch.autograd.grad(chunked * 0.37, (h2, w2))
    assert chunked.item() == pytest.approx(plain.item(), rel=1e-6)
    torch.testing.assert_close(ch, gh, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cw, gw, rtol=1e-6, atol=1e-6)


def test_chunked_head_in_the_model_gives_the_plain_loss_and_gradients() -> None:
    ids = torch.randint(0, SPEC.vocab_size, (2, 96), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :10] = IGNORE
    plain, chunked = build_model(SPEC, seed=0), use_chunked_loss(build_model(SPEC, seed=0), 50)
    (a, n), (b, m) = loss_sum(plain, ids, labels), loss_sum(chunked, ids, labels)
    a.backward()
    b.backward()
    assert int(n) == int(m) == 2 * 95 - 9 and b.item() == pytest.approx(a.item(), rel=1e-6)
    for (name, p), q in zip(plain.named_parameters(), chunked.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert chunked.state_dict().keys() == plain.state_dict().keys()  # checkpoints and the export read the same names


def test_tied_head_stays_the_embedding() -> None:
    spec = ModelSpec("tied", 64, 2, 4, 2, 172, 1000, True)
    model = use_chunked_loss(build_model(spec), 64)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model(input_ids=torch.zeros(1, 4, dtype=torch.long)).logits.shape == (1, 4, 1000)  # without targets: plain logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [0, 128, 256])
def test_the_losss_peak_bytes_are_the_planners_logits_term_within_5_percent(dtype: torch.dtype, chunk: int) -> None:
    """Live bytes the loss allocates (forward, then backward) beyond its inputs and the gradients it returns."""
    tokens, spec = 512, ModelSpec("v", 64, 1, 4, 2, 172, 5003, False, max_position_embeddings=512)
    h, w, y = _inputs(dtype, tokens, spec.vocab_size, spec.hidden_size)
    probe = LiveBytes()
    with probe:
        with probe.during("forward"):
            loss = (F.cross_entropy((h @ w.t()).float(), y, ignore_index=IGNORE, reduction="sum") if chunk == 0
                    else ChunkedCrossEntropy.apply(h, w, y, chunk))
        with probe.during("backward"):
            loss.backward()
    returned = (h.numel() + w.numel()) * h.element_size()  # the gradients of the inputs: other terms of the plan
    measured = max(probe.peaks["forward"]["allocated"], probe.peaks["backward"]["allocated"] - returned)
    want = planner.logits_bytes(planner.Workload(spec, seq_len=tokens, loss_chunk=chunk))
    print(dtype, chunk, "measured", measured, "planned", want)
    assert measured == pytest.approx(want, rel=0.05)
