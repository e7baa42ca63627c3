"""GPU workers run with expandable segments, and a run records the allocator's reserved peak beside
the allocated one (CUDA), or says it has none (CPU): the workers' environment and the summary fields."""

from __future__ import annotations

from typing import Any

import pytest
from tests.test_train_layout import spec

from raydlc.api._train import TrainResult
from raydlc.train import launch as L
from raydlc.train import metrics as M


def test_gpu_workers_get_expandable_segments_unless_the_user_set_the_allocator() -> None:
    gpu = L.worker_env(spec(use_gpu=True), environ={})
    assert gpu["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert gpu["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] and gpu["TOKENIZERS_PARALLELISM"] == "false"  # Ray's worker env still there
    assert "PYTORCH_CUDA_ALLOC_CONF" not in L.worker_env(spec(use_gpu=False), environ={})
    mine = "expandable_segments:False,max_split_size_mb:512"
    assert L.worker_env(spec(use_gpu=True), environ={"PYTORCH_CUDA_ALLOC_CONF": mine})["PYTORCH_CUDA_ALLOC_CONF"] == mine
    assert L.worker_env(spec(use_gpu=True), {"PYTORCH_CUDA_ALLOC_CONF": "x"}, environ={})["PYTORCH_CUDA_ALLOC_CONF"] == "x"  # RunTarget.env


def records(reserved: list[float | None]) -> list[dict[str, Any]]:
    return [{"step": i + 1, "loss": 1.0, "tokens": 10, "step_time_s": 1.0, "peak_mem_mb": 5.0, "peak_reserved_mb": r} for i, r in enumerate(reserved)]


def test_cpu_records_no_reserved_peak_and_the_summary_says_none() -> None:
    assert M.peak_reserved_mb() is None  # no CUDA here: no caching allocator to report
    s = M.summarize(records([None, None]))
    assert s["peak_reserved_mb"] is None and s["peak_mem_mb"] == 5.0
    assert "peak_reserved_mb" not in M.report(records([None, None]), step=2, every=2, mesh_shape=[1])


def test_cuda_reserved_peak_is_read_recorded_and_summarised(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 2 * 2**30)
    assert (M.peak_reserved_mb(), M.peak_memory_mb()) == (3072.0, 2048.0)
    recs = records([100.0, 300.0, 200.0])
    assert M.summarize(recs)["peak_reserved_mb"] == 300.0
    report = M.report(recs, step=3, every=3, mesh_shape=[2], last=True)
    assert report["peak_reserved_mb"] == 200.0 and report["summary_peak_reserved_mb"] == 300.0


def test_the_train_result_carries_the_reserved_peak() -> None:
    assert "peak_reserved_mb" in TrainResult.__dataclass_fields__
    assert TrainResult.__dataclass_fields__["peak_reserved_mb"].default is None
