"""The one way raydlc deletes a CloudFormation stack eksctl made: ask, wait until AWS says it is gone.

`up` deletes a stale stack that blocks a create of the same name (ROLLBACK_COMPLETE, DELETE_FAILED,
a failed node group's), `down` whatever eksctl left behind; both come here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raydlc import aws
from raydlc.lifecycle import cloud
from raydlc.lifecycle.types import StepFailed

if TYPE_CHECKING:
    from raydlc.lifecycle.context import Context


def delete_stack(ctx: Context, step: str, name: str) -> None:
    """Delete stack `name` and wait until it is gone; DELETE_FAILED is reported with the resource that failed."""
    cfn = ctx.aws("cloudformation")
    ctx.reporter.line(step, f"deleting stack {name}")
    aws.call(cfn, "delete_stack", StackName=name)
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
