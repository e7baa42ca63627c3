"""What `up` needs from the caller's AWS identity, and the check that it has it before anything is made.

`up` runs eksctl (which makes CloudFormation stacks for the VPC, the cluster, its node groups and one IAM role per
pod identity association) and makes the cluster's S3 bucket itself. eksctl's own needs are its "Minimum IAM
policies" (eksctl v0.230.0 userdocs/src/usage/minimum-iam-policies.md: EC2, CloudFormation, EKS, SSM parameters
under /aws, IAM on `eksctl-*` roles and OIDC providers). raydlc names its pod identity roles itself
(`raydlc-<cluster>-<region>-…`, raydlc.render.bucket and raydlc.render.autoscaler), outside eksctl's `eksctl-*`
pattern, so creating them, giving them their inline policy and passing them to EKS Pod Identity
(`eks:CreatePodIdentityAssociation` passes the role: iam:PassRole to pods.eks.amazonaws.com) need rights of their own.

`NEEDS` is the one list: `up` simulates it for the caller (IAM's policy simulator, iam:SimulatePrincipalPolicy) and
`managed_policies` turns it into the managed policies docs/lifecycle.md shows (scripts/iam_policy_doc.py writes that
block): the whole list is longer than one managed policy may be.
"""

from __future__ import annotations

import json
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
    step: str  # the step that needs it: the check asks only for the selected steps' needs
    actions: tuple[str, ...]
    resources: tuple[str, ...]  # templates over Names' fields
    # Where the need comes from: "raydlc" (raydlc's own boto3 calls: tests/lifecycle/test_permissions_derived.py
    # records them), "eksctl" (eksctl v0.230.0's "Minimum IAM policies" page) or "cloudformation" (the resource handlers
    # of the types eksctl's stacks hold, run with the caller's credentials: CFN_HANDLERS)
    origin: str = "raydlc"
    # A condition key the real request carries, with its value: the policy scopes the statement by it
    # (StringEquals) and the simulator is given it as a ContextEntry
    condition: tuple[str, str] | None = None
    orders: tuple[str, ...] = ("up",)


# The resource types eksctl v0.230.0's stacks hold for raydlc's ClusterConfig (new IPv4 VPC with one NAT gateway,
# managed node groups with launch templates, EFA's placement group and security group, pod identity roles;
# pkg/cfn/builder: vpc_ipv4.go, cluster.go, managed_nodegroup.go, managed_launch_template.go, nodegroup.go's EFA
# security group, iam.go, iam_helper.go's attachAllowPolicy) and their handlers' permissions as each type's
# CloudFormation resource schema lists them: `handlers.create` + `handlers.read` `.permissions` for `up` (CloudFormation
# reads each resource back after creating it), `handlers.delete.permissions` for `down`. Read from SCHEMAS (the registry
# schemas as terraform-provider-awscc stores them); tests/doubles/FIDELITY.md has one row per type. The IAM types'
# actions are granted on eksctl's and raydlc's roles (EksctlRoles, PodIdentityRoles, NodeRoles), not on `*`.
SCHEMAS = ("hashicorp/terraform-provider-awscc@f995d4f4139602dbb9044f3108702f2a1837a872 "
           "internal/service/cloudformation/schemas/AWS_<Service>_<Type>.json")
