"""What AWS says about one cluster: its EKS objects, eksctl's stacks, and everything that bills.

Each function takes the client it needs (from `raydlc.edges.aws`, through the Context) and answers
with plain data; "not found" is an answer (None or []), not an error. These are the facts `up`
checks before acting and `down` checks before it calls a cluster gone: AWS, not a tool's exit
code, decides that nothing is left.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raydlc.capacity import PROBE_TAG  # the tag `raydlc capacity --probe` puts on its reservation
from raydlc.edges import aws
from raydlc.render.eksctl import OWNER_TAG

# Stacks that will never become healthy again and block a create of the same name.
STALE_STACK = frozenset({"ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "DELETE_FAILED", "CREATE_FAILED", "UPDATE_ROLLBACK_FAILED"})
LIVE_STACK_STATUSES = [
    "CREATE_IN_PROGRESS", "CREATE_FAILED", "CREATE_COMPLETE", "ROLLBACK_IN_PROGRESS", "ROLLBACK_FAILED",
    "ROLLBACK_COMPLETE", "DELETE_IN_PROGRESS", "DELETE_FAILED", "UPDATE_IN_PROGRESS",
    "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS", "UPDATE_COMPLETE", "UPDATE_FAILED", "UPDATE_ROLLBACK_IN_PROGRESS",
    "UPDATE_ROLLBACK_FAILED", "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS", "UPDATE_ROLLBACK_COMPLETE",
    "REVIEW_IN_PROGRESS", "IMPORT_IN_PROGRESS", "IMPORT_COMPLETE", "IMPORT_ROLLBACK_IN_PROGRESS",
    "IMPORT_ROLLBACK_FAILED", "IMPORT_ROLLBACK_COMPLETE",
]
BILLED_INSTANCE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
CAPACITY_ERRORS = ("InsufficientInstanceCapacity", "InsufficientCapacity", "Unsupported", "InsufficientFreeAddresses",
                   "does not have sufficient", "not supported in your requested Availability Zone",
                   "UnfulfillableCapacity")


def cluster_stack(name: str) -> str:
    return f"eksctl-{name}-cluster"


def nodegroup_stack(name: str, nodegroup: str) -> str:
    return f"eksctl-{name}-nodegroup-{nodegroup}"


def pod_identity_stack(name: str, association: str) -> str:
    """The role stack eksctl makes for `namespace/serviceAccount` (pkg/actions/podidentityassociation `MakeStackName`)."""
    namespace, service_account = association.split("/", 1)
    return f"eksctl-{name}-podidentityrole-{namespace}-{service_account}"


def _missing(e: aws.AwsCallError) -> bool:
    return e.code in ("ResourceNotFoundException", "NotFoundException") or (
        e.code == "ValidationError" and "does not exist" in e.message
    )


def cluster(eks: Any, name: str) -> dict[str, Any] | None:
    try:
        return dict(aws.call(eks, "describe_cluster", name=name)["cluster"])
    except aws.AwsCallError as e:
        if _missing(e):
            return None
        raise


def owned(desc: dict[str, Any], name: str) -> bool:
    return (desc.get("tags") or {}).get(OWNER_TAG) == name


def nodegroup(eks: Any, cluster_name: str, ng: str) -> dict[str, Any] | None:
    try:
        return dict(aws.call(eks, "describe_nodegroup", clusterName=cluster_name, nodegroupName=ng)["nodegroup"])
    except aws.AwsCallError as e:
        if _missing(e):
            return None
        raise


def nodegroups(eks: Any, cluster_name: str) -> list[str]:
    try:
        return list(aws.paginate(eks, "list_nodegroups", "nodegroups", clusterName=cluster_name))
    except aws.AwsCallError as e:
        if _missing(e):
            return []
        raise


def addons(eks: Any, cluster_name: str) -> set[str]:
    """The cluster's EKS add-ons by name (eksctl makes them after the control plane)."""
    try:
        return set(aws.paginate(eks, "list_addons", "addons", clusterName=cluster_name))
    except aws.AwsCallError as e:
        if _missing(e):
            return set()
        raise


