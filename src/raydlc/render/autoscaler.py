"""Idle GPU nodes leave and come back: what the Kubernetes Cluster Autoscaler needs, as data.

Two engines share the work when IDLE_MINUTES > 0, and raydlc runs no loop of its own:

- Ray's autoscaler (KubeRay's in-tree autoscaling, v2; raydlc.render.raycluster) judges work: it
  removes a GPU worker pod that has held no Ray task or actor for IDLE_MINUTES, and asks KubeRay for
  pods when a job's placement group needs them.
- The Cluster Autoscaler judges nodes: it adds a GPU node for a worker pod that cannot be scheduled
  and removes a GPU node that no pod needs. Ray has already waited IDLE_MINUTES before emptying a
  node, so the CA removes an empty one after a short `--scale-down-unneeded-time`
  (`EMPTY_NODE_MINUTES`); a node that joined and never held work (the ones `up` starts to verify the
  hardware) gets IDLE_MINUTES through `--scale-down-delay-after-add`. Either way a GPU node bills
  about IDLE_MINUTES (plus `EMPTY_NODE_MINUTES`) after its last work, not more.

The CA finds the GPU node group's Auto Scaling group by two tags (`--node-group-auto-discovery=asg:tag=`,
the chart's `autoDiscovery.tags`; kubernetes/autoscaler cluster-autoscaler/cloudprovider/aws/README.md
"Auto-Discovery Setup"). Scaling from zero it cannot look at a node, so it reads the node's labels,
taints and extended resources from `k8s.io/cluster-autoscaler/node-template/...` tags on the ASG
(aws_manager.go `extractLabelsFromAsg`, `extractTaintsFromAsg` — which wants `value:Effect` —
and `extractAllocatableResourcesFromAsg`). eksctl copies a managed node group's labels, taints and
`tags` to its ASG when `propagateASGTags: true` (eksctl v0.230.0 pkg/cfn/manager/nodegroup.go
`propagateManagedNodeGroupTagsToASGTask`, builder.GenerateClusterAutoscalerTags); its taint tags
carry only the taint's value, so raydlc writes the taint tag itself in the `tags`, which eksctl
applies after (and over) its own.

GPU_CAPACITY_TYPE=spot-then-on-demand on an elastic cluster is two GPU groups, both scaling from 0: the Spot one
and an On-Demand twin (`fallback_group`), with the CA's `priority` expander preferring Spot (kubernetes/autoscaler
cluster-autoscaler/expander/priority/readme.md: the highest priority whose regexes match a group's name wins; a group
no regex matches is never expanded). When the Spot group cannot launch, the CA backs it off and expands the next
option: the On-Demand group. The chart (9.59.0 templates/priority-expander-configmap.yaml) writes
`expanderPriorities` into the `cluster-autoscaler-priority-expander` ConfigMap only when `extraArgs.expander` lists
`priority`. On AWS a managed node group's ASG is named `eks-<node group>-<uuid>`, so each regex anchors the name.

The CA's role (a pod identity, as the Ray pods' S3 role in raydlc.render.bucket) may read every
ASG but change only those tagged `k8s.io/cluster-autoscaler/<cluster>=owned`: this cluster's.
"""

from __future__ import annotations

from typing import Any

from raydlc.config import Config
from raydlc.facts import images
from raydlc.render import nodes
from raydlc.render.bucket import _capped

RELEASE = "cluster-autoscaler"  # the Helm release, its Deployment (fullnameOverride) and its service account
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = RELEASE
POLICY_NAME = "raydlc-cluster-autoscaler"
ENABLED_TAG = "k8s.io/cluster-autoscaler/enabled"
TEMPLATE = "k8s.io/cluster-autoscaler/node-template/"
EMPTY_NODE_MINUTES = 2
# Kubernetes' example requests for the CA (its chart sets none); the system node leaves room for them
# beside the operator, CoreDNS and the head's autoscaler sidecar (raydlc.render.sizing, system_node_pods).
RESOURCES = {"requests": {"cpu": "100m", "memory": "600Mi"}, "limits": {"memory": "600Mi"}}

# Reads on "*" as the CA README lists them ("Full Cluster Autoscaler Features Policy"): ASG discovery,
# instance types for node templates, launch templates, and the managed node group's labels and taints.
READ_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations",
    "autoscaling:DescribeScalingActivities",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:GetInstanceTypesFromInstanceRequirements",
    "eks:DescribeNodegroup",
)
WRITE_ACTIONS = ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup")


def enabled(cfg: Config) -> bool:
    """IDLE_MINUTES > 0: the GPU group scales between 0 and GPU_NODE_COUNT."""
    return cfg.gpu_nodes.idle_minutes > 0


