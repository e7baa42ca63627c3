"""The training step on one process (gloo, world size 1): accumulation and what it reads back to the host."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from raydlc.config import TrainConfig
from raydlc.train import loop as L
from raydlc.train.layout import plan_mesh

HOST_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy")


@contextlib.contextmanager
def world_of_one() -> Iterator[None]:
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def counting_host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Every way a tensor's value reaches Python, counted (a CUDA sync happens in exactly these)."""
    import torch

    calls = dict.fromkeys(HOST_READS, 0)
    for name in HOST_READS:
        real = getattr(torch.Tensor, name)

        def counted(self: Any, *a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _real(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield calls
    monkeypatch.undo()


def trainer(accum: int, sync: str) -> L.Trainer:
    import torch

    settings = TrainConfig(model_id="tiny", seq_len=16, batch_size=2, grad_accum=accum, grad_sync=sync, num_workers=1, warmup_steps=0)
    return L.build(settings, spec="tiny", mesh=plan_mesh("fsdp", [1]), device=torch.device("cpu"), bf16=False)


def test_a_step_with_accumulation_reads_nothing_back_to_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a GPU run executes (fused AdamW keeps its step count on the device), on the CPU:
    until the loop reads, no tensor value reaches Python, so nothing would wait for a GPU."""
    import torch

    ids = np.random.default_rng(0).integers(0, 4096, size=(8, 16), dtype=np.int32)
    with world_of_one():
        t = trainer(4, "once")
        t.optimizer = L.make_optimizer(t.model, t.settings, torch.device("cuda"))  # fused, as on CUDA
        assert t.optimizer.defaults["fused"] is True
        batches = L.micro_batches(ids, ids, np.arange(8), 2, torch.device("cpu"))
        assert [b[0].shape[0] for b in batches] == [2, 2, 2, 2]
        unread = L.Unread([], 0.0)
        with counting_host_reads(monkeypatch) as calls:
            for step in (1, 2, 3):
                out = L.train_step(t, batches, 1e-3)
                unread.steps.append((step, 1e-3, "fp", out))
            during = dict(calls)
            records = unread.read(tokens_per_step=8 * 16, device=torch.device("cpu"))
        assert during == dict.fromkeys(HOST_READS, 0), during
        assert calls["tolist"] == 1  # the read: one copy for all the steps since the last one
        assert [r["step"] for r in records] == [1, 2, 3] and records[2]["loss"] < records[0]["loss"]
        assert all(isinstance(r["loss"], float) and isinstance(r["grad_norm"], float) for r in records)
        assert records[0]["loss"] == float(out.loss) or records[2]["loss"] == float(out.loss)


def test_the_switches_are_restored_after_each_step() -> None:
    """Each step ends on its last micro-batch, which reduces: evaluation and the next step start synced."""
    import torch

    ids = np.random.default_rng(1).integers(0, 4096, size=(4, 16), dtype=np.int32)
    with world_of_one():
        for sync in ("once", "all-reduce-once", "every"):
            t = trainer(2, sync)
            L.train_step(t, L.micro_batches(ids, ids, np.arange(4), 2, torch.device("cpu")), 1e-3)
            groups = [g for m in t.model.modules() if hasattr(m, "_get_fsdp_state") for g in m._get_fsdp_state()._fsdp_param_groups]
            assert groups and all(g.reduce_grads and g.all_reduce_grads for g in groups), sync


def test_the_ready_causal_mask_is_the_mask_transformers_would_build() -> None:
    """Skipping transformers' packed-sequence check (a GPU sync per forward) changes no number."""
    import torch

    from raydlc.facts.models import SPECS
    from raydlc.train.model import build_model

    model = build_model(SPECS["tiny"])
    ids = torch.as_tensor(np.random.default_rng(2).integers(0, 4096, size=(3, 24)))
    assert L.causal_masks(model) == {"full_attention": None}
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=L.causal_masks(model)).logits, model(input_ids=ids).logits)
    model.config.layer_types = ["sliding_attention", "full_attention"] * 2
    assert L.causal_masks(model) is None  # a sliding window needs its mask built


def test_a_llama_model_gets_no_mask_mapping_and_its_forward_runs() -> None:
    """Llama's forward takes no per-layer-type mapping: handed one, it would fail on `.ndim`."""
    import dataclasses

    import torch

    from raydlc.facts.models import SPECS
    from raydlc.train.model import build_model

    spec = dataclasses.replace(SPECS["tiny"], name="tiny-llama", architecture="llama", qkv_bias=False)
    model = build_model(spec)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert L.causal_masks(model) is None
    ids = torch.as_tensor(np.random.default_rng(3).integers(0, 4096, size=(2, 16)))
    labels = ids.clone()
    loss, n = L.loss_sum(model, ids, labels)
    assert n.item() == 2 * 15 and torch.isfinite(loss)