CFN_HANDLERS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    # type: (the steps whose stacks hold it, create+read permissions, delete permissions)
    "AWS::EC2::VPC": (("cluster",), ("ec2:CreateVpc", "ec2:DescribeVpcs", "ec2:ModifyVpcAttribute", "ec2:DescribeVpcAttribute",
                                     "ec2:CreateTags", "ec2:DescribeSecurityGroups", "ec2:DescribeNetworkAcls",
                                     "ec2:DescribeVpcEncryptionControls"),
                      ("ec2:DeleteVpc", "ec2:DescribeVpcs")),
    "AWS::EC2::Subnet": (("cluster",), ("ec2:CreateSubnet", "ec2:DescribeSubnets", "ec2:ModifySubnetAttribute", "ec2:CreateTags",
                                        "ec2:DescribeNetworkAcls"), ("ec2:DeleteSubnet", "ec2:DescribeSubnets")),
    "AWS::EC2::InternetGateway": (("cluster",), ("ec2:CreateInternetGateway", "ec2:CreateTags", "ec2:DescribeInternetGateways"),
                                  ("ec2:DeleteInternetGateway", "ec2:DescribeInternetGateways")),
    "AWS::EC2::VPCGatewayAttachment": (("cluster",), ("ec2:AttachInternetGateway", "ec2:DescribeInternetGateways",
                                                      "ec2:DescribeVpnGateways"),
                                       ("ec2:DetachInternetGateway", "ec2:DescribeInternetGateways", "ec2:DescribeVpnGateways")),
    "AWS::EC2::RouteTable": (("cluster",), ("ec2:CreateRouteTable", "ec2:CreateTags", "ec2:DescribeRouteTables"),
                             ("ec2:DeleteRouteTable", "ec2:DescribeRouteTables")),
    "AWS::EC2::Route": (("cluster",), ("ec2:CreateRoute", "ec2:DescribeRouteTables", "ec2:DescribeNetworkInterfaces"),
                        ("ec2:DeleteRoute", "ec2:DescribeRouteTables")),
    "AWS::EC2::SubnetRouteTableAssociation": (("cluster",), ("ec2:AssociateRouteTable", "ec2:ReplaceRouteTableAssociation",
                                                             "ec2:DescribeRouteTables", "ec2:DescribeSubnets"),
                                              ("ec2:DisassociateRouteTable", "ec2:DescribeRouteTables", "ec2:DescribeSubnets")),
    "AWS::EC2::NatGateway": (("cluster",), ("ec2:CreateNatGateway", "ec2:CreateTags", "ec2:DescribeNatGateways"),
                             ("ec2:DeleteNatGateway", "ec2:DescribeNatGateways")),
    "AWS::EC2::EIP": (("cluster",), ("ec2:AllocateAddress", "ec2:DescribeAddresses", "ec2:CreateTags"),
                      ("ec2:ReleaseAddress", "ec2:DisassociateAddress", "ec2:DescribeAddresses")),
    "AWS::EC2::SecurityGroup": (("cluster", "gpu-nodegroup"), (
        "ec2:CreateSecurityGroup", "ec2:DescribeSecurityGroups", "ec2:AuthorizeSecurityGroupEgress",
        "ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupEgress", "ec2:CreateTags"),
        ("ec2:DeleteSecurityGroup", "ec2:DescribeSecurityGroups", "ec2:DescribeInstances")),
    "AWS::EC2::SecurityGroupIngress": (("cluster", "gpu-nodegroup"), (
        "ec2:AuthorizeSecurityGroupIngress", "ec2:DescribeSecurityGroupRules", "ec2:DescribeSecurityGroups"),
        ("ec2:RevokeSecurityGroupIngress", "ec2:DescribeSecurityGroupRules")),
    "AWS::EC2::SecurityGroupEgress": (("cluster", "gpu-nodegroup"), (
        "ec2:AuthorizeSecurityGroupEgress", "ec2:RevokeSecurityGroupEgress", "ec2:DescribeSecurityGroupRules"),
        ("ec2:RevokeSecurityGroupEgress", "ec2:DescribeSecurityGroupRules")),
    "AWS::EKS::Cluster": (("cluster",), ("eks:CreateCluster", "eks:DescribeCluster", "eks:TagResource", "eks:CreateAccessEntry",
                                         "iam:PassRole", "iam:GetRole", "iam:ListAttachedRolePolicies",
                                         "iam:CreateServiceLinkedRole", "ec2:DescribeSubnets", "ec2:DescribeVpcs"),
                          ("eks:DeleteCluster", "eks:DescribeCluster")),
    "AWS::EKS::Nodegroup": (("gpu-nodegroup",), (
        "eks:CreateNodegroup", "eks:DescribeNodegroup", "eks:TagResource", "ec2:DescribeSubnets", "ec2:DescribeVpcs",
        "ec2:DescribeSecurityGroups", "ec2:DescribeKeyPairs", "ec2:CreateTags", "ec2:DeleteTags", "ec2:DescribeRouteTables",
        "ec2:DescribeLaunchTemplates", "ec2:DescribeLaunchTemplateVersions", "ec2:RunInstances", "iam:CreateServiceLinkedRole",
        "iam:GetRole", "iam:PassRole", "iam:ListAttachedRolePolicies"),
        ("eks:DeleteNodegroup", "eks:DescribeNodegroup")),
    "AWS::EC2::LaunchTemplate": (("gpu-nodegroup",), ("ec2:CreateLaunchTemplate", "ec2:CreateTags", "ec2:DescribeLaunchTemplates"),
                                 ("ec2:DeleteLaunchTemplate", "ec2:DeleteTags", "ec2:DescribeLaunchTemplates")),
    "AWS::EC2::PlacementGroup": (("gpu-nodegroup",), ("ec2:CreatePlacementGroup", "ec2:DescribePlacementGroups", "ec2:CreateTags"),
                                 ("ec2:DeletePlacementGroup", "ec2:DescribePlacementGroups")),
    "AWS::IAM::Role": (("cluster", "gpu-nodegroup"), (
        "iam:CreateRole", "iam:PutRolePolicy", "iam:AttachRolePolicy", "iam:GetRolePolicy", "iam:TagRole", "iam:UntagRole",
        "iam:GetRole", "iam:ListAttachedRolePolicies", "iam:ListRolePolicies"),
        ("iam:DeleteRole", "iam:DetachRolePolicy", "iam:DeleteRolePolicy", "iam:GetRole", "iam:ListAttachedRolePolicies",
         "iam:ListRolePolicies", "iam:TagRole", "iam:UntagRole")),
    # No schema with handlers was found for AWS::IAM::Policy (terraform-provider-awscc holds none; cfn-lint's copy has
    # its handlers stripped): the actions of AWS::IAM::RolePolicy's handlers, which a Policy on `Roles` amounts to
    "AWS::IAM::Policy": (("cluster",), ("iam:PutRolePolicy", "iam:GetRolePolicy"), ("iam:DeleteRolePolicy", "iam:GetRolePolicy")),
}
# What the schemas list that raydlc does not grant, with the property of the type that needs it and eksctl leaves
# unset for raydlc's ClusterConfig (tests/lifecycle/test_permissions_derived.py checks none of them is granted)
LEFT_OUT: dict[str, tuple[str, ...]] = {
    "AWS::EC2::VPC": ("ec2:CreateVpcEncryptionControl",),  # VpcEncryptionControl
    "AWS::EC2::VPCGatewayAttachment": ("ec2:AttachVpnGateway", "ec2:DetachVpnGateway"),  # VpnGatewayId
    "AWS::EC2::EIP": ("ec2:AcceptAddressTransfer", "ec2:AssociateAddress"),  # TransferAddress, InstanceId
    # EncryptionConfig (KMS) and the instance-profile actions (the schema ties them to no property; raydlc's cluster has
    # no OutpostConfig or ComputeConfig, the settings under which EKS runs instances for the cluster)
    "AWS::EKS::Cluster": ("kms:DescribeKey", "kms:CreateGrant", "iam:CreateInstanceProfile", "iam:TagInstanceProfile",
                          "iam:AddRoleToInstanceProfile", "iam:GetInstanceProfile", "iam:DeleteInstanceProfile",
                          "iam:RemoveRoleFromInstanceProfile"),
}


