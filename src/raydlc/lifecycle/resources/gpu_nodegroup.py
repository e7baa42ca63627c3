"""The GPU node group: EFA GPU nodes in one Availability Zone, the one the capacity resource chose.

`up` creates it with eksctl in `ZoneChoice.zone`; when raydlc chose that zone and the group fails
for capacity (InsufficientInstanceCapacity, …), the failed group is removed and the next ranked
candidate tried, each attempt's error kept for the message. An AZ the user set (GPU_AZ), or the one
an existing group is in, is never left. Done when every GPU node is Ready with its role label.
`down` deletes the group and its stack and is done when no instance of it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raydlc.edges import kube as k8s
from raydlc.edges.tools import ToolFailed
from raydlc.lifecycle import cloud, commands, nodegroups
from raydlc.lifecycle.resource import Resource, cluster_active, gone, kube_if_cluster, no_cluster, no_kubeconfig, ready_nodes
from raydlc.lifecycle.types import Observation, StepFailed, StepPlan
from raydlc.render import FILES, eksctl
from raydlc.render.autoscaler import enabled as elastic
from raydlc.render.autoscaler import fallback_group, two_groups
from raydlc.render.nodes import GPU_ROLE, ROLE

if TYPE_CHECKING:
    from raydlc.capacity.choice import ZoneChoice
    from raydlc.config import Config
    from raydlc.lifecycle.context import Context


def wanted_nodes(cfg: Config, ng: dict[str, Any]) -> int:
    """GPU nodes `up` waits for: GPU_NODE_COUNT, or with IDLE_MINUTES > 0 the node group's desired size now (the
    Cluster Autoscaler's to set: 0 while idle, GPU_NODE_COUNT once when the group is created so `up` sees the GPUs)."""
    if not elastic(cfg):
        return cfg.gpu_nodes.count
    return min(int((ng.get("scalingConfig") or {}).get("desiredSize") or 0), cfg.gpu_nodes.count)


def attempts(cfg: Config, choice: ZoneChoice, tried: list[str]) -> list[tuple[str, bool]]:
    """(AZ, Spot?) in the order `up` tries them: each AZ raydlc may use (only the first unless raydlc chose it),
    Spot or on-demand as GPU_CAPACITY_TYPE says; spot-then-on-demand tries Spot in each, then on-demand in each."""
    zones = [z for z in (choice.candidates or (choice.zone,)) if z and z not in tried]
    if not choice.chosen:
        zones = zones[:1]
    kind = cfg.gpu_nodes.capacity_type
    if kind == "spot-then-on-demand" and choice.spot_quota_short:
        return [(z, False) for z in zones]  # the Spot vCPU quota cannot hold the nodes: EC2 would refuse every launch
    if kind == "spot-then-on-demand":
        return [(z, True) for z in zones] + [(z, False) for z in zones]
    return [(z, kind == "spot") for z in zones]


def _names(cfg: Config) -> list[str]:
    """The GPU node groups: the one, or the Spot one and its On-Demand twin."""
    return [cfg.gpu_nodes.nodegroup_name, *([fallback_group(cfg)] if two_groups(cfg) else [])]


def _scaling(cfg: Config) -> str:
    g = cfg.gpu_nodes
    return f" (scales 0..{g.count}; idle nodes leave after {g.idle_minutes} min)" if elastic(cfg) else ""


