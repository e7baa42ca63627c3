"""permissions.NEEDS is what `up` and `down` call: every AWS operation raydlc's own clients send in a full `up`,
`status` and `down --delete-storage` (recorded by a botocore `before-parameter-build` hook on the clients the lifecycle
tests build, tests/lifecycle/conftest.py) maps to an action in the list, and every action the list says raydlc calls
is one some recorded call needs. eksctl's own calls and CloudFormation's resource handlers (which run with the
caller's credentials) are not raydlc's: they come from eksctl's "Minimum IAM policies" page and the resource schemas
(tests/doubles/FIDELITY.md)."""

from __future__ import annotations

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
