"""The parallel layout of a run, decided once on the driver and shipped to every worker.

The driver knows what Ray granted (how many workers land on each node) before any worker
starts; the workers only build the mesh they are given and check that Ray placed them as
planned. Ray Train numbers ranks node by node (contiguous ranks share a node), so an HSDP
mesh (replicate, shard) whose shard groups divide a node's ranks keeps each shard group's
all-gathers and reduce-scatters inside one node; the workers' reports of their nodes prove it
(`check_nodes`). Pure: no torch, no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from raydlc.errors import InputError, TrainError
from raydlc.facts.models import ModelSpec

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
class StepLayout:
    """How each optimizer step is run: sharding, micro-batch, accumulation, when gradients sync, and why."""

    sharding: Sharding
    micro_batch: int
    grad_accum: int
    grad_sync: str
    planned: bool  # the planner chose at least one of them
    note: str  # for people: where the choice came from
    step_time_s: float | None = None  # the planner's estimate of one optimizer step, when it planned
    activation_checkpointing: bool | str = False  # False, True (full) or "selective"
    tokens_per_s: float | None = None  # the planner's estimate, when it planned
    reduce_dtype: str = "fp32"  # REDUCE_DTYPE as set, or auto's choice: fp32 unless only bf16 lets a layout fit

    def apply(self, train: TrainConfig) -> TrainConfig:
        """The settings with the step concrete, as the workers must receive them."""
        return train.updated(batch_size=self.micro_batch, grad_accum=self.grad_accum, grad_sync=self.grad_sync,
                             activation_checkpointing=self.activation_checkpointing, reduce_dtype=self.reduce_dtype)


def decide(
    train: TrainConfig,
    ranks_per_node: Sequence[int],
    *,
    model: ModelSpec | None,
    instance_type: str | None,
    max_sequences: int | None = None,
) -> StepLayout:
    """SHARDING, GRAD_ACCUM, GRAD_SYNC and ACTIVATION_CHECKPOINTING (empty: searched) made concrete for workers placed `ranks_per_node`.

    Whatever is `auto` comes from one planner search (raydlc.planner.recommend) when there is
    something to plan with: a known architecture, a GPU node type with a known GPU (a local
    run has none), the same number of ranks on every node, and the mesh the planner models
    (HSDP with one replica per node). GRAD_ACCUM=auto takes the planner's micro-batch with its
    accumulation, so BATCH_SIZE is replaced; `max_sequences` (the training set) caps the
    global batch beside MAX_GLOBAL_BATCH. Without a plan: FSDP, accumulation 1, and the
    sync mode the issue's switches name (once for FSDP, all-reduce-once for HSDP).
    """
    from raydlc import planner
    from raydlc.facts import instances

    requested = train.sharding
    if requested not in ("fsdp", "hsdp", "auto"):
        raise InputError(f"--sharding {requested!r} is not one of fsdp, hsdp, auto")
    counts = [int(c) for c in ranks_per_node]
    nodes = len(counts)
    accum_auto = train.grad_accum == "auto"
    it = instances.instance_type(instance_type) if instance_type else None
    why_not = None
    if model is None:
        why_not = "no known architecture to plan with"
    elif it is None or it.gpu is None:
        why_not = "no known GPU type to plan with, as in a local run"
    elif len(set(counts)) != 1:
        why_not = f"ranks per node differ ({' + '.join(map(str, counts))})"
    elif requested == "hsdp" and train.hsdp_replicas not in (0, nodes):
        why_not = f"HSDP_REPLICAS={train.hsdp_replicas} is not the one replica per node the planner models"
    ac_auto = train.activation_checkpointing is None
    wanted = requested == "auto" or accum_auto or train.grad_sync == "auto" or ac_auto
    if why_not is None:
        assert model is not None
        layout = planner.layout_for(nodes, counts[0], instance_type=instance_type)
        work = _workload(train, model, max_sequences)
        strategies = ("fsdp", "hsdp") if requested == "auto" and nodes > 1 else (("fsdp",) if requested == "auto" else (requested,))
        search = lambda w: planner.recommend(
            w, layout, strategies=strategies,
            micro_batches=None if accum_auto else (train.batch_size,),
            grad_accums=None if accum_auto else (train.grad_accum,),  # type: ignore[arg-type]
            syncs=None if train.grad_sync == "auto" else (train.grad_sync,),
            checkpointing=planner.AC_SEARCH if ac_auto else None,
        )
        rec = search(work)
        if rec.best is None and train.reduce_dtype == "auto":  # bf16 reduction rounds every sum: only when fp32 fits nowhere
            work = work.at(reduce_dtype="bf16")
            rec = search(work)
        if rec.best is not None:
            b = rec.best
            forced = requested != "auto" or not accum_auto or train.grad_sync != "auto" or not ac_auto
            note = f"planned: {rec.reason}" + (_better(work, layout, b) if forced else "")
            return _checked(StepLayout(b.strategy, b.micro_batch, b.grad_accum, b.sync, wanted, note,  # type: ignore[arg-type]
                                       b.step_time_s, b.activation_checkpointing, b.tokens_per_s, str(work.reduce_dtype)))
        why_not = f"the planner finds nothing that fits ({rec.reason})"
    sharding: Sharding = "fsdp" if requested == "auto" else requested  # type: ignore[assignment]
    accum = 1 if accum_auto else int(train.grad_accum)
    from raydlc.planner import default_sync

    sync = default_sync(sharding, accum) if train.grad_sync == "auto" else train.grad_sync
    note = "as configured"
    if wanted and why_not:
        note = f"chosen without the planner ({why_not}): {_in_words(sharding, accum, sync)}"
    return _checked(StepLayout(sharding, train.batch_size, accum, sync, False, note, activation_checkpointing=train.activation_checkpointing or False,
                               reduce_dtype="fp32" if train.reduce_dtype == "auto" else train.reduce_dtype))


SYNC_WORDS = {"every": "after every micro-batch", "once": "once a step", "all-reduce-once": "within a node every micro-batch, across nodes once a step"}


def _in_words(sharding: str, accum: int, sync: str) -> str:
    """The layout a person reads in the summary (the settings' names and values are in --json)."""
    spread = "the model sharded over every worker" if sharding == "fsdp" else "the model sharded within each node and copied across nodes"
    grads = "no gradient accumulation" if accum == 1 else f"{accum} micro-batches accumulated, gradients synchronised {SYNC_WORDS.get(sync, sync)}"
    return f"{spread}, {grads}"


def _workload(train: TrainConfig, model: ModelSpec, max_sequences: int | None) -> Any:
    """The planner's workload of the run's settings (checkpointing as set, or off while it is searched)."""
    from raydlc import planner

    bf16 = bool(train.use_gpu) if train.bf16 is None else train.bf16
    ceiling = train.max_global_batch if max_sequences is None else min(train.max_global_batch, max_sequences * train.seq_len)
    return planner.Workload(
        model, seq_len=train.seq_len, policy="bf16-mixed" if bf16 else "fp32",
        activation_checkpointing=train.activation_checkpointing or False, max_global_batch=max(ceiling, 1),
        loss_chunk=train.loss_chunk, reduce_dtype="fp32" if train.reduce_dtype == "auto" else train.reduce_dtype,
        compile=planner.planned_compile(train.compile),
    )


def _better(work: Any, layout: Any, chosen: Any) -> str:
    """A warning when what the settings forced is communication-bound and the planner's free choice is faster."""
    from raydlc import planner

    if chosen.bound == "compute":
        return ""
    free = planner.recommend(work, layout, checkpointing=planner.AC_SEARCH).best
    if free is None or free.tokens_per_s <= chosen.tokens_per_s * (1 + planner.DEFAULT_ASSUMPTIONS.tie_fraction):
        return ""
    return (f"; WARNING: the layout the settings force is {chosen.bound}-bound at ~{chosen.tokens_per_s:,.0f} tokens/s; "
            f"the planner's choice, {free.describe()}, plans ~{free.tokens_per_s:,.0f} tokens/s "
            "(leave BATCH_SIZE, GRAD_ACCUM, SHARDING, GRAD_SYNC and ACTIVATION_CHECKPOINTING unset to take it)")


def _checked(d: StepLayout) -> StepLayout:
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


def shard_groups(mesh: Mesh) -> list[list[int]]:
    """The ranks of each shard group: torch's DeviceMesh lays ranks out row-major over the mesh
    shape, so an HSDP mesh (replicas, shard) shards within each run of `shard` consecutive ranks;
    FSDP is one group of every rank."""
    if mesh.sharding == "fsdp":
        return [list(range(mesh.world_size))]
    return [list(range(r * mesh.shard, (r + 1) * mesh.shard)) for r in range(mesh.replicas)]


def check_nodes(mesh: Mesh, nodes: Sequence[str]) -> None:
    """On every worker, before the first step: each rank's node (what the workers reported at mesh
    build, by rank) keeps every HSDP shard group on one node, else its all-gathers and
    reduce-scatters would cross the network: refused, naming the ranks and their nodes. FSDP
    shards over every rank by design and is not judged."""
    if len(nodes) != mesh.world_size:
        raise TrainError(f"{len(nodes)} workers reported their node; the mesh has {mesh.world_size} ranks")
    if mesh.sharding != "hsdp":
        return
    split = []
    for group in shard_groups(mesh):
        where: dict[str, list[int]] = {}
        for r in group:
            where.setdefault(nodes[r], []).append(r)
        if len(where) > 1:
            split.append(f"ranks {group[0]}-{group[-1]} on " + ", ".join(f"{node} (ranks {', '.join(map(str, rs))})" for node, rs in where.items()))
    if split:
        raise TrainError(
            f"HSDP shard group(s) of {mesh.shard} ranks span nodes: " + "; ".join(split),
            hint="Ray did not number the ranks node by node as planned; run again, or use --sharding fsdp",
        )
