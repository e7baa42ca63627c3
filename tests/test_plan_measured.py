"""The planner's sharded sizes against what FSDP2 really allocates, on 2 gloo workers under Ray Train."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from raydlc import planner
from raydlc.facts.models import SPECS, ModelSpec

# Untied head and a vocabulary that does not split evenly, so FSDP2's padding and the root unit show.
SMALL = ModelSpec("small", 512, 8, 8, 2, 1376, 32003, False, max_position_embeddings=2048)
CASES = [(SPECS["tiny"], "bf16-mixed"), (SPECS["tiny"], "pure-bf16"), (SMALL, "bf16-mixed"), (SMALL, "pure-bf16")]
HSDP_CASE = (SPECS["tiny"], "bf16-mixed")  # 2 workers as 2 nodes x 1 GPU: shard 1, replicate 2


def _local_bytes(t: Any) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _count_collectives(dist: Any, counts: dict[str, int]) -> None:
    """Wrap the collectives FSDP2 calls (looked up on torch.distributed at call time) to count bytes."""

    def wrap(name: str, key: str, which: int, kwarg: str) -> None:
        real = getattr(dist, name)

        def counted(*args: Any, **kw: Any) -> Any:
            t = args[which] if len(args) > which else kw[kwarg]
            counts[key] += t.numel() * t.element_size()
            return real(*args, **kw)

        setattr(dist, name, counted)

    wrap("all_gather_single", "all_gather", 0, "output_tensor")  # output: the whole gathered buffer
    wrap("reduce_scatter_single", "reduce_scatter", 1, "input")  # input: the whole unsharded gradient
    wrap("all_reduce", "all_reduce", 0, "tensor")


def shard_sizes_loop(config: dict[str, Any]) -> None:
    """One AdamW step per case: local bytes of parameters, gradients and optimizer state, and collective bytes."""
    import gc

    import ray.train
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    from raydlc.facts.models import ModelSpec
    from raydlc.train.model import apply_fsdp, build_model

    rank = ray.train.get_context().get_world_rank()
    counts = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0}
    _count_collectives(dist, counts)
    buffers: list[int] = []
    real_copy_in = _fsdp_collectives.foreach_reduce_scatter_copy_in

    def copy_in(grads: Any, buffer: Any, world: int) -> None:
        buffers.append(buffer.numel() * buffer.element_size())  # FSDP2's fresh reduce-scatter input of one unit
        real_copy_in(grads, buffer, world)

    _fsdp_collectives.foreach_reduce_scatter_copy_in = copy_in
    out = []
    for spec_d, policy, strategy in config["cases"]:
        spec = ModelSpec(**spec_d)
        bf16 = torch.bfloat16
        model = build_model(spec, dtype=bf16 if policy == "pure-bf16" else torch.float32, seed=0)
        mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard")) if strategy == "hsdp" else None
        if policy == "bf16-mixed":
            apply_fsdp(model, mesh=mesh, param_dtype=bf16, reduce_dtype=torch.float32)
        else:
            apply_fsdp(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, spec.vocab_size, (1, 16), generator=torch.Generator().manual_seed(rank))
        counts.update(dict.fromkeys(counts, 0))
        buffers.clear()
        model(input_ids=ids, labels=ids).loss.backward()
        reduce_buffer = max(buffers, default=0)
        step_counts = dict(counts)
        opt.step()
        params = list(model.parameters())
        state = [v for p in params for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
        out.append({
            "spec": spec.name,
            "policy": policy,
            "strategy": strategy,
            "collective_bytes": step_counts,
            "reduce_buffer": reduce_buffer,
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
        train_loop_config={
            "cases": [(asdict(s), p, "fsdp") for s, p in CASES] + [(asdict(HSDP_CASE[0]), HSDP_CASE[1], "hsdp")],
            "out": str(tmp_path),
        },
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="plan-shards", storage_path=str(tmp_path / "ray")),
    ).fit()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    one_node = planner.Layout(nodes=1, gpus_per_node=2, gpu="l4", network_gbps=40)
    for i, (spec, policy) in enumerate(CASES):
        want = planner.memory_bytes(planner.Workload(spec, seq_len=16, policy=policy), 2)
        traffic = planner.traffic_bytes(planner.Workload(spec, policy=policy), "fsdp", one_node)
        b = planner.PRECISION[policy]
        got = [r[i] for r in ranks]
        keys = ("params", "grads", "optimizer")
        print(spec.name, policy, "planned", {k: want[k] for k in keys}, {k: traffic[k] for k in ("all_gather", "reduce_scatter")})
        print(spec.name, policy, "measured", [{k: g[k] for k in keys} | {"received": {k: v // 2 for k, v in g["collective_bytes"].items()}} for g in got])
        assert sum(g["numel"] for g in got) == spec.param_count()  # the shards cover the model exactly once
        expected_dtype = "torch.float32" if policy == "bf16-mixed" else "torch.bfloat16"
        assert all(g["dtypes"] == [expected_dtype] and g["state_dtypes"] == [expected_dtype] for g in got), got
        # The sharded state: in the optimizer step's phase, where every shard's gradient exists.
        state = planner.memory_phases(planner.Workload(spec, seq_len=16, policy=policy), 2)["optimizer_step"]
        buffer = planner.unsharded_parts(planner.Workload(spec, seq_len=16, policy=policy))["reduce_buffer"]
        for g in got:
            for key in ("params", "grads", "optimizer"):
                assert g[key] == pytest.approx(state[key], rel=0.02), (spec.name, policy, key, g[key], state[key])
            # The largest unit's reduce-scatter buffer, in the reduce dtype (fp32 under bf16-mixed, bf16 under pure-bf16).
            assert g["reduce_buffer"] == pytest.approx(buffer, rel=0.05), (spec.name, policy, g["reduce_buffer"], buffer)
        assert sum(g["params"] for g in got) == spec.param_count() * b.param
        assert sum(g["grads"] for g in got) == spec.param_count() * b.grad
        # Each rank receives (n-1)/n of every gathered buffer and of every reduce-scattered gradient.
        for g in got:
            c = g["collective_bytes"]
            assert c["all_gather"] / 2 == pytest.approx(traffic["all_gather"], rel=0.02), (spec.name, policy, c, traffic)
            assert c["reduce_scatter"] / 2 == pytest.approx(traffic["reduce_scatter"], rel=0.02), (spec.name, policy, c, traffic)
            assert c["all_reduce"] == 0

    spec, policy = HSDP_CASE
    two_nodes = planner.Layout(nodes=2, gpus_per_node=1, gpu="l4", network_gbps=40)
    traffic = planner.traffic_bytes(planner.Workload(spec, policy=policy), "hsdp", two_nodes)
    want = planner.memory_bytes(planner.Workload(spec, seq_len=16, policy=policy), 1)
    for r in ranks:
        g = r[len(CASES)]
        assert g["strategy"] == "hsdp" and g["params"] == want["params"]  # replicated: every rank holds it all
        # A ring all-reduce moves 2(n-1)/n of the buffer; nothing is gathered or scattered with shard size 1.
        assert g["collective_bytes"]["all_reduce"] * 2 * (2 - 1) / 2 == pytest.approx(traffic["all_reduce"], rel=0.02)
        assert traffic["cross_node_per_node"] == traffic["all_reduce"]
