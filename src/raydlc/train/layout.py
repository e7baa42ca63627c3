"""The parallel layout of a run, decided once on the driver and shipped to every worker.

The driver knows what Ray granted (how many workers land on each node) before any worker
starts; the workers only build the mesh they are given and check that Ray placed them as
planned. Ray Train numbers ranks node by node (contiguous ranks share a node), so an HSDP
mesh (replicate, shard) whose shard groups divide a node's ranks keeps each shard group's
all-gathers and reduce-scatters inside one node. Pure: no torch, no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from raydlc.errors import InputError, TrainError
from raydlc.models import ModelSpec

if TYPE_CHECKING:
    from raydlc.config import TrainConfig

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


@dataclass(frozen=True)
class Decision:
    """How each optimizer step is run: sharding, micro-batch, accumulation, when gradients sync, and why."""

    sharding: Sharding
    micro_batch: int
    grad_accum: int
    grad_sync: str
    planned: bool  # the planner chose at least one of them
    note: str  # for people: where the choice came from
    step_time_s: float | None = None  # the planner's estimate of one optimizer step, when it planned

    def apply(self, train: TrainConfig) -> TrainConfig:
        """The settings with the step concrete, as the workers must receive them."""
        return train.updated(batch_size=self.micro_batch, grad_accum=self.grad_accum, grad_sync=self.grad_sync)


def decide(
    train: TrainConfig,
    ranks_per_node: Sequence[int],
    *,
    model: ModelSpec | None,
    instance_type: str | None,
    max_sequences: int | None = None,
) -> Decision:
    """SHARDING, GRAD_ACCUM and GRAD_SYNC made concrete for workers placed `ranks_per_node`.

    Whatever is `auto` comes from one planner search (raydlc.plan.recommend) when there is
    something to plan with: a known architecture, a GPU node type with a known GPU (a local
    run has none), the same number of ranks on every node, and the mesh the planner models
    (HSDP with one replica per node). GRAD_ACCUM=auto takes the planner's micro-batch with its
    accumulation, so BATCH_SIZE is replaced; `max_sequences` (the training set) caps the
    global batch beside MAX_GLOBAL_BATCH. Without a plan: FSDP, accumulation 1, and the
    sync mode the issue's switches name (once for FSDP, all-reduce-once for HSDP).
    """
    from raydlc import catalog
    from raydlc import plan as planner

    requested = train.sharding
    if requested not in ("fsdp", "hsdp", "auto"):
        raise InputError(f"--sharding {requested!r} is not one of fsdp, hsdp, auto")
    counts = [int(c) for c in ranks_per_node]
    nodes = len(counts)
    accum_auto = train.grad_accum == "auto"
    it = catalog.instance_type(instance_type) if instance_type else None
    why_not = None
    if model is None:
        why_not = "no known architecture to plan with"
    elif it is None or it.gpu is None:
        why_not = "no known GPU type to plan with, as in a local run"
    elif len(set(counts)) != 1:
        why_not = f"ranks per node differ ({' + '.join(map(str, counts))})"
    elif requested == "hsdp" and train.hsdp_replicas not in (0, nodes):
        why_not = f"HSDP_REPLICAS={train.hsdp_replicas} is not the one replica per node the planner models"
    wanted = requested == "auto" or accum_auto or train.grad_sync == "auto"
    if why_not is None and wanted:
        assert model is not None
        bf16 = bool(train.use_gpu) if train.bf16 is None else train.bf16
        layout = planner.layout_for(nodes, counts[0], instance_type=instance_type)
        ceiling = train.max_global_batch if max_sequences is None else min(train.max_global_batch, max_sequences * train.seq_len)
        strategies = ("fsdp", "hsdp") if requested == "auto" and nodes > 1 else (("fsdp",) if requested == "auto" else (requested,))
        work = planner.Workload(
            model, seq_len=train.seq_len, policy="bf16-mixed" if bf16 else "fp32",
            activation_checkpointing=train.activation_checkpointing, max_global_batch=max(ceiling, 1),
            loss_chunk=train.loss_chunk, reduce_dtype=train.reduce_dtype,
        )
        rec = planner.recommend(
            work, layout, strategies=strategies,
            micro_batches=None if accum_auto else (train.batch_size,),
            grad_accums=None if accum_auto else (train.grad_accum,),  # type: ignore[arg-type]
            syncs=None if train.grad_sync == "auto" else (train.grad_sync,),
        )
        if rec.best is not None:
            b = rec.best
            return _checked(Decision(b.strategy, b.micro_batch, b.grad_accum, b.sync, True, f"planned: {rec.reason}", b.step_time_s))  # type: ignore[arg-type]
        why_not = f"the planner finds nothing that fits ({rec.reason})"
    sharding: Sharding = "fsdp" if requested == "auto" else requested  # type: ignore[assignment]
    accum = 1 if accum_auto else int(train.grad_accum)
    from raydlc.plan import default_sync

    sync = default_sync(sharding, accum) if train.grad_sync == "auto" else train.grad_sync
    note = "as configured"
    if wanted and why_not:
        auto = [n for n, v in (("SHARDING", requested), ("GRAD_ACCUM", train.grad_accum), ("GRAD_SYNC", train.grad_sync)) if v == "auto"]
        note = f"{' '.join(a + '=auto' for a in auto)} without a plan ({why_not}): {sharding}, accumulation {accum}, sync {sync}"
    return _checked(Decision(sharding, train.batch_size, accum, sync, False, note))


def _checked(d: Decision) -> Decision:
    if d.grad_sync == "all-reduce-once" and d.sharding != "hsdp":
        raise InputError(
            "GRAD_SYNC=all-reduce-once needs HSDP: with FSDP there is no all-reduce to put off",
            hint="use GRAD_SYNC=once (or every, or auto), or SHARDING=hsdp",
        )
    return d


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
