"""The identity policy `up` and `down` need, as IAM can hold it: several customer managed policies, each within IAM's
size quota (6,144 characters, white space not counted; IAM User Guide, "IAM and AWS STS quotas"), together the whole
list (raydlc.lifecycle.permissions.managed_policies).

moto 5.2 reports IAM's quotas (GetAccountSummary's PolicySizeQuota 6144) but does not enforce them on CreatePolicy,
so the size is asserted here by IAM's count; the policies are still created in moto's IAM, attached to a role, and
the permission check run as that role.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from raydlc.edges import aws
from raydlc.errors import InputError
from raydlc.lifecycle import permissions

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import iam_policy_doc

_ACCOUNT = "123456789012"
_ALL_STEPS = ["capacity", "storage", "cluster", "gpu-nodegroup"]


def _names(world: Any) -> permissions.Names:
    from raydlc.render.bucket import for_cluster

    return permissions.names_for(for_cluster(world.config(), lambda: _ACCOUNT), _ACCOUNT)


def _cfg(world: Any) -> Any:
    from raydlc.render.bucket import for_cluster

    return for_cluster(world.config(), lambda: _ACCOUNT)


def _grants(statements: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(action, resource, condition) for every statement: what a policy allows, regardless of how it is cut."""
    return {(a, r, json.dumps(st.get("Condition"), sort_keys=True)) for st in statements for a in st["Action"]
            for r in st["Resource"]}


_LONG = permissions.Names(account=_ACCOUNT, region="ap-southeast-2", cluster="c" * 100, bucket="b" * 63,
                          pod_roles=tuple(f"{'r' * 60}-{i}" for i in range(3)))


@pytest.mark.parametrize("long_names", [False, True], ids=["docs-placeholders", "longest-names"])
def test_each_managed_policy_is_within_iams_size_quota_and_together_they_grant_exactly_the_needs(long_names: bool) -> None:
    names = _LONG if long_names else iam_policy_doc.PLACEHOLDERS
    whole = permissions.minimal_policy(names)
    assert permissions.iam_size(whole) > permissions.POLICY_SIZE_QUOTA  # why it is split at all
    split = permissions.managed_policies(names)
    assert split == permissions.managed_policies(names)  # deterministic
    assert 1 < len(split) <= permissions.ATTACHED_POLICIES_QUOTA
    policy_names = [n for n, _ in split]
    assert len(set(policy_names)) == len(split)
    assert all(len(n) <= permissions.POLICY_NAME_MAX and n.startswith("raydlc-") for n in policy_names)
    for name, doc in split:
        assert permissions.iam_size(doc) <= permissions.POLICY_SIZE_QUOTA, name
        assert permissions.iam_size(doc) == len(json.dumps(doc, separators=(",", ":")))  # no white space inside values
    # every statement whole, in exactly one policy: a condition stays with its actions
    by_sid = {st["Sid"]: st for st in whole["Statement"]}
    placed = [st for _, doc in split for st in doc["Statement"]]
    assert sorted(st["Sid"] for st in placed) == sorted(by_sid)
    assert all(st == by_sid[st["Sid"]] for st in placed)
    # the union of the split policies' actions is the unsplit needs' actions, and their grants are the same
    needs_actions = {a for n in (*permissions.NEEDS, permissions.SELF_CHECK) for a in n.actions}
    assert {a for st in placed for a in st["Action"]} == needs_actions
    assert _grants(placed) == _grants(whole["Statement"])


def test_the_policies_follow_their_purposes() -> None:
    split = dict(permissions.managed_policies(iam_policy_doc.PLACEHOLDERS))
    sids = {name.rsplit("-", 1)[1]: {st["Sid"] for st in doc["Statement"]} for name, doc in split.items()}
    assert list(sids) == list(permissions.PURPOSES)
    assert sids["down"] == {n.sid for n in permissions.NEEDS if n.orders == ("down",)}
    assert {"DeleteBucket", "DeleteObjects", "DeleteStacks", "DeleteNetwork", "DownReads"} <= sids["down"]
    assert sids["storage"] == {"Bucket", "CodeZips"}
    assert {"StackNodeGroups", "NodeRoles", "PassNodeRoles", "CapacityReads"} <= sids["nodegroups"]
    assert {"EksctlPassRoles", "PassPodIdentityRoles", "PodIdentityRoles"} <= sids["identities"]


