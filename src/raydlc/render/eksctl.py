"""The eksctl ClusterConfig (eksctl.io/v1alpha5): VPC, add-ons and the two managed node groups.

The GPU node group lives in exactly one Availability Zone: EFA traffic cannot cross AZs, and
eksctl's `efaEnabled` also gives it a cluster placement group and EFA network interfaces. For a
managed node group on Kubernetes 1.33 or newer eksctl creates no separate EFA security group: the
cluster's default security group carries EFA's traffic (eksctl v0.230.0 pkg/utils/efa/efa.go
`ProcessSecurityGroup`/`IsBuiltInSupported`); older versions get eksctl's own "EFA-enabled" group.
The cluster itself needs at least two AZs (an EKS requirement), one of which is the GPU AZ.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from raydlc.config import Config, zone_problem
from raydlc.errors import InputError
from raydlc.render import autoscaler, bucket, nodes

API_VERSION = "eksctl.io/v1alpha5"
OWNER_TAG = "raydlc.io/cluster"  # on every AWS resource of the cluster; `raydlc down` refuses clusters without it
CORE_ADDONS = ("vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent")
# EKS enforces NetworkPolicy only when the VPC CNI add-on (1.14 or newer) is told to; eksctl's
# `version: latest` resolves to the newest add-on version for the cluster's Kubernetes version
# (pkg/actions/addon/addon.go getLatestMatchingVersion, DescribeAddonVersions by KubernetesVersion),
# which on every Kubernetes version raydlc accepts is well past 1.14. Without this the head's
# NetworkPolicy (raydlc.render.netpol) would be accepted by the API server and enforced by nobody.
ADDON_SETTINGS: dict[str, dict[str, str]] = {
    "vpc-cni": {"version": "latest", "configurationValues": json.dumps({"enableNetworkPolicy": "true"})},
}

# eksctl installs the NVIDIA plugin itself only for AmazonLinux2 (which raydlc does not offer);
# the flag keeps that true should eksctl's default change. See raydlc.render.helm for owners.
CREATE_FLAGS: tuple[str, ...] = ("--install-nvidia-plugin=false",)


def availability_zones(cfg: Config, zones: Sequence[str] | None) -> tuple[list[str], str]:
    """(cluster AZs, the one GPU AZ) from GPU_AZ and the capacity answer (AZs offering the type, best first)."""
    offered = list(dict.fromkeys(zones or []))
    region = cfg.cluster.region
    for z in offered:
        if why := zone_problem(z, region):
            raise InputError(f"--zones: {why}", hint=f"pass zones such as {region}a,{region}b")
    gpu_az = cfg.gpu_nodes.az or (offered[0] if offered else None)
    if gpu_az is None:
        raise InputError(
            "GPU_AZ: the GPU Availability Zone is unknown (GPU_AZ is empty and no capacity answer was given)",
            hint=f"set GPU_AZ (e.g. {region}a) and pass the zones that offer {cfg.gpu_nodes.instance_type} "
            f"(raydlc render --zones {region}a,{region}b)",
        )
    if offered and gpu_az not in offered:
        raise InputError(
            f"GPU_AZ: {gpu_az} is not among the zones that offer {cfg.gpu_nodes.instance_type} ({', '.join(offered)})",
            hint="pick GPU_AZ from those zones, or leave it empty to take the best one",
        )
    cluster_azs = [gpu_az] + [z for z in offered if z != gpu_az]
    if len(cluster_azs) < 2:
        raise InputError(
            f"an EKS cluster needs subnets in at least two Availability Zones; only {gpu_az} is known",
            hint=f"pass a second zone of {region}, e.g. raydlc render --zones {gpu_az},<another zone>",
        )
    return cluster_azs, gpu_az


def _nodegroup(
    name: str, instance: str, count: int, volume_gb: int, ami: str, labels: dict[str, str]
) -> dict[str, Any]:
    return {
        "name": name,
        "instanceType": instance,
        "desiredCapacity": count,
        "minSize": count,
        "maxSize": count,
        "privateNetworking": True,
        "amiFamily": ami,
        "volumeSize": volume_gb,
        "volumeType": "gp3",
        "labels": labels,
    }


def _elastic(cfg: Config, gpu: dict[str, Any]) -> None:
    """The GPU group scales between 0 and GPU_NODE_COUNT: the Cluster Autoscaler finds it by its tags and
    sizes a node it has never seen from them (raydlc.render.autoscaler). It starts at GPU_NODE_COUNT so
    that `up` sees every GPU and EFA interface once; idle, the nodes leave after IDLE_MINUTES."""
    it = cfg.gpu_instance
    gpu["minSize"] = 0
    gpu["propagateASGTags"] = True
    gpu["tags"] = {**gpu["tags"], **autoscaler.asg_tags(cfg, it.efa_interfaces if it is not None else 1)}


def spot(cfg: Config) -> bool:
    """Whether the GPU node group asks for Spot capacity. eksctl v0.230.0's ManagedNodeGroup `spot: true`
    becomes the AWS::EKS::Nodegroup's CapacityType SPOT (pkg/cfn/builder/managed_nodegroup.go); it keeps the
    one `instanceType` (eksctl refuses instanceType with instanceTypes) and the group's one AZ and EFA.
    The system group never does."""
    return cfg.gpu_nodes.capacity_type != "on-demand"


def on_demand(cfg: Config) -> Config:
    """The same config with the GPU nodes on-demand: spot-then-on-demand's fallback group."""
    return cfg.model_copy(update={"gpu_nodes": cfg.gpu_nodes.model_copy(update={"capacity_type": "on-demand"})})


