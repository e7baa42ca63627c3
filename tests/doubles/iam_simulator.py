"""IAM's policy simulator (iam:SimulatePrincipalPolicy), which moto 5.2 does not implement, as a botocore handler.

It evaluates the identity-based policies moto's IAM holds for the principal — a user's inline and attached managed
policies (and its groups'), a role's inline and attached ones — as IAM's evaluation logic does for one account:
an explicit Deny wins, else an Allow whose Action and Resource patterns match (`*` and `?` wildcards; actions
case-insensitive), else implicitDeny (AWS IAM User Guide, "Policy evaluation logic"; IAM API reference,
SimulatePrincipalPolicy: EvalActionName, EvalResourceName, EvalDecision allowed/explicitDeny/implicitDeny).
Condition blocks are evaluated against the request's ContextEntries for the operators StringEquals, StringLike,
StringNotEquals, StringNotLike and Bool (keys case-insensitive, values as given; several values of one key: any
matches): a key the request did not carry makes the condition false and is named in MissingContextValues, as IAM's
simulator does ("A list of context keys that are required by the included input policies but that were not provided
by one of the input parameters"); any other operator makes the statement not apply. The answer has IAM's current
shape: one EvaluationResult per action, its ResourceSpecificResults one per resource (EvalResourceName,
EvalResourceDecision, MissingContextValues), the top-level EvalDecision the most restrictive. Not modelled:
NotAction/NotResource, permission boundaries, SCPs, resource policies. The caller is taken to be the principal (raydlc simulates itself): a
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


_OPERATORS = {
    "stringequals": lambda have, want: have == want,
    "stringnotequals": lambda have, want: have != want,
    "stringlike": fnmatch.fnmatchcase,
    "stringnotlike": lambda have, want: not fnmatch.fnmatchcase(have, want),
    "bool": lambda have, want: have.lower() == want.lower(),
}


def _condition_holds(condition: dict[str, Any], context: dict[str, list[str]], missing: set[str]) -> bool:
    """Every operator's every key holds (IAM: AND across them, OR across a key's values)."""
    for operator, keys in condition.items():
        test = _OPERATORS.get(operator.lower())
        if test is None:
            return False
        for key, wanted in keys.items():
            have = context.get(key.lower())
            if have is None:
                missing.add(key)
                return False
            if not any(test(h, w) for h in have for w in _list(wanted)):
                return False
    return True


def decide(policies: list[dict[str, Any]], action: str, resource: str,
           context: dict[str, list[str]] | None = None) -> tuple[str, list[str]]:
    """(decision, the condition keys that were needed and not given)."""
    allowed = False
    missing: set[str] = set()
    for policy in policies:
        for st in _list_statements(policy):
            if "NotAction" in st or "NotResource" in st:
                continue
            if not any(fnmatch.fnmatchcase(action.lower(), p.lower()) for p in _list(st.get("Action"))):
                continue
            if not any(fnmatch.fnmatchcase(resource, p) for p in _list(st.get("Resource"))):
                continue
            if "Condition" in st and not _condition_holds(st["Condition"], context or {}, missing):
                continue
            if st.get("Effect") == "Deny":
                return "explicitDeny", []
            allowed = True
    return ("allowed", []) if allowed else ("implicitDeny", sorted(missing))


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
        if policies is None or decide(policies, "iam:SimulatePrincipalPolicy", principal)[0] != "allowed":
            return AWSResponse("http://stub", 403, {}, None), {
                "Error": {"Code": "AccessDenied", "Message": "User is not authorized to perform: iam:SimulatePrincipalPolicy"},
                "ResponseMetadata": {"HTTPStatusCode": 403}}
        context = {e["ContextKeyName"].lower(): list(e["ContextKeyValues"]) for e in asked.get("ContextEntries") or []}
        results = []
        for a in asked["ActionNames"]:
            each = []
            for r in asked.get("ResourceArns") or ["*"]:
                decision, missing = decide(policies, a, r, context)
                each.append({"EvalResourceName": r, "EvalResourceDecision": decision, "MissingContextValues": missing})
            worst = next((d for d in ("explicitDeny", "implicitDeny") if any(e["EvalResourceDecision"] == d for e in each)), "allowed")
            results.append({"EvalActionName": a, "EvalResourceName": "*", "EvalDecision": worst, "ResourceSpecificResults": each,
                            "MissingContextValues": sorted({k for e in each for k in e["MissingContextValues"]})})
        return AWSResponse("http://stub", 200, {}, None), {"EvaluationResults": results, "IsTruncated": False,
                                                          "ResponseMetadata": {"HTTPStatusCode": 200}}

    return {"before-parameter-build.iam.SimulatePrincipalPolicy": record,
            "before-call.iam.SimulatePrincipalPolicy": answer}
