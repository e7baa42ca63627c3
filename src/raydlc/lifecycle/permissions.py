"""What `up` needs from the caller's AWS identity, and the check that it has it before anything is made.

`up` runs eksctl (which makes CloudFormation stacks for the VPC, the cluster, its node groups and one IAM role per
pod identity association) and makes the cluster's S3 bucket itself. eksctl's own needs are its "Minimum IAM
policies" (eksctl v0.230.0 userdocs/src/usage/minimum-iam-policies.md: EC2, CloudFormation, EKS, SSM parameters
under /aws, IAM on `eksctl-*` roles and OIDC providers). raydlc names its pod identity roles itself
(`raydlc-<cluster>-<region>-…`, raydlc.render.bucket and raydlc.render.autoscaler), outside eksctl's `eksctl-*`
pattern, so creating them, giving them their inline policy and passing them to EKS
(`eks:CreatePodIdentityAssociation` passes the role: iam:PassRole) need rights of their own.

`NEEDS` is the one list: `up` simulates it for the caller (IAM's policy simulator, iam:SimulatePrincipalPolicy) and
`minimal_policy` turns it into the policy docs/lifecycle.md shows (scripts/iam_policy_doc.py writes that block).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raydlc.errors import InputError


@dataclass(frozen=True)
class Names:
    """What the resource ARNs are made of; placeholders (`<account_id>`) for the docs."""

    account: str
    region: str
    cluster: str
    pod_roles: tuple[str, ...]
    bucket: str | None
    partition: str = "aws"


@dataclass(frozen=True)
class Need:
    sid: str
    step: str  # the `up` step that needs it: the check asks only for the selected steps' needs
    actions: tuple[str, ...]
    resources: tuple[str, ...]  # templates over Names' fields


# eksctl's needs as its minimum-policies page lists them, narrowed to what `create cluster` with managed node groups,
# add-ons, OIDC and pod identity associations calls (ec2/autoscaling/cloudformation/eks on "*", as the page has them).
NEEDS: tuple[Need, ...] = (
    Need("CloudFormationStacks", "cluster", (
        "cloudformation:CreateStack", "cloudformation:DescribeStacks", "cloudformation:DescribeStackEvents",
        "cloudformation:DescribeStackResources", "cloudformation:ListStacks", "cloudformation:GetTemplate",
        "cloudformation:UpdateTerminationProtection", "cloudformation:DeleteStack"), ("*",)),
    Need("Network", "cluster", (
        "ec2:CreateVpc", "ec2:CreateSubnet", "ec2:CreateInternetGateway", "ec2:AttachInternetGateway",
        "ec2:CreateNatGateway", "ec2:AllocateAddress", "ec2:CreateRouteTable", "ec2:CreateRoute",
        "ec2:AssociateRouteTable", "ec2:CreateSecurityGroup", "ec2:AuthorizeSecurityGroupIngress",
        "ec2:AuthorizeSecurityGroupEgress", "ec2:CreateTags", "ec2:ModifyVpcAttribute", "ec2:ModifySubnetAttribute",
        "ec2:DescribeVpcs", "ec2:DescribeSubnets", "ec2:DescribeAvailabilityZones", "ec2:DescribeSecurityGroups"),
        ("*",)),
    Need("NodeGroups", "gpu-nodegroup", (
        "ec2:RunInstances", "ec2:CreateLaunchTemplate", "ec2:CreatePlacementGroup", "ec2:DescribeInstanceTypes",
        "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeImages", "ec2:DescribeLaunchTemplateVersions",
        "autoscaling:DescribeAutoScalingGroups", "autoscaling:CreateOrUpdateTags"), ("*",)),
    Need("Eks", "cluster", (
        "eks:CreateCluster", "eks:DescribeCluster", "eks:CreateNodegroup", "eks:DescribeNodegroup", "eks:ListNodegroups",
        "eks:CreateAddon", "eks:DescribeAddon", "eks:DescribeAddonVersions", "eks:ListAddons", "eks:TagResource",
        "eks:CreatePodIdentityAssociation", "eks:ListPodIdentityAssociations", "eks:DescribePodIdentityAssociation"),
        ("*",)),
    Need("EksAmiParameters", "cluster", ("ssm:GetParameter", "ssm:GetParameters"),
         ("arn:{partition}:ssm:{region}::parameter/aws/*",)),
    Need("EksctlRoles", "cluster", (
        "iam:CreateRole", "iam:GetRole", "iam:TagRole", "iam:PassRole", "iam:AttachRolePolicy", "iam:PutRolePolicy",
        "iam:GetRolePolicy", "iam:ListAttachedRolePolicies", "iam:DeleteRole", "iam:DetachRolePolicy",
        "iam:DeleteRolePolicy"), ("arn:{partition}:iam::{account}:role/eksctl-{cluster}-*",)),
    Need("OidcProvider", "cluster", (
        "iam:CreateOpenIDConnectProvider", "iam:GetOpenIDConnectProvider", "iam:TagOpenIDConnectProvider"),
        ("arn:{partition}:iam::{account}:oidc-provider/*",)),
    Need("PodIdentityRoles", "cluster", (
        "iam:CreateRole", "iam:GetRole", "iam:TagRole", "iam:PutRolePolicy", "iam:GetRolePolicy", "iam:PassRole",
        "iam:DeleteRole", "iam:DeleteRolePolicy"), ("{pod_role_arns}",)),
    Need("Bucket", "storage", (
        "s3:CreateBucket", "s3:ListBucket", "s3:GetBucketLocation", "s3:GetBucketTagging", "s3:PutBucketTagging",
        "s3:PutBucketPublicAccessBlock", "s3:PutEncryptionConfiguration", "s3:PutLifecycleConfiguration"),
        ("arn:{partition}:s3:::{bucket}",)),
    Need("CodeZips", "storage", ("s3:PutObject", "s3:GetObject"), ("arn:{partition}:s3:::{bucket}/code/*",)),
)
STEPS = frozenset(n.step for n in NEEDS)
# Not needed by `up`, but what lets it check the rest first (IAM authorises SimulatePrincipalPolicy on the simulated
# principal's ARN); without it `up` says so and goes on.
SELF_CHECK = Need("CheckOwnPermissions", "", ("iam:SimulatePrincipalPolicy",),
                  ("arn:{partition}:iam::{account}:user/*", "arn:{partition}:iam::{account}:role/*"))


def resources(need: Need, names: Names) -> list[str]:
    out: list[str] = []
    for template in need.resources:
        if template == "{pod_role_arns}":
            out.extend(f"arn:{names.partition}:iam::{names.account}:role/{r}" for r in names.pod_roles)
        elif "{bucket}" in template and names.bucket is None:
            continue
        else:
            out.append(template.format(partition=names.partition, region=names.region, account=names.account,
                                       cluster=names.cluster, bucket=names.bucket))
    return out


def needs_for(steps: Sequence[str]) -> list[Need]:
    return [n for n in NEEDS if n.step in steps]


def minimal_policy(names: Names) -> dict[str, Any]:
    """The policy to attach to an identity that runs `up` (and `down`): one statement per need."""
    statements = []
    for need in (*NEEDS, SELF_CHECK):
        res = resources(need, names)
        if res:
            statements.append({"Sid": need.sid, "Effect": "Allow", "Action": list(need.actions), "Resource": res})
    return {"Version": "2012-10-17", "Statement": statements}


def names_for(cfg: Any, account: str) -> Names:
    """The config's Names: its cluster, region, bucket, and the pod identity roles `render` gives eksctl."""
    from raydlc.render import autoscaler, bucket

    roles = [bucket.role_name(cfg), bucket.worker_role_name(cfg)] if bucket.bucket_of(cfg) is not None else []
    if autoscaler.enabled(cfg):
        roles.append(autoscaler.role_name(cfg))
    found = bucket.bucket_of(cfg)
    return Names(account, cfg.cluster.region, cfg.cluster.name, tuple(roles), found.name if found else None)


