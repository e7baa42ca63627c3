"""The parallel layout decided once on the driver, and the RunSpec every worker re-validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from raydlc.config import TrainConfig
from raydlc.data.tokenizer import TokenizerInfo
from raydlc.errors import InputError, TrainError
from raydlc.train import launch as L
from raydlc.train import resolve as R
from raydlc.train.faults import Crash
from raydlc.train.layout import Mesh, check_placement, placement, plan_mesh
from raydlc.train.runspec import RunSpec, RunTarget


def test_placement_fills_the_largest_nodes_first_as_ray_packs_them() -> None:
    assert placement([4, 4], 8) == [4, 4]
    assert placement([4, 4, 0], 4) == [4]  # one node holds them all; the CPU-only head has no GPU
    assert placement([4, 4], 6) == [4, 2]
    assert placement([2, 8], 4) == [4]
    with pytest.raises(InputError, match="3 workers need 3 worker slots and the Ray cluster has 2"):
        placement([2], 3)


def test_hsdp_is_refused_when_it_would_not_be_hsdp() -> None:
    with pytest.raises(InputError, match=r"at least 2 replicas.*1 node.*which is FSDP"):
        plan_mesh("hsdp", [2])  # the local 2-worker run that used to be validated (2, 1) and built (1, 2)
    with pytest.raises(InputError, match="one rank per node shards nothing"):
        plan_mesh("hsdp", [1, 1])
    with pytest.raises(InputError, match="cross nodes"):
        plan_mesh("hsdp", [4, 2])  # 2 replicas of 3 ranks: a shard group would span both nodes
    with pytest.raises(InputError, match="do not split into 4 replicas"):
        plan_mesh("hsdp", [6], hsdp_replicas=4)
    asked = plan_mesh("hsdp", [1, 1], hsdp_replicas=2)  # plain replication, asked for explicitly
    assert (asked.shape, asked.replicas, asked.shard) == ((2, 1), 2, 1)
    two_per_node = plan_mesh("hsdp", [4, 4], hsdp_replicas=4)
    assert (two_per_node.shape, two_per_node.dim_names) == ((4, 2), ("replicate", "shard"))
    fsdp = plan_mesh("fsdp", [4, 2])
    assert (fsdp.shape, fsdp.dim_names, fsdp.nodes) == ((6,), ("shard",), 2)


def test_a_local_hsdp_run_is_refused_before_ray_starts(tmp_path: Path) -> None:
    train = TrainConfig(model_id="tiny", num_workers=2, seq_len=32, batch_size=2, sharding="hsdp", storage_path=str(tmp_path))
    with pytest.raises(InputError, match="at least 2 replicas"):
        L.prepare(train, RunTarget())
    assert not list(tmp_path.iterdir())


def test_workers_refuse_a_placement_other_than_the_planned_one() -> None:
    mesh = plan_mesh("hsdp", [4, 4])
    check_placement(mesh, world_size=8, local_world_size=4)
    with pytest.raises(TrainError, match="Ray placed 2 of 8 workers"):
        check_placement(mesh, world_size=8, local_world_size=2)
    with pytest.raises(TrainError, match="planned for 8"):
        check_placement(mesh, world_size=6, local_world_size=4)


def spec(**kw: object) -> RunSpec:
    base: dict[str, object] = dict(
        train=TrainConfig(model_id="tiny", num_workers=2, steps=7, weight_decay=0.1, warmup_steps=3),
        spec="tiny",
        mesh=plan_mesh("hsdp", [2], hsdp_replicas=2),
        use_gpu=False,
        bf16=False,
        run_name="run-x",
        run_dir="/tmp/out/run-x",
        tokenizer=TokenizerInfo(eos_id=0, vocab_size=10, tokenizer_json="{}"),
        data_digest="abc",
        faults=Crash(rank=1, step=5),
    )
    return RunSpec(**(base | kw))  # type: ignore[arg-type]


def test_runspec_round_trips_through_json_and_is_validated_again_on_the_worker_side() -> None:
    s = spec()
    back = RunSpec.from_wire(s.to_wire())
    assert back == s and isinstance(back.mesh, Mesh) and back.mesh.shape == (2, 1)
    assert (back.train.weight_decay, back.train.warmup_steps, back.faults) == (0.1, 3, Crash(rank=1, step=5))
    assert back.checkpoint_meta() == {"model": "tiny", "spec": "tiny", "seq_len": 128, "global_batch": 2, "seed": 0, "data": "abc",
                                   "lora_rank": 0}
    # Accumulation is part of the global batch (the data order), and arrives decided.
    assert spec(train=TrainConfig(model_id="tiny", num_workers=2, batch_size=3, grad_accum=4)).global_batch == 3 * 4 * 2
    with pytest.raises(ValidationError, match="decided accumulation"):
        spec(train=TrainConfig(grad_accum="auto"))
    with pytest.raises(ValidationError, match="needs an HSDP mesh"):
        spec(train=TrainConfig(grad_accum=2, grad_sync="all-reduce-once"), mesh=plan_mesh("fsdp", [2]))
    wire = json.loads(s.to_wire())
    wire["train"]["steps"] = 0
    with pytest.raises(ValidationError, match="at least 1"):
        RunSpec.from_wire(json.dumps(wire))
    wire["train"]["steps"], wire["train"]["no_such_knob"] = 7, 1
    with pytest.raises(ValidationError, match="no_such_knob"):
        RunSpec.from_wire(json.dumps(wire))


def test_a_layout_on_several_nodes_needs_storage_every_node_sees(tmp_path: Path) -> None:
    from raydlc.errors import ConfigError

    train = TrainConfig(model_id="tiny", num_workers=8, storage_path=str(tmp_path))
    two_nodes, _ = R.plan_layout(train, [4, 4, 0], model=None, instance_type=None)
    assert two_nodes.nodes == 2
    with pytest.raises(ConfigError, match="STORAGE_PATH: 2 nodes need storage every node sees"):
        R.check_storage(train, two_nodes)
    R.check_storage(train.updated(storage_shared=True), two_nodes)
    R.check_storage(train.updated(storage_path="s3://bucket/runs"), two_nodes)
    R.check_storage(train, R.plan_layout(train, [8], model=None, instance_type=None)[0])  # one node: its disk will do


# ---- HSDP placement, proven by the workers' own reports ---------------------------------------------


def test_shard_groups_are_the_ones_torchs_device_mesh_builds() -> None:
    """One process pretending to be each rank of 8 (torch's fake process group): the shard group
    DeviceMesh gives that rank is the one `shard_groups` names."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from raydlc.train.layout import shard_groups

    for mesh in (plan_mesh("hsdp", [4, 4]), plan_mesh("hsdp", [4, 4], hsdp_replicas=4), plan_mesh("fsdp", [4, 4])):
        groups = shard_groups(mesh)
        assert sorted(r for g in groups for r in g) == list(range(8))
        for rank in range(8):
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=8)
            try:
                built = init_device_mesh("cpu", mesh.shape, mesh_dim_names=mesh.dim_names)
                assert built["shard"].mesh.tolist() in groups, (mesh.shape, rank)
            finally:
                dist.destroy_process_group()


