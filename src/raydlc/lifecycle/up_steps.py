"""`raydlc up`: six steps from an empty account to a RayCluster whose GPUs and EFA are allocatable.

    capacity ─► cluster ─┬─► gpu-nodegroup ─► device-plugins ─┬─► raycluster
                         └─► kuberay ─────────────────────────┘

Each step checks the world, acts only on the difference, and verifies its promise in terms a
person cares about: not "helm said deployed" but "every GPU node advertises 4 GPUs and an EFA
interface"; not "the RayCluster was accepted" but "the head is Ready and every worker Running".
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import Any

from raydlc import kube as k8s
from raydlc.errors import InputError
from raydlc.lifecycle import cloud, commands
from raydlc.lifecycle.context import Context
from raydlc.lifecycle.steps import Observation, Plan, Step, StepFailed
from raydlc.render import FILES
from raydlc.render import helm as helm_render
from raydlc.render.eksctl import OWNER_TAG
from raydlc.render.nodes import EFA_RESOURCE, GPU_RESOURCE, GPU_ROLE, ROLE, SYSTEM_ROLE
from raydlc.render.raycluster import SECRET_KEYS, SECRET_NAME
from raydlc.tools import ToolFailed

EFA_DAEMONSET = "aws-efa-k8s-device-plugin-daemonset"  # eksctl's, in kube-system
MANAGED_BY = {"app.kubernetes.io/managed-by": "raydlc"}
NG_FAILED = ("CREATE_FAILED", "DEGRADED", "DELETE_FAILED")
NG_BUSY = ("CREATING", "UPDATING")


def _eks(ctx: Context) -> Any:
    return ctx.aws("eks")


def _cfn(ctx: Context) -> Any:
    return ctx.aws("cloudformation")


def _cluster_active(ctx: Context) -> dict[str, Any] | None:
    desc = cloud.cluster(_eks(ctx), ctx.cfg.cluster.name)
    return desc if desc is not None and desc.get("status") == "ACTIVE" else None


def _no_cluster(ctx: Context) -> Observation:
    return Observation("absent", f"EKS cluster {ctx.cfg.cluster.name} does not exist yet (the cluster step creates it)")


def _no_kubeconfig(ctx: Context) -> Observation:
    return Observation("unknown", f"cannot look inside the cluster: no kubeconfig at {ctx.kubeconfig} yet "
                                  "(the cluster step writes it)")


def _ready_nodes(kube: k8s.Kube, role: str) -> list[dict[str, Any]]:
    return [n for n in kube.nodes({ROLE: role}) if k8s.node_ready(n)]


def _delete_stack(ctx: Context, step: str, name: str) -> None:
    """Delete a stack that blocks a create (ROLLBACK_COMPLETE, DELETE_FAILED, …) and wait until it is gone."""
    from raydlc import aws

    cfn = _cfn(ctx)
    ctx.reporter.line(step, f"deleting stale stack {name}")
    aws.call(cfn, "delete_stack", StackName=name)
    last = ctx.wait(step, lambda: cloud.stack(cfn, name), lambda s: s is None or s.get("StackStatus") == "DELETE_FAILED",
                    timeout=ctx.timings.stack_s, what=f"stack {name} to be deleted")
    if last is not None:
        why = cloud.stack_failure(cfn, name)
        raise StepFailed(
            f"stack {name} could not be deleted (DELETE_FAILED{': ' + why if why else ''})",
            hint=f"remove what it names, then `aws cloudformation delete-stack --stack-name {name} --region {ctx.cfg.cluster.region}`",
        )


# ---------------------------------------------------------------------- capacity


def decide_zones(ctx: Context) -> None:
    """The GPU AZ: the existing node group's, else GPU_AZ, else capacity discovery's best; once per run."""
    with ctx._lock:
        if ctx.zones is not None or ctx.capacity is not None:
            return
        cfg = ctx.cfg
        ng = None
        desc = cloud.cluster(_eks(ctx), cfg.cluster.name)
        if desc is not None:
            ng = cloud.nodegroup(_eks(ctx), cfg.cluster.name, cfg.gpu_nodes.nodegroup_name)
        if ng is not None and ng.get("status") not in NG_FAILED:
            zones = cloud.subnet_zones(ctx.aws("ec2"), ng.get("subnets") or [])
            az = sorted(set(zones.values()))[0] if zones else None
            cluster_zones = cloud.subnet_zones(ctx.aws("ec2"), (desc or {}).get("resourcesVpcConfig", {}).get("subnetIds") or [])
            if az is not None:
                ctx.gpu_az, ctx.az_chosen = az, False
                ctx.zones = [az] + sorted(set(cluster_zones.values()) - {az})
                ctx.candidates = [az]
                ctx.capacity_reason = f"{az}: the AZ of the existing node group {cfg.gpu_nodes.nodegroup_name}"
                return
        from raydlc import capacity

        report = capacity.discover(cfg)
        ctx.capacity = report
        usable = [z for z in report.zones if z.offered and z.verdict in ("ready", "unknown")]
        if report.cluster is not None:  # an existing VPC has subnets only where it has them
            usable = [z for z in usable if z.zone in report.cluster.private_zones] or usable
        others = [z.zone for z in report.zones if z not in usable]
        if cfg.gpu_nodes.az:
            az = cfg.gpu_nodes.az
            zone = next((z for z in report.zones if z.zone == az), None)
            ctx.az_chosen = False
            if zone is not None and zone.verdict in ("not-offered", "quota-short"):
                ctx.capacity_reason = f"GPU_AZ {az} ({cfg.origin('GPU_AZ')}) is {zone.verdict}: {zone.reason}"
                return
            ctx.gpu_az = az
            ctx.candidates = [az]
            ctx.capacity_reason = f"{az}: set by GPU_AZ ({cfg.origin('GPU_AZ')})" + (f"; {zone.verdict}: {zone.reason}" if zone else "")
        else:
            if not usable:
                why = report.zones[0].reason if report.zones else "no Availability Zone could be read"
                ctx.capacity_reason = f"no AZ of {cfg.cluster.region} can take {cfg.gpu_nodes.count} × {cfg.gpu_nodes.instance_type}: {why}"
                return
            ctx.gpu_az, ctx.az_chosen = usable[0].zone, True
            ctx.candidates = [z.zone for z in usable]
            ctx.capacity_reason = f"{usable[0].zone}: {usable[0].verdict} ({usable[0].reason})"
        rest = [z.zone for z in usable if z.zone != ctx.gpu_az] + others
        ctx.zones = [ctx.gpu_az, *[z for z in rest if z != ctx.gpu_az]]


def _capacity_check(ctx: Context) -> Observation:
    decide_zones(ctx)
    if ctx.gpu_az is None:
        return Observation("degraded", ctx.capacity_reason)
    return Observation("ready", ctx.capacity_reason)


def _capacity_plan(ctx: Context, obs: Observation) -> Plan:
    cmd = ("raydlc capacity (reads: ec2:DescribeInstanceTypeOfferings, ec2:DescribeInstanceTypes, "
           "servicequotas:GetServiceQuota, ec2:GetSpotPlacementScores, eks:DescribeCluster)")
    if obs.state != "ready":
        return Plan("blocked", obs.reason, (cmd,))
    return Plan("none", obs.reason, (cmd,))


def _capacity_act(ctx: Context, obs: Observation) -> None:
    hint = None
    if ctx.capacity is not None and ctx.capacity.quota_request is not None:
        hint = ctx.capacity.quota_request.command
    raise StepFailed(obs.reason, hint=hint or "choose another REGION or GPU_NODE_TYPE (`raydlc capacity` shows each AZ)")


def _capacity_verify(ctx: Context) -> str:
    decide_zones(ctx)
    if ctx.gpu_az is None:
        raise StepFailed(ctx.capacity_reason)
    return ctx.capacity_reason


# ---------------------------------------------------------------------- cluster


def _cluster_check(ctx: Context) -> Observation:
    cfg = ctx.cfg
    name = cfg.cluster.name
    stack_name = cloud.cluster_stack(name)
    desc = cloud.cluster(_eks(ctx), name)
    if desc is None:
        st = cloud.stack(_cfn(ctx), stack_name)
        if st is None:
            return Observation("absent", f"no EKS cluster {name} in {cfg.cluster.region}")
        status = st["StackStatus"]
        if status == "DELETE_IN_PROGRESS":
            return Observation("deleting", f"stack {stack_name} is DELETE_IN_PROGRESS", {"stack_deleting": True})
        if status == "CREATE_IN_PROGRESS":
            return Observation("creating", f"stack {stack_name} is CREATE_IN_PROGRESS (a create is under way)")
        return Observation("absent", f"stale stack {stack_name} ({status}) from an earlier attempt blocks a new create",
                           {"stale_stack": stack_name})
    status = desc.get("status")
    if not cloud.owned(desc, name) and not ctx.force:
        return Observation("degraded", f"EKS cluster {name} exists but was not created by raydlc (no {OWNER_TAG} tag)",
                           {"foreign": True})
    if status in ("CREATING", "UPDATING", "PENDING"):
        return Observation("creating", f"EKS cluster {name} is {status}")
    if status == "DELETING":
        return Observation("deleting", f"EKS cluster {name} is DELETING")
    if status == "FAILED":
        return Observation("degraded", f"EKS cluster {name} is FAILED", {"failed": True})
    facts: dict[str, Any] = {}
    missing: list[str] = []
    sysname = cfg.system_nodes.nodegroup_name
    sysng = cloud.nodegroup(_eks(ctx), name, sysname)
    if sysng is None:
        missing.append(f"system node group {sysname} does not exist")
        facts["system"] = "absent"
    elif sysng.get("status") in NG_BUSY:
        missing.append(f"system node group {sysname} is {sysng['status']}")
        facts["system"] = "creating"
    elif sysng.get("status") in NG_FAILED:
        missing.append(f"system node group {sysname} is {sysng['status']}")
        facts["system"] = "failed"
    kube = ctx.kube_or_none()
    if kube is None:
        missing.append(f"no kubeconfig at {ctx.kubeconfig}")
        facts["kubeconfig"] = "missing"
    else:
        try:
            kube.version()
        except Exception as e:
            missing.append(f"the kubeconfig at {ctx.kubeconfig} does not reach the cluster ({e})")
            facts["kubeconfig"] = "broken"
    if not missing:
        ready = _ready_nodes(kube, SYSTEM_ROLE) if kube is not None else []
        if len(ready) < cfg.system_nodes.count:
            return Observation("creating", f"{len(ready)}/{cfg.system_nodes.count} system nodes Ready")
        return Observation("ready", f"EKS cluster {name} ACTIVE with {len(ready)} system node(s) Ready")
    state = "creating" if facts.get("system") == "creating" and len(missing) == 1 else "degraded"
    return Observation(state, "; ".join(missing), facts)


def _cluster_plan(ctx: Context, obs: Observation) -> Plan:
    sysname = ctx.cfg.system_nodes.nodegroup_name
    f = obs.facts
    if obs.state == "ready":
        return Plan("none", obs.reason)
    if f.get("foreign"):
        return Plan("refuse", obs.reason + "; pass --force to use it anyway")
    cmds: list[str] = []
    if obs.state == "creating" and not f:
        return Plan("wait", obs.reason, ("eks:DescribeCluster until ACTIVE",))
    if f.get("stale_stack"):
        cmds.append(f"cloudformation:DeleteStack {f['stale_stack']} (then wait until deleted)")
    if obs.state == "deleting":
        cmds.append("eks:DescribeCluster until it is gone")
    if f.get("failed"):
        cmds.append(str(commands.delete_cluster(ctx)))
    if obs.state in ("absent", "deleting") or f.get("failed"):
        cmds += [f"write {ctx.path_of(FILES['eksctl'])}", str(commands.create_cluster(ctx)),
                 str(commands.create_nodegroup(ctx, sysname))]
        return Plan("replace" if f.get("stale_stack") or f.get("failed") else "create", obs.reason, tuple(cmds))
    if f.get("system") == "failed":
        cmds.append(str(commands.delete_nodegroup(ctx, sysname)))
    if f.get("system") in ("absent", "failed"):
        cmds += [f"write {ctx.path_of(FILES['eksctl'])}", str(commands.create_nodegroup(ctx, sysname))]
    if f.get("system") == "creating":
        cmds.append(f"eks:DescribeNodegroup {sysname} until ACTIVE")
    if f.get("kubeconfig") in ("missing", "broken"):
        cmds.append(str(commands.write_kubeconfig(ctx)))
    return Plan("repair", obs.reason, tuple(cmds))


def _write_eksctl(ctx: Context, zones: list[str] | None = None) -> None:
    decide_zones(ctx)
    docs = ctx.documents("eksctl", zones)
    ctx.write({FILES["eksctl"]: docs[FILES["eksctl"]]})


def _wait_cluster(ctx: Context, step: str, gone: bool = False) -> dict[str, Any] | None:
    name = ctx.cfg.cluster.name
    if gone:
        ctx.wait(step, lambda: (cloud.cluster(_eks(ctx), name), cloud.stack(_cfn(ctx), cloud.cluster_stack(name))),
                 lambda t: t[0] is None and (t[1] is None or t[1].get("StackStatus") != "DELETE_IN_PROGRESS"),
                 timeout=ctx.timings.cluster_s, what=f"cluster {name} to be deleted")
        return None
    return ctx.wait(step, lambda: cloud.cluster(_eks(ctx), name),
                    lambda d: d is not None and d.get("status") in ("ACTIVE", "FAILED"),
                    timeout=ctx.timings.cluster_s, what=f"EKS cluster {name} to become ACTIVE",
                    explain=lambda d: f"status {d.get('status') if d else 'absent'}")


def _ensure_nodegroup_gone(ctx: Context, step: str, ngname: str) -> None:
    """A failed node group or its stale stack blocks a create of the same name: remove both."""
    name = ctx.cfg.cluster.name
    ng = cloud.nodegroup(_eks(ctx), name, ngname)
    if ng is not None:
        if ng.get("status") != "DELETING":
            ctx.tool(step, commands.delete_nodegroup(ctx, ngname), timeout=ctx.timings.nodegroup_s)
        ctx.wait(step, lambda: cloud.nodegroup(_eks(ctx), name, ngname), lambda n: n is None,
                 timeout=ctx.timings.nodegroup_s, what=f"node group {ngname} to be deleted")
    st = cloud.stack(_cfn(ctx), cloud.nodegroup_stack(name, ngname))
    if st is not None and st.get("StackStatus") in cloud.STALE_STACK | {"CREATE_COMPLETE"}:
        _delete_stack(ctx, step, st["StackName"])


def _cluster_act(ctx: Context, obs: Observation) -> None:
    step = "cluster"
    cfg = ctx.cfg
    name = cfg.cluster.name
    if obs.facts.get("foreign"):
        raise InputError(obs.reason, hint="choose another CLUSTER_NAME, or pass --force to let raydlc manage it")
    decide_zones(ctx)
    desc = cloud.cluster(_eks(ctx), name)
    if (desc is not None and desc.get("status") == "DELETING") or obs.facts.get("stack_deleting"):
        _wait_cluster(ctx, step, gone=True)
        desc = None
    if desc is not None and desc.get("status") == "FAILED":
        ctx.tool(step, commands.delete_cluster(ctx), timeout=ctx.timings.cluster_s)
        desc = None
    if desc is None:
        st = cloud.stack(_cfn(ctx), cloud.cluster_stack(name))
        if st is not None and st.get("StackStatus") == "CREATE_IN_PROGRESS":
            desc = _wait_cluster(ctx, step)
        elif st is not None:
            _delete_stack(ctx, step, st["StackName"])
    if desc is None:
        _write_eksctl(ctx)
        ctx.tool(step, commands.create_cluster(ctx), timeout=ctx.timings.cluster_s)
        ctx.forget_kube()
    desc = _wait_cluster(ctx, step)
    if desc is None or desc.get("status") != "ACTIVE":
        raise StepFailed(f"EKS cluster {name} is {desc.get('status') if desc else 'absent'} after create",
                         hint=f"see the stack's events: aws cloudformation describe-stack-events --stack-name {cloud.cluster_stack(name)}")
    sysname = cfg.system_nodes.nodegroup_name
    ng = cloud.nodegroup(_eks(ctx), name, sysname)
    if ng is not None and ng.get("status") in NG_FAILED:
        _ensure_nodegroup_gone(ctx, step, sysname)
        ng = None
    if ng is None:
        _ensure_nodegroup_gone(ctx, step, sysname)
        _write_eksctl(ctx)
        ctx.tool(step, commands.create_nodegroup(ctx, sysname), timeout=ctx.timings.nodegroup_s)
    _wait_nodegroup(ctx, step, sysname)
    kube = ctx.kube_or_none()
    works = False
    if kube is not None:
        try:
            kube.version()
            works = True
        except Exception:
            works = False
    if not works:
        ctx.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        ctx.tool(step, commands.write_kubeconfig(ctx))
        ctx.forget_kube()


def _wait_nodegroup(ctx: Context, step: str, ngname: str) -> dict[str, Any]:
    name = ctx.cfg.cluster.name
    ng = ctx.wait(step, lambda: cloud.nodegroup(_eks(ctx), name, ngname),
                  lambda n: n is None or n.get("status") not in NG_BUSY,
                  timeout=ctx.timings.nodegroup_s, what=f"node group {ngname} to become ACTIVE",
                  explain=lambda n: f"status {n.get('status') if n else 'absent'}")
    if ng is None:
        st = cloud.stack(_cfn(ctx), cloud.nodegroup_stack(name, ngname))
        why = cloud.stack_failure(_cfn(ctx), st["StackName"]) if st else ""
        raise StepFailed(f"node group {ngname} was not created" + (f": {why}" if why else ""))
    if ng.get("status") != "ACTIVE":
        err = cloud.launch_error(_eks(ctx), ctx.aws("autoscaling"), ng)
        raise StepFailed(f"node group {ngname} is {ng.get('status')}" + (f": {err}" if err else ""))
    return ng


def _cluster_verify(ctx: Context) -> str:
    cfg = ctx.cfg
    desc = cloud.cluster(_eks(ctx), cfg.cluster.name)
    if desc is None or desc.get("status") != "ACTIVE":
        raise StepFailed(f"EKS cluster {cfg.cluster.name} is {desc.get('status') if desc else 'absent'}")
    if not cloud.owned(desc, cfg.cluster.name) and not ctx.force:
        raise StepFailed(f"EKS cluster {cfg.cluster.name} lacks the {OWNER_TAG} tag")
    kube = ctx.kube()
    version = kube.version()
    want = cfg.system_nodes.count
    ready = ctx.wait("cluster", lambda: _ready_nodes(kube, SYSTEM_ROLE), lambda ns: len(ns) >= want,
                     timeout=ctx.timings.nodes_s, what=f"{want} system node(s) Ready",
                     explain=lambda ns: f"{len(ns)}/{want} Ready")
    return (f"EKS {desc.get('version', '?')} ACTIVE, API {version} reached through {ctx.kubeconfig}; "
            f"{len(ready)} system node(s) Ready")


# ---------------------------------------------------------------------- GPU node group


def _gpu_check(ctx: Context) -> Observation:
    cfg = ctx.cfg
    name, ngname = cfg.cluster.name, cfg.gpu_nodes.nodegroup_name
    if _cluster_active(ctx) is None:
        return _no_cluster(ctx)
    ng = cloud.nodegroup(_eks(ctx), name, ngname)
    if ng is None:
        st = cloud.stack(_cfn(ctx), cloud.nodegroup_stack(name, ngname))
        if st is not None and st.get("StackStatus") != "CREATE_IN_PROGRESS":
            return Observation("absent", f"stale stack {st['StackName']} ({st['StackStatus']}) blocks the node group",
                               {"stale_stack": st["StackName"]})
        if st is not None:
            return Observation("creating", f"stack {st['StackName']} is CREATE_IN_PROGRESS")
        return Observation("absent", f"node group {ngname} does not exist")
    status = ng.get("status")
    if status in NG_FAILED:
        err = cloud.launch_error(_eks(ctx), ctx.aws("autoscaling"), ng)
        return Observation("degraded", f"node group {ngname} is {status}" + (f": {err}" if err else ""), {"failed": True})
    if status in NG_BUSY:
        return Observation("creating", f"node group {ngname} is {status}")
    if status == "DELETING":
        return Observation("deleting", f"node group {ngname} is DELETING")
    kube = ctx.kube_or_none()
    if kube is None:
        return _no_kubeconfig(ctx)
    want = cfg.gpu_nodes.count
    ready = _ready_nodes(kube, GPU_ROLE)
    if len(ready) < want:
        return Observation("creating", f"{len(ready)}/{want} GPU nodes Ready")
    return Observation("ready", f"{len(ready)} × {cfg.gpu_nodes.instance_type} Ready")


def _gpu_plan(ctx: Context, obs: Observation) -> Plan:
    ngname = ctx.cfg.gpu_nodes.nodegroup_name
    if obs.state == "ready":
        return Plan("none", obs.reason)
    if obs.state in ("creating", "unknown") and not obs.facts:
        return Plan("wait", obs.reason, (f"eks:DescribeNodegroup {ngname} until ACTIVE; nodes role={GPU_ROLE} Ready",))
    cmds: list[str] = []
    if obs.facts.get("failed") or obs.state == "deleting":
        cmds.append(str(commands.delete_nodegroup(ctx, ngname)))
    if obs.facts.get("stale_stack"):
        cmds.append(f"cloudformation:DeleteStack {obs.facts['stale_stack']}")
    where = f" in {ctx.gpu_az}" if ctx.gpu_az else ""
    cmds += [f"write {ctx.path_of(FILES['eksctl'])} (GPU node group{where})", str(commands.create_nodegroup(ctx, ngname))]
    if ctx.az_chosen and len(ctx.candidates) > 1:
        cmds.append(f"on a capacity failure: delete it and retry in {', '.join(ctx.candidates[1:])}")
    action = "replace" if obs.facts else "create"
    return Plan(action, obs.reason, tuple(cmds))


def _gpu_act(ctx: Context, obs: Observation) -> None:
    step = "gpu-nodegroup"
    cfg = ctx.cfg
    name, ngname = cfg.cluster.name, cfg.gpu_nodes.nodegroup_name
    decide_zones(ctx)
    ng = cloud.nodegroup(_eks(ctx), name, ngname)
    if ng is not None and ng.get("status") in NG_BUSY:
        ng = _wait_settled(ctx, step, ngname)
    if ng is not None and ng.get("status") == "ACTIVE":
        return
    tried: list[str] = []
    if ng is not None and ng.get("status") in NG_FAILED:
        err = cloud.launch_error(_eks(ctx), ctx.aws("autoscaling"), ng)
        az = _nodegroup_az(ctx, ng)
        ctx.reporter.line(step, f"node group {ngname} is {ng.get('status')} in {az}: {err}; deleting it")
        _ensure_nodegroup_gone(ctx, step, ngname)
        if az and cloud.is_capacity_error(err) and ctx.az_chosen:
            tried.append(az)
    else:
        _ensure_nodegroup_gone(ctx, step, ngname)
    candidates = [z for z in (ctx.candidates or [ctx.gpu_az]) if z and z not in tried]
    errors: list[str] = [f"{z}: a failed node group found there" for z in tried]
    for i, az in enumerate(candidates):
        if i > 0 or tried:
            ctx.reporter.line(step, f"trying the next ranked AZ: {az}")
        _write_eksctl(ctx, [az] + [z for z in (ctx.zones or []) if z != az])
        tool_error = ""
        try:
            ctx.tool(step, commands.create_nodegroup(ctx, ngname), timeout=ctx.timings.nodegroup_s)
        except ToolFailed as e:
            tool_error = e.message
        ng = _wait_settled(ctx, step, ngname)
        if ng is not None and ng.get("status") == "ACTIVE":
            ctx.gpu_az = az
            if errors:
                ctx.note(step, f"came up in {az} after: {'; '.join(errors)}")
            return
        if ng is not None:
            err = cloud.launch_error(_eks(ctx), ctx.aws("autoscaling"), ng) or tool_error
        else:
            st = cloud.stack(_cfn(ctx), cloud.nodegroup_stack(name, ngname))
            err = (cloud.stack_failure(_cfn(ctx), st["StackName"]) if st else "") or tool_error or "no node group was created"
        errors.append(f"{az}: {err}")
        _ensure_nodegroup_gone(ctx, step, ngname)
        if not (ctx.az_chosen and cloud.is_capacity_error(err)):
            break
    hint = ("run `raydlc capacity` and set GPU_AZ to a zone that has capacity, or retry later"
            if any(cloud.is_capacity_error(e) for e in errors) else "see the error above; re-run `raydlc up` once fixed")
    raise StepFailed(f"GPU node group {ngname} could not be created: {' | '.join(errors)}", hint=hint)


def _wait_settled(ctx: Context, step: str, ngname: str) -> dict[str, Any] | None:
    name = ctx.cfg.cluster.name
    return ctx.wait(step, lambda: cloud.nodegroup(_eks(ctx), name, ngname),
                    lambda n: n is None or n.get("status") not in NG_BUSY,
                    timeout=ctx.timings.nodegroup_s, what=f"node group {ngname} to settle",
                    explain=lambda n: f"status {n.get('status') if n else 'absent'}")


def _nodegroup_az(ctx: Context, ng: dict[str, Any]) -> str | None:
    zones = sorted(set(cloud.subnet_zones(ctx.aws("ec2"), ng.get("subnets") or []).values()))
    return zones[0] if zones else None


def _gpu_verify(ctx: Context) -> str:
    cfg = ctx.cfg
    ng = cloud.nodegroup(_eks(ctx), cfg.cluster.name, cfg.gpu_nodes.nodegroup_name)
    if ng is None or ng.get("status") != "ACTIVE":
        raise StepFailed(f"node group {cfg.gpu_nodes.nodegroup_name} is {ng.get('status') if ng else 'absent'}")
    kube = ctx.kube()
    want = cfg.gpu_nodes.count
    ready = ctx.wait("gpu-nodegroup", lambda: _ready_nodes(kube, GPU_ROLE), lambda ns: len(ns) >= want,
                     timeout=ctx.timings.nodes_s, what=f"{want} GPU nodes Ready with {ROLE}={GPU_ROLE}",
                     explain=lambda ns: f"{len(ns)}/{want} Ready")
    az = _nodegroup_az(ctx, ng) or "?"
    ctx.gpu_az = az
    return f"{len(ready)} × {cfg.gpu_nodes.instance_type} Ready in {az}"


# ---------------------------------------------------------------------- helm releases


def _release_check(ctx: Context, release: Callable[[Any], helm_render.Release | None],
                   extra: Callable[[k8s.Kube], Observation | None]) -> Observation:
    if _cluster_active(ctx) is None:
        return _no_cluster(ctx)
    kube = ctx.kube_or_none()
    if kube is None:
        return _no_kubeconfig(ctx)
    r = release(ctx.cfg)
    if r is not None:
        state = commands.release_state(ctx, r)
        if not state.matches(r):
            kind = "absent" if state.status == "absent" else "degraded"
            return Observation(kind, state.describe(r), {"release": state.status})
    found = extra(kube)
    if found is not None:
        return found
    return Observation("ready", f"release {r.name} {r.version} deployed" if r is not None else "no release to install")


def _release_plan(ctx: Context, obs: Observation, release: helm_render.Release | None) -> Plan:
    if obs.state == "ready":
        return Plan("none", obs.reason)
    cmds: list[str] = []
    if release is not None and (obs.facts.get("release") or obs.state in ("absent", "unknown")):
        if str(obs.facts.get("release", "")).startswith("pending"):
            cmds.append(str(commands.uninstall(ctx, release)))
        cmds += [f"write {ctx.path_of(release.filename)}", str(commands.install(ctx, release))]
        return Plan("create" if obs.state in ("absent", "unknown") else "repair", obs.reason, tuple(cmds))
    return Plan("wait", obs.reason)


def _install(ctx: Context, step: str, r: helm_render.Release, obs: Observation) -> None:
    status = str(obs.facts.get("release", ""))
    if status.startswith("pending") or status == "uninstalling":
        ctx.reporter.line(step, f"release {r.name} is {status} (an interrupted helm run); uninstalling it first")
        ctx.tool(step, commands.uninstall(ctx, r), timeout=ctx.timings.helm_s)
    docs = ctx.documents("helm")
    ctx.write({r.filename: docs[r.filename]})
    ctx.tool(step, commands.install(ctx, r), timeout=ctx.timings.helm_s + 60)


# ---------------------------------------------------------------------- KubeRay operator

CRDS = ("rayclusters.ray.io", "rayjobs.ray.io")


def _operator(kube: k8s.Kube, cfg: Any) -> dict[str, Any] | None:
    return kube.get("apps/v1", "Deployment", "kuberay-operator", cfg.ray.operator_namespace)


def _kuberay_extra(ctx: Context) -> Callable[[k8s.Kube], Observation | None]:
    def extra(kube: k8s.Kube) -> Observation | None:
        dep = _operator(kube, ctx.cfg)
        if not k8s.deployment_available(dep):
            return Observation("creating", "Deployment kuberay-operator is not available yet")
        missing = [c for c in CRDS if not k8s.crd_established(kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", c))]
        if missing:
            return Observation("creating", f"CRDs not served yet: {', '.join(missing)}")
        return None

    return extra


def _kuberay_check(ctx: Context) -> Observation:
    return _release_check(ctx, helm_render.kuberay_operator, _kuberay_extra(ctx))


def _kuberay_plan(ctx: Context, obs: Observation) -> Plan:
    return _release_plan(ctx, obs, helm_render.kuberay_operator(ctx.cfg))


def _kuberay_act(ctx: Context, obs: Observation) -> None:
    if obs.facts.get("release"):
        _install(ctx, "kuberay", helm_render.kuberay_operator(ctx.cfg), obs)


def _kuberay_verify(ctx: Context) -> str:
    cfg = ctx.cfg
    kube = ctx.kube()
    ns = cfg.ray.operator_namespace
    ctx.wait("kuberay", lambda: _operator(kube, cfg), k8s.deployment_available, timeout=ctx.timings.helm_s,
             what="Deployment kuberay-operator to be Available",
             explain=lambda d: f"{(d or {}).get('status', {}).get('availableReplicas', 0)} available" if d else "no Deployment")
    ctx.wait("kuberay", lambda: [kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", c) for c in CRDS],
             lambda crds: all(k8s.crd_established(c) for c in crds), timeout=ctx.timings.helm_s,
             what="the RayCluster and RayJob CRDs to be served")
    nodes = {k8s.name_of(n): n for n in kube.nodes()}
    pods = [p for p in kube.pods(ns) if k8s.name_of(p).startswith("kuberay-operator-") and k8s.pod_phase(p) == "Running"]
    where = sorted({k8s.pod_node(p) or "?" for p in pods})
    off = [w for w in where if k8s.labels_of(nodes.get(w, {})).get(ROLE) != SYSTEM_ROLE]
    if off:
        raise StepFailed(f"the KubeRay operator runs on {', '.join(off)}, not on a {ROLE}={SYSTEM_ROLE} node",
                         hint="check the nodeSelector in helm/kuberay-operator.values.yaml")
    return (f"kuberay-operator {cfg.images.kuberay_version} Available on {', '.join(where) or 'a system node'}; "
            f"CRDs {', '.join(CRDS)} served")


# ---------------------------------------------------------------------- device plugins


def node_devices(node: dict[str, Any]) -> tuple[int, int]:
    return k8s.allocatable(node, GPU_RESOURCE), k8s.allocatable(node, EFA_RESOURCE)


def short_nodes(nodes: list[dict[str, Any]], gpus: int) -> list[dict[str, Any]]:
    """GPU nodes that do not yet advertise every GPU and at least one EFA interface (pure)."""
    return [n for n in nodes if node_devices(n)[0] != gpus or node_devices(n)[1] < 1]


def _plugins_extra(ctx: Context) -> Callable[[k8s.Kube], Observation | None]:
    def extra(kube: k8s.Kube) -> Observation | None:
        cfg = ctx.cfg
        nodes = kube.nodes({ROLE: GPU_ROLE})
        if len(nodes) < cfg.gpu_nodes.count:
            return Observation("absent", f"{len(nodes)}/{cfg.gpu_nodes.count} GPU nodes exist (the gpu-nodegroup step makes them)")
        short = short_nodes(nodes, cfg.gpu_nodes.gpus_per_node)
        if short:
            return Observation("creating", "; ".join(_node_devices_text(n, cfg.gpu_nodes.gpus_per_node) for n in short))
        return None

    return extra


def _node_devices_text(node: dict[str, Any], gpus: int) -> str:
    g, e = node_devices(node)
    return f"{k8s.name_of(node)}: {GPU_RESOURCE} {g}/{gpus}, {EFA_RESOURCE} {e}"


def _plugins_check(ctx: Context) -> Observation:
    return _release_check(ctx, helm_render.nvidia_device_plugin, _plugins_extra(ctx))


def _plugins_plan(ctx: Context, obs: Observation) -> Plan:
    p = _release_plan(ctx, obs, helm_render.nvidia_device_plugin(ctx.cfg))
    if p.action == "wait":
        return Plan("wait", obs.reason, (f"nodes role={GPU_ROLE}: {GPU_RESOURCE} = {ctx.cfg.gpu_nodes.gpus_per_node} and "
                                          f"{EFA_RESOURCE} >= 1 (EFA plugin: eksctl's {EFA_DAEMONSET})",))
    return p


def _plugins_act(ctx: Context, obs: Observation) -> None:
    r = helm_render.nvidia_device_plugin(ctx.cfg)
    if r is not None and obs.facts.get("release"):
        _install(ctx, "device-plugins", r, obs)


def _plugin_pod_state(kube: k8s.Kube, node: str, daemonset: str) -> str:
    pods = [p for p in kube.pods("kube-system", node=node)
            if k8s.name_of(p).startswith(daemonset + "-") and k8s.pod_node(p) == node]
    if not pods:
        ds = kube.get("apps/v1", "DaemonSet", daemonset, "kube-system")
        if ds is None:
            return f"DaemonSet {daemonset} does not exist"
        st = ds.get("status") or {}
        return (f"no {daemonset} pod on this node (DaemonSet: {st.get('numberReady', 0)} ready of "
                f"{st.get('desiredNumberScheduled', '?')} scheduled)")
    p = pods[0]
    return f"pod {k8s.name_of(p)} is {k8s.pod_phase(p)}" + (
        "" if k8s.pod_ready(p) else f" ({k8s.pending_reason(p, kube.events('kube-system', involved=k8s.name_of(p)))})")


def _plugins_verify(ctx: Context) -> str:
    cfg = ctx.cfg
    kube = ctx.kube()
    gpus = cfg.gpu_nodes.gpus_per_node
    r = helm_render.nvidia_device_plugin(cfg)
    nvidia_ds = r.name if r is not None else "nvidia-device-plugin"
    try:
        nodes = ctx.wait("device-plugins", lambda: kube.nodes({ROLE: GPU_ROLE}),
                         lambda ns: len(ns) >= cfg.gpu_nodes.count and not short_nodes(ns, gpus),
                         timeout=ctx.timings.plugins_s, what=f"{GPU_RESOURCE} and {EFA_RESOURCE} on every GPU node")
    except k8s.KubeTimeout as e:
        ns = kube.nodes({ROLE: GPU_ROLE})
        lines = []
        for n in short_nodes(ns, gpus):
            name = k8s.name_of(n)
            g, efa = node_devices(n)
            parts = []
            if g != gpus:
                parts.append(f"{GPU_RESOURCE} {g} (want {gpus}); NVIDIA plugin: {_plugin_pod_state(kube, name, nvidia_ds)}")
            if efa < 1:
                parts.append(f"{EFA_RESOURCE} {efa} (want >= 1); EFA plugin: {_plugin_pod_state(kube, name, EFA_DAEMONSET)}")
            lines.append(f"node {name}: " + "; ".join(parts))
        if len(ns) < cfg.gpu_nodes.count:
            lines.append(f"only {len(ns)}/{cfg.gpu_nodes.count} GPU nodes exist")
        raise StepFailed(
            "device plugins: " + " | ".join(lines or [e.message]),
            hint="`kubectl -n kube-system describe pod` on the pods named shows why they are not running; "
            "eksctl's EFA plugin tolerates only the aws.amazon.com/efa taint",
        ) from e
    return f"{len(nodes)} GPU nodes each advertise {GPU_RESOURCE}={gpus} and {EFA_RESOURCE}>=1"


# ---------------------------------------------------------------------- RayCluster


def _hf_token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def desired_objects(ctx: Context) -> list[dict[str, Any]]:
    """What the raycluster step applies, in order: namespace, secret (when HF_TOKEN is set), policies, cluster."""
    cfg = ctx.cfg
    ns = cfg.cluster.namespace
    labels = {**MANAGED_BY, OWNER_TAG: cfg.cluster.name}
    out: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}]
    token = _hf_token()
    if token:
        out.append({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET_NAME, "namespace": ns, "labels": labels},
            "data": {key: base64.b64encode(token.encode()).decode() for key in SECRET_KEYS[:1]},
        })
    out.extend(ctx.documents("netpol")[FILES["netpol"]]["items"])
    out.append(ctx.documents("raycluster")[FILES["raycluster"]])
    return out


def _describe(doc: dict[str, Any]) -> str:
    return f"{doc['kind']} {doc['metadata']['name']}"


def ray_pods(kube: k8s.Kube, ctx: Context) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pods = kube.pods(ctx.cfg.cluster.namespace, labels={"ray.io/cluster": ctx.cfg.ray.cluster_name})
    head = [p for p in pods if k8s.labels_of(p).get("ray.io/node-type") == "head"]
    workers = [p for p in pods if k8s.labels_of(p).get("ray.io/node-type") == "worker"]
    return head, workers


def _pods_ok(ctx: Context, pods: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> bool:
    head, workers = pods
    running = [w for w in workers if k8s.pod_phase(w) == "Running"]
    return any(k8s.pod_ready(h) for h in head) and len(running) >= ctx.cfg.gpu_nodes.count


def _raycluster_check(ctx: Context) -> Observation:
    if _cluster_active(ctx) is None:
        return _no_cluster(ctx)
    kube = ctx.kube_or_none()
    if kube is None:
        return _no_kubeconfig(ctx)
    differ: list[str] = []
    missing: list[str] = []
    for doc in desired_objects(ctx):
        have = kube.get(doc["apiVersion"], doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace"))
        if have is None:
            missing.append(_describe(doc))
        elif k8s.differences({k: v for k, v in doc.items() if k != "status"}, have):
            differ.append(_describe(doc))
    if missing and any(m.startswith("RayCluster ") for m in missing):
        return Observation("absent", f"not created yet: {', '.join(missing)}", {"apply": True})
    if missing or differ:
        return Observation("degraded", "; ".join(filter(None, [
            f"missing: {', '.join(missing)}" if missing else "", f"differs from the rendered: {', '.join(differ)}" if differ else ""])),
            {"apply": True})
    pods = ray_pods(kube, ctx)
    if not _pods_ok(ctx, pods):
        head, workers = pods
        return Observation("creating", f"head {'Ready' if any(k8s.pod_ready(h) for h in head) else 'not Ready'}, "
                                       f"{sum(k8s.pod_phase(w) == 'Running' for w in workers)}/{ctx.cfg.gpu_nodes.count} workers Running")
    return Observation("ready", f"RayCluster {ctx.cfg.ray.cluster_name}: head Ready, {ctx.cfg.gpu_nodes.count} workers Running")


def _raycluster_plan(ctx: Context, obs: Observation) -> Plan:
    if obs.state == "ready":
        return Plan("none", obs.reason)
    what = ", ".join(_describe(d) for d in desired_objects(ctx))
    secret = " (the Secret's value comes from HF_TOKEN in the environment)" if _hf_token() else ""
    cmd = f"kubernetes apply (create or merge-patch): {what}{secret}"
    if obs.facts.get("apply") or obs.state in ("absent", "unknown"):
        return Plan("create" if obs.state in ("absent", "unknown") else "repair", obs.reason, (cmd,))
    return Plan("wait", obs.reason, ("pods ray.io/cluster=" + ctx.cfg.ray.cluster_name + ": head Ready, workers Running",))


def _raycluster_act(ctx: Context, obs: Observation) -> None:
    kube = ctx.kube()
    for doc in desired_objects(ctx):
        for applied in kube.apply(doc):
            if applied.action != "unchanged":
                ctx.reporter.line("raycluster", f"{applied.action} {applied.kind} {applied.name}")


def _raycluster_verify(ctx: Context) -> str:
    cfg = ctx.cfg
    kube = ctx.kube()
    try:
        ctx.wait("raycluster", lambda: ray_pods(kube, ctx), lambda p: _pods_ok(ctx, p), timeout=ctx.timings.pods_s,
                 what=f"RayCluster {cfg.ray.cluster_name}: head Ready and {cfg.gpu_nodes.count} workers Running")
    except k8s.KubeTimeout as e:
        head, workers = ray_pods(kube, ctx)
        events = kube.events(cfg.cluster.namespace)
        lines = [f"pod {k8s.name_of(p)} ({k8s.labels_of(p).get('ray.io/node-type')}) is {k8s.pod_phase(p)}: "
                 f"{k8s.pending_reason(p, events)}"
                 for p in head + workers if not (k8s.pod_ready(p) if p in head else k8s.pod_phase(p) == "Running")]
        if not head:
            lines.append("no head pod exists (is the KubeRay operator running?)")
        if len(workers) < cfg.gpu_nodes.count:
            lines.append(f"{len(workers)}/{cfg.gpu_nodes.count} worker pods exist")
        raise StepFailed(f"RayCluster {cfg.ray.cluster_name} not up: " + " | ".join(lines or [e.message]),
                         hint="Insufficient cpu/memory: the pod asks for more than the node offers (see `raydlc render`); "
                         "Insufficient nvidia.com/gpu or vpc.amazonaws.com/efa: see the device-plugins step") from e
    head, workers = ray_pods(kube, ctx)
    where = sorted({k8s.pod_node(w) or "?" for w in workers})
    return (f"head {k8s.name_of(head[0]) if head else '?'} Ready on {k8s.pod_node(head[0]) if head else '?'}; "
            f"{len(workers)} workers Running on {', '.join(where)}")


STEPS: list[Step] = [
    Step("capacity", (), "choose the GPU Availability Zone", _capacity_check, _capacity_plan, _capacity_act, _capacity_verify),
    Step("cluster", ("capacity",), "EKS control plane, VPC, system node group, kubeconfig",
         _cluster_check, _cluster_plan, _cluster_act, _cluster_verify),
    Step("gpu-nodegroup", ("cluster",), "EFA GPU node group in one AZ", _gpu_check, _gpu_plan, _gpu_act, _gpu_verify),
    Step("kuberay", ("cluster",), "KubeRay operator and CRDs", _kuberay_check, _kuberay_plan, _kuberay_act, _kuberay_verify),
    Step("device-plugins", ("gpu-nodegroup",), "GPUs and EFA allocatable on every GPU node",
         _plugins_check, _plugins_plan, _plugins_act, _plugins_verify),
    Step("raycluster", ("device-plugins", "kuberay"), "namespace, NetworkPolicies, RayCluster",
         _raycluster_check, _raycluster_plan, _raycluster_act, _raycluster_verify),
]