class GpuNodeGroup(Resource):
    name = "gpu-nodegroup"
    scope = "aws"
    fact = "the GPU nodes"
    summary = "EFA GPU node group in one AZ"
    removal = "the EFA GPU node group"
    tools = ("eksctl",)

    def found(self, ctx: Context) -> Observation:
        from raydlc.lifecycle import attach

        return attach.found_gpu_nodes(ctx)

    def __init__(self, zones: Callable[[Context], ZoneChoice]) -> None:
        self.zones = zones  # the capacity resource's decision: where to go, and where next

    # ------------------------------------------------------------------ up

    def look(self, ctx: Context) -> Observation:
        cfg = ctx.cfg
        ngname = cfg.gpu_nodes.nodegroup_name
        if cluster_active(ctx) is None:
            return no_cluster(ctx)
        ng = nodegroups.describe(ctx, ngname)
        if ng is None:
            st = nodegroups.stack(ctx, ngname)
            if st is not None and st.get("StackStatus") != "CREATE_IN_PROGRESS":
                return Observation("absent", f"stale stack {st['StackName']} ({st['StackStatus']}) blocks the node group",
                                   {"stale_stack": st["StackName"]})
            if st is not None:
                return Observation("creating", f"stack {st['StackName']} is CREATE_IN_PROGRESS")
            return Observation("absent", f"node group {ngname} does not exist")
        status = ng.get("status")
        if status in nodegroups.FAILED:
            err = nodegroups.launch_error(ctx, ng)
            return Observation("degraded", f"node group {ngname} is {status}" + (f": {err}" if err else ""), {"failed": True})
        if status in nodegroups.BUSY:
            return Observation("creating", f"node group {ngname} is {status}")
        if status == "DELETING":
            return Observation("deleting", f"node group {ngname} is DELETING")
        if two_groups(cfg) and status == "ACTIVE":
            twin = nodegroups.describe(ctx, fallback_group(cfg))
            if twin is None or twin.get("status") != "ACTIVE":
                return Observation("absent", f"the On-Demand group {fallback_group(cfg)} the Cluster Autoscaler falls back to "
                                             f"is {twin.get('status') if twin else 'absent'}")
        kube = ctx.kube_or_none()
        if kube is None:
            return no_kubeconfig(ctx)
        want = wanted_nodes(cfg, ng)
        ready = ready_nodes(kube, GPU_ROLE)
        if len(ready) < want:
            return Observation("creating", f"{len(ready)}/{want} GPU nodes Ready")
        return Observation("ready", f"{len(ready)} × {cfg.gpu_nodes.instance_type} Ready{_scaling(cfg)}")

    def plan_up(self, ctx: Context, obs: Observation) -> StepPlan:
        ngname = ctx.cfg.gpu_nodes.nodegroup_name
        if obs.state == "ready":
            return StepPlan("none", obs.reason)
        if obs.state in ("creating", "unknown") and not obs.facts:
            return StepPlan("wait", obs.reason, (f"eks:DescribeNodegroup {ngname} until ACTIVE; nodes role={GPU_ROLE} Ready",))
        cmds: list[str] = []
        if obs.facts.get("failed") or obs.state == "deleting":
            cmds.append(str(commands.delete_nodegroup(ctx, ngname)))
        if obs.facts.get("stale_stack"):
            cmds.append(f"cloudformation:DeleteStack {obs.facts['stale_stack']}")
        choice = self.zones(ctx)
        where = f" in {choice.zone}" if choice.zone else ""
        cmds += [f"write {ctx.path_of(FILES['eksctl'])} (GPU node group{where})", str(commands.create_nodegroup(ctx, ngname))]
        plan = attempts(ctx.cfg, choice, [])
        if len(plan) > 1:
            nxt = ", ".join(f"{z}{' (Spot)' if spot else ' (On-Demand)' if eksctl.spot(ctx.cfg) else ''}" for z, spot in plan[1:])
            cmds.append(f"on a capacity failure: delete it and retry in {nxt}")
        return StepPlan("replace" if obs.facts else "create", obs.reason, tuple(cmds))

    def ensure(self, ctx: Context, obs: Observation) -> None:
        self._ensure_main(ctx)
        if two_groups(ctx.cfg):
            self._ensure_twin(ctx)

    def _ensure_twin(self, ctx: Context) -> None:
        """The On-Demand group at 0 beside the Spot one, in its AZ: the Cluster Autoscaler's fallback (priority
        expander) when the Spot group cannot launch (raydlc.render.autoscaler)."""
        cfg, twin = ctx.cfg, fallback_group(ctx.cfg)
        ng = nodegroups.describe(ctx, twin)
        if ng is not None and ng.get("status") in nodegroups.BUSY:
            ng = nodegroups.wait_settled(ctx, self.name, twin)
        if ng is not None and ng.get("status") == "ACTIVE":
            return
        nodegroups.remove(ctx, self.name, twin)
        main = nodegroups.describe(ctx, cfg.gpu_nodes.nodegroup_name) or {}
        az = nodegroups.zone_of(ctx, main) or self.zones(ctx).zone
        docs = ctx.documents("eksctl", self.zones(ctx).zones_for(az) if az else ())
        ctx.write({FILES["eksctl"]: docs[FILES["eksctl"]]})
        ctx.tool(self.name, commands.create_nodegroup(ctx, twin), timeout=ctx.timings.nodegroup_s)
        nodegroups.wait_active(ctx, self.name, twin)
        ctx.note(self.name, f"On-Demand group {twin} (0 nodes) beside the Spot one: the Cluster Autoscaler's fallback")

    def _ensure_main(self, ctx: Context) -> None:
        ngname = ctx.cfg.gpu_nodes.nodegroup_name
        choice = self.zones(ctx)
        ng = nodegroups.describe(ctx, ngname)
        if ng is not None and ng.get("status") in nodegroups.BUSY:
            ng = nodegroups.wait_settled(ctx, self.name, ngname)
        if ng is not None and ng.get("status") == "ACTIVE":
            return
        tried: list[str] = []
        if ng is not None and ng.get("status") in nodegroups.FAILED:
            err = nodegroups.launch_error(ctx, ng)
            az = nodegroups.zone_of(ctx, ng)
            ctx.reporter.line(self.name, f"node group {ngname} is {ng.get('status')} in {az}: {err}; deleting it")
            nodegroups.remove(ctx, self.name, ngname)
            if az and cloud.is_capacity_error(err) and choice.chosen:
                tried.append(az)
        else:
            nodegroups.remove(ctx, self.name, ngname)
        self._create(ctx, choice, tried)

    def _create(self, ctx: Context, choice: ZoneChoice, tried: list[str]) -> None:
        """Create the group in the first attempt not yet tried; on a capacity failure, the next (another AZ raydlc
        chose, or under spot-then-on-demand an on-demand group once Spot had no capacity in any of them)."""
        ngname = ctx.cfg.gpu_nodes.nodegroup_name
        errors: list[str] = [f"{z}: a failed node group found there" for z in tried]
        plan = attempts(ctx.cfg, choice, tried)
        if choice.spot_quota_short and plan:
            ctx.reporter.line(self.name, "the Spot vCPU quota cannot hold the GPU nodes; On-Demand instead (spot-then-on-demand)")
        spot_quota_hit = False
        for i, (az, spot) in enumerate(plan):
            if spot and spot_quota_hit:
                continue  # the Spot quota is the region's: no other AZ's Spot launch can pass it
            kind = "Spot" if spot else "On-Demand"
            if i > 0 and not spot and plan[i - 1][1]:
                ctx.reporter.line(self.name, f"no Spot capacity; falling back to On-Demand: trying {az}")
            elif i > 0 or tried:
                ctx.reporter.line(self.name, f"trying the next ranked AZ: {az}")
            docs = ctx.documents("eksctl", choice.zones_for(az), cfg=None if spot == eksctl.spot(ctx.cfg) else eksctl.on_demand(ctx.cfg))
            ctx.write({FILES["eksctl"]: docs[FILES["eksctl"]]})
            tool_error = ""
            try:
                ctx.tool(self.name, commands.create_nodegroup(ctx, ngname), timeout=ctx.timings.nodegroup_s)
            except ToolFailed as e:
                tool_error = e.message
            ng = nodegroups.wait_settled(ctx, self.name, ngname)
            if ng is not None and ng.get("status") == "ACTIVE":
                if errors:
                    ctx.note(self.name, f"came up {kind} in {az} after: {'; '.join(errors)}")
                return
            err = self._failure(ctx, ng, tool_error)
            errors.append(f"{az}{f' ({kind})' if eksctl.spot(ctx.cfg) else ''}: {err}")
            nodegroups.remove(ctx, self.name, ngname)
            if spot and cloud.is_spot_quota_error(err):
                if ctx.cfg.gpu_nodes.capacity_type != "spot-then-on-demand":
                    break  # the Spot quota is the region's: no other AZ's Spot launch can pass it
                spot_quota_hit = True
                continue
            if not cloud.is_capacity_error(err):
                break
        hint = ("run `raydlc capacity` and set GPU_AZ to a zone that has capacity, or retry later"
                if any(cloud.is_capacity_error(e) for e in errors) else "see the error above; re-run `raydlc up` once fixed")
        if any(cloud.is_spot_quota_error(e) for e in errors) and ctx.cfg.gpu_nodes.capacity_type == "spot":
            hint = ("the account's Spot vCPU quota for this instance family is below the GPU nodes' vCPUs: request more "
                    "(`raydlc capacity` names the quota code), or GPU_CAPACITY_TYPE=spot-then-on-demand falls back to "
                    "On-Demand nodes")
        elif ctx.cfg.gpu_nodes.capacity_type == "spot" and any(cloud.is_capacity_error(e) for e in errors):
            hint += "; GPU_CAPACITY_TYPE=spot-then-on-demand falls back to On-Demand nodes"
        raise StepFailed(f"GPU node group {ngname} could not be created: {' | '.join(errors)}", hint=hint)

    def _failure(self, ctx: Context, ng: dict[str, Any] | None, tool_error: str) -> str:
        """Why a create did not end ACTIVE: the launch error, the stack's failed resource, or eksctl's message."""
        if ng is not None:
            return nodegroups.launch_error(ctx, ng) or tool_error
        st = nodegroups.stack(ctx, ctx.cfg.gpu_nodes.nodegroup_name)
        why = cloud.stack_failure(ctx.aws("cloudformation"), st["StackName"]) if st else ""
        return why or tool_error or "no node group was created"

    def kept(self, ctx: Context) -> str:
        cfg = ctx.cfg
        ng = nodegroups.describe(ctx, cfg.gpu_nodes.nodegroup_name)
        if ng is None or ng.get("status") != "ACTIVE":
            raise StepFailed(f"node group {cfg.gpu_nodes.nodegroup_name} is {ng.get('status') if ng else 'absent'}")
        kube = ctx.kube()
        want = wanted_nodes(cfg, ng)
        ready = ctx.wait(self.name, lambda: ready_nodes(kube, GPU_ROLE), lambda ns: len(ns) >= want,
                         timeout=ctx.timings.nodes_s, what=f"{want} GPU nodes Ready with {ROLE}={GPU_ROLE}",
                         explain=lambda ns: f"{len(ns)}/{want} Ready")
        spot = ", Spot capacity" if ng.get("capacityType") == "SPOT" else ""
        return f"{len(ready)} × {cfg.gpu_nodes.instance_type} Ready in {nodegroups.zone_of(ctx, ng) or '?'}{_scaling(cfg)}{spot}"

    # ------------------------------------------------------------------ down

    def left(self, ctx: Context) -> Observation:
        ngname = ctx.cfg.gpu_nodes.nodegroup_name
        twin = fallback_group(ctx.cfg)
        if two_groups(ctx.cfg) and (nodegroups.stack(ctx, twin) or (cloud.cluster(ctx.aws("eks"), ctx.cfg.cluster.name)
                                                                     and nodegroups.describe(ctx, twin))):
            return Observation("ready", f"node group {twin} exists", {"nodegroup": True})
        ng = nodegroups.describe(ctx, ngname) if cloud.cluster(ctx.aws("eks"), ctx.cfg.cluster.name) else None
        st = nodegroups.stack(ctx, ngname)
        if ng is None and st is None:
            return gone(f"node group {ngname} does not exist")
        facts = {"nodegroup": ng is not None, "stack": st["StackName"] if st else None}
        what = f"node group {ngname} is {ng.get('status')}" if ng else f"stack {st['StackName']} is {st['StackStatus']}"  # type: ignore[index]
        return Observation("ready", what, facts)

    def plan_down(self, ctx: Context, obs: Observation) -> StepPlan:
        if obs.state == "absent":
            return StepPlan("none", obs.reason)
        if obs.facts.get("nodegroup"):
            return StepPlan("delete", obs.reason, (str(commands.delete_nodegroup(ctx, ctx.cfg.gpu_nodes.nodegroup_name)),))
        return StepPlan("delete", obs.reason, (f"cloudformation:DeleteStack {obs.facts['stack']}",))

    def remove(self, ctx: Context, obs: Observation) -> None:
        for ngname in _names(ctx.cfg):
            nodegroups.remove(ctx, self.name, ngname, stacks=None)

    def cleared(self, ctx: Context) -> str:
        cfg = ctx.cfg
        name, ngname = cfg.cluster.name, cfg.gpu_nodes.nodegroup_name
        for each in _names(cfg):
            if cloud.cluster(ctx.aws("eks"), name) and nodegroups.describe(ctx, each) is not None:
                raise StepFailed(f"node group {each} still exists")
            if nodegroups.stack(ctx, each) is not None:
                raise StepFailed(f"stack {cloud.nodegroup_stack(name, each)} still exists")
        left = [i["InstanceId"] for i in cloud.instances(ctx.aws("ec2"), name) if cloud.tag(i, "eks:nodegroup-name") in _names(cfg)]
        if left:
            raise StepFailed(f"instances of node group {ngname} still run: {', '.join(left)}",
                             hint=f"aws ec2 terminate-instances --instance-ids {' '.join(left)} --region {cfg.cluster.region}")
        kube = kube_if_cluster(ctx)
        if kube is not None:
            ctx.wait(self.name, lambda: kube.nodes({ROLE: GPU_ROLE}), lambda ns: not ns, timeout=ctx.timings.nodes_s,
                     what="the GPU nodes to leave the cluster", explain=lambda ns: ", ".join(k8s.name_of(n) for n in ns))
        return f"node group {ngname}, its stack and its instances are gone"