# Granted by needs of their own, scoped by the condition key their requests carry (iam:PassedToService,
# iam:AWSServiceName), on the roles they apply to
_SCOPED = ("iam:PassRole", "iam:CreateServiceLinkedRole")


def _handler_actions(step: str, service: str, delete: bool) -> tuple[str, ...]:
    out: list[str] = []
    for where, create, remove in CFN_HANDLERS.values():
        for a in remove if delete else create:
            if step in where and a.startswith(service + ":") and a not in out and a not in _SCOPED:
                out.append(a)
    return tuple(out)


_ANY = ("*",)
_EKSCTL_ROLES = ("arn:{partition}:iam::{account}:role/eksctl-{cluster}-*",)
_TO_EKS = ("iam:PassedToService", "eks.amazonaws.com")
# eks:CreatePodIdentityAssociation passes its role to EKS Pod Identity, whose service principal is
# pods.eks.amazonaws.com: AWS's own statement for the identity that creates associations scopes PassRole by it (Amazon
# EMR on EKS Development Guide, "Option 1: Enable EKS Pod Identity on the EKS Cluster", "Set up EKS pod identity
# associations: Prerequisite")
_TO_POD_IDENTITY = ("iam:PassedToService", "pods.eks.amazonaws.com")
_BUCKET = ("arn:{partition}:s3:::{bucket}",)
_OBJECTS = ("arn:{partition}:s3:::{bucket}/*",)
_EKS_SLR = "arn:{partition}:iam::{account}:role/aws-service-role/eks.amazonaws.com/AWSServiceRoleForAmazonEKS"
_NODEGROUP_SLR = ("arn:{partition}:iam::{account}:role/aws-service-role/eks-nodegroup.amazonaws.com/"
                  "AWSServiceRoleForAmazonEKSNodegroup",)

