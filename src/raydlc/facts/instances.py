"""Facts raydlc knows without asking AWS: GPU instance types and the DLC images.

Config validation, rendering and planning need these before any cloud call (and offline);
`raydlc capacity` reads the live facts from EC2 and can confirm them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gib: float
    bf16_tflops: float  # dense bf16 peak, no sparsity


GPUS: dict[str, GpuModel] = {
    "l4": GpuModel("L4", 22.4, 121.0),  # 24 GB marketed, 22.4 GiB usable as reported by nvidia-smi
    "a10g": GpuModel("A10G", 22.4, 125.0),
    "l40s": GpuModel("L40S", 44.4, 362.0),
    "a100-40gb": GpuModel("A100-40GB", 40.0, 312.0),
    "a100-80gb": GpuModel("A100-80GB", 80.0, 312.0),
    "h100": GpuModel("H100", 80.0, 989.0),  # SXM
    "h100-pcie": GpuModel("H100 PCIe", 80.0, 756.0),
    "h100-nvl": GpuModel("H100 NVL", 94.0, 835.0),
    "h200": GpuModel("H200", 141.0, 989.0),
    "b200": GpuModel("B200", 180.0, 2250.0),
}


@dataclass(frozen=True)
class InstanceType:
    """One EC2 type as the planner, the renderer and the config checks need it.

    `network_gbps` and `efa_interfaces` are EC2's figures (DescribeInstanceTypes: NetworkPerformance,
    MaximumEfaInterfaces); a worker pod claims all of the node's EFA interfaces. `gpudirect_rdma`:
    EFA reads and writes GPU memory directly (p4d and later), so NCCL's traffic skips host memory.
    `gpu_link_gbytes_s` is the peak GPU-to-GPU rate inside the node, per GPU and direction, from
    NVIDIA's datasheets: NVLink 3 (A100 SXM) 600 GB/s and NVLink 4 (H100/H200 SXM) 900 GB/s
    both directions together; without NVLink, PCIe Gen4 x16 (L4, L40S, A10G): 32 GB/s.
    """

    name: str
    vcpus: int
    memory_gib: int
    gpus: int
    gpu: str | None  # key into GPUS
    efa_interfaces: int  # maximum EFA interfaces; 0 = no EFA
    network_gbps: float
    gpudirect_rdma: bool = False
    nvlink: bool = False  # False: GPUs talk over PCIe
    gpu_link_gbytes_s: float = 0.0

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def gpu_model(self) -> GpuModel | None:
        return GPUS[self.gpu] if self.gpu else None


PCIE4_X16 = 32.0  # GB/s per direction
NVLINK3 = 300.0  # A100 SXM: 600 GB/s over both directions
NVLINK4 = 450.0  # H100/H200 SXM: 900 GB/s over both directions


def _pcie(name: str, vcpus: int, mem: int, gpus: int, gpu: str, efa: int, gbps: float) -> InstanceType:
    return InstanceType(name, vcpus, mem, gpus, gpu, efa, gbps, gpu_link_gbytes_s=PCIE4_X16)


def _nvlink(name: str, vcpus: int, mem: int, gpus: int, gpu: str, efa: int, gbps: float, link: float) -> InstanceType:
    return InstanceType(name, vcpus, mem, gpus, gpu, efa, gbps, gpudirect_rdma=True, nvlink=True, gpu_link_gbytes_s=link)


# Cross-checked against EC2's DescribeInstanceTypes as moto 5.2 snapshots it (vCPUs, GiB, GPUs and
# their memory, NetworkPerformance, MaximumEfaInterfaces).
INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in [
        InstanceType("m7i.xlarge", 4, 16, 0, None, 0, 12.5),
        InstanceType("m7i.2xlarge", 8, 32, 0, None, 0, 12.5),
        InstanceType("m7i.4xlarge", 16, 64, 0, None, 0, 12.5),
        InstanceType("m7i.8xlarge", 32, 128, 0, None, 0, 12.5),
        InstanceType("m5.xlarge", 4, 16, 0, None, 0, 10),
        _pcie("g5.12xlarge", 48, 192, 4, "a10g", 1, 40),
        _pcie("g5.24xlarge", 96, 384, 4, "a10g", 1, 50),
        _pcie("g5.48xlarge", 192, 768, 8, "a10g", 1, 100),
        _pcie("g6.12xlarge", 48, 192, 4, "l4", 1, 40),
        _pcie("g6.24xlarge", 96, 384, 4, "l4", 1, 50),
        _pcie("g6.48xlarge", 192, 768, 8, "l4", 1, 100),
        _pcie("g6e.12xlarge", 48, 384, 4, "l40s", 1, 100),
        _pcie("g6e.24xlarge", 96, 768, 4, "l40s", 2, 200),
        _pcie("g6e.48xlarge", 192, 1536, 8, "l40s", 4, 400),
        _nvlink("p4d.24xlarge", 96, 1152, 8, "a100-40gb", 4, 400, NVLINK3),
        _nvlink("p4de.24xlarge", 96, 1152, 8, "a100-80gb", 4, 400, NVLINK3),
        _nvlink("p5.48xlarge", 192, 2048, 8, "h100", 32, 3200, NVLINK4),
        _nvlink("p5e.48xlarge", 192, 2048, 8, "h200", 32, 3200, NVLINK4),
        _nvlink("p5en.48xlarge", 192, 2048, 8, "h200", 16, 3200, NVLINK4),
    ]
}


def instance_type(name: str) -> InstanceType | None:
    return INSTANCE_TYPES.get(name)


# The value of the node label `k8s.amazonaws.com/accelerator` per GPU. The Cluster Autoscaler (1.36,
# cloudprovider/aws/aws_cloud_provider.go GPULabel) counts a node as a GPU node by the label's presence
# (utils/gpu/gpu.go NodeHasGpu); the value is its metrics' GPU type, and its `availableGPUTypes` names
# nvidia-a10g, nvidia-l4, nvidia-l40s and nvidia-tesla-a100. Newer GPUs follow the same nvidia-<model> form.
ACCELERATOR_LABELS: dict[str, str] = {
    "l4": "nvidia-l4",
    "a10g": "nvidia-a10g",
    "l40s": "nvidia-l40s",
    "a100-40gb": "nvidia-tesla-a100",
    "a100-80gb": "nvidia-tesla-a100",
    "h100": "nvidia-h100",
    "h100-pcie": "nvidia-h100",
    "h100-nvl": "nvidia-h100",
    "h200": "nvidia-h200",
    "b200": "nvidia-b200",
}


def accelerator_label(name: str) -> str | None:
    """The `k8s.amazonaws.com/accelerator` value for a GPU instance type; None for an unknown or CPU type."""
    it = INSTANCE_TYPES.get(name)
    return ACCELERATOR_LABELS[it.gpu] if it is not None and it.gpu else None


def type_with_gpu(gpu: str, gpus: int) -> InstanceType | None:
    """The catalogue's type with `gpus` of this GPU per node, else any with this GPU: the fastest network wins."""
    with_gpu = [t for t in INSTANCE_TYPES.values() if t.gpu == gpu]
    exact = [t for t in with_gpu if t.gpus == gpus]
    return max(exact or with_gpu, key=lambda t: t.network_gbps, default=None)


