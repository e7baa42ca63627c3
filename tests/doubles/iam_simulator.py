"""IAM's policy simulator (iam:SimulatePrincipalPolicy), which moto 5.2 does not implement, as a botocore handler.

It evaluates the identity-based policies moto's IAM holds for the principal — a user's inline and attached managed
policies (and its groups'), a role's inline and attached ones — as IAM's evaluation logic does for one account:
an explicit Deny wins, else an Allow whose Action and Resource patterns match (`*` and `?` wildcards; actions
case-insensitive), else implicitDeny (AWS IAM User Guide, "Policy evaluation logic"; IAM API reference,
SimulatePrincipalPolicy: EvalActionName, EvalResourceName, EvalDecision allowed/explicitDeny/implicitDeny).
Not modelled: Condition blocks (a statement with one is taken not to apply), NotAction/NotResource, permission
boundaries, SCPs, resource policies. The caller is taken to be the principal (raydlc simulates itself): a
principal whose policies do not allow iam:SimulatePrincipalPolicy on its own ARN, or one moto's IAM does not hold,
gets AccessDenied, as a caller who may not simulate gets from IAM.
"""

from __future__ import annotations

import fnmatch
import json
import urllib.parse
from collections.abc import Callable
from typing import Any


def _list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _doc(doc: Any) -> dict[str, Any]:
    if isinstance(doc, str):
        doc = json.loads(urllib.parse.unquote(doc))
    return dict(doc)


def decide(policies: list[dict[str, Any]], action: str, resource: str) -> str:
    allowed = False
    for policy in policies:
        for st in _list_statements(policy):
            if "Condition" in st or "NotAction" in st or "NotResource" in st:
                continue
            if not any(fnmatch.fnmatchcase(action.lower(), p.lower()) for p in _list(st.get("Action"))):
                continue
            if not any(fnmatch.fnmatchcase(resource, p) for p in _list(st.get("Resource"))):
                continue
            if st.get("Effect") == "Deny":
                return "explicitDeny"
            allowed = True
    return "allowed" if allowed else "implicitDeny"


def _list_statements(policy: dict[str, Any]) -> list[dict[str, Any]]:
    st = policy.get("Statement") or []
    return [st] if isinstance(st, dict) else list(st)


def _managed(iam: Any, attached: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for a in attached:
        pol = iam.get_policy(PolicyArn=a["PolicyArn"])["Policy"]
        out.append(_doc(iam.get_policy_version(PolicyArn=a["PolicyArn"], VersionId=pol["DefaultVersionId"])
                        ["PolicyVersion"]["Document"]))
    return out


def policies_of(iam: Any, principal: str) -> list[dict[str, Any]] | None:
    """The identity policies moto holds for a user or role ARN; None when it holds no such principal."""
    kind, _, name = principal.split(":", 5)[5].partition("/")
    name = name.rsplit("/", 1)[-1]
    try:
        if kind == "user":
            iam.get_user(UserName=name)
            docs = [_doc(iam.get_user_policy(UserName=name, PolicyName=p)["PolicyDocument"])
                    for p in iam.list_user_policies(UserName=name)["PolicyNames"]]
            docs += _managed(iam, iam.list_attached_user_policies(UserName=name)["AttachedPolicies"])
            for g in iam.list_groups_for_user(UserName=name)["Groups"]:
                gn = g["GroupName"]
                docs += [_doc(iam.get_group_policy(GroupName=gn, PolicyName=p)["PolicyDocument"])
                         for p in iam.list_group_policies(GroupName=gn)["PolicyNames"]]
                docs += _managed(iam, iam.list_attached_group_policies(GroupName=gn)["AttachedPolicies"])
            return docs
        if kind == "role":
            iam.get_role(RoleName=name)
            docs = [_doc(iam.get_role_policy(RoleName=name, PolicyName=p)["PolicyDocument"])
                    for p in iam.list_role_policies(RoleName=name)["PolicyNames"]]
            return docs + _managed(iam, iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"])
    except iam.exceptions.NoSuchEntityException:
        return None
    return None


def handlers(make_iam: Callable[[], Any], calls: list[dict[str, Any]] | None = None) -> dict[str, Callable[..., Any]]:
    """botocore events answering SimulatePrincipalPolicy from moto's IAM (`make_iam`: a client with moto's own keys)."""
    from botocore.awsrequest import AWSResponse

    asked: dict[str, Any] = {}

    def record(params: dict[str, Any], **kw: Any) -> None:
        asked.clear()
        asked.update(params)
        if calls is not None:
            calls.append(dict(params))

    def answer(**kw: Any) -> Any:
        principal = asked["PolicySourceArn"]
        policies = policies_of(make_iam(), principal)
        if policies is None or decide(policies, "iam:SimulatePrincipalPolicy", principal) != "allowed":
            return AWSResponse("http://stub", 403, {}, None), {
                "Error": {"Code": "AccessDenied", "Message": "User is not authorized to perform: iam:SimulatePrincipalPolicy"},
                "ResponseMetadata": {"HTTPStatusCode": 403}}
        results = [{"EvalActionName": a, "EvalResourceName": r, "EvalDecision": decide(policies, a, r)}
                   for a in asked["ActionNames"] for r in asked.get("ResourceArns") or ["*"]]
        return AWSResponse("http://stub", 200, {}, None), {"EvaluationResults": results, "IsTruncated": False,
                                                          "ResponseMetadata": {"HTTPStatusCode": 200}}

    return {"before-parameter-build.iam.SimulatePrincipalPolicy": record,
            "before-call.iam.SimulatePrincipalPolicy": answer}
