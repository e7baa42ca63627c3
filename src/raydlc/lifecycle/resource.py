"""What a resource of the lifecycle is: one class that knows how to look at, make, remove and report one thing.

`up` and `down` are two orders over the same resources (`raydlc.lifecycle.orders`); a step is one
resource in the direction of one command. Each resource answers six questions:

- `check(ctx, goal)`: how the world stands for that goal (for `up`: is the promise kept; for
  `down`: what of it is left). Reads only, so dry runs and `status` can ask.
- `plan(ctx, obs, goal)`: what would be done about it, with the exact commands.
- `ensure(ctx, obs)` (up) and `remove(ctx, obs)` (down): act on the difference.
- `verify(ctx, goal)`: the promise in terms a person cares about; raises StepFailed when broken.
- `status(ctx)`: the row `raydlc status` shows (up's check, a failure to look reported as unknown).

`check`, `plan` and `verify` send each goal to its own method (`look`/`plan_up`/`kept` for up,
`left`/`plan_down`/`cleared` for down), which is what a resource implements.

Ownership is a property of each resource, not a branch in its steps: `scope` says where it lives (AWS, the
cluster, or NAMESPACE). raydlc makes every resource on a cluster it owns; attached to a cluster a platform team
runs (ATTACH), only the namespace's, and each other resource enters the orders as `Found(resource)`: its
`found(ctx)` is read as a fact (with where it came from), nothing is planned for it, and `down` leaves it.

A resource that needs a decision another one makes (the GPU node group needs the zone the capacity
resource chose) receives it as a frozen value through its constructor, never through the Context.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from raydlc.edges import kube as k8s
from raydlc.errors import RaydlcError
from raydlc.lifecycle import cloud
from raydlc.lifecycle.types import Goal, Observation, StepPlan
from raydlc.render.nodes import ROLE

if TYPE_CHECKING:
    from raydlc.lifecycle.context import Context

Scope = Literal["aws", "cluster", "namespace"]


class Resource(ABC):
    name: ClassVar[str]  # the step's name in both orders, `--only`, `--from`, `--until` and `status`
    summary: ClassVar[str]  # what `up` makes
    removal: ClassVar[str]  # what `down` removes
    tools: ClassVar[tuple[str, ...]] = ()  # the programs it runs, checked on PATH before anything changes
    scope: ClassVar[Scope] = "aws"  # where it lives: attached, raydlc makes only what lives in the namespace
    fact: ClassVar[str] = ""  # attached, what of the platform it stands for (`status` shows it as found)

    def made_when(self, attach: bool) -> bool:
        """Whether raydlc makes (and may remove) this resource in the mode a run is in."""
        return not attach or self.scope == "namespace"

    def found(self, ctx: Context) -> Observation:
        """Attached: the resource as the platform has it, a read-only fact; facts["source"] says where it was read."""
        return Observation("unknown", f"{self.fact or self.name}: not read by raydlc")

    def check(self, ctx: Context, goal: Goal) -> Observation:
        return self.look(ctx) if goal == "up" else self.left(ctx)

    def plan(self, ctx: Context, obs: Observation, goal: Goal) -> StepPlan:
        return self.plan_up(ctx, obs) if goal == "up" else self.plan_down(ctx, obs)

    def verify(self, ctx: Context, goal: Goal) -> str:
        return self.kept(ctx) if goal == "up" else self.cleared(ctx)

    # ------------------------------------------------------------------ up

    @abstractmethod
    def look(self, ctx: Context) -> Observation:
        """How far `up`'s promise is kept."""

    @abstractmethod
    def plan_up(self, ctx: Context, obs: Observation) -> StepPlan: ...

    @abstractmethod
    def ensure(self, ctx: Context, obs: Observation) -> None: ...

    @abstractmethod
    def kept(self, ctx: Context) -> str:
        """The promise in a person's terms; StepFailed when it does not hold."""

    # ------------------------------------------------------------------ down

    @abstractmethod
    def left(self, ctx: Context) -> Observation:
        """What of the resource is left to remove (absent: nothing)."""

    @abstractmethod
    def plan_down(self, ctx: Context, obs: Observation) -> StepPlan: ...

    @abstractmethod
    def remove(self, ctx: Context, obs: Observation) -> None: ...

    @abstractmethod
    def cleared(self, ctx: Context) -> str:
        """Nothing of it is left; StepFailed naming what still is."""

    def status(self, ctx: Context) -> Observation:
        try:
            return self.check(ctx, "up")
        except RaydlcError as e:
            return Observation("unknown", e.message)


