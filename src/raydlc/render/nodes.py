"""The contract between node groups and pods: the labels and the taint both sides must agree on.

eksctl puts these on the nodes, and the Ray pods and device-plugin DaemonSets select and tolerate
them; keeping them in one place is what stops a renamed label from leaving a pod Pending.

The GPU taint key is `aws.amazon.com/efa`, not the more common `nvidia.com/gpu`, on purpose:
eksctl (`efaEnabled: true`) installs its own EFA device-plugin DaemonSet, and that DaemonSet
tolerates only `CriticalAddonsOnly` and `aws.amazon.com/efa` (eksctl adds no tolerations to it
for node-group taints). Under an `nvidia.com/gpu` taint the EFA plugin would never run, and
`vpc.amazonaws.com/efa` would never become allocatable. The taint still means what we want:
only pods that asked to be on the EFA GPU nodes land there.
"""

from __future__ import annotations

from typing import Any

from raydlc.config import Config
from raydlc.facts import instances

ROLE = "role"
SYSTEM_ROLE = "system"
GPU_ROLE = "gpu-worker"
GPU_PRESENT = "nvidia.com/gpu.present"  # the NVIDIA chart's default node affinity keys on it
# The Cluster Autoscaler 1.36 (cloudprovider/aws GPULabel) sees a GPU node by this label or by allocatable
# nvidia.com/gpu (utils/gpu NodeHasGpu). A labelled node whose device plugin has not registered yet is
# "resource unready" (processors/customresources/gpu_processor.go FilterOutNodesWithUnreadyResources), so the CA
# counts it as still coming up; an unlabelled one looks Ready with no GPU, and the CA adds more nodes for the
# pending worker pods, up to the group's maximum.
ACCELERATOR = "k8s.amazonaws.com/accelerator"

GPU_TAINT_KEY = "aws.amazon.com/efa"
GPU_TAINT_VALUE = "true"
GPU_TAINT_EFFECT = "NoSchedule"

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"


def system_labels() -> dict[str, str]:
    return {ROLE: SYSTEM_ROLE}


def gpu_labels(cfg: Config) -> dict[str, str]:
    """The GPU node group's labels: on the nodes (eksctl) and in the ASG's node-template tags (the CA)."""
    labels = {ROLE: GPU_ROLE, GPU_PRESENT: "true"}
    if accelerator := instances.accelerator_label(cfg.gpu_nodes.instance_type):
        labels[ACCELERATOR] = accelerator
    return labels


def gpu_taints(cfg: Config) -> list[dict[str, str]]:
    """The taints of the GPU node group, in eksctl's shape; none when GPU_TAINT is off."""
    if not cfg.gpu_nodes.taint:
        return []
    return [{"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT}]


def gpu_tolerations(cfg: Config) -> list[dict[str, Any]]:
    """Pod tolerations matching `gpu_taints` exactly, so the two can never drift apart."""
    return [
        {"key": t["key"], "operator": "Equal", "value": t["value"], "effect": t["effect"]}
        for t in gpu_taints(cfg)
    ]