def pod_identity_associations(cfg: Config) -> list[dict[str, Any]]:
    """The ClusterConfig's `iam.podIdentityAssociations` (eks-pod-identity-agent, one of CORE_ADDONS, serves them):
    the Ray head's and workers' S3 access (raydlc.render.bucket) and the Cluster Autoscaler's ASG access
    (raydlc.render.autoscaler)."""
    ca = autoscaler.pod_identity(cfg)
    return [*bucket.pod_identities(cfg), *([ca] if ca is not None else [])]


def association_name(pia: Mapping[str, Any]) -> str:
    """`namespace/serviceAccount`, as EKS lists an association and eksctl names it."""
    return f"{pia['namespace']}/{pia['serviceAccountName']}"


def render_eksctl(cfg: Config, zones: Sequence[str] | None = None) -> dict[str, Any]:
    cluster_azs, gpu_az = availability_zones(cfg, zones)
    sysn, gpun = cfg.system_nodes, cfg.gpu_nodes
    system = _nodegroup(
        sysn.nodegroup_name, sysn.instance_type, sysn.count, sysn.volume_size_gb, cfg.cluster.ami_family,
        nodes.system_labels(),
    )
    gpu = _nodegroup(
        gpun.nodegroup_name, gpun.instance_type, gpun.count, gpun.volume_size_gb, cfg.cluster.ami_family,
        nodes.gpu_labels(cfg),
    )
    for ng in (system, gpu):
        ng["tags"] = {OWNER_TAG: cfg.cluster.name}
    gpu["availabilityZones"] = [gpu_az]
    gpu["efaEnabled"] = True
    if spot(cfg):
        gpu["spot"] = True
    taints = nodes.gpu_taints(cfg)
    if taints:
        gpu["taints"] = taints
    if autoscaler.enabled(cfg):
        _elastic(cfg, gpu)
    groups = [system, gpu]
    if autoscaler.two_groups(cfg):  # the On-Demand twin the CA expands when the Spot group cannot launch
        groups.append({**gpu, "name": autoscaler.fallback_group(cfg), "desiredCapacity": 0, "spot": False})
        groups[-1].pop("spot")
    iam: dict[str, Any] = {"withOIDC": True}
    associations = pod_identity_associations(cfg)
    if associations:
        iam["podIdentityAssociations"] = associations
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterConfig",
        "metadata": {
            "name": cfg.cluster.name,
            "region": cfg.cluster.region,
            "version": cfg.cluster.k8s_version,
            "tags": {"app.kubernetes.io/managed-by": "raydlc", OWNER_TAG: cfg.cluster.name},
        },
        "availabilityZones": cluster_azs,
        "vpc": {"nat": {"gateway": "Single"}},
        "iam": iam,
        "addons": [{"name": name, **ADDON_SETTINGS.get(name, {})} for name in CORE_ADDONS],
        "managedNodeGroups": groups,
    }