class Found(Resource):
    """A resource of the platform an attached run reads and never changes: `up` plans nothing for it (its look is
    the fact `found` reads), `down` leaves it as found, `status` shows it in the found column."""

    scope = "cluster"

    def __init__(self, inner: Resource) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.summary = f"read {inner.fact or inner.name} (found, never changed)"  # type: ignore[misc]
        self.removal = f"leave {inner.fact or inner.name} as found"  # type: ignore[misc]

    def made_when(self, attach: bool) -> bool:
        return False

    def found(self, ctx: Context) -> Observation:
        return self.inner.found(ctx)

    def look(self, ctx: Context) -> Observation:
        return self.inner.found(ctx)

    def plan_up(self, ctx: Context, obs: Observation) -> StepPlan:
        return StepPlan("none", f"found: {obs.reason}")

    def ensure(self, ctx: Context, obs: Observation) -> None:  # pragma: no cover - plan_up never acts
        raise AssertionError(f"{self.name} is found, never made")

    def kept(self, ctx: Context) -> str:
        return f"found: {self.inner.found(ctx).reason}"

    def left(self, ctx: Context) -> Observation:
        what = self.inner.fact or self.name
        ctx.note(self.name, f"kept {what} (found, not raydlc's)")
        return Observation("absent", f"{what} is the platform's: left as found")

    def plan_down(self, ctx: Context, obs: Observation) -> StepPlan:
        return StepPlan("none", obs.reason)

    def remove(self, ctx: Context, obs: Observation) -> None:  # pragma: no cover - plan_down never acts
        raise AssertionError(f"{self.name} is found, never removed")

    def cleared(self, ctx: Context) -> str:
        return f"{self.inner.fact or self.name} left as found"

    def status(self, ctx: Context) -> Observation:
        try:
            return self.inner.found(ctx)
        except RaydlcError as e:
            return Observation("unknown", e.message)


def owned_or_found(resource: Resource, attach: bool) -> Resource:
    """The resource as a run in this mode meets it: to make, or found."""
    return resource if resource.made_when(attach) else Found(resource)


# ---------------------------------------------------------------------- what most resources look at first


def cluster_active(ctx: Context) -> dict[str, Any] | None:
    desc = cloud.cluster(ctx.aws("eks"), ctx.cfg.cluster.name)
    return desc if desc is not None and desc.get("status") == "ACTIVE" else None


def no_cluster(ctx: Context) -> Observation:
    return Observation("absent", f"EKS cluster {ctx.cfg.cluster.name} does not exist yet (the cluster step creates it)")


def no_kubeconfig(ctx: Context) -> Observation:
    return Observation("unknown", f"cannot look inside the cluster: no kubeconfig at {ctx.kubeconfig} yet "
                                  "(the cluster step writes it)")


def look_inside(ctx: Context) -> k8s.Kube | Observation:
    """The cluster's API to look inside, or why `up` cannot look yet (no cluster, no kubeconfig); attached, the
    API the kubeconfig context reaches (the attach preflight has already checked that it answers)."""
    if ctx.attach:
        return ctx.kube()
    if cluster_active(ctx) is None:
        return no_cluster(ctx)
    kube = ctx.kube_or_none()
    return no_kubeconfig(ctx) if kube is None else kube


def gone(what: str) -> Observation:
    return Observation("absent", what)


def kube_if_cluster(ctx: Context) -> k8s.Kube | None:
    """The API when the cluster still exists and raydlc's kubeconfig reaches it; else None (down's look).
    Attached, the cluster is the platform's and always stays: the API when it answers."""
    if ctx.attach:
        kube = ctx.kube_or_none()
        return kube if kube is not None and reaches(kube) else None
    desc = cloud.cluster(ctx.aws("eks"), ctx.cfg.cluster.name)
    if desc is None or desc.get("status") not in ("ACTIVE", "UPDATING"):
        return None
    kube = ctx.kube_or_none()
    if kube is None or not reaches(kube):
        return None
    return kube


def api_unreachable(ctx: Context) -> str | None:
    """Why `down` cannot look inside a cluster that is still there (ACTIVE or UPDATING): no kubeconfig, or an API
    server that does not answer through it; None when the cluster is gone or its API answers."""
    name = ctx.cfg.cluster.name
    if ctx.attach:
        kube = ctx.kube_or_none()
        return None if kube is not None and reaches(kube) else f"the API of the attached cluster does not answer through {ctx.where}"
    desc = cloud.cluster(ctx.aws("eks"), name)
    if desc is None or desc.get("status") not in ("ACTIVE", "UPDATING"):
        return None
    kube = ctx.kube_or_none()
    if kube is None:
        return f"EKS cluster {name} is {desc['status']}, but there is no kubeconfig at {ctx.kubeconfig} to look inside it"
    if not reaches(kube):
        return f"EKS cluster {name} is {desc['status']}, but its API server does not answer through {ctx.kubeconfig}"
    return None


def gone_or_unseen(ctx: Context, what: str, gone_reason: str) -> Observation:
    """Down's look when the API is not there: `what` is gone with a gone cluster. Beside a cluster that is still
    there but cannot be looked into, it goes when this `down` deletes the cluster, and with `--keep-cluster` it
    is unknown: still to remove, as far as anyone can tell."""
    why = api_unreachable(ctx)
    if why is None:
        return gone(gone_reason)
    if not ctx.keeps_cluster and not ctx.attach:  # an attached cluster never goes with raydlc's down
        return gone(f"{why}: {what} goes when the cluster is deleted")
    return Observation("unknown", f"{why}: {what} may still be there")


def reaches(kube: k8s.Kube) -> bool:
    try:
        kube.version()
    except Exception:
        return False
    return True


def ready_nodes(kube: k8s.Kube, role: str) -> list[dict[str, Any]]:
    return [n for n in kube.nodes({ROLE: role}) if k8s.node_ready(n)]
