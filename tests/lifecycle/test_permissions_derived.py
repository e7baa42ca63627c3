"""permissions.NEEDS is what `up` and `down` call: every AWS operation raydlc's own clients send in a full `up`,
`status` and `down --delete-storage` (recorded by a botocore `before-parameter-build` hook on the clients the lifecycle
tests build, tests/lifecycle/conftest.py) maps to an action in the list, and every action the list says raydlc calls
is one some recorded call needs. eksctl's own calls and CloudFormation's resource handlers (which run with the
caller's credentials) are not raydlc's: they come from eksctl's "Minimum IAM policies" page and the resource schemas
(tests/doubles/FIDELITY.md)."""

from __future__ import annotations

import json
from typing import Any

from raydlc import lifecycle
from raydlc.lifecycle import Timings, permissions

FAST = Timings(poll_s=0.1, cluster_s=120, nodegroup_s=120, stack_s=120, helm_s=120, nodes_s=60, plugins_s=60, pods_s=90)

# The IAM action each operation is authorised as, where it is not `prefix:Operation` (S3 User Guide, "Required
# permissions for Amazon S3 API operations"; IAM's Service Authorization Reference). GetCallerIdentity needs none.
AUTHORISED_AS = {
    ("s3", "HeadBucket"): "s3:ListBucket", ("s3", "ListObjectsV2"): "s3:ListBucket", ("s3", "ListObjects"): "s3:ListBucket",
    ("s3", "HeadObject"): "s3:GetObject", ("s3", "ListObjectVersions"): "s3:ListBucketVersions",
    ("s3", "GetPublicAccessBlock"): "s3:GetBucketPublicAccessBlock", ("s3", "PutPublicAccessBlock"): "s3:PutBucketPublicAccessBlock",
    ("s3", "GetBucketEncryption"): "s3:GetEncryptionConfiguration", ("s3", "PutBucketEncryption"): "s3:PutEncryptionConfiguration",
    ("s3", "GetBucketLifecycleConfiguration"): "s3:GetLifecycleConfiguration",
    ("s3", "PutBucketLifecycleConfiguration"): "s3:PutLifecycleConfiguration",
    ("s3", "ListMultipartUploads"): "s3:ListBucketMultipartUploads",
    ("s3", "CreateMultipartUpload"): "s3:PutObject", ("s3", "UploadPart"): "s3:PutObject",
    ("s3", "CompleteMultipartUpload"): "s3:PutObject",
    ("servicequotas", "GetServiceQuota"): "servicequotas:GetServiceQuota",
}
NO_PERMISSION = {("sts", "GetCallerIdentity")}


def action_of(service: str, operation: str) -> str:
    return AUTHORISED_AS.get((service, operation), f"{service}:{operation}")


def _record(world: Any, run: Any) -> set[str]:
    world.operations = []
    try:
        run()
    finally:
        ops, world.operations = world.operations, None
    return {action_of(*op) for op in ops if op not in NO_PERMISSION}


def test_every_call_up_status_and_down_make_is_in_the_list_and_every_own_action_is_called(world: Any) -> None:
    cfg = world.config()
    up = _record(world, lambda: _ok(lifecycle.up(cfg, timings=FAST)))
    # every resource type the stacks `up` made hold has its handlers' permissions in the list
    stacked = _stack_types(world)
    assert "AWS::EC2::VPC" in stacked and sorted(stacked - set(permissions.CFN_HANDLERS)) == []
    status = _record(world, lambda: lifecycle.status(cfg, timings=FAST))
    bucket = world.client("s3").list_buckets()["Buckets"][0]["Name"]
    world.client("s3").create_multipart_upload(Bucket=bucket, Key="runs/r1/checkpoint_000001/big.bin")  # down aborts it
    world.reservations.append({"CapacityReservationId": "cr-0recorded", "State": "active", "InstanceType": "g6.12xlarge",
                               "Tags": [{"Key": "raydlc.io/cluster", "Value": cfg.cluster.name}]})  # down cancels it
    down = _record(world, lambda: _ok(lifecycle.down(cfg, delete_storage=True, timings=FAST)))
    granted = {a.lower() for n in (*permissions.NEEDS, permissions.SELF_CHECK) for a in n.actions}
    assert sorted(a for a in up | status | down if a.lower() not in granted) == []
    called = {a.lower() for a in up | status | down}
    # `down` is checked against its own needs: what it calls is what it asks for
    down_granted = {a.lower() for n in permissions.NEEDS if "down" in n.orders for a in n.actions}
    assert sorted(a for a in down if a.lower() not in down_granted) == []
    own = {a.lower() for n in permissions.NEEDS if n.origin == "raydlc" for a in n.actions}
    assert sorted(own - called) == []


def _ok(run: Any) -> Any:
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    return run


def _stack_types(world: Any) -> set[str]:
    cfn = world.client("cloudformation")
    types: set[str] = set()
    for stack in cfn.describe_stacks()["Stacks"]:
        body = cfn.get_template(StackName=stack["StackName"])["TemplateBody"]
        template = json.loads(body) if isinstance(body, str) else body
        types |= {r["Type"] for r in template.get("Resources", {}).values()}
    return types


def test_every_handler_permission_is_granted_to_its_steps_for_up_and_down_and_nothing_left_out_is() -> None:
    """CFN_HANDLERS (the resource schemas' create+read and delete permissions, tests/doubles/FIDELITY.md) reach the
    needs: a type's create/read actions are asked for by `up` for every step whose stacks hold it, its delete actions
    by `down`; the IAM types' actions on roles, never on `*`; what LEFT_OUT names is granted nowhere."""
    for kind, (steps, create, delete) in permissions.CFN_HANDLERS.items():
        for step in steps:
            for order, actions in (("up", create), ("down", delete)):
                granted = {a for n in permissions.needs_for([step], order) for a in n.actions}
                assert [a for a in actions if a not in granted] == [], (kind, step, order)
        assert not set(permissions.LEFT_OUT.get(kind, ())) & {*create, *delete}, kind
    granted = {a for n in permissions.NEEDS for a in n.actions}
    assert sorted(a for left in permissions.LEFT_OUT.values() for a in left if a in granted) == []
    for need in permissions.NEEDS:
        if any(a.startswith("iam:") and a != "iam:SimulatePrincipalPolicy" for a in need.actions):
            assert need.resources != ("*",), need.sid
    # what `up` no longer asks for: an action no schema of these types lists
    assert "iam:ListInstanceProfilesForRole" not in granted

