"""A recorded double of eksctl 0.230: the subcommands raydlc runs, their flags, their effects.

It logs its argv, validates the ClusterConfig it is given against raydlc's packaged eksctl
schema, refuses flags eksctl does not have, and changes the moto and kmock state the way
eksctl would: CloudFormation stacks named `eksctl-<cluster>-cluster` / `-nodegroup-<ng>`, a VPC
with private subnets and a NAT gateway (through CloudFormation), the EKS cluster and managed
node groups, EC2 instances tagged `eks:cluster-name`, Kubernetes nodes with labels, taints and
allocatable CPU/memory, and (for `efaEnabled` groups) its EFA device-plugin DaemonSet.

Every stack is created with termination protection on, and eksctl's own deletes check the stack
bears its cluster-name tag and turn the protection off first (`pkg/cfn/manager/api.go`,
`DoCreateStackRequest`, `DeleteStackBySpec`): a raw DeleteStack of one fails, as on AWS.

moto leaves a stack's NAT gateway and Elastic IP in place when the stack is deleted; real
CloudFormation deletes them, so the double does (unless the scenario's `delete_leaves_nat`
asks for the "VPC has dependencies" failure).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import eks_state
import yaml
from world import (
    EFA_DAEMONSET,
    KUBE_URL_ENV,
    NODE_FACTS,
    Kube,
    delay,
    fail,
    log_call,
    node_allocatable,
    reconcile_daemonsets,
    say,
    scenario,
)

VERSION = "0.230.0"
ACCOUNT = "123456789012"
CIDRS = ["192.168.0.0/19", "192.168.32.0/19", "192.168.64.0/19", "192.168.96.0/19", "192.168.128.0/19", "192.168.160.0/19"]
_CLIENTS: dict[tuple[str, str], Any] = {}


def client(service: str, region: str) -> Any:
    import boto3

    if (service, region) not in _CLIENTS:
        _CLIENTS[(service, region)] = boto3.client(service, region_name=region)
    return _CLIENTS[(service, region)]


@contextlib.contextmanager
def cloud_side() -> Iterator[None]:
    """What AWS does once asked goes on when eksctl is killed: SIGINT/SIGTERM wait until it is done."""
    held = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def load_config(path: str) -> dict[str, Any]:
    from raydlc import schemas

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        fail(f"Error: reading config file {path!r}: {e}")
    problems = schemas.problems(doc) if doc.get("kind") == "ClusterConfig" else ["kind must be ClusterConfig"]
    if problems:
        fail(f"Error: loading config file {path!r}: invalid ClusterConfig: {'; '.join(problems)}")
    for addon in doc.get("addons") or []:
        check_addon(addon)
    check_pod_identities(doc)
    return doc


def check_pod_identities(cfg: dict[str, Any]) -> None:
    """eksctl's config-file checks for iam.podIdentityAssociations: the agent add-on must be in the
    config, each names a namespace and service account, a permissionPolicyName needs a permissionPolicy."""
    pias = (cfg.get("iam") or {}).get("podIdentityAssociations") or []
    if pias and not any(a.get("name") == "eks-pod-identity-agent" for a in cfg.get("addons") or []):
        fail('Error: the "eks-pod-identity-agent" addon must be installed to create pod identity associations; '
             'please add "eks-pod-identity-agent" addon to the config file')
    for i, pia in enumerate(pias):
        for key in ("namespace", "serviceAccountName"):
            if not pia.get(key):
                fail(f"Error: iam.podIdentityAssociations[{i}].{key} must be set")
        if pia.get("permissionPolicyName") and not pia.get("permissionPolicy"):
            fail(f"Error: iam.podIdentityAssociations[{i}]: permissionPolicyName requires permissionPolicy to be set")


def pod_identity_stack(cluster: str, pia: dict[str, Any]) -> str:
    return f"eksctl-{cluster}-podidentityrole-{pia['namespace']}-{pia['serviceAccountName']}"


def create_pod_identities(cfg: dict[str, Any]) -> None:
    """After the cluster: per association, a role stack, the service account (and its namespace), the association.

    moto has no EKS pod identity associations: the double keeps them in eks_state (which answers
    raydlc's ListPodIdentityAssociations)."""
    for pia in (cfg.get("iam") or {}).get("podIdentityAssociations") or []:
        create_pod_identity(cfg, pia)


def create_pod_identity(cfg: dict[str, Any], pia: dict[str, Any]) -> None:
    meta = cfg["metadata"]
    name, region = meta["name"], meta["region"]
    cfn = client("cloudformation", region)
    kube = Kube(os.environ[KUBE_URL_ENV])
    stack = pod_identity_stack(name, pia)
    key = f"{pia['namespace']}/{pia['serviceAccountName']}"
    if key in eks_state.current(name)["associations"]:
        fail(f'Error: creating pod identity association for service account "{key}": operation error EKS: '
             "CreatePodIdentityAssociation, ResourceInUseException: Association already exists")
    if stack_exists(cfn, stack):
        fail(f'Error: creating CloudFormation stack "{stack}": operation error CloudFormation: CreateStack, '
             f"https response error StatusCode: 400, AlreadyExistsException: Stack [{stack}] already exists")
    say(f'[ℹ]  create IAM role for pod identity association for service account "{key}"')
    role: dict[str, Any] = {
        "AssumeRolePolicyDocument": {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
            "Action": ["sts:AssumeRole", "sts:TagSession"]}]},
        "Policies": [{"PolicyName": pia.get("permissionPolicyName") or "Policy1",
                      "PolicyDocument": pia.get("permissionPolicy") or {}}],
    }
    if pia.get("roleName"):
        role["RoleName"] = pia["roleName"]
    tags = [{"Key": k, "Value": v} for k, v in (pia.get("tags") or {}).items()]
    tags.append({"Key": "alpha.eksctl.io/podidentityassociation-name", "Value": key})
    tags.append({"Key": "alpha.eksctl.io/cluster-name", "Value": name})
    cfn.create_stack(StackName=stack, TemplateBody=json.dumps({"Resources": {"Role": {"Type": "AWS::IAM::Role", "Properties": role}}}),
                     Tags=tags, Capabilities=["CAPABILITY_NAMED_IAM"], EnableTerminationProtection=True)
    if pia.get("createServiceAccount"):
        kube.ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": pia["namespace"]}})
        kube.ensure({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {
            "name": pia["serviceAccountName"], "namespace": pia["namespace"],
            "labels": {"app.kubernetes.io/managed-by": "eksctl"}}})
    say(f'[ℹ]  create pod identity association for service account "{key}"')
    with eks_state.changing(name) as state:
        state["associations"] = sorted({*state["associations"], key})


