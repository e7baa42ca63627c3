"""The parallel layout of a run, decided once on the driver and shipped to every worker.

The driver knows what Ray granted (how many workers land on each node) before any worker
starts; the workers only build the mesh they are given and check that Ray placed them as
planned. Ray Train numbers ranks node by node (contiguous ranks share a node), so an HSDP
mesh (replicate, shard) whose shard groups divide a node's ranks keeps each shard group's
all-gathers and reduce-scatters inside one node. Pure: no torch, no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from raydlc.errors import InputError, TrainError
from raydlc.models import ModelSpec

Sharding = Literal["fsdp", "hsdp"]


class Mesh(BaseModel):
    """(world,) for FSDP; (replicas, shard) for HSDP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sharding: Sharding
    world_size: int
    ranks_per_node: list[int]  # as Ray places them, node by node
    replicas: int
    shard: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.world_size,) if self.sharding == "fsdp" else (self.replicas, self.shard)

    @property
    def dim_names(self) -> tuple[str, ...]:
        return ("shard",) if self.sharding == "fsdp" else ("replicate", "shard")

    @property
    def nodes(self) -> int:
        return len(self.ranks_per_node)


def resolve_sharding(
    requested: str,
    num_nodes: int,
    gpus_per_node: int,
    *,
    model: ModelSpec | None = None,
    seq_len: int = 128,
    micro_batch: int = 1,
    instance_type: str | None = None,
) -> Sharding:
    """The concrete strategy for `auto`: the planner's choice (raydlc.plan) on a multi-node cluster.

    On one node HSDP would have a single replica, which is FSDP; without a known architecture
    (a hub id raydlc has no spec for) or GPU node type (a local run) there is nothing to plan
    with, so FSDP it is.
    """
    if requested not in ("fsdp", "hsdp", "auto"):
        raise InputError(f"--sharding {requested!r} is not one of fsdp, hsdp, auto")
    if requested != "auto":
        return requested  # type: ignore[return-value]
    if num_nodes <= 1 or model is None or instance_type is None:
        return "fsdp"
    from raydlc.plan import recommend_sharding

    choice = recommend_sharding(model, num_nodes, gpus_per_node, None, seq_len, micro_batch, instance_type=instance_type)
    return "hsdp" if choice == "hsdp" else "fsdp"


def placement(capacities: Sequence[int], num_workers: int) -> list[int]:
    """Workers per node as Ray Train's PACK placement fills them: the largest nodes first.

    `capacities` are the worker slots of each node (its GPUs, or CPUs for CPU workers).
    """
    left, out = num_workers, []
    for cap in sorted((int(c) for c in capacities if c >= 1), reverse=True):
        if left == 0:
            break
        take = min(cap, left)
        out.append(take)
        left -= take
    if left:
        have = sum(int(c) for c in capacities if c >= 1)
        raise InputError(
            f"{num_workers} workers need {num_workers} worker slots and the Ray cluster has {have}",
            hint="lower --workers (NUM_WORKERS), or join a larger cluster",
        )
    return out


def plan_mesh(sharding: Sharding, ranks_per_node: Sequence[int], hsdp_replicas: int = 0) -> Mesh:
    """The mesh for workers placed `ranks_per_node`; refuses a layout that is not what it says.

    HSDP replicates across groups and shards within each: by default one replica per node.
    It needs at least two replicas (one is FSDP), shard groups that do not cross a node, and,
    unless HSDP_REPLICAS asks for it, more than one rank per shard group.
    """
    counts = [int(c) for c in ranks_per_node]
    world = sum(counts)
    if sharding == "fsdp":
        return Mesh(sharding="fsdp", world_size=world, ranks_per_node=counts, replicas=1, shard=world)
    where = f"{world} workers on {len(counts)} node(s) ({' + '.join(map(str, counts))})"
    replicas = hsdp_replicas or len(counts)
    if replicas < 2:
        raise InputError(
            f"HSDP needs at least 2 replicas; {where} make {replicas}, which is FSDP",
            hint="use --sharding fsdp, or set HSDP_REPLICAS=2 to replicate within a node",
        )
    if world % replicas:
        raise InputError(f"HSDP: {where} do not split into {replicas} replicas", hint="set HSDP_REPLICAS to a divisor of the worker count")
    shard = world // replicas
    if any(c % shard for c in counts):
        raise InputError(
            f"HSDP: shard groups of {shard} ranks would cross nodes for {where}",
            hint="set HSDP_REPLICAS so each node holds whole shard groups, or use --sharding fsdp",
        )
    if shard == 1 and not hsdp_replicas:
        raise InputError(
            f"HSDP with one rank per node shards nothing: {where} make {replicas} replicas of one rank",
            hint="use --sharding fsdp (or set HSDP_REPLICAS to ask for plain replication)",
        )
    return Mesh(sharding="hsdp", world_size=world, ranks_per_node=counts, replicas=replicas, shard=shard)


def check_placement(mesh: Mesh, *, world_size: int, local_world_size: int) -> None:
    """On a worker: Ray placed the ranks as the driver planned, else the mesh would be wrong."""
    if world_size != mesh.world_size or local_world_size not in mesh.ranks_per_node:
        raise TrainError(
            f"Ray placed {local_world_size} of {world_size} workers on this node; the layout was planned "
            f"for {mesh.world_size} as {' + '.join(map(str, mesh.ranks_per_node))} per node",
            hint="the cluster changed between planning and start; run again",
        )
