"""`up` checks the caller's identity with IAM's policy simulator before it makes anything (raydlc.lifecycle.permissions).

moto has no SimulatePrincipalPolicy: tests/doubles/iam_simulator.py answers it from the policies moto's IAM holds
for the caller (a user made here, with access keys of its own, so that sts:GetCallerIdentity names it).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from raydlc import lifecycle
from raydlc.cli import main
from raydlc.edges import aws
from raydlc.errors import InputError
from raydlc.lifecycle import permissions
from raydlc.lifecycle.types import Reporter


def _as_user(world: Any, name: str, policy: dict[str, Any]) -> str:
    """An IAM user holding `policy`, whose keys the test then runs with; its ARN."""
    iam = world.client("iam")
    user = iam.create_user(UserName=name)["User"]
    iam.put_user_policy(UserName=name, PolicyName="up", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    world.monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    world.monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    return str(user["Arn"])


def _policy(world: Any, without: str = "") -> dict[str, Any]:
    cfg = world.config()
    from raydlc.render.bucket import for_cluster

    names = permissions.names_for(for_cluster(cfg, lambda: "123456789012"), "123456789012")
    doc = permissions.minimal_policy(names)
    for st in doc["Statement"]:
        st["Action"] = [a for a in st["Action"] if a != without]
    doc["Statement"] = [st for st in doc["Statement"] if st["Action"]]
    return doc


def _nothing_made(world: Any) -> None:
    assert world.client("s3").list_buckets()["Buckets"] == []
    assert world.client("cloudformation").list_stacks()["StackSummaries"] == []
    assert world.client("eks").list_clusters()["clusters"] == []
    assert world.mutating_calls() == []


def test_up_as_an_identity_without_pass_role_fails_before_anything_is_made_naming_the_action(
        world: Any, capsys: pytest.CaptureFixture[str]) -> None:
    arn = _as_user(world, "narrow", _policy(world, without="iam:PassRole"))
    assert main(["up"]) == 2
    err = capsys.readouterr().err
    assert f"{arn} lacks" in err and "iam:PassRole on arn:aws:iam::123456789012:role/raydlc-eks-cluster-us-east-2-ray" in err
    assert "iam:PassRole on arn:aws:iam::123456789012:role/eksctl-eks-cluster-*" in err
    assert "iam:CreateRole" not in err and "s3:" not in err  # only what is missing is named
    _nothing_made(world)
    (asked, *_) = world.simulations
    assert asked["PolicySourceArn"] == arn


def test_the_minimal_policy_passes_the_check(world: Any) -> None:
    _as_user(world, "enough", _policy(world))
    said: list[str] = []
    cfg = world.config()
    from raydlc.render.bucket import for_cluster

    cfg = for_cluster(cfg, lambda: "123456789012")
    permissions.check(aws.session("us-east-2"), cfg, ["storage", "cluster", "gpu-nodegroup"], said.append)
    assert said == ["IAM's policy simulator allows arn:aws:iam::123456789012:user/enough every action up needs"]
    with pytest.raises(InputError) as e:  # the same user without one statement is refused, naming its actions
        narrow = _policy(world)
        narrow["Statement"] = [s for s in narrow["Statement"] if s["Sid"] != "Bucket"]
        world.client("iam").put_user_policy(UserName="enough", PolicyName="up", PolicyDocument=json.dumps(narrow))
        permissions.check(aws.session("us-east-2"), cfg, ["storage"], said.append)
    named = e.value.message.split("needs: ", 1)[1]
    assert "s3:CreateBucket on arn:aws:s3:::" in named and "iam:" not in named


def test_a_caller_who_may_not_simulate_is_told_once_and_up_goes_on(world: Any) -> None:
    _as_user(world, "blind", _policy(world, without="iam:SimulatePrincipalPolicy"))
    said: list[str] = []
    run = lifecycle.up(world.config(), only="storage", reporter=_Lines(said))
    assert run.ok, [(r.step, r.reason) for r in run.failed]
    notices = [s for s in said if "permissions" in s]
    assert notices == ["arn:aws:iam::123456789012:user/blind may not run iam:SimulatePrincipalPolicy, so up cannot "
                       "check its permissions first; going on"]
    assert world.client("s3").list_buckets()["Buckets"]


def test_assumed_role_sessions_are_simulated_as_their_role() -> None:
    assert aws.principal_arn("arn:aws:sts::123456789012:assumed-role/Admin/alice") == "arn:aws:iam::123456789012:role/Admin"
    assert aws.principal_arn("arn:aws:iam::123456789012:user/ops/bob") == "arn:aws:iam::123456789012:user/ops/bob"
    assert aws.principal_arn("arn:aws:iam::123456789012:root") is None
    assert aws.principal_arn("arn:aws:sts::123456789012:federated-user/carol") is None


class _Lines(Reporter):
    def __init__(self, out: list[str]) -> None:
        self.out = out

    def line(self, step: str, text: str) -> None:
        self.out.append(text)


def _cfg(world: Any) -> Any:
    from raydlc.render.bucket import for_cluster

    return for_cluster(world.config(), lambda: "123456789012")


def test_pass_role_scoped_to_eks_by_passed_to_service_passes_and_to_another_service_is_refused(world: Any) -> None:
    """AWS's recommended PassRole statement (Condition iam:PassedToService) passes: the check gives the simulator the
    context the real CreateCluster/CreateNodegroup/CreatePodIdentityAssociation requests carry."""
    policy = _policy(world)
    passing = [st for st in policy["Statement"] if "iam:PassRole" in st["Action"]]
    # eksctl's roles (cluster, nodes) go to EKS; the pod identity roles to EKS Pod Identity (pods.eks.amazonaws.com)
    to = {st["Sid"]: st["Condition"]["StringEquals"]["iam:PassedToService"] for st in passing}
    assert to == {"EksctlPassRoles": "eks.amazonaws.com", "PassPodIdentityRoles": "pods.eks.amazonaws.com",
                  "PassNodeRoles": "eks.amazonaws.com"}
    _as_user(world, "scoped", policy)
    said: list[str] = []
    permissions.check(aws.session("us-east-2"), _cfg(world), ["storage", "cluster", "gpu-nodegroup"], said.append)
    assert said == ["IAM's policy simulator allows arn:aws:iam::123456789012:user/scoped every action up needs"]
    entries = [{e["ContextKeyName"]: e["ContextKeyValues"] for e in s.get("ContextEntries", [])} for s in world.simulations
               if "iam:PassRole" in s["ActionNames"]]
    assert sorted({e["iam:PassedToService"][0] for e in entries}) == ["eks.amazonaws.com", "pods.eks.amazonaws.com"]
    for st in passing:
        st["Condition"] = {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    world.client("iam").put_user_policy(UserName="scoped", PolicyName="up", PolicyDocument=json.dumps(policy))
    with pytest.raises(InputError) as e:
        permissions.check(aws.session("us-east-2"), _cfg(world), ["cluster"], said.append)
    assert "iam:PassRole on arn:aws:iam::123456789012:role/eksctl-eks-cluster-*" in e.value.message
    assert "iam:PassRole on arn:aws:iam::123456789012:role/raydlc-eks-cluster-us-east-2-ray" in e.value.message
    assert "--skip-permission-check" in (e.value.hint or "")


def test_a_condition_the_check_cannot_supply_is_cannot_tell_not_denied(world: Any) -> None:
    """A statement that asks for MFA (aws:MultiFactorAuthPresent, which the check cannot know for the real calls):
    the simulator names the key in MissingContextValues; `up` says it cannot tell and goes on."""
    policy = _policy(world)
    for st in policy["Statement"]:
        if st["Sid"] == "Bucket":
            st["Condition"] = {"Bool": {"aws:MultiFactorAuthPresent": "true"}}
    _as_user(world, "mfa", policy)
    said: list[str] = []
    permissions.check(aws.session("us-east-2"), _cfg(world), ["storage"], said.append)
    (line,) = said
    assert line.startswith("IAM's policy simulator cannot tell whether arn:aws:iam::123456789012:user/mfa may do ")
    assert "s3:CreateBucket on arn:aws:s3:::" in line and "(its policy asks for aws:MultiFactorAuthPresent)" in line
    assert "s3:ListBucket on" not in line  # another statement (DeleteBucket's) allows it without a condition
    assert line.endswith("; going on")


def test_skip_permission_check_is_a_flag_of_up_and_down(world: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _as_user(world, "nothing", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "iam:SimulatePrincipalPolicy", "Resource": "*"}]})
    assert main(["up", "--only", "storage"]) == 2
    assert "--skip-permission-check" in capsys.readouterr().err
    world.simulations.clear()
    said: list[str] = []
    cfg = world.config(RAYDLC_SKIP_PERMISSION_CHECK="true")
    permissions.check(aws.session("us-east-2"), cfg, ["storage"], said.append)
    assert said == ["not checking the caller's permissions for up (SKIP_PERMISSION_CHECK)"] and world.simulations == []
    from typer.testing import CliRunner

    from raydlc.cli import app

    for command in ("up", "down"):
        assert "--skip-permission-check" in CliRunner().invoke(app, [command, "--help"], terminal_width=200).output


def test_down_checks_its_own_needs_before_it_deletes_anything(world: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """An identity that may make the bucket but not delete it: `down --delete-storage` is refused naming
    s3:DeleteBucket and s3:DeleteObjectVersion, and the bucket is still there."""
    assert lifecycle.up(world.config(), only="storage").ok
    (bucket,) = [b["Name"] for b in world.client("s3").list_buckets()["Buckets"]]
    policy = _policy(world)
    policy["Statement"] = [st for st in policy["Statement"] if st["Sid"] not in ("DeleteBucket", "DeleteObjects")]
    _as_user(world, "maker", policy)
    assert main(["down", "--delete-storage", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "lacks" in err and "`down` needs" in err
    assert f"s3:DeleteBucket on arn:aws:s3:::{bucket}" in err and f"s3:DeleteObjectVersion on arn:aws:s3:::{bucket}/*" in err
    assert [b["Name"] for b in world.client("s3").list_buckets()["Buckets"]] == [bucket]
