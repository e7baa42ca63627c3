"""Values for the Helm releases raydlc installs, and which component owns each device plugin.

One owner per device plugin, never two DaemonSets advertising one device:

- EFA (`vpc.amazonaws.com/efa`): **eksctl**. With `efaEnabled: true` eksctl always applies its
  own EFA device-plugin DaemonSet (there is no switch to turn that off), so raydlc renders no
  EFA chart; installing `eks/aws-efa-k8s-device-plugin` as well, as the reference does, leaves
  two plugins fighting over one kubelet resource. raydlc's GPU taint is chosen so that
  eksctl's DaemonSet tolerates it (see raydlc.render.nodes); the config refuses
  EFA_DEVICE_PLUGIN_VERSION (`raydlc.config.RETIRED`) rather than ignore it.
- NVIDIA (`nvidia.com/gpu`): **raydlc**, through the `nvdp/nvidia-device-plugin` chart pinned
  to NVIDIA_DEVICE_PLUGIN_VERSION, on AmazonLinux2023 nodes. eksctl would apply its own copy of
  that plugin for NVIDIA instance types on AmazonLinux2 *and* AmazonLinux2023 node groups
  (eksctl v0.230.0 pkg/eks/tasks.go `ClusterTasksForNodeGroups`), so raydlc tells it
  `--install-nvidia-plugin=false`: one owner, the pinned chart. The AL2023 NVIDIA AMI ships the
  driver but not the plugin. On Bottlerocket the plugin is built into the AMI, so raydlc renders
  no NVIDIA release there.
- The KubeRay operator: **raydlc**, pinned to KUBERAY_VERSION, on the system node.
- The Kubernetes Cluster Autoscaler (IDLE_MINUTES > 0): **raydlc**, the `cluster-autoscaler` chart
  pinned to CLUSTER_AUTOSCALER_VERSION, its image matching K8S_VERSION, on the system node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raydlc.config import Config
from raydlc.render import autoscaler, nodes


@dataclass(frozen=True)
class Release:
    """One `helm upgrade --install`: where the chart comes from and what it is given."""

    name: str
    namespace: str
    repo_name: str
    repo_url: str
    chart: str
    version: str
    values: dict[str, Any]

    @property
    def filename(self) -> str:
        return f"helm/{self.name}.values.yaml"


def kuberay_operator(cfg: Config) -> Release:
    return Release(
        name="kuberay-operator",
        namespace=cfg.ray.operator_namespace,
        repo_name="kuberay",
        repo_url="https://ray-project.github.io/kuberay-helm/",
        chart="kuberay/kuberay-operator",
        version=cfg.images.kuberay_version,
        values={"nodeSelector": nodes.system_labels()},
    )


def nvidia_device_plugin(cfg: Config) -> Release | None:
    """The NVIDIA plugin on the GPU nodes only; None where the AMI already runs it (Bottlerocket)."""
    if cfg.cluster.ami_family == "Bottlerocket":
        return None
    tolerations: list[dict[str, Any]] = [
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
        {"key": nodes.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
        *nodes.gpu_tolerations(cfg),
    ]
    return Release(
        name="nvidia-device-plugin",
        namespace="kube-system",
        repo_name="nvdp",
        repo_url="https://nvidia.github.io/k8s-device-plugin",
        chart="nvdp/nvidia-device-plugin",
        version=cfg.images.nvidia_device_plugin_version,
        values={
            "nodeSelector": {nodes.ROLE: nodes.GPU_ROLE},
            "tolerations": tolerations,
        },
    )


def cluster_autoscaler(cfg: Config) -> Release | None:
    """The Kubernetes Cluster Autoscaler on the system node (raydlc.render.autoscaler); None at IDLE_MINUTES=0."""
    if not autoscaler.enabled(cfg):
        return None
    return Release(
        name=autoscaler.RELEASE,
        namespace=autoscaler.NAMESPACE,
        repo_name="autoscaler",
        repo_url="https://kubernetes.github.io/autoscaler",
        chart="autoscaler/cluster-autoscaler",
        version=cfg.images.cluster_autoscaler_version,
        values=autoscaler.values(cfg),
    )


def releases(cfg: Config) -> list[Release]:
    """Every release raydlc owns, in install order: the GPU plugin before anything asks for GPUs."""
    return [r for r in (nvidia_device_plugin(cfg), kuberay_operator(cfg), cluster_autoscaler(cfg)) if r is not None]


def render_helm(cfg: Config) -> dict[str, dict[str, Any]]:
    """filename -> values document for each release."""
    return {r.filename: r.values for r in releases(cfg)}
