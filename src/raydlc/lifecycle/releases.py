"""What every resource that is one of raydlc's Helm releases shares: install, look, uninstall.

A release is kept when helm reports it deployed with the pinned chart version and exactly the
rendered values, and what it runs is working (each subclass says what that means: a Deployment
Available, a resource allocatable on every node). `down` uninstalls it and is done when its
workload is gone, not when helm says so. A release interrupted mid-install (`pending-*`) is
uninstalled before it is installed again, since helm refuses to upgrade it.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, ClassVar

from raydlc.edges import kube as k8s
from raydlc.lifecycle import commands
from raydlc.lifecycle.resource import Resource, gone, gone_or_unseen, kube_if_cluster, look_inside
from raydlc.lifecycle.types import Observation, StepFailed, StepPlan
from raydlc.render.helm import Release

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.lifecycle.context import Context


class HelmRelease(Resource):
    tools = ("helm",)
    workload: ClassVar[tuple[str, str]]  # (apiVersion, kind) of what the chart runs, named as the release

    @abstractmethod
    def release(self, cfg: Config) -> Release | None:
        """The rendered release; None when there is nothing to install for this config."""

    def working(self, ctx: Context, kube: k8s.Kube) -> Observation | None:
        """Beyond helm's word: what is not working yet (None: all is)."""
        return None

    # ------------------------------------------------------------------ up

    def look(self, ctx: Context) -> Observation:
        kube = look_inside(ctx)
        if isinstance(kube, Observation):
            return kube
        r = self.release(ctx.cfg)
        if r is not None:
            state = commands.release_state(ctx, r)
            if not state.matches(r):
                kind = "absent" if state.status == "absent" else "degraded"
                return Observation(kind, state.describe(r), {"release": state.status})
        found = self.working(ctx, kube)
        if found is not None:
            return found
        return Observation("ready", f"release {r.name} {r.version} deployed" if r is not None else "no release to install")

    def plan_up(self, ctx: Context, obs: Observation) -> StepPlan:
        if obs.state == "ready":
            return StepPlan("none", obs.reason)
        r = self.release(ctx.cfg)
        if r is not None and (obs.facts.get("release") or obs.state in ("absent", "unknown")):
            cmds: list[str] = []
            if str(obs.facts.get("release", "")).startswith("pending"):
                cmds.append(str(commands.uninstall(ctx, r)))
            cmds += [f"write {ctx.path_of(r.filename)}", str(commands.install(ctx, r))]
            return StepPlan("create" if obs.state in ("absent", "unknown") else "repair", obs.reason, tuple(cmds))
        return StepPlan("wait", obs.reason)

    def ensure(self, ctx: Context, obs: Observation) -> None:
        r = self.release(ctx.cfg)
        if r is None or not obs.facts.get("release"):
            return  # installed as rendered: what is left is waiting, which verify does
        status = str(obs.facts["release"])
        if status.startswith("pending") or status == "uninstalling":
            ctx.reporter.line(self.name, f"release {r.name} is {status} (an interrupted helm run); uninstalling it first")
            ctx.tool(self.name, commands.uninstall(ctx, r), timeout=ctx.timings.helm_s)
        docs = ctx.documents("helm")
        ctx.write({r.filename: docs[r.filename]})
        ctx.tool(self.name, commands.install(ctx, r), timeout=ctx.timings.helm_s + 60)

    # ------------------------------------------------------------------ down

    def left(self, ctx: Context) -> Observation:
        r = self.release(ctx.cfg)
        if r is None:
            return gone("no release to remove for this AMI family")
        if kube_if_cluster(ctx) is None:
            return gone_or_unseen(ctx, f"release {r.name}", f"the cluster is gone, and release {r.name} with it")
        state = commands.release_state(ctx, r)
        if state.status == "absent":
            return gone(f"release {r.name} is not installed")
        return Observation("ready", f"release {r.name} is {state.status}")

    def plan_down(self, ctx: Context, obs: Observation) -> StepPlan:
        r = self.release(ctx.cfg)
        if obs.state == "absent" or r is None:
            return StepPlan("none", obs.reason)
        return StepPlan("delete", obs.reason, (str(commands.uninstall(ctx, r)),))

    def remove(self, ctx: Context, obs: Observation) -> None:
        r = self.release(ctx.cfg)
        assert r is not None  # planned "delete" only for a release there is
        ctx.tool(self.name, commands.uninstall(ctx, r), timeout=ctx.timings.helm_s + 60)
        ctx.note(self.name, f"removed release {r.name}")

    def cleared(self, ctx: Context) -> str:
        r = self.release(ctx.cfg)
        if r is None:
            return "nothing to remove"
        kube = kube_if_cluster(ctx)
        if kube is None:
            return f"cluster gone; release {r.name} with it"
        if commands.release_state(ctx, r).status != "absent":
            raise StepFailed(f"release {r.name} is still installed")
        av, kind = self.workload
        ctx.wait(self.name, lambda: kube.get(av, kind, r.name, r.namespace), lambda o: o is None, timeout=ctx.timings.helm_s,
                 what=f"{kind} {r.name} to be gone")
        return f"release {r.name} and its {kind} gone"
