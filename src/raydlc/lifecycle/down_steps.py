"""`raydlc down`: the same six steps in reverse, each one done only when its resources are gone.

    raycluster ─┬─► device-plugins ─► gpu-nodegroup ─┬─► cluster ─► capacity
                └─► kuberay ─────────────────────────┘

eksctl's exit code is not the judge: the cluster step ends only when AWS says the cluster is
NOT_FOUND, no `eksctl-<name>-*` stack is left, no instance of the cluster runs, and no NAT
gateway or Elastic IP of its VPC bills; what eksctl left behind ("VPC has dependencies") and
raydlc owns (tagged `raydlc.io/cluster=<name>`) is removed here, and anything still standing
is named with the command that removes it. Every step notes what it removed and what was
already absent, and a re-run after an interruption finishes the job.
"""

from __future__ import annotations

from typing import Any

from raydlc import aws
from raydlc import kube as k8s
from raydlc.lifecycle import cloud, commands
from raydlc.lifecycle.context import Context
from raydlc.lifecycle.steps import Observation, Plan, Step, StepFailed
from raydlc.lifecycle.up_steps import ray_pods
from raydlc.render import helm as helm_render
from raydlc.render.eksctl import OWNER_TAG
from raydlc.render.netpol import render_netpol
from raydlc.render.nodes import GPU_ROLE, ROLE
from raydlc.render.raycluster import SECRET_NAME
from raydlc.tools import ToolFailed


def _eks(ctx: Context) -> Any:
    return ctx.aws("eks")


def _kube_if_cluster(ctx: Context) -> k8s.Kube | None:
    """The API when the cluster still exists and raydlc's kubeconfig reaches it; else None."""
    desc = cloud.cluster(_eks(ctx), ctx.cfg.cluster.name)
    if desc is None or desc.get("status") not in ("ACTIVE", "UPDATING"):
        return None
    kube = ctx.kube_or_none()
    if kube is None:
        return None
    try:
        kube.version()
    except Exception:
        return None
    return kube


def _gone(what: str) -> Observation:
    return Observation("absent", what)


# ---------------------------------------------------------------------- RayCluster and its namespace


def _ray_objects(ctx: Context) -> list[tuple[str, str, str, str | None]]:
    cfg = ctx.cfg
    ns = cfg.cluster.namespace
    out: list[tuple[str, str, str, str | None]] = [
        ("ray.io/v1", "RayJob", cfg.ray.job_name, ns),
        ("ray.io/v1", "RayCluster", cfg.ray.cluster_name, ns),
    ]
    out += [(p["apiVersion"], p["kind"], p["metadata"]["name"], ns) for p in render_netpol(cfg)["items"]]
    out.append(("v1", "Secret", SECRET_NAME, ns))
    return out


def _namespace_ours(kube: k8s.Kube, ctx: Context) -> bool:
    ns = kube.get("v1", "Namespace", ctx.cfg.cluster.namespace)
    return ns is not None and k8s.labels_of(ns).get(OWNER_TAG) == ctx.cfg.cluster.name


def _raycluster_check(ctx: Context) -> Observation:
    kube = _kube_if_cluster(ctx)
    if kube is None:
        return _gone("the cluster or its API is gone, and the Ray objects with it")
    present = [f"{kind} {name}" for av, kind, name, ns in _ray_objects(ctx) if kube.get(av, kind, name, ns) is not None]
    if _namespace_ours(kube, ctx):
        present.append(f"Namespace {ctx.cfg.cluster.namespace}")
    pods = sum(len(x) for x in ray_pods(kube, ctx))
    if pods:
        present.append(f"{pods} Ray pods")
    if not present:
        return _gone(f"no RayCluster {ctx.cfg.ray.cluster_name} or other raydlc object in {ctx.cfg.cluster.namespace}")
    return Observation("ready", "present: " + ", ".join(present), {"present": present})


def _raycluster_plan(ctx: Context, obs: Observation) -> Plan:
    if obs.state == "absent":
        return Plan("none", obs.reason)
    return Plan("delete", obs.reason, (f"kubernetes delete: {', '.join(obs.facts.get('present', []))}; "
                                       "wait until the Ray pods are gone",))


