"""The cluster: the EKS control plane, its VPC, its add-ons and pod identity associations, the system
node group and raydlc's kubeconfig.

`up` creates what is missing with eksctl (a stale stack of an earlier attempt is removed first) and
is done when the API answers through raydlc's kubeconfig and the system nodes are Ready. eksctl makes
the add-ons and the pod identity associations itself after the control plane; a `create cluster` cut
short (Ctrl-C while it waits on the stack, which CloudFormation finishes) leaves them out, so they are
looked up in EKS and made here.

`down` is done only when AWS, not eksctl's exit code, lists nothing of the cluster that bills: no cluster, no
`eksctl-<name>-*` stack, instance, NAT gateway or Elastic IP; what eksctl left behind and raydlc
owns (tagged `raydlc.io/cluster=<name>`) is swept here, and anything still standing is named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raydlc.edges import aws
from raydlc.edges.tools import ToolFailed
from raydlc.errors import InputError
from raydlc.lifecycle import cloud, commands, kubeconfig, nodegroups
from raydlc.lifecycle.resource import Resource, gone, reaches, ready_nodes
from raydlc.lifecycle.stacks import delete_stack
from raydlc.lifecycle.types import Observation, StepFailed, StepPlan
from raydlc.render import FILES
from raydlc.render.eksctl import CORE_ADDONS, OWNER_TAG, association_name, pod_identity_associations
from raydlc.render.nodes import SYSTEM_ROLE

if TYPE_CHECKING:
    from raydlc.capacity.choice import ZoneChoice
    from raydlc.lifecycle.context import Context


def refuse_foreign(ctx: Context) -> None:
    """`down` deletes only a cluster raydlc made (its owner tag), unless forced: checked before any step."""
    cfg = ctx.cfg
    desc = cloud.cluster(ctx.aws("eks"), cfg.cluster.name)
    if desc is not None and not cloud.owned(desc, cfg.cluster.name) and not ctx.force:
        raise InputError(
            f"EKS cluster {cfg.cluster.name} in {cfg.cluster.region} was not created by raydlc "
            f"(it has no {OWNER_TAG}={cfg.cluster.name} tag); refusing to delete it",
            hint="check CLUSTER_NAME and REGION; pass --force to delete it anyway",
        )


class Cluster(Resource):
    name = "cluster"
    scope = "aws"
    fact = "the Kubernetes cluster and its API"
    summary = "EKS control plane, VPC, system node group, kubeconfig"
    removal = "the EKS cluster, its VPC and everything that bills"
    tools = ("eksctl",)

    def found(self, ctx: Context) -> Observation:
        from raydlc.lifecycle import attach

        return attach.found_cluster(ctx)

    def __init__(self, zones: Callable[[Context], ZoneChoice]) -> None:
        self.zones = zones  # the capacity resource's decision: the ClusterConfig's AZs

    # ------------------------------------------------------------------ up

    def look(self, ctx: Context) -> Observation:
        cfg = ctx.cfg
        name = cfg.cluster.name
        desc = cloud.cluster(ctx.aws("eks"), name)
        if desc is None:
            return self._stack_look(ctx)
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
        facts, missing = self._gaps(ctx)
        if not missing:
            kube = ctx.kube()
            ready = ready_nodes(kube, SYSTEM_ROLE)
            if len(ready) < cfg.system_nodes.count:
                return Observation("creating", f"{len(ready)}/{cfg.system_nodes.count} system nodes Ready")
            return Observation("ready", f"EKS cluster {name} ACTIVE with {len(ready)} system node(s) Ready")
        state = "creating" if facts.get("system") == "creating" and len(missing) == 1 else "degraded"
        return Observation(state, "; ".join(missing), facts)

    def _stack_look(self, ctx: Context) -> Observation:
        """No cluster: is a create under way, a delete, or is a stale stack in the way?"""
        stack_name = cloud.cluster_stack(ctx.cfg.cluster.name)
        st = cloud.stack(ctx.aws("cloudformation"), stack_name)
        if st is None:
            return Observation("absent", f"no EKS cluster {ctx.cfg.cluster.name} in {ctx.cfg.cluster.region}")
        status = st["StackStatus"]
        if status == "DELETE_IN_PROGRESS":
            return Observation("deleting", f"stack {stack_name} is DELETE_IN_PROGRESS", {"stack_deleting": True})
        if status == "CREATE_IN_PROGRESS":
            return Observation("creating", f"stack {stack_name} is CREATE_IN_PROGRESS (a create is under way)")
        return Observation("absent", f"stale stack {stack_name} ({status}) from an earlier attempt blocks a new create",
                           {"stale_stack": stack_name})

    def _gaps(self, ctx: Context) -> tuple[dict[str, Any], list[str]]:
        """An ACTIVE cluster's missing parts: the system node group, a kubeconfig that reaches the API."""
        facts: dict[str, Any] = {}
        missing: list[str] = []
        sysname = ctx.cfg.system_nodes.nodegroup_name
        sysng = nodegroups.describe(ctx, sysname)
        if sysng is None:
            missing.append(f"system node group {sysname} does not exist")
            facts["system"] = "absent"
        elif sysng.get("status") in nodegroups.BUSY:
            missing.append(f"system node group {sysname} is {sysng['status']}")
            facts["system"] = "creating"
        elif sysng.get("status") in nodegroups.FAILED:
            missing.append(f"system node group {sysname} is {sysng['status']}")
            facts["system"] = "failed"
        lacking, absent = self._made_after_control_plane(ctx)
        if lacking:
            missing.append(f"add-on(s) {', '.join(lacking)} missing")
            facts["addons"] = lacking
        if absent:
            missing.append(f"pod identity association(s) {', '.join(absent)} missing")
            facts["pod_identities"] = absent
        try:  # eksctl's exec plugin may be missing: loading the kubeconfig fails, the file stays to repair
            kube = ctx.kube_or_none()
            if kube is None:
                missing.append(f"no kubeconfig at {ctx.kubeconfig}")
                facts["kubeconfig"] = "missing"
            else:
                kube.version()
        except Exception as e:
            missing.append(f"the kubeconfig at {ctx.kubeconfig} does not reach the cluster ({e})")
            facts["kubeconfig"] = "broken"
        return facts, missing

    @staticmethod
    def _made_after_control_plane(ctx: Context) -> tuple[list[str], list[str]]:
        """(the add-ons, the pod identity associations) the config asks for that EKS does not list."""
        eks, name = ctx.aws("eks"), ctx.cfg.cluster.name
        lacking = sorted(set(CORE_ADDONS) - cloud.addons(eks, name))
        wanted = {association_name(p) for p in pod_identity_associations(ctx.cfg)}
        return lacking, sorted(wanted - cloud.pod_identities(eks, name))

    def plan_up(self, ctx: Context, obs: Observation) -> StepPlan:
        sysname = ctx.cfg.system_nodes.nodegroup_name
        f = obs.facts
        if obs.state == "ready":
            return StepPlan("none", obs.reason)
        if f.get("foreign"):
            return StepPlan("refuse", obs.reason + "; pass --force to use it anyway")
        cmds: list[str] = []
        if obs.state == "creating" and not f:
            return StepPlan("wait", obs.reason, ("eks:DescribeCluster until ACTIVE",))
        if f.get("stale_stack"):
            cmds.append(f"cloudformation:DeleteStack {f['stale_stack']} (then wait until deleted)")
        if obs.state == "deleting":
            cmds.append("eks:DescribeCluster until it is gone")
        if f.get("failed"):
            cmds.append(str(commands.delete_cluster(ctx)))
        if obs.state in ("absent", "deleting") or f.get("failed"):
            cmds += [f"write {ctx.path_of(FILES['eksctl'])}", str(commands.create_cluster(ctx)),
                     str(commands.create_nodegroup(ctx, sysname))]
            return StepPlan("replace" if f.get("stale_stack") or f.get("failed") else "create", obs.reason, tuple(cmds))
        if f.get("addons"):
            cmds += [f"write {ctx.path_of(FILES['eksctl'])}", str(commands.create_addons(ctx))]
        if f.get("pod_identities"):
            cmds += [f"write {ctx.path_of(commands.POD_IDENTITY_FILE)}", str(commands.create_pod_identities(ctx))]
        if f.get("system") == "failed":
            cmds.append(str(commands.delete_nodegroup(ctx, sysname)))
        if f.get("system") in ("absent", "failed"):
            cmds += [f"write {ctx.path_of(FILES['eksctl'])}", str(commands.create_nodegroup(ctx, sysname))]
        if f.get("system") == "creating":
            cmds.append(f"eks:DescribeNodegroup {sysname} until ACTIVE")
        if f.get("kubeconfig") in ("missing", "broken"):
            cmds.append(str(commands.write_kubeconfig(ctx)))
        return StepPlan("repair", obs.reason, tuple(cmds))

    def ensure(self, ctx: Context, obs: Observation) -> None:
        if obs.facts.get("foreign"):
            raise InputError(obs.reason, hint="choose another CLUSTER_NAME, or pass --force to let raydlc manage it")
        self._control_plane(ctx, obs)
        self._identities(ctx)
        self._system_nodes(ctx)
        self._kubeconfig(ctx)

    def _write_eksctl(self, ctx: Context) -> None:
        docs = ctx.documents("eksctl", self.zones(ctx).cluster_zones)
        ctx.write({FILES["eksctl"]: docs[FILES["eksctl"]]})

    def _control_plane(self, ctx: Context, obs: Observation) -> None:
        """An ACTIVE control plane: wait out a delete or a create under way, replace a failed one."""
        name = ctx.cfg.cluster.name
        self.zones(ctx)  # decided before anything is made, as the ClusterConfig will need it
        desc = cloud.cluster(ctx.aws("eks"), name)
        if (desc is not None and desc.get("status") == "DELETING") or obs.facts.get("stack_deleting"):
            self._wait(ctx, gone=True)
            desc = None
        if desc is not None and desc.get("status") == "FAILED":
            ctx.tool(self.name, commands.delete_cluster(ctx), timeout=ctx.timings.cluster_s)
            desc = None
        if desc is None:
            st = cloud.stack(ctx.aws("cloudformation"), cloud.cluster_stack(name))
            if st is not None and st.get("StackStatus") == "CREATE_IN_PROGRESS":
                desc = self._wait(ctx)
            elif st is not None:
                delete_stack(ctx, self.name, st["StackName"])
        if desc is None:
            self._write_eksctl(ctx)
            ctx.tool(self.name, commands.create_cluster(ctx), timeout=ctx.timings.cluster_s)
            ctx.forget_kube()
        desc = self._wait(ctx)
        if desc is None or desc.get("status") != "ACTIVE":
            raise StepFailed(f"EKS cluster {name} is {desc.get('status') if desc else 'absent'} after create",
                             hint="see the stack's events: aws cloudformation describe-stack-events "
                             f"--stack-name {cloud.cluster_stack(name)}")

    def _identities(self, ctx: Context) -> None:
        """What `create cluster` makes after the control plane, when a create was cut short: the add-ons (the
        pod identity agent among them), then each missing association. A role stack made before the cut
        would fail eksctl's CreateStack, so it goes first."""
        lacking, absent = self._made_after_control_plane(ctx)
        if lacking:
            self._write_eksctl(ctx)
            ctx.tool(self.name, commands.create_addons(ctx), timeout=ctx.timings.cluster_s)
        if not absent:
            return
        cfn, name = ctx.aws("cloudformation"), ctx.cfg.cluster.name
        for association in absent:
            st = cloud.stack(cfn, cloud.pod_identity_stack(name, association))
            if st is not None:
                delete_stack(ctx, self.name, st["StackName"])
        doc = ctx.documents("eksctl", self.zones(ctx).cluster_zones)[FILES["eksctl"]]
        only = [p for p in doc["iam"]["podIdentityAssociations"] if association_name(p) in absent]
        ctx.write({commands.POD_IDENTITY_FILE: {**doc, "iam": {**doc["iam"], "podIdentityAssociations": only}}})
        ctx.tool(self.name, commands.create_pod_identities(ctx), timeout=ctx.timings.cluster_s)

    def _system_nodes(self, ctx: Context) -> None:
        sysname = ctx.cfg.system_nodes.nodegroup_name
        ng = nodegroups.describe(ctx, sysname)
        if ng is None or ng.get("status") in nodegroups.FAILED:
            nodegroups.remove(ctx, self.name, sysname)
            self._write_eksctl(ctx)
            ctx.tool(self.name, commands.create_nodegroup(ctx, sysname), timeout=ctx.timings.nodegroup_s)
        nodegroups.wait_active(ctx, self.name, sysname)

    def _kubeconfig(self, ctx: Context) -> None:
        """raydlc's own kubeconfig for the cluster, with raydlc's token plugin; rewritten unless it reaches the API."""
        self._own_credentials(ctx)
        kube = ctx.kube_or_none()
        if kube is None or not reaches(kube):
            ctx.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
            ctx.tool(self.name, commands.write_kubeconfig(ctx))
            self._own_credentials(ctx)
            ctx.forget_kube()

    def _own_credentials(self, ctx: Context) -> None:
        """eksctl's exec plugin (aws-iam-authenticator or `aws`, installed or not) becomes `raydlc eks-token`."""
        c = ctx.cfg.cluster
        if ctx.kubeconfig.is_file() and kubeconfig.use_raydlc_credentials(ctx.kubeconfig, c.name, c.region):
            ctx.reporter.line(self.name, f"{ctx.kubeconfig}: tokens now come from `raydlc eks-token`")
            ctx.forget_kube()

    def _wait(self, ctx: Context, gone: bool = False) -> dict[str, Any] | None:
        name = ctx.cfg.cluster.name
        eks, cfn = ctx.aws("eks"), ctx.aws("cloudformation")
        if gone:
            ctx.wait(self.name, lambda: (cloud.cluster(eks, name), cloud.stack(cfn, cloud.cluster_stack(name))),
                     lambda t: t[0] is None and (t[1] is None or t[1].get("StackStatus") != "DELETE_IN_PROGRESS"),
                     timeout=ctx.timings.cluster_s, what=f"cluster {name} to be deleted")
            return None
        return ctx.wait(self.name, lambda: cloud.cluster(eks, name),
                        lambda d: d is not None and d.get("status") in ("ACTIVE", "FAILED"),
                        timeout=ctx.timings.cluster_s, what=f"EKS cluster {name} to become ACTIVE",
                        explain=lambda d: f"status {d.get('status') if d else 'absent'}")

    def kept(self, ctx: Context) -> str:
        cfg = ctx.cfg
        desc = cloud.cluster(ctx.aws("eks"), cfg.cluster.name)
        if desc is None or desc.get("status") != "ACTIVE":
            raise StepFailed(f"EKS cluster {cfg.cluster.name} is {desc.get('status') if desc else 'absent'}")
        if not cloud.owned(desc, cfg.cluster.name) and not ctx.force:
            raise StepFailed(f"EKS cluster {cfg.cluster.name} lacks the {OWNER_TAG} tag")
        kube = ctx.kube()
        version = kube.version()
        want = cfg.system_nodes.count
        ready = ctx.wait(self.name, lambda: ready_nodes(kube, SYSTEM_ROLE), lambda ns: len(ns) >= want,
                         timeout=ctx.timings.nodes_s, what=f"{want} system node(s) Ready",
                         explain=lambda ns: f"{len(ns)}/{want} Ready")
        return (f"EKS {desc.get('version', '?')} ACTIVE, API {version} reached through {ctx.kubeconfig}; "
                f"{len(ready)} system node(s) Ready")

    # ------------------------------------------------------------------ down

    def left(self, ctx: Context) -> Observation:
        found = _audit(ctx)
        left = _billing(found)
        if not left and not found["vpcs"]:
            return gone(f"AWS lists nothing of cluster {ctx.cfg.cluster.name}: no cluster, stack, instance, "
                        "NAT gateway or Elastic IP")
        return Observation("ready", "present: " + "; ".join(left or [f"vpcs: {', '.join(found['vpcs'])}"]),
                           {"found": found})

    def plan_down(self, ctx: Context, obs: Observation) -> StepPlan:
        if obs.state == "absent":
            return StepPlan("none", obs.reason)
        found = obs.facts["found"]
        cmds = [str(commands.delete_cluster(ctx))] if found["cluster"] else []
        cmds.append("then, for whatever AWS still lists tagged " + f"{OWNER_TAG}={ctx.cfg.cluster.name}: "
                    "cloudformation:DeleteStack, ec2:TerminateInstances, ec2:DeleteNatGateway, ec2:ReleaseAddress")
        return StepPlan("delete", obs.reason, tuple(cmds))

    def remove(self, ctx: Context, obs: Observation) -> None:
        cfg = ctx.cfg
        name = cfg.cluster.name
        vpcs = list(obs.facts["found"]["vpcs"])
        if cloud.cluster(ctx.aws("eks"), name) is not None:
            try:
                ctx.tool(self.name, commands.delete_cluster(ctx), timeout=ctx.timings.cluster_s)
                ctx.note(self.name, f"removed EKS cluster {name}")
            except ToolFailed as e:
                ctx.reporter.line(self.name, f"eksctl did not finish ({e.message}); removing what is left")
            ctx.wait(self.name, lambda: cloud.cluster(ctx.aws("eks"), name), lambda d: d is None,
                     timeout=ctx.timings.cluster_s, what=f"EKS cluster {name} to be NOT_FOUND")
        found = _audit(ctx, vpcs)
        if _billing(found):
            self._sweep(ctx, found)
        if ctx.kubeconfig.is_file() and not cfg.cluster.kubeconfig:
            ctx.kubeconfig.unlink()
            ctx.forget_kube()
            ctx.note(self.name, f"removed {ctx.kubeconfig}")

    def _sweep(self, ctx: Context, found: dict[str, list[str]]) -> None:
        """Remove what eksctl left behind, in dependency order; each removal is noted."""
        ec2 = ctx.aws("ec2")
        name, step = ctx.cfg.cluster.name, self.name
        if found["instances"]:
            aws.call(ec2, "terminate_instances", InstanceIds=found["instances"])
            ctx.wait(step, lambda: cloud.instances(ec2, name), lambda xs: not xs, timeout=ctx.timings.nodegroup_s,
                     what="the cluster's instances to terminate")
            ctx.note(step, f"removed instances {', '.join(found['instances'])}")
        for nat in found["nat_gateways"]:
            aws.call(ec2, "delete_nat_gateway", NatGatewayId=nat)
            ctx.note(step, f"removed NAT gateway {nat}")
        if found["nat_gateways"]:
            ctx.wait(step, lambda: cloud.nat_gateways(ec2, name, found["vpcs"]), lambda xs: not xs,
                     timeout=ctx.timings.stack_s, what="the NAT gateways to be deleted")
        for alloc in found["addresses"]:
            aws.call(ec2, "release_address", AllocationId=alloc)
            ctx.note(step, f"released Elastic IP {alloc}")
        for stack in sorted(found["stacks"], key=lambda s: s.endswith("-cluster")):  # node groups before the cluster
            delete_stack(ctx, step, stack)

    def cleared(self, ctx: Context) -> str:
        cfg = ctx.cfg
        left = _billing(_audit(ctx))
        if left:
            r = cfg.cluster.region
            raise StepFailed(
                f"AWS still lists resources of cluster {cfg.cluster.name}: " + "; ".join(left),
                hint=f"remove them in the console or with `aws ec2 terminate-instances/delete-nat-gateway/release-address "
                f"--region {r}` and `aws cloudformation delete-stack --region {r}`, then re-run `raydlc down`",
            )
        return (f"AWS says: cluster {cfg.cluster.name} NOT_FOUND; no eksctl-{cfg.cluster.name}-* stack, instance, "
                "NAT gateway or Elastic IP left")


def _audit(ctx: Context, vpc_ids: list[str] | None = None) -> dict[str, list[str]]:
    return cloud.leftovers(ctx.aws("eks"), ctx.aws("cloudformation"), ctx.aws("ec2"), ctx.cfg.cluster.name, vpc_ids)


def _billing(found: dict[str, list[str]]) -> list[str]:
    return [f"{kind}: {', '.join(ids)}" for kind, ids in found.items() if ids and kind != "vpcs"]
