"""What raydlc does to an eksctl managed node group, for the cluster's system group and the GPU group alike.

A node group is judged by what EKS says (`eks:DescribeNodegroup`), never by eksctl's exit code;
a failed one, or the stack it left, blocks a create of the same name until both are gone.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from raydlc.lifecycle import cloud, commands
from raydlc.lifecycle.stacks import delete_stack
from raydlc.lifecycle.types import StepFailed

if TYPE_CHECKING:
    from raydlc.lifecycle.context import Context

FAILED = ("CREATE_FAILED", "DEGRADED", "DELETE_FAILED")
BUSY = ("CREATING", "UPDATING")
BLOCKING_STACKS = cloud.STALE_STACK | {"CREATE_COMPLETE"}  # what a create of the same name cannot get past


def describe(ctx: Context, ngname: str) -> dict[str, Any] | None:
    return cloud.nodegroup(ctx.aws("eks"), ctx.cfg.cluster.name, ngname)


def stack(ctx: Context, ngname: str) -> dict[str, Any] | None:
    return cloud.stack(ctx.aws("cloudformation"), cloud.nodegroup_stack(ctx.cfg.cluster.name, ngname))


def zone_of(ctx: Context, ng: dict[str, Any]) -> str | None:
    """The node group's AZ (the first, by name, of its subnets')."""
    zones = sorted(set(cloud.subnet_zones(ctx.aws("ec2"), ng.get("subnets") or []).values()))
    return zones[0] if zones else None


def launch_error(ctx: Context, ng: dict[str, Any]) -> str:
    return cloud.launch_error(ctx.aws("eks"), ctx.aws("autoscaling"), ng)


def remove(ctx: Context, step: str, ngname: str, *, stacks: Collection[str] | None = BLOCKING_STACKS) -> None:
    """Delete the node group (eksctl) and then its stack; `stacks`: the stack states to delete (None: any)."""
    ng = describe(ctx, ngname)
    if ng is not None:
        if ng.get("status") != "DELETING":
            ctx.tool(step, commands.delete_nodegroup(ctx, ngname), timeout=ctx.timings.nodegroup_s)
        ctx.wait(step, lambda: describe(ctx, ngname), lambda n: n is None,
                 timeout=ctx.timings.nodegroup_s, what=f"node group {ngname} to be deleted")
        ctx.note(step, f"removed node group {ngname}")
    st = stack(ctx, ngname)
    if st is not None and (stacks is None or st.get("StackStatus") in stacks):
        delete_stack(ctx, step, st["StackName"])


def wait_settled(ctx: Context, step: str, ngname: str, what: str = "settle") -> dict[str, Any] | None:
    """The node group once it is neither CREATING nor UPDATING (None: it is gone)."""
    return ctx.wait(step, lambda: describe(ctx, ngname), lambda n: n is None or n.get("status") not in BUSY,
                    timeout=ctx.timings.nodegroup_s, what=f"node group {ngname} to {what}",
                    explain=lambda n: f"status {n.get('status') if n else 'absent'}")


def wait_active(ctx: Context, step: str, ngname: str) -> dict[str, Any]:
    """The node group once ACTIVE; StepFailed naming the stack's or the launch's error otherwise."""
    ng = wait_settled(ctx, step, ngname, "become ACTIVE")
    if ng is None:
        st = stack(ctx, ngname)
        why = cloud.stack_failure(ctx.aws("cloudformation"), st["StackName"]) if st else ""
        raise StepFailed(f"node group {ngname} was not created" + (f": {why}" if why else ""))
    if ng.get("status") != "ACTIVE":
        err = launch_error(ctx, ng)
        raise StepFailed(f"node group {ngname} is {ng.get('status')}" + (f": {err}" if err else ""))
    return ng