def test_a_shard_group_across_nodes_is_refused_naming_its_ranks() -> None:
    from raydlc.train.layout import check_nodes

    mesh = plan_mesh("hsdp", [4, 4])  # (2, 4): ranks 0-3 and 4-7 must each share a node
    check_nodes(mesh, ["10.0.0.1"] * 4 + ["10.0.0.2"] * 4)
    interleaved = ["10.0.0.1", "10.0.0.2"] * 4  # what a placement not node by node would give
    with pytest.raises(TrainError, match=r"span nodes: ranks 0-3 on 10\.0\.0\.1 \(ranks 0, 2\), 10\.0\.0\.2 \(ranks 1, 3\); ranks 4-7 on") as e:
        check_nodes(mesh, interleaved)
    assert "--sharding fsdp" in (e.value.hint or "")
    one_off = ["a", "a", "a", "b", "b", "b", "b", "b"]
    with pytest.raises(TrainError) as one:
        check_nodes(mesh, one_off)
    assert one.value.message.endswith("span nodes: ranks 0-3 on a (ranks 0, 1, 2), b (ranks 3)")  # the second group is whole
    check_nodes(plan_mesh("fsdp", [4, 4]), interleaved)  # FSDP shards across nodes by design
    with pytest.raises(TrainError, match="7 workers reported"):
        check_nodes(mesh, ["a"] * 7)
