"""Gradient accumulation with FSDP2's own switches, on 2 gloo workers under Ray Train (fp32, CPU).

One TorchTrainer runs every case through the product's `build`, `micro_batches` and
`train_step`: N = 4 micro-batches of 2 must take the same steps as one of 8, for FSDP and for
HSDP with 2 replicas, in each sync mode; and the bytes each rank's collectives move in one
accumulated step, and the gradients accumulation holds, must be the planner's figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from raydlc import planner
from raydlc.facts.models import SPECS

pytestmark = pytest.mark.slow

STEPS, SEQ, GLOBAL = 4, 32, 16
# (name, sharding, micro-batch, accumulation, sync)
CASES = [
    ("fsdp-8", "fsdp", 8, 1, "every"),
    ("fsdp-2x4-once", "fsdp", 2, 4, "once"),
    ("fsdp-2x4-every", "fsdp", 2, 4, "every"),
    ("hsdp-8", "hsdp", 8, 1, "every"),
    ("hsdp-2x4-all-reduce-once", "hsdp", 2, 4, "all-reduce-once"),
    ("hsdp-2x4-once", "hsdp", 2, 4, "once"),
    ("hsdp-2x4-every", "hsdp", 2, 4, "every"),
]
# 2 workers: FSDP is one node of 2 GPUs to the planner; HSDP (2, 1) is 2 nodes of 1.
LAYOUTS = {
    "fsdp": planner.Layout(nodes=1, gpus_per_node=2, gpu="l4", network_gbps=40),
    "hsdp": planner.Layout(nodes=2, gpus_per_node=1, gpu="l4", network_gbps=40),
}


def accumulation_loop(config: dict[str, Any]) -> None:
    import gc

    import numpy as np
    import ray.train
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from raydlc.config import TrainConfig
    from raydlc.data.order import global_batch, rank_slice
    from raydlc.train import loop as L
    from raydlc.train.layout import plan_mesh

    rank = ray.train.get_context().get_world_rank()
    counts = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0, "scalars": 0}

    def wrap(name: str, key: str, which: int, kwarg: str) -> None:
        real = getattr(dist, name)

        def counted(*args: Any, **kw: Any) -> Any:
            t = args[which] if len(args) > which else kw[kwarg]
            counts["scalars" if t.numel() <= 1 else key] += t.numel() * t.element_size()
            return real(*args, **kw)

        setattr(dist, name, counted)

    wrap("all_gather_single", "all_gather", 0, "output_tensor")  # the whole gathered buffer
    wrap("reduce_scatter_single", "reduce_scatter", 1, "input")  # the whole unsharded gradient
    wrap("all_reduce", "all_reduce", 0, "tensor")

    rng = np.random.default_rng(0)
    # Tokens from 64 of the 4096 ids: something a few steps can learn (uniform ids over the whole vocabulary sit at the
    # loss floor from the start, and whether 4 steps of them go down depends on the initialisation).
    ids = rng.integers(0, 64, size=(64, config["seq"]), dtype=np.int32)
    device = torch.device("cpu")

    def trainer(sharding: str, mb: int, accum: int, sync: str) -> L.Trainer:
        settings = TrainConfig(model_id="tiny", seq_len=config["seq"], batch_size=mb, grad_accum=accum, grad_sync=sync,
                               num_workers=2, learning_rate=2e-3, warmup_steps=0, sharding=sharding, hsdp_replicas=2)
        mesh = plan_mesh(sharding, [2], hsdp_replicas=2) if sharding == "hsdp" else plan_mesh("fsdp", [2])  # type: ignore[arg-type]
        return L.build(settings, spec="tiny", mesh=mesh, device=device, bf16=False)

    out: dict[str, Any] = {"cases": {}}
    for name, sharding, mb, accum, sync in config["cases"]:
        t = trainer(sharding, mb, accum, sync)
        assert t.sync == sync or accum == 1
        losses, traffic, rows = [], None, []
        for step in range(1, config["steps"] + 1):
            mine = rank_slice(global_batch(step, len(ids), config["global"], 0), rank, 2)
            batches = L.micro_batches(ids, ids, mine, mb, device)
            rows.append(torch.cat([b[0] for b in batches]).tolist())
            counts.update(dict.fromkeys(counts, 0))
            o = L.train_step(t, batches, 2e-3)
            if step == 1:
                traffic = dict(counts)
            losses.append(float(o.loss))
        out["cases"][name] = {"losses": losses, "traffic": traffic, "rows": rows, "micro_batches": len(batches)}
        del t
        gc.collect()
        dist.barrier()

    # What accumulation holds between micro-batches: after one non-final backward of each mode.
    held: dict[str, int] = {}
    for sharding, sync in (("fsdp", "once"), ("hsdp", "once"), ("hsdp", "all-reduce-once")):
        t = trainer(sharding, 2, 4, sync)
        batches = L.micro_batches(ids, ids, rank_slice(global_batch(1, len(ids), config["global"], 0), rank, 2), 2, device)
        n = L.target_tokens(t, batches)
        L.gradient_sync(t, last=False)
        L.forward_backward(t, batches[0], n)
        total = 0
        for m in t.model.modules():
            if isinstance(m, FSDPModule):
                for group in m._get_fsdp_state()._fsdp_param_groups:
                    if group._partial_reduce_output is not None:
                        total += group._partial_reduce_output.numel() * group._partial_reduce_output.element_size()
                    for fp in group.fsdp_params:
                        g = fp.unsharded_accumulated_grad if fp.unsharded_accumulated_grad is not None else fp._unsharded_param.grad
                        total += 0 if g is None else g.numel() * g.element_size()
        held[f"{sharding}-{sync}"] = total
        del t
        gc.collect()
        dist.barrier()
    out["held"] = held
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()


@pytest.fixture(scope="module")
def measured(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from ray import cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    tmp = tmp_path_factory.mktemp("accum")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    TorchTrainer(
        accumulation_loop,
        train_loop_config={"cases": CASES, "steps": STEPS, "seq": SEQ, "global": GLOBAL, "out": str(tmp)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="accumulation", storage_path=str(tmp / "ray")),
    ).fit()
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def test_four_micro_batches_of_2_take_the_same_steps_as_one_of_8(measured: list[dict[str, Any]]) -> None:
    cases = measured[0]["cases"]
    base = cases["fsdp-8"]["losses"]
    assert len(base) == STEPS and base[-1] < base[0]  # it trains
    for name, c in cases.items():
        worst = max(abs(a - b) for a, b in zip(c["losses"], base))
        assert worst <= 1e-5, f"{name}: max |dloss| {worst:.3g} vs fsdp-8: {c['losses']} vs {base}"
        # Every rank reads the same global batch of each step, cut into micro-batches or not.
        for r in measured:
            assert r["cases"][name]["rows"] == r["cases"]["fsdp-8"]["rows"]
            assert r["cases"][name]["losses"] == c["losses"]  # the loss is the global mean, the same on each rank
        assert c["micro_batches"] == (4 if "2x4" in name else 1)


def test_each_ranks_collectives_in_one_accumulated_step_are_the_planners_bytes(measured: list[dict[str, Any]]) -> None:
    spec = SPECS["tiny"]
    for name, sharding, _, accum, sync in CASES:
        want = planner.traffic_bytes(planner.Workload(spec, policy="fp32", grad_accum=accum, sync=sync), sharding, LAYOUTS[sharding])
        for r in measured:
            got = r["cases"][name]["traffic"]
            # Of each gathered buffer and each unsharded gradient a rank receives the other half (ring, 2 ranks);
            # a ring all-reduce of 2 moves 2 x 1/2 of its buffer.
            received = {"all_gather": got["all_gather"] / 2, "reduce_scatter": got["reduce_scatter"] / 2, "all_reduce": got["all_reduce"]}
            print(name, "planned", {k: want[k] for k in received}, "measured", received, "scalars", got["scalars"])
            for key, value in received.items():
                assert value == pytest.approx(want[key], rel=0.02, abs=0), (name, key, value, want[key])
            assert got["scalars"] <= 64  # the token count, the loss and the gradient norm: a few numbers, not traffic
    # The switches do what the planner charges them for: `once` skips 3 of 4 reductions, `all-reduce-once` 3 of 4 all-reduces.
    cases = measured[0]["cases"]
    assert cases["fsdp-2x4-every"]["traffic"]["reduce_scatter"] == 4 * cases["fsdp-2x4-once"]["traffic"]["reduce_scatter"] > 0
    assert cases["hsdp-2x4-every"]["traffic"]["all_reduce"] == 4 * cases["hsdp-2x4-all-reduce-once"]["traffic"]["all_reduce"] > 0
    assert cases["hsdp-2x4-once"]["traffic"]["all_reduce"] == cases["hsdp-2x4-all-reduce-once"]["traffic"]["all_reduce"]


def test_what_accumulation_holds_between_micro_batches_is_the_planners_accumulated_grads(measured: list[dict[str, Any]]) -> None:
    spec = SPECS["tiny"]
    for key, (sharding, sync) in {"fsdp-once": ("fsdp", "once"), "hsdp-once": ("hsdp", "once"), "hsdp-all-reduce-once": ("hsdp", "all-reduce-once")}.items():
        shard = 2 if sharding == "fsdp" else 1
        want = planner.memory_bytes(planner.Workload(spec, policy="fp32", seq_len=SEQ, micro_batch=2, grad_accum=4, sync=sync), shard)["accumulated_grads"]
        for r in measured:
            assert r["held"][key] == pytest.approx(want, rel=0.02), (key, r["held"][key], want)
    assert planner.memory_bytes(planner.Workload(spec, policy="fp32", seq_len=SEQ, micro_batch=2, grad_accum=4, sync="once"), 2)["accumulated_grads"] == 4 * spec.param_count()