def _raycluster_act(ctx: Context, obs: Observation) -> None:
    step = "raycluster"
    kube = _kube_if_cluster(ctx)
    if kube is None:
        return
    for av, kind, name, ns in _ray_objects(ctx):
        if kube.delete(av, kind, name, ns):
            ctx.note(step, f"removed {kind} {name}")
            ctx.reporter.line(step, f"deleted {kind} {name}")
        else:
            ctx.note(step, f"absent {kind} {name}")
    ctx.wait(step, lambda: (kube.get("ray.io/v1", "RayCluster", ctx.cfg.ray.cluster_name, ctx.cfg.cluster.namespace),
                            ray_pods(kube, ctx)),
             lambda t: t[0] is None and not (t[1][0] or t[1][1]), timeout=ctx.timings.pods_s,
             what="the RayCluster and its pods to be gone",
             explain=lambda t: f"{len(t[1][0]) + len(t[1][1])} Ray pods left" + (", RayCluster still there" if t[0] else ""))
    if _namespace_ours(kube, ctx):
        ns = ctx.cfg.cluster.namespace
        kube.delete("v1", "Namespace", ns)
        ctx.wait(step, lambda: kube.get("v1", "Namespace", ns), lambda n: n is None, timeout=ctx.timings.pods_s,
                 what=f"namespace {ns} to be deleted")
        ctx.note(step, f"removed Namespace {ns}")


def _raycluster_verify(ctx: Context) -> str:
    kube = _kube_if_cluster(ctx)
    if kube is None:
        return "no cluster API: nothing of Ray can be left in it"
    left = [f"{kind} {name}" for av, kind, name, ns in _ray_objects(ctx) if kube.get(av, kind, name, ns) is not None]
    pods = [k8s.name_of(p) for group in ray_pods(kube, ctx) for p in group]
    if left or pods:
        raise StepFailed(f"still present: {', '.join(left + pods)}")
    return f"no RayCluster, RayJob, NetworkPolicy, Secret or Ray pod of {ctx.cfg.ray.cluster_name} left"


# ---------------------------------------------------------------------- helm releases


def _release_step(name: str, release: Any, workload: tuple[str, str]) -> Step:
    """Uninstall one of raydlc's releases; verified by its workload being gone, not by helm."""

    def rel(ctx: Context) -> helm_render.Release | None:
        return release(ctx.cfg)

    def check(ctx: Context) -> Observation:
        r = rel(ctx)
        if r is None:
            return _gone("no release to remove for this AMI family")
        kube = _kube_if_cluster(ctx)
        if kube is None:
            return _gone(f"the cluster is gone, and release {r.name} with it")
        state = commands.release_state(ctx, r)
        if state.status == "absent":
            return _gone(f"release {r.name} is not installed")
        return Observation("ready", f"release {r.name} is {state.status}")

    def plan(ctx: Context, obs: Observation) -> Plan:
        r = rel(ctx)
        if obs.state == "absent" or r is None:
            return Plan("none", obs.reason)
        return Plan("delete", obs.reason, (str(commands.uninstall(ctx, r)),))

    def act(ctx: Context, obs: Observation) -> None:
        r = rel(ctx)
        assert r is not None
        ctx.tool(name, commands.uninstall(ctx, r), timeout=ctx.timings.helm_s + 60)
        ctx.note(name, f"removed release {r.name}")

    def verify(ctx: Context) -> str:
        r = rel(ctx)
        if r is None:
            return "nothing to remove"
        kube = _kube_if_cluster(ctx)
        if kube is None:
            return f"cluster gone; release {r.name} with it"
        if commands.release_state(ctx, r).status != "absent":
            raise StepFailed(f"release {r.name} is still installed")
        av, kind = workload
        ctx.wait(name, lambda: kube.get(av, kind, r.name, r.namespace), lambda o: o is None, timeout=ctx.timings.helm_s,
                 what=f"{kind} {r.name} to be gone")
        return f"release {r.name} and its {kind} gone"

    return Step(name, (), f"uninstall {name}", check, plan, act, verify)


# ---------------------------------------------------------------------- node groups