def create_addons(cfg: dict[str, Any]) -> None:
    """Each add-on of the config through EKS; one already present is skipped (pkg/actions/addon/create.go `Create`)."""
    name = cfg["metadata"]["name"]
    for addon in cfg.get("addons") or []:
        with eks_state.changing(name) as state:
            if addon["name"] in state["addons"]:
                say(f'[ℹ]  "{addon["name"]}" addon is already present on the cluster, as an EKS managed addon, skipping creation')
                continue
            say(f'[ℹ]  creating addon: {addon["name"]}')
            state["addons"] = sorted({*state["addons"], addon["name"]})


def create_addon(args: argparse.Namespace) -> None:
    """`create addon --config-file`: the cluster must exist; the config's add-ons are made as `create cluster` makes them."""
    cfg = load_config(args.config_file)
    meta = cfg["metadata"]
    eks = client("eks", meta["region"])
    try:
        eks.describe_cluster(name=meta["name"])
    except eks.exceptions.ResourceNotFoundException:
        fail(f'Error: cluster "{meta["name"]}" not found')
    create_addons(cfg)


def create_podidentityassociation(args: argparse.Namespace) -> None:
    """`create podidentityassociation --config-file` (pkg/ctl/create/pod_identity_association.go): the agent add-on
    must be installed; every listed association is made, and one that exists fails the command."""
    cfg = load_config(args.config_file)
    meta = cfg["metadata"]
    pias = (cfg.get("iam") or {}).get("podIdentityAssociations") or []
    if not pias:
        fail("Error: no iam.podIdentityAssociations specified in the config file")
    if "eks-pod-identity-agent" not in eks_state.current(meta["name"])["addons"]:
        fail(f"Error: eks-pod-identity-agent addon is required to create pod identity associations; please enable it using "
             f"`eksctl create addon --cluster={meta['name']} --name=eks-pod-identity-agent`")
    for pia in pias:
        with cloud_side():
            create_pod_identity(cfg, pia)


