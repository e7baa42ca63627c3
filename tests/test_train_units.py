"""FSDP2's units as apply_fsdp builds them, what the planner says they hold, and checkpoints across the change (gloo, world size 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.test_train_step import world_of_one

from raydlc import planner
from raydlc.facts.models import SPECS, ModelSpec
from raydlc.train import checkpoint as ckpt
from raydlc.train.loop import loss_sum
from raydlc.train.loss import use_chunked_loss
from raydlc.train.memprobe import LiveBytes
from raydlc.train.model import apply_fsdp, build_model

UNTIED = ModelSpec("untied", 64, 2, 4, 2, 172, 5003, False, max_position_embeddings=512)


def _units(model: torch.nn.Module) -> dict[str, int]:
    """Parameters per FSDP2 parameter group, named by the planner's words (read from FSDP2's state)."""
    from torch.distributed.fsdp import FSDPModule

    names = {id(model): "root", id(model.model.embed_tokens): "embeddings", id(model.model.norm): "head"}
    out: dict[str, int] = {}
    for m in model.modules():
        if not isinstance(m, FSDPModule) or m is model.lm_head:
            continue
        groups = m._get_fsdp_state()._fsdp_param_groups
        n = sum(p._orig_size.numel() for g in groups for p in g.fsdp_params)
        key = names.get(id(m), "block")
        out[key] = n if key != "block" else max(out.get("block", 0), n)
    return out


@pytest.mark.parametrize("spec", [UNTIED, SPECS["tiny"]], ids=["untied", "tied"])
def test_the_units_are_torchtitans_and_what_the_planner_counts(spec: ModelSpec) -> None:
    with world_of_one():
        model = apply_fsdp(use_chunked_loss(build_model(spec), 64))
        want = planner.fsdp_units(spec)
        got = _units(model)
        assert got.get("root", 0) == want["root"] and got["block"] == want["block"]
        assert got.get("embeddings", 0) == want["embeddings"] and got.get("head", 0) == want["head"]
        if spec.tie_embeddings:
            assert model.lm_head.weight is model.model.embed_tokens.weight  # one parameter, in the root unit


def test_peak_unsharded_parameters_and_gradients_are_the_planners_within_5_percent() -> None:
    """The real vocabulary of Qwen2.5 on narrow layers: the unsharded head and embeddings dominate, as at 7B."""
    spec = ModelSpec("qwen-vocab", 64, 2, 4, 2, 172, 152064, False, max_position_embeddings=512)
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    for reduce, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        buffers: list[int] = []
        real = _fsdp_collectives.foreach_reduce_scatter_copy_in

        def counted(grads: Any, buffer: torch.Tensor, world: int, real: Any = real, buffers: list[int] = buffers) -> None:
            buffers.append(buffer.numel() * buffer.element_size())  # the fresh reduce-scatter input of one unit
            real(grads, buffer, world)

        _fsdp_collectives.foreach_reduce_scatter_copy_in = counted
        try:
            with world_of_one():
                model = apply_fsdp(use_chunked_loss(build_model(spec), 64), param_dtype=torch.bfloat16, reduce_dtype=reduce)
                ids = torch.randint(0, spec.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0))
                probe = LiveBytes(model)
                with probe:
                    with probe.during("forward"):
                        total, _ = loss_sum(model, ids, ids)
                    with probe.during("backward"):
                        total.backward()
        finally:
            _fsdp_collectives.foreach_reduce_scatter_copy_in = real
        w = planner.Workload(spec, seq_len=128, loss_chunk=64, reduce_dtype=name)
        want = planner.unsharded_parts(w)
        got = {k: probe.peak(k) for k in ("unsharded_params", "unsharded_grads")} | {"reduce_buffer": max(buffers)}
        print(name, "measured", got, "planned", want, probe.peaks)
        for term in want:
            assert got[term] == pytest.approx(want[term], rel=0.05), (name, term)
        # One buffer per unit that has gradients, each in the reduce dtype, even where that is the compute dtype.
        assert len(buffers) == spec.num_layers + 2 and got["reduce_buffer"] == planner.fsdp_units(spec)["head"] * (4 if name == "fp32" else 2)


def _old_layout(model: torch.nn.Module) -> torch.nn.Module:
    """The units before torchtitan's: each block, then a root with embeddings, norm and head."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model, reshard_after_forward=False)
    return model


def test_a_checkpoint_of_the_old_units_loads_into_the_new_ones(tmp_path: Path) -> None:
    def full(model: torch.nn.Module) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))

    with world_of_one():
        old = _old_layout(build_model(UNTIED, seed=1))
        opt = torch.optim.AdamW(old.parameters(), lr=1e-3)
        ids = torch.randint(0, UNTIED.vocab_size, (1, 32))
        old(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        ckpt.save(tmp_path, old, opt, step=1, rank=0, world_size=1, extra={}, meta={})
        new = apply_fsdp(use_chunked_loss(build_model(UNTIED, seed=2), 16))
        new_opt = torch.optim.AdamW(new.parameters(), lr=1e-3)
        ckpt.load(tmp_path, new, new_opt, rank=0)
        a, b = full(old), full(new)
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)
        assert len(new_opt.state) == len(list(new.parameters()))  # AdamW's moments came along