def _gpu_check(ctx: Context) -> Observation:
    cfg = ctx.cfg
    name, ngname = cfg.cluster.name, cfg.gpu_nodes.nodegroup_name
    ng = cloud.nodegroup(_eks(ctx), name, ngname) if cloud.cluster(_eks(ctx), name) else None
    st = cloud.stack(ctx.aws("cloudformation"), cloud.nodegroup_stack(name, ngname))
    if ng is None and st is None:
        return _gone(f"node group {ngname} does not exist")
    facts = {"nodegroup": ng is not None, "stack": st["StackName"] if st else None}
    what = f"node group {ngname} is {ng.get('status')}" if ng else f"stack {st['StackName']} is {st['StackStatus']}"  # type: ignore[index]
    return Observation("ready", what, facts)


def _gpu_plan(ctx: Context, obs: Observation) -> Plan:
    if obs.state == "absent":
        return Plan("none", obs.reason)
    ngname = ctx.cfg.gpu_nodes.nodegroup_name
    if obs.facts.get("nodegroup"):
        return Plan("delete", obs.reason, (str(commands.delete_nodegroup(ctx, ngname)),))
    return Plan("delete", obs.reason, (f"cloudformation:DeleteStack {obs.facts['stack']}",))


def _delete_stack(ctx: Context, step: str, name: str) -> None:
    cfn = ctx.aws("cloudformation")
    aws.call(cfn, "delete_stack", StackName=name)
    last = ctx.wait(step, lambda: cloud.stack(cfn, name),
                    lambda s: s is None or s.get("StackStatus") in ("DELETE_FAILED",),
                    timeout=ctx.timings.stack_s, what=f"stack {name} to be deleted")
    if last is not None:
        why = cloud.stack_failure(cfn, name)
        raise StepFailed(f"stack {name} is DELETE_FAILED" + (f": {why}" if why else ""),
                         hint=f"aws cloudformation delete-stack --stack-name {name} --region {ctx.cfg.cluster.region}")
    ctx.note(step, f"removed stack {name}")


def _gpu_act(ctx: Context, obs: Observation) -> None:
    step = "gpu-nodegroup"
    cfg = ctx.cfg
    name, ngname = cfg.cluster.name, cfg.gpu_nodes.nodegroup_name
    if cloud.nodegroup(_eks(ctx), name, ngname) is not None:
        ctx.tool(step, commands.delete_nodegroup(ctx, ngname), timeout=ctx.timings.nodegroup_s)
        ctx.wait(step, lambda: cloud.nodegroup(_eks(ctx), name, ngname), lambda n: n is None,
                 timeout=ctx.timings.nodegroup_s, what=f"node group {ngname} to be deleted")
        ctx.note(step, f"removed node group {ngname}")
    st = cloud.stack(ctx.aws("cloudformation"), cloud.nodegroup_stack(name, ngname))
    if st is not None:
        _delete_stack(ctx, step, st["StackName"])


def _gpu_verify(ctx: Context) -> str:
    cfg = ctx.cfg
    name, ngname = cfg.cluster.name, cfg.gpu_nodes.nodegroup_name
    if cloud.cluster(_eks(ctx), name) and cloud.nodegroup(_eks(ctx), name, ngname) is not None:
        raise StepFailed(f"node group {ngname} still exists")
    if cloud.stack(ctx.aws("cloudformation"), cloud.nodegroup_stack(name, ngname)) is not None:
        raise StepFailed(f"stack {cloud.nodegroup_stack(name, ngname)} still exists")
    left = [i["InstanceId"] for i in cloud.instances(ctx.aws("ec2"), name) if cloud.tag(i, "eks:nodegroup-name") == ngname]
    if left:
        raise StepFailed(f"instances of node group {ngname} still run: {', '.join(left)}",
                         hint=f"aws ec2 terminate-instances --instance-ids {' '.join(left)} --region {cfg.cluster.region}")
    kube = _kube_if_cluster(ctx)
    if kube is not None:
        ctx.wait("gpu-nodegroup", lambda: kube.nodes({ROLE: GPU_ROLE}), lambda ns: not ns, timeout=ctx.timings.nodes_s,
                 what="the GPU nodes to leave the cluster", explain=lambda ns: ", ".join(k8s.name_of(n) for n in ns))
    return f"node group {ngname}, its stack and its instances are gone"


# ---------------------------------------------------------------------- the cluster, audited