def check_addon(addon: dict[str, Any]) -> None:
    """eksctl's Addon.Validate: configurationValues must parse as JSON or YAML (to an object)."""
    values = addon.get("configurationValues")
    if not values:
        return
    try:
        parsed = json.loads(values)
    except ValueError:
        try:
            parsed = yaml.safe_load(values)
        except yaml.YAMLError:
            parsed = None
    if not isinstance(parsed, dict):
        fail(f'Error: invalid configuration for "{addon["name"]}" addon: configurationValues: {values!r} is not valid, '
             "supported format(s) are: JSON and YAML")


def tags_of(cfg: dict[str, Any], extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    meta = cfg["metadata"]
    tags = {**(meta.get("tags") or {}), "alpha.eksctl.io/cluster-name": meta["name"], **(extra or {})}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def stack_exists(cfn: Any, name: str) -> dict[str, Any] | None:
    try:
        stacks = cfn.describe_stacks(StackName=name)["Stacks"]
    except Exception:
        return None
    live = [s for s in stacks if s["StackStatus"] != "DELETE_COMPLETE"]
    return live[0] if live else None


def create_stack(cfn: Any, stack: str, template: dict[str, Any], tags: list[dict[str, str]]) -> None:
    """CreateStack as eksctl's DoCreateStackRequest sends it: EnableTerminationProtection always true."""
    cfn.create_stack(StackName=stack, TemplateBody=json.dumps(template), Tags=tags, EnableTerminationProtection=True)


def delete_stack(cfn: Any, cluster: str, stack: str) -> None:
    """eksctl's DeleteStackBySpec: refuse a stack without our cluster-name tag, unprotect, then delete by ID."""
    found = stack_exists(cfn, stack)
    if found is None:
        return
    tags = {t["Key"]: t["Value"] for t in found.get("Tags") or []}
    if cluster not in (tags.get("alpha.eksctl.io/cluster-name"), tags.get("eksctl.cluster.k8s.io/v1alpha1/cluster-name")):
        fail(f'Error: cannot delete stack "{stack}" as it doesn\'t bear our "eksctl.cluster.k8s.io/v1alpha1/cluster-name:'
             f'{cluster}", "alpha.eksctl.io/cluster-name:{cluster}" tags')
    if found.get("EnableTerminationProtection"):
        cfn.update_termination_protection(StackName=found["StackId"], EnableTerminationProtection=False)
    cfn.delete_stack(StackName=found["StackId"])
    say(f'[ℹ]  will delete stack "{stack}"')


def authenticator(cluster: str, region: str) -> dict[str, Any]:
    """The exec entry eksctl writes: aws-iam-authenticator, else `aws eks get-token`, else aws-iam-authenticator
    even though it is not installed (`pkg/utils/kubeconfig/kubeconfig.go` `NewForKubectl`, `AppendAuthenticator`)."""
    import shutil

    cmd = next((c for c in ("aws-iam-authenticator", "aws") if shutil.which(c)), "aws-iam-authenticator")
    env = [{"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"}]
    if cmd == "aws":
        args = ["eks", "get-token", "--output", "json", "--cluster-name", cluster, "--region", region]
    else:
        args = ["token", "-i", cluster]
        env.append({"name": "AWS_DEFAULT_REGION", "value": region})
    if os.environ.get("AWS_PROFILE"):
        env.append({"name": "AWS_PROFILE", "value": os.environ["AWS_PROFILE"]})
    return {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": cmd, "args": args, "env": env,
            "provideClusterInfo": False}


def write_kubeconfig(path: str, cluster: str, region: str) -> None:
    url = os.environ[KUBE_URL_ENV]
    ctx = f"raydlc@{cluster}.{region}.eksctl.io"
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": ctx,
        "clusters": [{"name": f"{cluster}.{region}.eksctl.io", "cluster": {"server": url}}],
        "contexts": [{"name": ctx, "context": {"cluster": f"{cluster}.{region}.eksctl.io", "user": ctx}}],
        "users": [{"name": ctx, "user": {"exec": authenticator(cluster, region)}}],
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(doc))
    say(f"[✔]  saved kubeconfig as \"{path}\"")


