"""The one way raydlc deletes a CloudFormation stack eksctl made: check it is ours, unprotect, ask, wait.

`up` deletes a stale stack that blocks a create of the same name (ROLLBACK_COMPLETE, DELETE_FAILED,
a failed node group's), `down` whatever eksctl left behind; both come here.

eksctl creates every stack with termination protection on and turns it off itself before each of
its own deletes, after checking the stack carries its cluster-name tag (`pkg/cfn/manager/api.go`,
`DoCreateStackRequest` and `DeleteStackBySpec`, v0.230.0). A raw DeleteStack of such a stack fails,
so raydlc does what eksctl does: only a stack named `eksctl-<cluster>-…` that bears eksctl's tag for
this cluster is touched, its protection is turned off, then it is deleted by its stack ID.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raydlc.edges import aws
from raydlc.lifecycle import cloud
from raydlc.lifecycle.types import StepFailed

if TYPE_CHECKING:
    from raydlc.lifecycle.context import Context

# eksctl's cluster-name tags on every stack it makes (api.ClusterNameTag, api.OldClusterNameTag).
CLUSTER_TAGS = ("alpha.eksctl.io/cluster-name", "eksctl.cluster.k8s.io/v1alpha1/cluster-name")


def ours(st: dict[str, Any], cluster: str) -> bool:
    """Whether a stack is one eksctl made for this cluster: by its name and by eksctl's tag (pure)."""
    return str(st.get("StackName", "")).startswith(f"eksctl-{cluster}-") and any(
        cloud.tag(st, key) == cluster for key in CLUSTER_TAGS)


def delete_stack(ctx: Context, step: str, name: str) -> None:
    """Delete stack `name` and wait until it is gone; DELETE_FAILED is reported with the resource that failed."""
    cfn = ctx.aws("cloudformation")
    cluster = ctx.cfg.cluster.name
    st = cloud.stack(cfn, name)
    if st is None:
        return
    if not ours(st, cluster):
        raise StepFailed(
            f"stack {name} does not bear eksctl's {CLUSTER_TAGS[0]}={cluster} tag; raydlc deletes only the stacks "
            "eksctl made for this cluster",
            hint=f"look at it: aws cloudformation describe-stacks --stack-name {name} --region {ctx.cfg.cluster.region}",
        )
    stack_id = st.get("StackId") or name
    if st.get("EnableTerminationProtection"):
        ctx.reporter.line(step, f"turning off the termination protection eksctl put on stack {name}")
        aws.call(cfn, "update_termination_protection", StackName=stack_id, EnableTerminationProtection=False)
    ctx.reporter.line(step, f"deleting stack {name}")
    aws.call(cfn, "delete_stack", StackName=stack_id)
    last = ctx.wait(step, lambda: cloud.stack(cfn, name), lambda s: s is None or s.get("StackStatus") == "DELETE_FAILED",
                    timeout=ctx.timings.stack_s, what=f"stack {name} to be deleted")
    if last is not None:
        why = cloud.stack_failure(cfn, name)
        raise StepFailed(
            f"stack {name} could not be deleted (DELETE_FAILED{': ' + why if why else ''})",
            hint=f"remove what it names, then `aws cloudformation delete-stack --stack-name {name} "
            f"--region {ctx.cfg.cluster.region}`",
        )
    ctx.note(step, f"removed stack {name}")
