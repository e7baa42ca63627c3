"""The Ray pods' S3 policy, evaluated the way IAM evaluates an identity policy, statement by statement.

Not a string comparison: each request (action, resource ARN, the `s3:prefix` of a list) is run
through every statement with IAM's matching rules — `*`/`?` wildcards in actions (case-blind)
and resources, a `Condition` of `StringLike` whose keys must all match, an explicit Deny
winning — so any widening (another action, a broader resource, a dropped condition) turns
one of the denied requests below into an allowed one and fails.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from raydlc import schemas
from raydlc.config import load_config
from raydlc.render.bucket import SERVICE_ACCOUNT, WORKER_SERVICE_ACCOUNT, Bucket, pod_policy, role_name, worker_role_name
from raydlc.render.eksctl import render_eksctl

sys.path.insert(0, str(Path(__file__).parent / "doubles"))
from s3_iam import Check, evaluate  # type: ignore[import-not-found]

B = Bucket("raydlc-123456789012-us-east-2-eks-cluster", "runs")
ARN = f"arn:aws:s3:::{B.name}"


def allowed(policy: dict[str, Any], action: str, resource: str, **context: str) -> bool:
    """IAM's decision for one identity policy (the S3 front's evaluator, tests/doubles/s3_iam.py)."""
    return evaluate(policy, Check(action, resource, {f"s3:{k}": v for k, v in context.items()}))


OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload")


@pytest.mark.parametrize("action", OBJECT_ACTIONS)
@pytest.mark.parametrize("key", ["runs/r1/checkpoint_000010/model.distcp", "runs/x", "runs/a/b/c/d"])
def test_object_actions_are_allowed_under_the_run_prefix(action: str, key: str) -> None:
    assert allowed(pod_policy(B), action, f"{ARN}/{key}")


@pytest.mark.parametrize("action", OBJECT_ACTIONS)
@pytest.mark.parametrize("resource", [
    f"{ARN}/runsX/r1/a", f"{ARN}/runsX", f"{ARN}/other/runs/a",
    "arn:aws:s3:::another-bucket/runs/r1/a", f"{ARN}x/runs/r1/a", ARN,
])
def test_object_actions_are_denied_outside_the_prefix_and_on_other_buckets(action: str, resource: str) -> None:
    assert not allowed(pod_policy(B), action, resource)


@pytest.mark.parametrize("action", OBJECT_ACTIONS)
def test_the_code_zips_are_readable_and_nothing_more(action: str) -> None:
    assert allowed(pod_policy(B), action, f"{ARN}/code/raydlc-0.1.0-0123456789ab.zip") == (action == "s3:GetObject")
    assert not allowed(pod_policy(B), action, f"{ARN}/codeX/raydlc.zip")
    assert not allowed(pod_policy(B), action, "arn:aws:s3:::another-bucket/code/raydlc.zip")


@pytest.mark.parametrize("prefix, ok", [
    ("runs/", True), ("runs/r1/", True), ("runs/r1/checkpoint_000010/", True),
    ("", False), ("code/", False), ("runsX/", False), ("other/runs/", False),
])
def test_listing_is_scoped_to_the_run_prefix(prefix: str, ok: bool) -> None:
    assert allowed(pod_policy(B), "s3:ListBucket", ARN, prefix=prefix) is ok
    assert not allowed(pod_policy(B), "s3:ListBucket", "arn:aws:s3:::another-bucket", prefix=prefix)


def test_head_bucket_is_allowed_as_s3_authorises_it_a_list_without_prefix_context() -> None:
    """HeadBucket is `s3:ListBucket` with no `s3:prefix`: pyarrow's create_dir(recursive) needs it (and S3's 404)."""
    assert allowed(pod_policy(B), "s3:ListBucket", ARN)
    assert not allowed(pod_policy(B), "s3:ListBucket", "arn:aws:s3:::another-bucket")


@pytest.mark.parametrize("action", OBJECT_ACTIONS)
def test_the_key_of_the_prefix_itself_can_be_headed_and_nothing_more(action: str) -> None:
    """get_file_info("bucket/runs") heads the key `runs` before it lists `runs/`."""
    assert allowed(pod_policy(B), action, f"{ARN}/runs") == (action == "s3:GetObject")


@pytest.mark.parametrize("action", [
    "s3:DeleteBucket", "s3:PutBucketPolicy", "s3:PutBucketAcl", "s3:PutObjectAcl", "s3:GetBucketPolicy",
    "s3:ListAllMyBuckets", "s3:PutLifecycleConfiguration", "s3:CreateBucket", "s3:GetObjectVersion",
    "s3:DeleteObjectVersion", "iam:PassRole", "sts:AssumeRole", "ec2:RunInstances",
])
def test_nothing_else_is_allowed_anywhere(action: str) -> None:
    for resource in (ARN, f"{ARN}/runs/r1/a", "*"):
        assert not allowed(pod_policy(B), action, resource, prefix="runs/")


def test_the_evaluator_itself_turns_a_widened_policy_into_an_allowed_request() -> None:
    """The tests above can fail: each widening they guard against is caught."""
    wide_resource = pod_policy(B)
    wide_resource["Statement"][1]["Resource"] = [f"{ARN}/*"]
    assert allowed(wide_resource, "s3:PutObject", f"{ARN}/code/raydlc.zip")
    wide_action = pod_policy(B)
    wide_action["Statement"][1]["Action"] = ["s3:*"]
    assert allowed(wide_action, "s3:PutObjectAcl", f"{ARN}/runs/r1/a")
    no_condition = pod_policy(B)
    del no_condition["Statement"][0]["Condition"]
    assert allowed(no_condition, "s3:ListBucket", ARN, prefix="")
    strict = pod_policy(B)
    strict["Statement"][0]["Condition"] = {"StringLike": strict["Statement"][0]["Condition"]["StringLikeIfExists"]}
    assert not allowed(strict, "s3:ListBucket", ARN)  # the policy issue 32 found: HeadBucket refused


def test_the_rendered_cluster_config_grants_this_policy_to_the_ray_pods_service_account(tmp_path) -> None:
    cfg = load_config(env={}, overrides={"STORAGE_PATH": f"s3://{B.name}/runs"}, cwd=tmp_path)
    cc = render_eksctl(cfg, ["us-east-2a", "us-east-2b"])
    assert schemas.problems(cc) == []
    # the Ray pods' association; the Cluster Autoscaler's (IDLE_MINUTES > 0) is in tests/test_autoscale.py
    # the head's service account and the workers' each get an association, a role of their own and this policy
    head, worker = [a for a in cc["iam"]["podIdentityAssociations"] if a["namespace"] == "ray-train"]
    assert (head["namespace"], head["serviceAccountName"], head["createServiceAccount"]) == ("ray-train", SERVICE_ACCOUNT, True)
    assert (worker["serviceAccountName"], worker["createServiceAccount"]) == (WORKER_SERVICE_ACCOUNT, True)
    assert head["roleName"] == role_name(cfg) == "raydlc-eks-cluster-us-east-2-ray" and len(head["roleName"]) <= 64
    assert worker["roleName"] == worker_role_name(cfg) == "raydlc-eks-cluster-us-east-2-ray-worker"
    for pia in (head, worker):
        assert pia["permissionPolicy"] == pod_policy(B) and "permissionPolicyARNs" not in pia and "wellKnownPolicies" not in pia
    assert {a["name"] for a in cc["addons"]} >= {"eks-pod-identity-agent"}  # the agent that serves the association