def missing(decisions: dict[tuple[str, str], str], need: Need, names: Names) -> list[str]:
    """`action on resource` for each pair the simulator did not allow."""
    return [f"{a} on {r}" for a in need.actions for r in resources(need, names)
            if decisions.get((a, r), "implicitDeny") != "allowed"]


def check(sess: Any, cfg: Any, steps: Sequence[str], say: Any) -> None:
    """Simulate the selected steps' needs for the caller; InputError naming every missing action. A caller who may
    not simulate (or that the simulator cannot take, e.g. root) gets one line through `say` and `up` goes on."""
    from raydlc.edges import aws

    wanted = needs_for(steps)
    if not wanted:
        return
    caller, principal = aws.caller_principal(sess)
    if principal is None:
        say(f"cannot check {caller}'s permissions with IAM's policy simulator (not a user or a role); going on")
        return
    names = names_for(cfg, principal.split(":")[4])
    lacking: list[str] = []
    try:
        for need in wanted:
            res = resources(need, names)
            if res:
                lacking += missing(aws.simulate(sess, principal, list(need.actions), res), need, names)
    except aws.AccessDeniedError:
        say(f"{caller} may not run iam:SimulatePrincipalPolicy, so up cannot check its permissions first; going on")
        return
    if lacking:
        raise InputError(
            f"{principal} lacks {len(lacking)} permission(s) `up` needs: " + "; ".join(lacking),
            hint="attach the policy in docs/lifecycle.md (\"What up needs from your identity\") or ask your "
            "administrator for these actions; nothing was created",
        )
    say(f"IAM's policy simulator allows {principal} every action up needs")