NEEDS: tuple[Need, ...] = (
    # -- raydlc's own calls (recorded: tests/lifecycle/test_permissions_derived.py)
    Need("CapacityReads", "capacity", (
        "ec2:DescribeAvailabilityZones", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes",
        "ec2:DescribeSpotPriceHistory", "ec2:GetSpotPlacementScores", "ec2:DescribeSubnets", "ec2:DescribeInstances",
        "servicequotas:GetServiceQuota", "servicequotas:GetAWSDefaultServiceQuota"), _ANY),
    Need("ClusterReads", "cluster", (
        "cloudformation:DescribeStacks", "eks:DescribeCluster", "eks:DescribeNodegroup", "eks:ListAddons",
        "eks:ListPodIdentityAssociations"), _ANY, orders=("up", "down")),
    Need("Bucket", "storage", (
        "s3:CreateBucket", "s3:ListBucket", "s3:GetBucketLocation", "s3:GetBucketTagging", "s3:PutBucketTagging",
        "s3:PutBucketPublicAccessBlock", "s3:GetBucketPublicAccessBlock", "s3:PutEncryptionConfiguration",
        "s3:GetEncryptionConfiguration", "s3:PutLifecycleConfiguration", "s3:GetLifecycleConfiguration"), _BUCKET),
    Need("CodeZips", "storage", ("s3:PutObject", "s3:GetObject"), ("arn:{partition}:s3:::{bucket}/code/*",)),
    Need("DownReads", "cluster", (
        "cloudformation:ListStacks", "ec2:DescribeAddresses", "ec2:DescribeCapacityReservations", "ec2:DescribeInstances",
        "ec2:DescribeNatGateways", "ec2:DescribeVpcs"), _ANY, orders=("down",)),
    Need("DownCapacityReservations", "gpu-nodegroup", ("ec2:CancelCapacityReservation",), _ANY, orders=("down",)),
    Need("DeleteBucket", "storage", (
        "s3:ListBucket", "s3:GetBucketTagging", "s3:ListBucketVersions", "s3:ListBucketMultipartUploads", "s3:DeleteBucket"),
        _BUCKET, orders=("down",)),
    Need("DeleteObjects", "storage", ("s3:DeleteObject", "s3:DeleteObjectVersion", "s3:AbortMultipartUpload"), _OBJECTS,
         orders=("down",)),
    # -- eksctl's own calls (its "Minimum IAM policies" page, v0.230.0), narrowed to what `create/delete cluster`,
    #    managed node groups, add-ons, OIDC and pod identity associations call
    Need("EksctlStacks", "cluster", (
        "cloudformation:CreateStack", "cloudformation:DescribeStacks", "cloudformation:DescribeStackEvents",
        "cloudformation:DescribeStackResources", "cloudformation:ListStacks", "cloudformation:GetTemplate",
        "cloudformation:UpdateTerminationProtection"), _ANY, "eksctl"),
    Need("EksctlReads", "cluster", (
        "ec2:DescribeAvailabilityZones", "ec2:DescribeInstanceTypes", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeImages",
        "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeSubnets", "ec2:DescribeVpcs", "ec2:DescribeSecurityGroups",
        "autoscaling:DescribeAutoScalingGroups", "autoscaling:CreateOrUpdateTags"), _ANY, "eksctl"),
    Need("EksctlEks", "cluster", (
        "eks:CreateAddon", "eks:DescribeAddon", "eks:DescribeAddonVersions", "eks:ListAddons", "eks:ListNodegroups",
        "eks:CreatePodIdentityAssociation", "eks:ListPodIdentityAssociations", "eks:DescribePodIdentityAssociation",
        "eks:TagResource"), _ANY, "eksctl"),
    Need("EksAmiParameters", "cluster", ("ssm:GetParameter", "ssm:GetParameters"),
         ("arn:{partition}:ssm:{region}::parameter/aws/*",), "eksctl"),
    Need("EksctlRoles", "cluster", _handler_actions("cluster", "iam", delete=False), _EKSCTL_ROLES, "cloudformation"),
    Need("EksctlPassRoles", "cluster", ("iam:PassRole",), _EKSCTL_ROLES, "eksctl", _TO_EKS),
    Need("OidcProvider", "cluster", (
        "iam:CreateOpenIDConnectProvider", "iam:GetOpenIDConnectProvider", "iam:TagOpenIDConnectProvider"),
        ("arn:{partition}:iam::{account}:oidc-provider/*",), "eksctl"),
    Need("PodIdentityRoles", "cluster", _handler_actions("cluster", "iam", delete=False), ("{pod_role_arns}",), "cloudformation"),
    Need("PassPodIdentityRoles", "cluster", ("iam:PassRole",), ("{pod_role_arns}",), "eksctl", _TO_POD_IDENTITY),
    Need("EksServiceLinkedRole", "cluster", ("iam:CreateServiceLinkedRole",), (_EKS_SLR,), "cloudformation",
         ("iam:AWSServiceName", "eks.amazonaws.com")),
    Need("EksNodegroupServiceLinkedRole", "gpu-nodegroup", ("iam:CreateServiceLinkedRole",), _NODEGROUP_SLR, "cloudformation",
         ("iam:AWSServiceName", "eks-nodegroup.amazonaws.com")),
    # -- CloudFormation's resource handlers for the stacks eksctl makes
    Need("StackNetwork", "cluster", _handler_actions("cluster", "ec2", delete=False), _ANY, "cloudformation"),
    Need("StackCluster", "cluster", _handler_actions("cluster", "eks", delete=False), _ANY, "cloudformation"),
    Need("StackNodeGroups", "gpu-nodegroup", (
        *_handler_actions("gpu-nodegroup", "eks", delete=False), *_handler_actions("gpu-nodegroup", "ec2", delete=False)),
        _ANY, "cloudformation"),
    # the node groups' stacks hold their node role (eksctl-<cluster>-nodegroup-…), which EKS::Nodegroup reads and passes
    Need("NodeRoles", "gpu-nodegroup", _handler_actions("gpu-nodegroup", "iam", delete=False), _EKSCTL_ROLES, "cloudformation"),
    Need("PassNodeRoles", "gpu-nodegroup", ("iam:PassRole",), _EKSCTL_ROLES, "cloudformation", _TO_EKS),
    # -- down: eksctl's deletes and the handlers' delete permissions
    Need("DeleteStacks", "cluster", (
        "cloudformation:DeleteStack", "cloudformation:DescribeStacks", "cloudformation:ListStacks",
        "cloudformation:DescribeStackEvents", "cloudformation:DescribeStackResources", "cloudformation:UpdateTerminationProtection",
        "eks:ListNodegroups", "eks:DeleteAddon", "eks:ListAddons", "eks:DeletePodIdentityAssociation",
        "eks:ListPodIdentityAssociations", "eks:DescribePodIdentityAssociation"), _ANY, "eksctl", orders=("down",)),
    Need("DeleteNetwork", "cluster", _handler_actions("cluster", "ec2", delete=True), _ANY, "cloudformation", orders=("down",)),
    Need("DeleteCluster", "cluster", _handler_actions("cluster", "eks", delete=True), _ANY, "cloudformation", orders=("down",)),
    Need("DeleteNodeGroups", "gpu-nodegroup", (
        *_handler_actions("gpu-nodegroup", "eks", delete=True), *_handler_actions("gpu-nodegroup", "ec2", delete=True)), _ANY,
        "cloudformation", orders=("down",)),
    Need("DeleteRoles", "cluster", _handler_actions("cluster", "iam", delete=True), (*_EKSCTL_ROLES, "{pod_role_arns}"),
         "cloudformation", orders=("down",)),
    Need("DeleteNodeRoles", "gpu-nodegroup", _handler_actions("gpu-nodegroup", "iam", delete=True), _EKSCTL_ROLES,
         "cloudformation", orders=("down",)),
    Need("DeleteOidcProvider", "cluster", ("iam:GetOpenIDConnectProvider", "iam:DeleteOpenIDConnectProvider"),
         ("arn:{partition}:iam::{account}:oidc-provider/*",), "eksctl", orders=("down",)),
)
STEPS = frozenset(n.step for n in NEEDS)
# Not needed by `up`, but what lets it check the rest first (IAM authorises SimulatePrincipalPolicy on the simulated
# principal's ARN); without it `up` says so and goes on.
SELF_CHECK = Need("CheckOwnPermissions", "", ("iam:SimulatePrincipalPolicy",),
                  ("arn:{partition}:iam::{account}:user/*", "arn:{partition}:iam::{account}:role/*"), orders=("up", "down"))


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