def audit(ctx: Context, vpc_ids: list[str] | None = None) -> dict[str, list[str]]:
    """Everything of the cluster AWS still lists (pure reads): empty lists mean nothing bills."""
    cfg = ctx.cfg
    name = cfg.cluster.name
    ec2 = ctx.aws("ec2")
    desc = cloud.cluster(_eks(ctx), name)
    known = list(vpc_ids or [])
    if desc is not None:
        known.append((desc.get("resourcesVpcConfig") or {}).get("vpcId", ""))
    vpcs = cloud.vpcs(ec2, name, known)
    nats = cloud.nat_gateways(ec2, name, vpcs)
    alloc = [a.get("AllocationId", "") for n in nats for a in n.get("NatGatewayAddresses") or []]
    return {
        "cluster": [f"{name} ({desc.get('status')})"] if desc else [],
        "stacks": [s["StackName"] for s in cloud.stacks(ctx.aws("cloudformation"), f"eksctl-{name}-")],
        "instances": [i["InstanceId"] for i in cloud.instances(ec2, name)],
        "nat_gateways": [n["NatGatewayId"] for n in nats],
        "addresses": [a["AllocationId"] for a in cloud.addresses(ec2, name, alloc)],
        "vpcs": vpcs,
    }


def _billing(found: dict[str, list[str]]) -> list[str]:
    return [f"{kind}: {', '.join(ids)}" for kind, ids in found.items() if ids and kind != "vpcs"]


def _cluster_check(ctx: Context) -> Observation:
    found = audit(ctx)
    left = _billing(found)
    if not left and not found["vpcs"]:
        return _gone(f"AWS lists nothing of cluster {ctx.cfg.cluster.name}: no cluster, stack, instance, NAT gateway or Elastic IP")
    return Observation("ready", "present: " + "; ".join(left or [f"vpcs: {', '.join(found['vpcs'])}"]), {"found": found})


def _cluster_plan(ctx: Context, obs: Observation) -> Plan:
    if obs.state == "absent":
        return Plan("none", obs.reason)
    found = obs.facts["found"]
    cmds = [str(commands.delete_cluster(ctx))] if found["cluster"] else []
    cmds.append("then, for whatever AWS still lists tagged " + f"{OWNER_TAG}={ctx.cfg.cluster.name}: "
                "cloudformation:DeleteStack, ec2:TerminateInstances, ec2:DeleteNatGateway, ec2:ReleaseAddress")
    return Plan("delete", obs.reason, tuple(cmds))


def _sweep(ctx: Context, step: str, found: dict[str, list[str]]) -> None:
    """Remove what eksctl left behind, in dependency order; each removal is noted."""
    ec2 = ctx.aws("ec2")
    cfg = ctx.cfg
    if found["instances"]:
        aws.call(ec2, "terminate_instances", InstanceIds=found["instances"])
        ctx.wait(step, lambda: cloud.instances(ec2, cfg.cluster.name), lambda xs: not xs, timeout=ctx.timings.nodegroup_s,
                 what="the cluster's instances to terminate")
        ctx.note(step, f"removed instances {', '.join(found['instances'])}")
    for nat in found["nat_gateways"]:
        aws.call(ec2, "delete_nat_gateway", NatGatewayId=nat)
        ctx.note(step, f"removed NAT gateway {nat}")
    if found["nat_gateways"]:
        ctx.wait(step, lambda: cloud.nat_gateways(ec2, cfg.cluster.name, found["vpcs"]), lambda xs: not xs,
                 timeout=ctx.timings.stack_s, what="the NAT gateways to be deleted")
    for alloc in found["addresses"]:
        aws.call(ec2, "release_address", AllocationId=alloc)
        ctx.note(step, f"released Elastic IP {alloc}")
    for name in sorted(found["stacks"], key=lambda s: s.endswith("-cluster")):  # node groups before the cluster
        _delete_stack(ctx, step, name)


def _cluster_act(ctx: Context, obs: Observation) -> None:
    step = "cluster"
    cfg = ctx.cfg
    name = cfg.cluster.name
    vpcs = list(obs.facts["found"]["vpcs"])
    desc = cloud.cluster(_eks(ctx), name)
    if desc is not None:
        try:
            ctx.tool(step, commands.delete_cluster(ctx), timeout=ctx.timings.cluster_s)
            ctx.note(step, f"removed EKS cluster {name}")
        except ToolFailed as e:
            ctx.reporter.line(step, f"eksctl did not finish ({e.message}); removing what is left")
        ctx.wait(step, lambda: cloud.cluster(_eks(ctx), name), lambda d: d is None, timeout=ctx.timings.cluster_s,
                 what=f"EKS cluster {name} to be NOT_FOUND")
    found = audit(ctx, vpcs)
    if _billing(found):
        _sweep(ctx, step, found)
    if ctx.kubeconfig.is_file() and not cfg.cluster.kubeconfig:
        ctx.kubeconfig.unlink()
        ctx.forget_kube()
        ctx.note(step, f"removed {ctx.kubeconfig}")