# ---------------------------------------------------------------------- cluster


def vpc_template(cfg: dict[str, Any]) -> dict[str, Any]:
    zones = cfg["availabilityZones"]
    res: dict[str, Any] = {"VPC": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "192.168.0.0/16", "Tags": tags_of(cfg)}}}
    outputs: dict[str, Any] = {"VPC": {"Value": {"Ref": "VPC"}}}
    for i, az in enumerate(zones[:3]):
        key = az[-1].upper()
        res[f"SubnetPublic{key}"] = {"Type": "AWS::EC2::Subnet", "Properties": {
            "VpcId": {"Ref": "VPC"}, "CidrBlock": CIDRS[i], "AvailabilityZone": az, "MapPublicIpOnLaunch": True,
            "Tags": tags_of(cfg, {"kubernetes.io/role/elb": "1"})}}
        res[f"SubnetPrivate{key}"] = {"Type": "AWS::EC2::Subnet", "Properties": {
            "VpcId": {"Ref": "VPC"}, "CidrBlock": CIDRS[i + 3], "AvailabilityZone": az,
            "Tags": tags_of(cfg, {"kubernetes.io/role/internal-elb": "1"})}}
    first = zones[0][-1].upper()
    res["NATIP"] = {"Type": "AWS::EC2::EIP", "Properties": {"Domain": "vpc", "Tags": tags_of(cfg)}}
    res["NATGateway"] = {"Type": "AWS::EC2::NatGateway", "Properties": {
        "SubnetId": {"Ref": f"SubnetPublic{first}"}, "AllocationId": {"Fn::GetAtt": ["NATIP", "AllocationId"]},
        "Tags": tags_of(cfg)}}
    return {"Resources": res, "Outputs": outputs}


def create_cluster(args: argparse.Namespace) -> None:
    cfg = load_config(args.config_file)
    meta = cfg["metadata"]
    name, region = meta["name"], meta["region"]
    cfn, eks = client("cloudformation", region), client("eks", region)
    say(f"[ℹ]  eksctl version {VERSION}")
    say(f"[ℹ]  using region {region}")
    say(f"[ℹ]  setting availability zones to {cfg['availabilityZones']}")
    stack = f"eksctl-{name}-cluster"
    if stack_exists(cfn, stack):
        fail(f'Error: creating CloudFormation stack "{stack}": operation error CloudFormation: CreateStack, '
             f"https response error StatusCode: 400, AlreadyExistsException: Stack [{stack}] already exists")
    try:
        eks.describe_cluster(name=name)
        fail(f'Error: cluster "{name}" already exists')
    except eks.exceptions.ResourceNotFoundException:
        pass
    say(f'[ℹ]  building cluster stack "{stack}"')
    with cloud_side():
        create_stack(cfn, stack, vpc_template(cfg), tags_of(cfg))
        say(f'[ℹ]  waiting for CloudFormation stack "{stack}"')
        delay("create cluster")
        ec2 = client("ec2", region)
        vpc = next(o["OutputValue"] for o in cfn.describe_stacks(StackName=stack)["Stacks"][0]["Outputs"] if o["OutputKey"] == "VPC")
        subnets = [s["SubnetId"] for s in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]]
        try:
            eks.create_cluster(
                name=name, version=str(meta.get("version", "1.36")),
                roleArn=f"arn:aws:iam::{ACCOUNT}:role/eksctl-{name}-cluster-ServiceRole",
                resourcesVpcConfig={"subnetIds": subnets}, tags=dict(meta.get("tags") or {}),
            )
        except eks.exceptions.ClientError as e:  # EKS refused the control plane: the stack rolled back
            if e.response["Error"]["Code"] != "UnsupportedAvailabilityZoneException":
                raise
            rolled_back(cfn, stack)
        kube = Kube(os.environ[KUBE_URL_ENV])
        kube.ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
    create_addons(cfg)
    if not args.without_nodegroup:
        for ng in cfg.get("managedNodeGroups") or []:
            create_one_nodegroup(cfg, ng)
    with cloud_side():
        create_pod_identities(cfg)
    if args.kubeconfig:
        write_kubeconfig(args.kubeconfig, name, region)
    say(f'[✔]  EKS cluster "{name}" in "{region}" region is ready')