def test_a_purpose_too_long_for_one_policy_is_numbered_not_cut_inside_a_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(permissions, "POLICY_SIZE_QUOTA", 2000)
    names = dataclasses.replace(_LONG, cluster="c" * 40)
    split = permissions.managed_policies(names)
    cut = [n.rsplit("-", 2)[-2:] for n, _ in split]
    assert ["down", "1"] in cut and ["down", "2"] in cut
    assert all(permissions.iam_size(d) <= 2000 for _, d in split)
    whole = permissions.minimal_policy(names)
    assert _grants([st for _, d in split for st in d["Statement"]]) == _grants(whole["Statement"])


def _as_role_with(world: Any, policies: list[tuple[str, dict[str, Any]]]) -> tuple[str, list[str]]:
    """A role with every policy created in moto's IAM and attached, whose session the test then runs as."""
    iam = world.client("iam")
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"AWS": f"arn:aws:iam::{_ACCOUNT}:root"}}]}
    role = iam.create_role(RoleName="raydlc-operator", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    arns = []
    for name, doc in policies:
        arn = iam.create_policy(PolicyName=name, PolicyDocument=json.dumps(doc))["Policy"]["Arn"]
        iam.attach_role_policy(RoleName="raydlc-operator", PolicyArn=arn)
        arns.append(arn)
    creds = world.client("sts").assume_role(RoleArn=role["Arn"], RoleSessionName="alice")["Credentials"]
    world.monkeypatch.setenv("AWS_ACCESS_KEY_ID", creds["AccessKeyId"])
    world.monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", creds["SecretAccessKey"])
    world.monkeypatch.setenv("AWS_SESSION_TOKEN", creds["SessionToken"])
    return str(role["Arn"]), arns


def test_a_role_with_the_managed_policies_attached_passes_up_and_downs_check(world: Any) -> None:
    split = permissions.managed_policies(_names(world))
    role, arns = _as_role_with(world, split)
    attached = world.client("iam").list_attached_role_policies(RoleName="raydlc-operator")["AttachedPolicies"]
    assert sorted(a["PolicyName"] for a in attached) == sorted(n for n, _ in split)
    for name, doc in split:  # moto holds each document as given
        arn = next(a for a in arns if a.endswith(f"/{name}"))
        version = world.client("iam").get_policy_version(PolicyArn=arn, VersionId="v1")["PolicyVersion"]["Document"]
        stored = json.loads(version) if isinstance(version, str) else version
        assert stored == doc
    for order in ("up", "down"):
        said: list[str] = []
        permissions.check(aws.session("us-east-2"), _cfg(world), _ALL_STEPS, said.append, order=order)
        assert said == [f"IAM's policy simulator allows {role} every action {order} needs"]
    # without the down policy, down is refused, naming what it lacks; up still passes
    down_arn = next(a for a in arns if a.endswith("-down"))
    world.client("iam").detach_role_policy(RoleName="raydlc-operator", PolicyArn=down_arn)
    said = []
    permissions.check(aws.session("us-east-2"), _cfg(world), _ALL_STEPS, said.append, order="up")
    assert said == [f"IAM's policy simulator allows {role} every action up needs"]
    with pytest.raises(InputError) as e:
        permissions.check(aws.session("us-east-2"), _cfg(world), _ALL_STEPS, said.append, order="down")
    assert f"{role} lacks" in e.value.message and "s3:DeleteBucket on arn:aws:s3:::" in e.value.message


def test_moto_reports_the_size_quota_the_split_keeps_to(world: Any) -> None:
    summary = world.client("iam").get_account_summary()["SummaryMap"]
    assert summary["PolicySizeQuota"] == permissions.POLICY_SIZE_QUOTA
    assert summary["AttachedPoliciesPerRoleQuota"] == permissions.ATTACHED_POLICIES_QUOTA
    assert summary["AttachedPoliciesPerUserQuota"] == permissions.ATTACHED_POLICIES_QUOTA


def test_the_docs_show_each_policy_with_its_name_and_the_commands_that_attach_them() -> None:
    text = iam_policy_doc.text()
    for name, doc in permissions.managed_policies(iam_policy_doc.PLACEHOLDERS):
        assert f"aws iam create-policy --policy-name {name} --policy-document file://{name}.json" in text
        assert f"--policy-arn arn:aws:iam::<account_id>:policy/{name}" in text
        assert f"`{name}` ({permissions.iam_size(doc):,} characters" in text
        assert json.dumps(doc, indent=2) in text
    assert json.dumps(permissions.minimal_policy(iam_policy_doc.PLACEHOLDERS), indent=2) not in text  # not the whole, unattachable one


def test_long_names_are_capped_within_iams_policy_name_quota() -> None:
    names = dataclasses.replace(_LONG, cluster="x" * 128)
    assert all(len(n) <= 128 for n, _ in permissions.managed_policies(names))