def needs_for(steps: Sequence[str], order: str = "up") -> list[Need]:
    return [n for n in NEEDS if n.step in steps and order in n.orders]


def _statement(need: Need, names: Names) -> dict[str, Any] | None:
    res = resources(need, names)
    if not res:
        return None
    st: dict[str, Any] = {"Sid": need.sid, "Effect": "Allow", "Action": list(need.actions), "Resource": res}
    if need.condition:
        st["Condition"] = {"StringEquals": {need.condition[0]: need.condition[1]}}
    return st


def minimal_policy(names: Names) -> dict[str, Any]:
    """The policy to attach to an identity that runs `up` and `down`: one statement per need, scoped by the condition
    key its requests carry (`iam:PassedToService` on PassRole, as AWS recommends). Too long for one managed policy:
    `managed_policies` is what to attach."""
    statements = [st for need in (*NEEDS, SELF_CHECK) if (st := _statement(need, names))]
    return {"Version": "2012-10-17", "Statement": statements}


# IAM's quotas (IAM User Guide, "IAM and AWS STS quotas"; tests/doubles/FIDELITY.md): a customer managed policy holds
# at most 6,144 characters, white space not counted; at most 10 managed policies attach to a user or role by default
# (20 on request). An inline policy is smaller still on a user (2,048 in all), so the list goes out as managed policies.
POLICY_SIZE_QUOTA = 6144
ATTACHED_POLICIES_QUOTA = 10
POLICY_NAME_MAX = 128
# What each managed policy is for, in the order they are shown
PURPOSES = ("cluster", "identities", "nodegroups", "storage", "down")