# ---------------------------------------------------------------------- node groups


def private_subnets(cfg: dict[str, Any], zones: list[str] | None) -> list[str]:
    meta = cfg["metadata"]
    region = meta["region"]
    ec2, eks = client("ec2", region), client("eks", region)
    ids = eks.describe_cluster(name=meta["name"])["cluster"]["resourcesVpcConfig"]["subnetIds"]
    out = []
    for s in ec2.describe_subnets(SubnetIds=ids)["Subnets"]:
        tags = {t["Key"]: t["Value"] for t in s.get("Tags") or []}
        if "kubernetes.io/role/internal-elb" in tags and (not zones or s["AvailabilityZone"] in zones):
            out.append(s["SubnetId"])
    return out


def create_one_nodegroup(cfg: dict[str, Any], ng: dict[str, Any]) -> None:
    meta = cfg["metadata"]
    name, region = meta["name"], meta["region"]
    cfn, eks, ec2 = client("cloudformation", region), client("eks", region), client("ec2", region)
    ngname = ng["name"]
    stack = f"eksctl-{name}-nodegroup-{ngname}"
    say(f'[ℹ]  building managed nodegroup stack "{stack}"')
    if stack_exists(cfn, stack):
        fail(f'Error: creating CloudFormation stack "{stack}": AlreadyExistsException: Stack [{stack}] already exists')
    template = {"Resources": {"LaunchTemplate": {"Type": "AWS::EC2::LaunchTemplate", "Properties": {
        "LaunchTemplateName": f"{stack}-lt", "LaunchTemplateData": {"InstanceType": ng["instanceType"]}}}}}
    create_stack(cfn, stack, template, tags_of(cfg, ng.get("tags") or {}))
    subnets = private_subnets(cfg, ng.get("availabilityZones"))
    count = int(ng.get("desiredCapacity", 1))
    taints = [{"key": t["key"], "value": t.get("value", ""), "effect": t["effect"].upper().replace("NOSCHEDULE", "NO_SCHEDULE")}
              for t in ng.get("taints") or []]
    eks.create_nodegroup(
        clusterName=name, nodegroupName=ngname, subnets=subnets, instanceTypes=[ng["instanceType"]],
        scalingConfig={"minSize": int(ng.get("minSize", count)), "maxSize": int(ng.get("maxSize", count)), "desiredSize": count},
        labels=ng.get("labels") or {},
        taints=taints, tags={**(meta.get("tags") or {}), **(ng.get("tags") or {})},
        nodeRole=f"arn:aws:iam::{ACCOUNT}:role/{stack}-NodeInstanceRole",
        capacityType="SPOT" if ng.get("spot") else "ON_DEMAND",  # pkg/cfn/builder/managed_nodegroup.go: spot -> SPOT
    )
    say(f'[ℹ]  waiting for CloudFormation stack "{stack}"')
    delay(f"create nodegroup {ngname}")
    try:
        got = eks.describe_nodegroup(clusterName=name, nodegroupName=ngname)["nodegroup"]
    except eks.exceptions.ResourceNotFoundException:
        rolled_back(cfn, stack)
    if got["status"] != "ACTIVE":
        issues = "; ".join(f"{i['code']}: {i['message']}" for i in (got.get("health") or {}).get("issues") or [])
        say(f'[!]  nodegroup "{ngname}" is {got["status"]}: {issues}')
        fail(f'Error: failed to create managed nodegroups: waiter state transitioned to Failure: '
             f'nodegroup "{ngname}" {got["status"]}: {issues}')
    subnet = ec2.describe_subnets(SubnetIds=subnets[:1])["Subnets"][0]
    image = "ami-0eks0al2023accel"  # EKS picks the AMI; moto does not check it
    inst_tags = [{"Key": "eks:cluster-name", "Value": name}, {"Key": "eks:nodegroup-name", "Value": ngname},
                 {"Key": f"kubernetes.io/cluster/{name}", "Value": "owned"},
                 *[{"Key": k, "Value": v} for k, v in (ng.get("tags") or {}).items()]]
    run = ec2.run_instances(ImageId=image, InstanceType=ng["instanceType"], MinCount=count, MaxCount=count,
                            SubnetId=subnet["SubnetId"], TagSpecifications=[{"ResourceType": "instance", "Tags": inst_tags}],
                            **({"InstanceMarketOptions": {"MarketType": "spot"}} if ng.get("spot") else {}))
    kube = Kube(os.environ[KUBE_URL_ENV])
    for inst in run["Instances"]:
        node = inst["PrivateDnsName"]
        labels = {**(ng.get("labels") or {}), "eks.amazonaws.com/nodegroup": ngname,
                  "eks.amazonaws.com/capacityType": "SPOT" if ng.get("spot") else "ON_DEMAND",
                  "node.kubernetes.io/instance-type": ng["instanceType"],
                  "topology.kubernetes.io/zone": subnet["AvailabilityZone"], "kubernetes.io/hostname": node}
        if ng["instanceType"] not in NODE_FACTS:
            fail(f"Error: the double has no node facts for {ng['instanceType']}")
        alloc = node_allocatable(ng["instanceType"])
        kube.create({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": labels, "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "spec": {"providerID": f"aws:///{subnet['AvailabilityZone']}/{inst['InstanceId']}",
                     "taints": [{"key": t["key"], "value": t.get("value", ""), "effect": t["effect"]} for t in ng.get("taints") or []]},
            "status": {"capacity": dict(alloc), "allocatable": dict(alloc),
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
        })
    if ng.get("efaEnabled"):
        say("[ℹ]  applying EFA device plugin")
        kube.ensure({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": EFA_DAEMONSET, "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"name": "aws-efa-k8s-device-plugin"}}, "template": {
                "metadata": {"labels": {"name": "aws-efa-k8s-device-plugin"}},
                "spec": {"tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                                         {"key": "aws.amazon.com/efa", "operator": "Exists", "effect": "NoSchedule"}],
                         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [{
                                 "key": "node.kubernetes.io/instance-type", "operator": "In",
                                 "values": [t for t, f in NODE_FACTS.items() if f[3] > 0]}]}]}}},
                         "containers": [{"name": "aws-efa-k8s-device-plugin", "image": "efa-k8s-device-plugin:v0.5.6"}]}}},
        })
    reconcile_daemonsets(kube)
    say(f'[✔]  created 1 managed nodegroup(s) in cluster "{name}"')


