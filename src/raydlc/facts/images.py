"""The DLC images raydlc knows (what each ships) and the Cluster Autoscaler image for each Kubernetes minor."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageFacts:
    image: str
    ray: str
    torch: str
    cuda: str
    nccl: str
    efa_installer: str


DEFAULT_IMAGE = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"

IMAGES: dict[str, ImageFacts] = {
    DEFAULT_IMAGE: ImageFacts(DEFAULT_IMAGE, "2.58.0", "2.13.0", "13.0.2", "2.29.7", "1.49"),
}


def image_facts(image: str) -> ImageFacts | None:
    return IMAGES.get(image)


# The Cluster Autoscaler's minor version must match the control plane's (its README: "use the
# Cluster Autoscaler release that matches your Kubernetes minor"); the chart (CLUSTER_AUTOSCALER_VERSION,
# kubernetes/autoscaler charts/cluster-autoscaler 9.59.0, appVersion 1.35.0) is told the image tag.
# The newest patch of each minor, from the kubernetes/autoscaler tags `cluster-autoscaler-1.N.P`.
CLUSTER_AUTOSCALER_REPOSITORY = "registry.k8s.io/autoscaling/cluster-autoscaler"
CLUSTER_AUTOSCALER_IMAGES: dict[str, str] = {
    "1.30": "v1.30.7",
    "1.31": "v1.31.5",
    "1.32": "v1.32.7",
    "1.33": "v1.33.6",
    "1.34": "v1.34.5",
    "1.35": "v1.35.2",
    "1.36": "v1.36.1",
}


def cluster_autoscaler_image(k8s_version: str) -> str | None:
    """The Cluster Autoscaler image tag for a Kubernetes minor version; None when none is pinned."""
    return CLUSTER_AUTOSCALER_IMAGES.get(k8s_version)
