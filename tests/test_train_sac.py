"""Selective activation checkpointing (train.sac): the same step as none, what it keeps as the planner counts it, and the planner's choice."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.test_train_step import world_of_one

from raydlc import planner
from raydlc.errors import InputError
from raydlc.facts.models import SPECS, ModelSpec, get_spec
from raydlc.train import sac
from raydlc.train.memprobe import LiveBytes
from raydlc.train.model import apply_fsdp, build_model

SMALL = ModelSpec("small", 512, 8, 8, 2, 1376, 32003, False, max_position_embeddings=2048)
MODES = (False, "selective", True)


def _step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor], int]:
    """Loss, gradients by state-dict name, and the bytes alive after forward (before backward) beyond the parameters."""
    with LiveBytes() as live:
        out = model(input_ids=ids, labels=ids)
        after_forward = live.allocated()
    out.loss.backward()
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad.detach().clone() for n, p in model.named_parameters()}
    return out.loss.item(), grads, after_forward


def _wrapped(base: torch.nn.Module, ac: bool | str) -> torch.nn.Module:
    model = copy.deepcopy(base)
    if ac:
        for i, layer in enumerate(model.model.layers):
            model.model.layers[i] = sac.wrap(layer, "selective" if ac == "selective" else "full")
    return model


@pytest.mark.parametrize("spec", [SPECS["tiny"], SMALL], ids=["tiny", "small"])
def test_selective_gives_the_loss_and_gradients_of_no_checkpointing_in_fp32(spec: ModelSpec) -> None:
    torch.manual_seed(0)
    base = build_model(spec)
    ids = torch.randint(0, spec.vocab_size, (2, 64))
    loss0, grads0, _ = _step(_wrapped(base, False), ids)
    loss, grads, _ = _step(_wrapped(base, "selective"), ids)
    assert loss == pytest.approx(loss0, rel=1e-5)
    assert grads.keys() == grads0.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, grads0[name], rtol=1e-5, atol=1e-7, msg=name)


def test_selective_keeps_between_none_and_full_as_the_planner_counts() -> None:
    """bf16 on CPU, SDPA: after forward, none - selective and selective - full are the planner's differences (within 1 %).
    Everything else alive (the logits, the loss's log-softmax, the embeddings' output) is the same in all three modes."""
    base = build_model(SMALL, dtype=torch.bfloat16)
    ids = torch.randint(0, SMALL.vocab_size, (2, 128))
    alive = {ac: _step(_wrapped(base, ac), ids)[2] for ac in MODES}
    assert alive[False] > alive["selective"] > alive[True]
    saved = {ac: planner.activation_parts(planner.Workload(SMALL, seq_len=128, micro_batch=2, activation_checkpointing=ac))["saved"] for ac in MODES}
    assert alive[False] - alive["selective"] == pytest.approx(saved[False] - saved["selective"], rel=0.01)
    assert alive["selective"] - alive[True] == pytest.approx(saved["selective"] - saved[True], rel=0.01)


def test_apply_fsdp_wraps_each_block_selectively_and_the_step_matches() -> None:
    with world_of_one():
        torch.manual_seed(1)
        base = build_model(SPECS["tiny"])
        ids = torch.randint(0, SPECS["tiny"].vocab_size, (1, 32))
        plain = apply_fsdp(copy.deepcopy(base))
        model = apply_fsdp(copy.deepcopy(base), activation_checkpointing="selective")
        assert all(getattr(layer, "checkpoint_fn", None) is not None for layer in model.model.layers)
        assert all(layer.checkpoint_fn.keywords.get("context_fn") is sac.context_fn for layer in model.model.layers)
        loss0, grads0, _ = _step(plain, ids)
        loss, grads, _ = _step(model, ids)
        assert loss == pytest.approx(loss0, rel=1e-5)
        for name, g in grads.items():
            torch.testing.assert_close(g.full_tensor(), grads0[name].full_tensor(), rtol=1e-5, atol=1e-7, msg=name)


def test_the_planner_puts_selective_between_none_and_full() -> None:
    spec = get_spec("qwen2.5-7b")
    w = {ac: planner.Workload(spec, seq_len=2048, activation_checkpointing=ac) for ac in MODES}
    per_param = {ac: planner.flops_per_step(x) / x.tokens / spec.param_count() for ac, x in w.items()}
    assert 6 < per_param[False] < per_param["selective"] < per_param[True]
    assert per_param["selective"] - per_param[False] < (per_param[True] - per_param[False]) / 2  # about a third of a block's matmuls
    saved = {ac: planner.activation_parts(x)["saved"] for ac, x in w.items()}
    assert saved[False] > saved["selective"] > saved[True]
    assert planner.Workload(spec, activation_checkpointing="full").activation_checkpointing is True
    with pytest.raises(InputError, match="unknown activation checkpointing"):
        planner.Workload(spec, activation_checkpointing="some")


def test_the_planner_picks_selective_where_full_was_chosen_for_memory_and_selective_fits() -> None:
    """Qwen2.5-7B at seq 16384 on one node of 8 H100s: without checkpointing not one sequence fits, full fits and so
    does selective, which is faster (a third of the recomputation, eager); searching only none and full chose full."""
    spec = get_spec("qwen2.5-7b")
    layout = planner.layout_for(1, 8, gpu="h100", network_gbps=3200)
    w = planner.Workload(spec, seq_len=16384)
    assert planner.recommend(w, layout, checkpointing=(False,)).best is None
    before = planner.recommend(w, layout, checkpointing=(False, True)).best
    assert before is not None and before.activation_checkpointing is True
    now = planner.recommend(w, layout, checkpointing=planner.AC_SEARCH)
    assert now.best is not None and now.best.activation_checkpointing == "selective"
    assert now.best.tokens_per_s > before.tokens_per_s * 1.02
    assert "selective activation checkpointing" in now.reason
    # The planner counts selective's blocks as eager (train.sac): its MFU is the eager one under COMPILE.
    assert not w.at(activation_checkpointing="selective").compiled_blocks and w.at(activation_checkpointing=True).compiled_blocks