def two_groups(cfg: Config) -> bool:
    """Spot then On-Demand as two GPU groups the CA chooses between (only where the CA runs: IDLE_MINUTES > 0)."""
    return enabled(cfg) and cfg.gpu_nodes.capacity_type == "spot-then-on-demand"


def fallback_group(cfg: Config) -> str:
    """The On-Demand twin of the Spot GPU group."""
    return f"{cfg.gpu_nodes.nodegroup_name}-on-demand"


SPOT_PRIORITY, ON_DEMAND_PRIORITY = 50, 10


def priorities(cfg: Config) -> dict[int, list[str]]:
    """The priority expander's table: the Spot group's ASG first, the On-Demand twin's next."""
    uuid = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    return {SPOT_PRIORITY: [f"^eks-{cfg.gpu_nodes.nodegroup_name}-{uuid}$"],
            ON_DEMAND_PRIORITY: [f"^eks-{fallback_group(cfg)}-{uuid}$"]}


def cluster_tag(cfg: Config) -> str:
    return f"k8s.io/cluster-autoscaler/{cfg.cluster.name}"


def role_name(cfg: Config) -> str:
    return _capped(f"raydlc-{cfg.cluster.name}-{cfg.cluster.region}-autoscaler", 64)


def asg_tags(cfg: Config, efa_interfaces: int) -> dict[str, str]:
    """The GPU node group's tags for discovery and for scale-from-zero (eksctl propagates them to the ASG)."""
    tags = {ENABLED_TAG: "true", cluster_tag(cfg): "owned"}
    tags.update({f"{TEMPLATE}label/{k}": v for k, v in nodes.gpu_labels(cfg).items()})
    tags.update({f"{TEMPLATE}taint/{t['key']}": f"{t['value']}:{t['effect']}" for t in nodes.gpu_taints(cfg)})
    tags[f"{TEMPLATE}resources/{nodes.GPU_RESOURCE}"] = str(cfg.gpu_nodes.gpus_per_node)
    tags[f"{TEMPLATE}resources/{nodes.EFA_RESOURCE}"] = str(efa_interfaces)
    return tags


def policy(cfg: Config) -> dict[str, Any]:
    """Reads everywhere; SetDesiredCapacity and TerminateInstanceInAutoScalingGroup only on this cluster's ASGs."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "DiscoverNodeGroups", "Effect": "Allow", "Action": list(READ_ACTIONS), "Resource": ["*"]},
            {"Sid": "ScaleThisClustersGroups", "Effect": "Allow", "Action": list(WRITE_ACTIONS), "Resource": ["*"],
             "Condition": {"StringEquals": {f"aws:ResourceTag/{cluster_tag(cfg)}": "owned"}}},
        ],
    }


def pod_identity(cfg: Config) -> dict[str, Any] | None:
    """The eksctl `iam.podIdentityAssociations` entry for the CA's service account; None at IDLE_MINUTES=0.
    The chart creates the service account (`rbac.serviceAccount`), so eksctl makes only the role and the association."""
    if not enabled(cfg):
        return None
    return {
        "namespace": NAMESPACE,
        "serviceAccountName": SERVICE_ACCOUNT,
        "createServiceAccount": False,
        "roleName": role_name(cfg),
        "permissionPolicyName": POLICY_NAME,
        "permissionPolicy": policy(cfg),
        "tags": {"raydlc.io/cluster": cfg.cluster.name},
    }


def args(cfg: Config) -> dict[str, Any]:
    """The CA's flags beyond the chart's (its `extraArgs`): the scale-down timing IDLE_MINUTES sets (module docstring)."""
    idle = cfg.gpu_nodes.idle_minutes
    out = {"scale-down-unneeded-time": f"{EMPTY_NODE_MINUTES}m", "scale-down-delay-after-add": f"{idle}m"}
    if two_groups(cfg):
        out["expander"] = "priority"
    return out


def values(cfg: Config) -> dict[str, Any]:
    """The chart's values (kubernetes/autoscaler charts/cluster-autoscaler values.yaml keys), on the system node."""
    return {
        "cloudProvider": "aws",
        "awsRegion": cfg.cluster.region,
        "autoDiscovery": {"clusterName": cfg.cluster.name},
        "fullnameOverride": RELEASE,
        "image": {"repository": images.CLUSTER_AUTOSCALER_REPOSITORY,
                  "tag": images.cluster_autoscaler_image(cfg.cluster.k8s_version) or ""},
        "rbac": {"serviceAccount": {"create": True, "name": SERVICE_ACCOUNT}},
        "extraArgs": args(cfg),
        "nodeSelector": nodes.system_labels(),
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "resources": RESOURCES,
        **({"expanderPriorities": priorities(cfg)} if two_groups(cfg) else {}),
    }
