"""`up`, `down` and `status`: two dependency orders over the same resources, and a question to each.

    up:    capacity ─► cluster ─┬─► gpu-nodegroup ─┬─► device-plugins ─┬─► raycluster
                                │                  └─► autoscaler       │
                                └─► kuberay ────────────────────────────┤
           storage ─────────────────────────────────────────────────────┘
    down:  the same graph with every arrow reversed: what `up` made last goes first.

`resources()` is the one place that says which resources there are, what each needs, and which
decision one hands to another (the capacity resource's ZoneChoice goes to the cluster and the
GPU node group). Adding a resource is one module under `resources/` and one line there.

Attached (ATTACH), the graph is the same; each resource that does not live in the namespace enters it as found
(`raydlc.lifecycle.resource.Found`): read as a fact, never planned for creation, left by `down`. Before any step an
attached `up` reaches the API, asks Kubernetes whether every call it will make is allowed, and reads the platform
(`raydlc.lifecycle.attach`), so what cannot work is said once, before anything is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from raydlc.errors import InputError
from raydlc.lifecycle.context import Context, Timings
from raydlc.lifecycle.resource import Resource, owned_or_found
from raydlc.lifecycle.resources.autoscaler import ClusterAutoscaler
from raydlc.lifecycle.resources.bucket import Storage
from raydlc.lifecycle.resources.capacity import Capacity
from raydlc.lifecycle.resources.cluster import Cluster, refuse_foreign
from raydlc.lifecycle.resources.device_plugins import DevicePlugins
from raydlc.lifecycle.resources.gpu_nodegroup import GpuNodeGroup
from raydlc.lifecycle.resources.kuberay import KubeRay
from raydlc.lifecycle.resources.raycluster import RayCluster
from raydlc.lifecycle.steps import Step, order, plan_all, run_all, select
from raydlc.lifecycle.types import Goal, Reporter, Run
from raydlc.render.autoscaler import enabled as elastic

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.edges.tools import Runner
    from raydlc.lifecycle.cluster_status import ClusterStatus

Graph = list[tuple[Resource, tuple[str, ...]]]


def resources(*, delete_storage: bool = False, autoscaling: bool = True, attach: bool = False) -> Graph:
    """A fresh set of one run's resources with what each needs, in up's order (a run's decisions are its own).

    The RayCluster needs the bucket its pods write to; `down` so empties a bucket only after the
    pods that write it are gone (and keeps it unless `delete_storage`). Without `autoscaling`
    (IDLE_MINUTES=0) there is no Cluster Autoscaler step: today's fixed-size cluster, step for step.
    `attach`: what raydlc does not make in that mode is found (`Resource.made_when`), with the same needs.
    """
    capacity = Capacity()
    graph: Graph = [
        (capacity, ()),
        (Storage(delete=delete_storage), ()),
        (Cluster(zones=capacity.choice), ("capacity",)),
        (GpuNodeGroup(zones=capacity.choice), ("cluster",)),
        (KubeRay(), ("cluster",)),
        (DevicePlugins(), ("gpu-nodegroup",)),
        (RayCluster(), ("device-plugins", "kuberay", "storage")),
        (ClusterAutoscaler(), ("gpu-nodegroup",)),
    ]
    graph = graph if autoscaling else [(r, n) for r, n in graph if not isinstance(r, ClusterAutoscaler)]
    return [(owned_or_found(r, attach), n) for r, n in graph]


def steps(goal: Goal, graph: Graph | None = None) -> list[Step]:
    """The resources as the scheduler's steps for one command; for `down` every need is reversed."""
    graph = resources() if graph is None else graph
    if goal == "up":
        needs = {r.name: n for r, n in graph}
    else:
        needs = {r.name: tuple(o.name for o, n in graph if r.name in n) for r, _ in graph}
        graph = graph[::-1]
    return [Step(r.name, needs[r.name], r.summary if goal == "up" else r.removal, partial(r.check, goal=goal),
                 partial(r.plan, goal=goal), r.ensure if goal == "up" else r.remove, partial(r.verify, goal=goal))
            for r, _ in graph]


def names(goal: Goal) -> list[str]:
    """The steps of `up` or `down` in the order they are shown."""
    return [s.name for s in order(steps(goal))]


def _context(cfg: Config, *, dry_run: bool, force: bool, reporter: Reporter | None, timings: Timings | None,
             runner: Runner | None, yes: bool = False) -> Context:
    from raydlc.edges import aws
    from raydlc.edges.tools import Runner
    from raydlc.render.bucket import for_cluster

    region = cfg.cluster.region
    cfg = for_cluster(cfg, lambda: aws.account_id(region))  # attached, only an s3:// STORAGE_PATH names a bucket
    return Context(cfg, runner=runner or Runner(dry_run=dry_run), reporter=reporter, timings=timings, force=force,
                   dry_run=dry_run, yes=yes)


def _require_tools(ctx: Context, graph: Graph, selected: Sequence[str]) -> None:
    """Every tool the selected steps may run, checked before anything changes."""
    for tool in sorted({t for r, _ in graph if r.name in selected for t in r.tools}):
        ctx.runner.require(tool)


def _refuse_zone(ctx: Context, graph: Graph, selected: Sequence[str]) -> None:
    """A GPU_AZ that EKS can never put the cluster in is the user's to change: refused before any step runs."""
    if not ctx.cfg.gpu_nodes.az or not {Capacity.name, Cluster.name, GpuNodeGroup.name} & set(selected):
        return
    capacity = next(r for r, _ in graph if isinstance(r, Capacity))
    choice = capacity.choice(ctx)
    if choice.refused:
        raise InputError(choice.reason, hint=choice.hint)


def _refuse_system_node(cfg: Config) -> None:
    """A system node that cannot hold the head beside the operator, the add-ons, the submitter and a probe pod
    leaves one of them Pending: refused (InputError naming SYSTEM_NODE_TYPE) before anything is asked or made."""
    from raydlc.render import autoscaler, sizing

    sizing.head_size(cfg.system_nodes.instance_type, cfg.total_gpus, autoscaler.enabled(cfg))


def _check_permissions(ctx: Context, selected: Sequence[str], order: str = "up") -> None:
    """The caller may do what the selected steps will ask of AWS (IAM's policy simulator): else one InputError naming
    every missing action, before anything is made or deleted (raydlc.lifecycle.permissions)."""
    from raydlc.lifecycle import permissions

    step = "capacity" if order == "up" else "cluster"
    permissions.check(ctx.aws_session(), ctx.cfg, selected, lambda text: ctx.reporter.line(step, text), order)


def _check_token(ctx: Context) -> None:
    """The cluster will authenticate raydlc by an STS-signed token: one STS refuses stops `up` before it bills."""
    from raydlc.edges import eks_token

    who = eks_token.check(ctx.aws_session(), ctx.cfg.cluster.name)
    ctx.reporter.line("capacity", f"STS accepts an EKS token signed as {who}")


def up(
    cfg: Config, *, only: str | None = None, from_: str | None = None, until: str | None = None,
    dry_run: bool = False, force: bool = False, reporter: Reporter | None = None, timings: Timings | None = None,
    runner: Runner | None = None, yes: bool = False,
) -> Run:
    graph = resources(autoscaling=elastic(cfg), attach=cfg.cluster.attach)
    plan = steps("up", graph)
    selected = select(plan, only=only, from_=from_, until=until)  # a bad step name is refused before AWS is asked
    _refuse_system_node(cfg)
    ctx = _context(cfg, dry_run=dry_run, force=force, reporter=reporter, timings=timings, runner=runner, yes=yes)
    if ctx.attach:
        from raydlc.lifecycle import attach

        attach.prepare(ctx)  # no AWS write, no cluster-scope write: reach, permissions, the platform's facts
        return Run("up", dry_run, plan_all(plan, ctx, selected) if dry_run else run_all(plan, ctx, selected), ctx.notes)
    if dry_run:
        return Run("up", True, plan_all(plan, ctx, selected))
    ctx.aws("eks")  # no usable credentials or an unknown region: stop here, before any step
    _check_token(ctx)  # credentials STS refuses: said as such, before the permission check asks STS who the caller is
    _check_permissions(ctx, selected)
    _require_tools(ctx, graph, selected)
    _refuse_zone(ctx, graph, selected)
    return Run("up", False, run_all(plan, ctx, selected), ctx.notes)


def down(
    cfg: Config, *, keep_cluster: bool = False, delete_storage: bool = False, dry_run: bool = False, force: bool = False,
    reporter: Reporter | None = None, timings: Timings | None = None, runner: Runner | None = None,
) -> Run:
    ctx = _context(cfg, dry_run=dry_run, force=force, reporter=reporter, timings=timings, runner=runner)
    ctx.keeps_cluster = keep_cluster
    if not ctx.attach:  # attached, the cluster is the platform's: down never offers to delete it
        refuse_foreign(ctx)
    else:
        from raydlc.lifecycle import attach

        attach.reach(ctx)
    graph = resources(delete_storage=delete_storage, autoscaling=elastic(cfg), attach=ctx.attach)
    plan = steps("down", graph)
    selected = [s.name for s in order(plan) if not (keep_cluster and s.name == Cluster.name)]
    if dry_run:
        return Run("down", True, plan_all(plan, ctx, selected))
    _check_permissions(ctx, [s for s in selected if delete_storage or s != Storage.name], "down")  # a kept bucket needs nothing
    _require_tools(ctx, graph, selected)
    return Run("down", False, run_all(plan, ctx, selected), ctx.notes)


def status(cfg: Config, *, timings: Timings | None = None, runner: Runner | None = None) -> ClusterStatus:
    from raydlc.lifecycle.cluster_status import report

    ctx = _context(cfg, dry_run=True, force=False, reporter=None, timings=timings, runner=runner)
    graph = resources(autoscaling=elastic(cfg), attach=ctx.attach)
    by_name = {r.name: r for r, _ in graph}
    return report(ctx, [by_name[s.name] for s in order(steps("up", graph))])