def pod_identities(eks: Any, cluster_name: str) -> set[str]:
    """The cluster's pod identity associations as `namespace/serviceAccount` (eksctl makes them after the add-ons)."""
    try:
        found = aws.paginate(eks, "list_pod_identity_associations", "associations", clusterName=cluster_name)
        return {f"{a['namespace']}/{a['serviceAccount']}" for a in found}
    except aws.AwsCallError as e:
        if _missing(e):
            return set()
        raise


def stack(cfn: Any, name: str) -> dict[str, Any] | None:
    """The live stack of that name; None when there is none (never created or DELETE_COMPLETE)."""
    try:
        found = aws.call(cfn, "describe_stacks", StackName=name).get("Stacks") or []
    except aws.AwsCallError as e:
        if _missing(e):
            return None
        raise
    live = [s for s in found if s.get("StackStatus") != "DELETE_COMPLETE"]
    return dict(live[0]) if live else None


def stacks(cfn: Any, prefix: str) -> list[dict[str, Any]]:
    """Every stack whose name starts with `prefix` and that is not DELETE_COMPLETE."""
    return [
        dict(s) for s in aws.paginate(cfn, "list_stacks", "StackSummaries", StackStatusFilter=LIVE_STACK_STATUSES)
        if str(s.get("StackName", "")).startswith(prefix)
    ]


def stack_failure(cfn: Any, name: str) -> str:
    """The first failed resource of a stack and why, from its events (what the console shows)."""
    try:
        events = list(aws.paginate(cfn, "describe_stack_events", "StackEvents", StackName=name))
    except aws.AwsCallError:
        return ""
    for ev in reversed(events):
        if str(ev.get("ResourceStatus", "")).endswith("FAILED") and ev.get("ResourceStatusReason"):
            return f"{ev.get('LogicalResourceId')} ({ev.get('ResourceType')}): {ev['ResourceStatusReason']}"
    return ""


def subnet_zones(ec2: Any, subnet_ids: Iterable[str]) -> dict[str, str]:
    ids = list(subnet_ids)
    if not ids:
        return {}
    return {s["SubnetId"]: s["AvailabilityZone"] for s in aws.call(ec2, "describe_subnets", SubnetIds=ids)["Subnets"]}


def launch_error(eks: Any, asg: Any, ng: dict[str, Any]) -> str:
    """Why a node group has no nodes: the Auto Scaling group's launch error, as EKS reports it.

    EKS copies the group's failed launch (InsufficientInstanceCapacity, …) into the node
    group's health issues; the group's own scaling activities are read when EKS says nothing.
    """
    issues = (ng.get("health") or {}).get("issues") or []
    if issues:
        return "; ".join(f"{i.get('code')}: {i.get('message', '').strip()}" for i in issues)
    for group in (ng.get("resources") or {}).get("autoScalingGroups") or []:
        try:
            acts = aws.call(asg, "describe_scaling_activities", AutoScalingGroupName=group["name"], MaxRecords=10)
        except aws.AwsCallError:
            continue
        for a in acts.get("Activities") or []:
            if a.get("StatusCode") in ("Failed", "Cancelled") and a.get("StatusMessage"):
                return str(a["StatusMessage"])
    return ""


def is_capacity_error(text: str) -> bool:
    return any(marker in text for marker in CAPACITY_ERRORS)


# EC2's answer to a Spot launch beyond the account's Spot vCPU quota (EC2 API error codes: "MaxSpotInstanceCountExceeded:
# You've reached the limit on the number of Spot Instances that you can launch"), which EKS shows in the node group's
# AsgInstanceLaunchFailures issue. The quota is the region's, so no other AZ helps; On-Demand may.
SPOT_QUOTA_ERRORS = ("MaxSpotInstanceCountExceeded",)


def is_spot_quota_error(text: str) -> bool:
    return any(marker in text for marker in SPOT_QUOTA_ERRORS)