def _cluster_verify(ctx: Context) -> str:
    cfg = ctx.cfg
    left = _billing(audit(ctx))
    if left:
        r = cfg.cluster.region
        raise StepFailed(
            f"AWS still lists resources of cluster {cfg.cluster.name}: " + "; ".join(left),
            hint=f"remove them in the console or with `aws ec2 terminate-instances/delete-nat-gateway/release-address "
            f"--region {r}` and `aws cloudformation delete-stack --region {r}`, then re-run `raydlc down`",
        )
    return (f"AWS says: cluster {cfg.cluster.name} NOT_FOUND; no eksctl-{cfg.cluster.name}-* stack, instance, "
            "NAT gateway or Elastic IP left")


# ---------------------------------------------------------------------- capacity reservations


def _reservations(ctx: Context) -> list[dict[str, Any]]:
    return cloud.capacity_reservations(ctx.aws("ec2"), ctx.cfg.cluster.name)


def _capacity_check(ctx: Context) -> Observation:
    try:
        found = _reservations(ctx)
    except aws.UnsupportedError as e:
        return Observation("unknown", f"capacity reservations cannot be listed here ({e.message})")
    if not found:
        return _gone("no capacity reservation of raydlc is active")
    return Observation("ready", f"{len(found)} raydlc capacity reservation(s) active",
                       {"ids": [r["CapacityReservationId"] for r in found]})


def _capacity_plan(ctx: Context, obs: Observation) -> Plan:
    if obs.state != "ready":
        return Plan("none", obs.reason)
    return Plan("delete", obs.reason, tuple(f"ec2:CancelCapacityReservation {i}" for i in obs.facts["ids"]))


def _capacity_act(ctx: Context, obs: Observation) -> None:
    ec2 = ctx.aws("ec2")
    for rid in obs.facts["ids"]:
        aws.call(ec2, "cancel_capacity_reservation", CapacityReservationId=rid)
        ctx.note("capacity", f"cancelled capacity reservation {rid}")


def _capacity_verify(ctx: Context) -> str:
    try:
        left = _reservations(ctx)
    except aws.UnsupportedError as e:
        return f"not verifiable: {e.message}"
    if left:
        ids = " ".join(r["CapacityReservationId"] for r in left)
        raise StepFailed(f"capacity reservations still active: {ids}",
                         hint=f"aws ec2 cancel-capacity-reservation --capacity-reservation-id <id> --region {ctx.cfg.cluster.region}")
    return "no raydlc capacity reservation active"


def steps() -> list[Step]:
    device = _release_step("device-plugins", helm_render.nvidia_device_plugin, ("apps/v1", "DaemonSet"))
    kuberay = _release_step("kuberay", helm_render.kuberay_operator, ("apps/v1", "Deployment"))
    return [
        Step("raycluster", (), "RayCluster, RayJob, NetworkPolicies, Secret, namespace",
             _raycluster_check, _raycluster_plan, _raycluster_act, _raycluster_verify),
        Step(device.name, ("raycluster",), device.summary, device.check, device.plan, device.act, device.verify),
        Step(kuberay.name, ("raycluster",), kuberay.summary, kuberay.check, kuberay.plan, kuberay.act, kuberay.verify),
        Step("gpu-nodegroup", ("device-plugins",), "the EFA GPU node group", _gpu_check, _gpu_plan, _gpu_act, _gpu_verify),
        Step("cluster", ("gpu-nodegroup", "kuberay"), "the EKS cluster, its VPC and everything that bills",
             _cluster_check, _cluster_plan, _cluster_act, _cluster_verify),
        Step("capacity", ("cluster",), "raydlc's capacity reservations",
             _capacity_check, _capacity_plan, _capacity_act, _capacity_verify),
    ]


STEPS = steps()
