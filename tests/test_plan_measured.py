"""The planner's sharded sizes against what FSDP2 really allocates, on 2 gloo workers under Ray Train."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from raydlc import plan as planner
from raydlc.train.model import SPECS, ModelSpec

# Untied head and a vocabulary that does not split evenly, so FSDP2's padding and the root unit show.
SMALL = ModelSpec("small", 512, 8, 8, 2, 1376, 32003, False, max_position_embeddings=2048)
CASES = [(SPECS["tiny"], "bf16-mixed"), (SPECS["tiny"], "pure-bf16"), (SMALL, "bf16-mixed"), (SMALL, "pure-bf16")]


def _local_bytes(t: Any) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def shard_sizes_loop(config: dict[str, Any]) -> None:
    """One AdamW step per case, then the local bytes of parameters, gradients and optimizer state."""
    import gc

    import ray.train
    import torch
    import torch.distributed as dist

    from raydlc.train.model import ModelSpec, apply_fsdp, build_model

    rank = ray.train.get_context().get_world_rank()
    out = []
    for spec_d, policy in config["cases"]:
        spec = ModelSpec(**spec_d)
        bf16 = torch.bfloat16
        model = build_model(spec, dtype=bf16 if policy == "pure-bf16" else torch.float32, seed=0)
        if policy == "bf16-mixed":
            apply_fsdp(model, param_dtype=bf16, reduce_dtype=torch.float32)
        else:
            apply_fsdp(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, spec.vocab_size, (1, 16), generator=torch.Generator().manual_seed(rank))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        params = list(model.parameters())
        state = [v for p in params for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
        out.append({
            "spec": spec.name,
            "policy": policy,
            "params": sum(_local_bytes(p) for p in params),
            "grads": sum(_local_bytes(p.grad) for p in params),
            "optimizer": sum(_local_bytes(v) for v in state),
            "dtypes": sorted({str(p.dtype) for p in params} | {str(p.grad.dtype) for p in params}),
            "state_dtypes": sorted({str(v.dtype) for p in params for k, v in opt.state[p].items() if k != "step"}),
            "numel": sum(p.to_local().numel() for p in params),
        })
        del model, opt, params, state
        gc.collect()
        dist.barrier()
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()


@pytest.mark.slow
def test_fsdp2_local_shards_match_the_planner_within_2_percent(ray_local: Any, tmp_path: Path) -> None:
    from ray import cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    TorchTrainer(
        shard_sizes_loop,
        train_loop_config={"cases": [(asdict(s), p) for s, p in CASES], "out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="plan-shards", storage_path=str(tmp_path / "ray")),
    ).fit()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for i, (spec, policy) in enumerate(CASES):
        want = planner.memory_bytes(spec, 2, policy, 16, 1, False)
        b = planner.PRECISION[policy]
        got = [r[i] for r in ranks]
        print(spec.name, policy, {k: want[k] for k in ("params", "grads", "optimizer")}, [{k: g[k] for k in ("params", "grads", "optimizer")} for g in got])
        assert sum(g["numel"] for g in got) == spec.param_count()  # the shards cover the model exactly once
        expected_dtype = "torch.float32" if policy == "bf16-mixed" else "torch.bfloat16"
        assert all(g["dtypes"] == [expected_dtype] and g["state_dtypes"] == [expected_dtype] for g in got), got
        for g in got:
            for key in ("params", "grads", "optimizer"):
                assert g[key] == pytest.approx(want[key], rel=0.02), (spec.name, policy, key, g[key], want[key])
        assert sum(g["params"] for g in got) == spec.param_count() * b.param
        assert sum(g["grads"] for g in got) == spec.param_count() * b.grad