def _instances(ec2: Any, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in aws.paginate(ec2, "describe_instances", "Reservations", Filters=filters):
        out.extend(r.get("Instances") or [])
    return out


def instances(ec2: Any, name: str) -> list[dict[str, Any]]:
    """Instances of the cluster that bill or may bill: EKS's own tag, or raydlc's owner tag."""
    states = {"Name": "instance-state-name", "Values": BILLED_INSTANCE_STATES}
    found: dict[str, dict[str, Any]] = {}
    for key in ("eks:cluster-name", OWNER_TAG):
        for inst in _instances(ec2, [{"Name": f"tag:{key}", "Values": [name]}, states]):
            found[inst["InstanceId"]] = inst
    return list(found.values())


def tag(resource: dict[str, Any], key: str) -> str | None:
    for t in resource.get("Tags") or []:
        if t.get("Key") == key:
            return t.get("Value")
    return None


def vpcs(ec2: Any, name: str, known: Iterable[str] = ()) -> list[str]:
    """The cluster's VPC ids: tagged by raydlc (through eksctl), plus any known from the cluster."""
    ids = {v["VpcId"] for v in aws.call(ec2, "describe_vpcs", Filters=[{"Name": f"tag:{OWNER_TAG}", "Values": [name]}])["Vpcs"]}
    return sorted(ids | {v for v in known if v})


def nat_gateways(ec2: Any, name: str, vpc_ids: Iterable[str] = ()) -> list[dict[str, Any]]:
    """NAT gateways that bill (pending/available) in the cluster's VPCs or tagged for it."""
    live = {"Name": "state", "Values": ["pending", "available"]}
    found: dict[str, dict[str, Any]] = {}
    filters = [[{"Name": f"tag:{OWNER_TAG}", "Values": [name]}, live]]
    if list(vpc_ids):
        filters.append([{"Name": "vpc-id", "Values": list(vpc_ids)}, live])
    for f in filters:
        for n in aws.paginate(ec2, "describe_nat_gateways", "NatGateways", Filter=f):
            found[n["NatGatewayId"]] = n
    return list(found.values())


def addresses(ec2: Any, name: str, allocation_ids: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Elastic IPs of the cluster: tagged for it, or known to belong to its NAT gateways."""
    found = {a["AllocationId"]: a for a in aws.call(
        ec2, "describe_addresses", Filters=[{"Name": f"tag:{OWNER_TAG}", "Values": [name]}])["Addresses"]}
    wanted = [a for a in allocation_ids if a and a not in found]
    if wanted:
        try:
            for a in aws.call(ec2, "describe_addresses", AllocationIds=wanted)["Addresses"]:
                found[a["AllocationId"]] = a
        except aws.AwsCallError as e:
            if "NotFound" not in (e.code or ""):
                raise
    return list(found.values())


def capacity_reservations(ec2: Any, name: str) -> list[dict[str, Any]]:
    """Active or pending reservations raydlc made (a probe's, or tagged for this cluster)."""
    live = {"Name": "state", "Values": ["active", "pending"]}
    found: dict[str, dict[str, Any]] = {}
    for f in ([{"Name": "tag-key", "Values": [PROBE_TAG]}, live], [{"Name": f"tag:{OWNER_TAG}", "Values": [name]}, live]):
        for r in aws.call(ec2, "describe_capacity_reservations", Filters=f).get("CapacityReservations") or []:
            found[r["CapacityReservationId"]] = r
    return list(found.values())


def leftovers(eks: Any, cfn: Any, ec2: Any, name: str, vpc_ids: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Everything of the cluster AWS still lists, by kind (reads only): empty lists mean nothing bills."""
    desc = cluster(eks, name)
    known = list(vpc_ids or [])
    if desc is not None:
        known.append((desc.get("resourcesVpcConfig") or {}).get("vpcId", ""))
    found_vpcs = vpcs(ec2, name, known)
    nats = nat_gateways(ec2, name, found_vpcs)
    alloc = [a.get("AllocationId", "") for n in nats for a in n.get("NatGatewayAddresses") or []]
    return {
        "cluster": [f"{name} ({desc.get('status')})"] if desc else [],
        "stacks": [s["StackName"] for s in stacks(cfn, f"eksctl-{name}-")],
        "instances": [i["InstanceId"] for i in instances(ec2, name)],
        "nat_gateways": [n["NatGatewayId"] for n in nats],
        "addresses": [a["AllocationId"] for a in addresses(ec2, name, alloc)],
        "vpcs": found_vpcs,
    }