def rolled_back(cfn: Any, stack: str) -> None:
    """The stack failed and CloudFormation rolled it back (the node group with it): eksctl's troubleshooting, then its error."""
    st = stack_exists(cfn, stack) or {"StackStatus": "DELETE_COMPLETE"}
    say(f'[✖]  unexpected status "{st["StackStatus"]}" while waiting for CloudFormation stack "{stack}"')
    say("[ℹ]  fetching stack events in attempt to troubleshoot the root cause of the failure")
    for e in cfn.describe_stack_events(StackName=stack)["StackEvents"] if st["StackStatus"] != "DELETE_COMPLETE" else []:
        if e["ResourceStatus"] == "CREATE_FAILED":
            say(f'[✖]  {e["ResourceType"]}/{e["LogicalResourceId"]}: CREATE_FAILED – "{e.get("ResourceStatusReason", "")}"')
    fail(f'Error: failed to create nodegroups for cluster: waiter state transitioned to Failure: stack "{stack}" {st["StackStatus"]}')


def create_nodegroup(args: argparse.Namespace) -> None:
    cfg = load_config(args.config_file)
    meta = cfg["metadata"]
    eks = client("eks", meta["region"])
    try:
        if eks.describe_cluster(name=meta["name"])["cluster"]["status"] != "ACTIVE":
            fail(f'Error: cluster "{meta["name"]}" is not ACTIVE')
    except eks.exceptions.ResourceNotFoundException:
        fail(f'Error: getting cluster "{meta["name"]}": ResourceNotFoundException: No cluster found for name: {meta["name"]}.')
    globs = [g for g in (args.include or "*").split(",") if g]
    chosen = [ng for ng in cfg.get("managedNodeGroups") or [] if any(fnmatch.fnmatch(ng["name"], g) for g in globs)]
    existing = set(eks.list_nodegroups(clusterName=meta["name"])["nodegroups"])
    for ng in chosen:
        if ng["name"] in existing:
            say(f'[ℹ]  1 existing nodegroup(s) ({ng["name"]}) will be excluded')
            continue
        with cloud_side():  # the stack, the group, its instances and nodes, and the EFA plugin eksctl applies
            create_one_nodegroup(cfg, ng)