def purpose(need: Need) -> str:
    """Which managed policy holds the need: `down`'s own, the storage step's, the node groups' (and the capacity
    reads that pick their instances), the IAM identities the cluster step makes and passes, or the rest of the cluster
    step (network, stacks, EKS; and the check itself)."""
    if need.orders == ("down",):
        return "down"
    if need.step == "storage":
        return "storage"
    if need.step in ("capacity", "gpu-nodegroup"):
        return "nodegroups"
    if need.step and all(a.startswith("iam:") for a in need.actions):
        return "identities"
    return "cluster"


def iam_size(doc: dict[str, Any]) -> int:
    """A policy's size as IAM counts it against its quotas: its characters, white space not counted."""
    return sum(not c.isspace() for c in json.dumps(doc))


def _pack(statements: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Whole statements, in order, into as few documents within POLICY_SIZE_QUOTA as taking them in turn gives."""
    parts: list[list[dict[str, Any]]] = [[]]
    for st in statements:
        if parts[-1] and iam_size({"Version": "2012-10-17", "Statement": [*parts[-1], st]}) > POLICY_SIZE_QUOTA:
            parts.append([])
        parts[-1].append(st)
    return parts


def managed_policies(names: Names) -> list[tuple[str, dict[str, Any]]]:
    """`minimal_policy` as customer managed policies to attach together, (name, document) in PURPOSES' order: one per
    purpose, named `raydlc-<cluster>-<region>-<purpose>` (as the pod identity roles are, so two clusters' do not clash),
    each within IAM's size quota. Statements are never split (a condition stays with its actions); a purpose whose
    statements outgrow one document (long names) is numbered `-1`, `-2`, …; a name over IAM's 128 characters is cut
    and hashed as the roles' are."""
    from raydlc.render.bucket import _capped

    by_purpose: dict[str, list[dict[str, Any]]] = {p: [] for p in PURPOSES}
    for need in (*NEEDS, SELF_CHECK):
        if st := _statement(need, names):
            by_purpose[purpose(need)].append(st)
    out = []
    for name, statements in by_purpose.items():
        if not statements:
            continue
        parts = _pack(statements)
        for i, part in enumerate(parts, 1):
            suffix = f"-{i}" if len(parts) > 1 else ""
            policy_name = _capped(f"raydlc-{names.cluster}-{names.region}-{name}{suffix}", POLICY_NAME_MAX)
            out.append((policy_name, {"Version": "2012-10-17", "Statement": part}))
    return out


def context_of(need: Need, names: Names) -> dict[str, list[str] | bool]:
    """The condition keys the real requests carry, as the simulator's ContextEntries: the region they are sent to (IAM
    is global: us-east-1 in the commercial partition), HTTPS, and the need's own key."""
    region = "us-east-1" if all(a.startswith("iam:") for a in need.actions) else names.region
    out: dict[str, list[str] | bool] = {"aws:RequestedRegion": [region], "aws:SecureTransport": True}
    if need.condition:
        out[need.condition[0]] = [need.condition[1]]
    return out


def names_for(cfg: Any, account: str) -> Names:
    """The config's Names: its cluster, region, bucket, and the pod identity roles `render` gives eksctl."""
    from raydlc.render import autoscaler, bucket

    roles = [bucket.role_name(cfg), bucket.worker_role_name(cfg)] if bucket.bucket_of(cfg) is not None else []
    if autoscaler.enabled(cfg):
        roles.append(autoscaler.role_name(cfg))
    found = bucket.bucket_of(cfg)
    return Names(account, cfg.cluster.region, cfg.cluster.name, tuple(roles), found.name if found else None)


def missing(decisions: dict[tuple[str, str], Any], need: Need, names: Names) -> tuple[list[str], list[str]]:
    """(`action on resource` the simulator did not allow, `action on resource (needs KEYS)` it cannot tell about:
    not allowed only for want of a condition key the request would carry)."""
    from raydlc.edges.aws import Decision

    lacking, unknown = [], []
    for a in need.actions:
        for r in resources(need, names):
            d = decisions.get((a, r), Decision("implicitDeny"))
            if d.unknown:
                unknown.append(f"{a} on {r} (its policy asks for {', '.join(d.missing_keys)})")
            elif not d.allowed:
                lacking.append(f"{a} on {r}")
    return lacking, unknown


def check(sess: Any, cfg: Any, steps: Sequence[str], say: Any, order: str = "up") -> None:
    """Simulate the selected steps' needs for the caller, before `order` (up or down) changes anything; InputError
    naming every missing action. A caller who may not simulate (or that the simulator cannot take, e.g. root) gets one
    line through `say` and the order goes on, as it does for what the simulator cannot tell (a condition key the
    check cannot supply) and with SKIP_PERMISSION_CHECK."""
    from raydlc.edges import aws

    wanted = needs_for(steps, order)
    if not wanted:
        return
    if cfg.cluster.skip_permission_check:
        say(f"not checking the caller's permissions for {order} (SKIP_PERMISSION_CHECK)")
        return
    caller, principal = aws.caller_principal(sess)
    if principal is None:
        say(f"cannot check {caller}'s permissions with IAM's policy simulator (not a user or a role); going on")
        return
    names = names_for(cfg, principal.split(":")[4])
    lacking: list[str] = []
    unknown: list[str] = []
    try:
        for need in wanted:
            res = resources(need, names)
            if res:
                no, cannot_tell = missing(aws.simulate(sess, principal, list(need.actions), res, context_of(need, names)), need, names)
                lacking += no
                unknown += cannot_tell
    except aws.AccessDeniedError:
        say(f"{caller} may not run iam:SimulatePrincipalPolicy, so {order} cannot check its permissions first; going on")
        return
    if lacking:
        raise InputError(
            f"{principal} lacks {len(lacking)} permission(s) `{order}` needs: " + "; ".join(lacking),
            hint="attach the policies in docs/lifecycle.md (\"What up needs from your identity\") or ask your "
            "administrator for these actions; nothing was changed. If IAM allows them by what its simulator cannot see "
            "(an SCP, a boundary, a condition), run again with --skip-permission-check",
        )
    if unknown:
        say(f"IAM's policy simulator cannot tell whether {principal} may do {len(unknown)} thing(s) {order} needs: "
            + "; ".join(unknown) + "; going on")
        return
    say(f"IAM's policy simulator allows {principal} every action {order} needs")