# What `torch.cuda.get_device_name()` reports, most specific first: "NVIDIA L40S" must not be
# read as an L4, nor an "NVIDIA H100 PCIe" as the SXM part with its higher peak.
_DEVICE_NAMES: list[tuple[str, str]] = [
    (r"\bg?h200\b", "h200"),
    (r"\bh100\b.*\bpcie\b", "h100-pcie"),
    (r"\bh100\b.*\bnvl\b", "h100-nvl"),
    (r"\bh100\b", "h100"),
    (r"\ba100\b.*\b80\s*gb\b", "a100-80gb"),
    (r"\ba100\b", "a100-40gb"),
    (r"\bl40s\b", "l40s"),
    (r"\bl4\b", "l4"),
    (r"\ba10g\b", "a10g"),
    (r"\bb200\b", "b200"),
]


def gpu_for_device_name(device_name: str) -> GpuModel | None:
    """The GPU model behind a CUDA device name, so figures like MFU use the right peak."""
    name = device_name.lower()
    for pattern, key in _DEVICE_NAMES:
        if re.search(pattern, name):
            return GPUS[key]
    return None



# How long a scale-up of one GPU node group takes, from the cluster autoscaler raising the Auto
# Scaling group to a Ray worker pod running: EC2 launch, EKS bootstrap and join, the device plugins,
# and the first pull of the DLC image (tens of GiB). raydlc's estimates, not measured figures:
# `submit` on a cold cluster shows the node group's own last launch time when its ASG has one, and
# the figure is the floor of IDLE_MINUTES: a node that leaves sooner than one takes to come back
# makes the next job wait longer than the idle time saved.
SCALE_UP_ESTIMATE_MIN: dict[str, float] = {
    "g5": 8.0, "g6": 8.0, "g6e": 8.0,  # PCIe GPU nodes: a few minutes to boot and join, the rest the image pull
    "p4d": 12.0, "p4de": 12.0,  # 8 GPUs and 4 EFA interfaces to bring up before the node is Ready
    "p5": 15.0, "p5e": 15.0, "p5en": 15.0,  # 8 GPUs and up to 32 EFA interfaces
}
SCALE_UP_DEFAULT_MIN = 10.0


def scale_up_estimate_s(instance_type: str) -> float:
    """raydlc's estimate (seconds) of a scale-up of nodes of this type, by instance family."""
    family = instance_type.split(".", 1)[0]
    return SCALE_UP_ESTIMATE_MIN.get(family, SCALE_UP_DEFAULT_MIN) * 60


def gpu_node_startup_minutes(instance_type: str) -> int:
    """Whole minutes a GPU node of this type takes to come back: the shortest IDLE_MINUTES worth having."""
    return math.ceil(scale_up_estimate_s(instance_type) / 60)