def _delete_nodegroup(name: str, region: str, ngname: str) -> bool:
    cfn, eks, ec2 = client("cloudformation", region), client("eks", region), client("ec2", region)
    kube = Kube(os.environ[KUBE_URL_ENV])
    found = False
    try:
        eks.describe_nodegroup(clusterName=name, nodegroupName=ngname)
        found = True
    except eks.exceptions.ResourceNotFoundException:
        pass
    if found:
        say(f'[ℹ]  will drain and delete nodegroup "{ngname}"')
        nodes = [n for n in kube.list("Node") if (n["metadata"].get("labels") or {}).get("eks.amazonaws.com/nodegroup") == ngname]
        names = {n["metadata"]["name"] for n in nodes}
        for p in kube.list("Pod"):
            if (p.get("spec") or {}).get("nodeName") in names:
                kube.delete("Pod", p["metadata"]["name"], p["metadata"].get("namespace"))
        for n in names:
            kube.delete("Node", n)
        ids = [i["InstanceId"] for r in ec2.describe_instances(Filters=[
            {"Name": "tag:eks:nodegroup-name", "Values": [ngname]}, {"Name": "tag:eks:cluster-name", "Values": [name]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"] for i in r["Instances"]]
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
        eks.delete_nodegroup(clusterName=name, nodegroupName=ngname)
        delay(f"delete nodegroup {ngname}")
        reconcile_daemonsets(kube)
    stack = f"eksctl-{name}-nodegroup-{ngname}"
    if stack_exists(cfn, stack):
        found = True
        delete_stack(cfn, name, stack)
    return found


def delete_nodegroup(args: argparse.Namespace) -> None:
    if not _delete_nodegroup(args.cluster, args.region, args.name):
        fail(f'Error: nodegroup "{args.name}" not found in cluster "{args.cluster}"')
    say(f'[✔]  deleted 1 nodegroup(s) from cluster "{args.cluster}"')


def delete_cluster(args: argparse.Namespace) -> None:
    name, region = args.name, args.region
    cfn, eks, ec2 = client("cloudformation", region), client("eks", region), client("ec2", region)
    try:
        desc = eks.describe_cluster(name=name)["cluster"]
    except eks.exceptions.ResourceNotFoundException:
        fail(f'Error: cluster "{name}" not found: ResourceNotFoundException')
    say(f'[ℹ]  deleting EKS cluster "{name}"')
    for ng in eks.list_nodegroups(clusterName=name)["nodegroups"]:
        _delete_nodegroup(name, region, ng)
    kube = Kube(os.environ[KUBE_URL_ENV])
    kube.delete("DaemonSet", EFA_DAEMONSET, "kube-system")
    eks.delete_cluster(name=name)
    delay("delete cluster")
    stack = f"eksctl-{name}-cluster"
    vpc = desc["resourcesVpcConfig"].get("vpcId")
    if not vpc:
        subnets = desc["resourcesVpcConfig"]["subnetIds"]
        vpc = ec2.describe_subnets(SubnetIds=subnets[:1])["Subnets"][0]["VpcId"]
    if scenario().get("delete_leaves_nat"):
        say(f'[✖]  AWS::EC2::VPC/VPC: DELETE_FAILED – "The vpc \'{vpc}\' has dependencies and cannot be deleted."')
        delete_stack(cfn, name, stack)
        fail(f'Error: failed to delete cluster with nodegroup(s): waiter state transitioned to Failure: stack "{stack}" DELETE_FAILED')
    for nat in ec2.describe_nat_gateways(Filter=[{"Name": "vpc-id", "Values": [vpc]}])["NatGateways"]:
        if nat["State"] in ("pending", "available"):
            ec2.delete_nat_gateway(NatGatewayId=nat["NatGatewayId"])
            for a in nat.get("NatGatewayAddresses") or []:
                ec2.release_address(AllocationId=a["AllocationId"])
    for s in cfn.list_stacks()["StackSummaries"]:  # its pod identity roles (pkg/actions/cluster/owned.go)
        if s["StackStatus"] != "DELETE_COMPLETE" and s["StackName"].startswith(f"eksctl-{name}-podidentityrole-"):
            delete_stack(cfn, name, s["StackName"])
    delete_stack(cfn, name, stack)
    eks_state.forget(name)
    say('[✔]  all cluster resources were deleted')


# ---------------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eksctl", add_help=False)
    sub = p.add_subparsers(dest="verb", required=True)
    sub.add_parser("version")
    create = sub.add_parser("create").add_subparsers(dest="noun", required=True)
    c = create.add_parser("cluster")
    c.add_argument("--config-file", "-f", required=True)
    c.add_argument("--without-nodegroup", action="store_true")
    c.add_argument("--kubeconfig")
    c.add_argument("--install-nvidia-plugin", choices=["true", "false"], default="true")
    ca = create.add_parser("addon")
    ca.add_argument("--config-file", "-f", required=True)
    ca.add_argument("--force", action="store_true")
    cp = create.add_parser("podidentityassociation")
    cp.add_argument("--config-file", "-f", required=True)
    n = create.add_parser("nodegroup")
    n.add_argument("--config-file", "-f", required=True)
    n.add_argument("--include")
    n.add_argument("--install-nvidia-plugin", choices=["true", "false"], default="true")
    delete = sub.add_parser("delete").add_subparsers(dest="noun", required=True)
    dn = delete.add_parser("nodegroup")
    dn.add_argument("--cluster", required=True)
    dn.add_argument("--region", required=True)
    dn.add_argument("--name", "-n", required=True)
    dn.add_argument("--wait", action="store_true")
    dc = delete.add_parser("cluster")
    dc.add_argument("--name", "-n", required=True)
    dc.add_argument("--region", required=True)
    dc.add_argument("--wait", action="store_true")
    utils = sub.add_parser("utils").add_subparsers(dest="noun", required=True)
    wk = utils.add_parser("write-kubeconfig")
    wk.add_argument("--cluster", required=True)
    wk.add_argument("--region", required=True)
    wk.add_argument("--kubeconfig", required=True)
    return p


def main(argv: list[str]) -> int:
    t0 = time.time()
    rc = 0
    try:
        args = parser().parse_args(argv)
        if args.verb == "version":
            say(os.environ.get("DOUBLES_EKSCTL_VERSION", VERSION))
        elif (args.verb, args.noun) == ("create", "cluster"):
            create_cluster(args)
        elif (args.verb, args.noun) == ("create", "nodegroup"):
            create_nodegroup(args)
        elif (args.verb, args.noun) == ("create", "addon"):
            create_addon(args)
        elif (args.verb, args.noun) == ("create", "podidentityassociation"):
            create_podidentityassociation(args)
        elif (args.verb, args.noun) == ("delete", "nodegroup"):
            delete_nodegroup(args)
        elif (args.verb, args.noun) == ("delete", "cluster"):
            delete_cluster(args)
        elif (args.verb, args.noun) == ("utils", "write-kubeconfig"):
            client("eks", args.region).describe_cluster(name=args.cluster)
            write_kubeconfig(args.kubeconfig, args.cluster, args.region)
    except SystemExit as e:
        rc = int(e.code or 0)
    finally:
        log_call("eksctl", argv, rc, t0)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
