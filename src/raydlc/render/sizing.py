"""How much CPU and memory a Ray pod may claim so that it still fits on its node.

A pod that requests more than the node's allocatable stays Pending with no error anywhere but
its events, so pods are sized from the instance type with explicit reservations:

- CPU: EKS's kube-reserved formula (6% of the first core, 1% of the second, 0.5% of the next
  two, 0.25% of the rest) plus `DAEMONSET_CPU` for the DaemonSets on every node (aws-node,
  kube-proxy, eks-pod-identity-agent, the EFA and NVIDIA device plugins), rounded down to whole
  cores.
- Memory: `KERNEL_MEMORY_FRACTION` of the nominal size is never seen by Kubernetes (kernel,
  firmware, the nominal GiB being a marketing figure), then `KUBE_RESERVED_MEMORY_GIB` for
  kubelet/containerd reserve and eviction threshold (EKS reserves 11 MiB per max pod + 255 MiB,
  about 2.8 GiB at 234 pods, plus 100 MiB eviction), then `DAEMONSET_MEMORY_GIB`.
- On the system node the head shares the node with the KubeRay operator and CoreDNS, so it
  leaves `SYSTEM_PODS_CPU` / `SYSTEM_PODS_MEMORY_GIB` more.

On g6.12xlarge (48 vCPU, 192 GiB) a worker gets 47 CPUs and 176Gi; on m7i.xlarge (4 vCPU,
16 GiB) the head gets 2 CPUs and 9Gi.

The head grows with the job: it runs the GCS (a table entry and a connection for every node and
every worker actor), the dashboard (every node's agent reports to it), and the job's driver with
Ray Train's controller, which gathers every worker's report at each `ray.train.report` and
receives every worker's log lines. The rule (`head_needs`): 2 CPUs and 6 GiB, plus one CPU per
64 Ray Train workers and one GiB per 32: 2 x g6.12xlarge (8 workers) need 2 CPUs / 7 GiB,
16 x p5.48xlarge (128) 4 / 10 GiB, 64 x p5.48xlarge (512) 10 / 22 GiB. A system node too small
for the job is refused at render time, naming the smallest known type that fits. DaemonSets' requests measured on EKS add up to about
0.2 CPU (aws-node 25m, kube-proxy 100m, EFA plugin 10m), operator + CoreDNS to 0.3 CPU and
0.7 GiB: the margins above cover them with room for one more agent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from raydlc import catalog
from raydlc.errors import InputError

DAEMONSET_CPU = 0.5
SYSTEM_PODS_CPU = 0.5
KERNEL_MEMORY_FRACTION = 0.06
KUBE_RESERVED_MEMORY_GIB = 3.0
DAEMONSET_MEMORY_GIB = 1.0
SYSTEM_PODS_MEMORY_GIB = 2.0
HEAD_BASE_CPU = 2
HEAD_WORKERS_PER_CPU = 64
HEAD_BASE_MEMORY_GIB = 6
HEAD_WORKERS_PER_GIB = 32


@dataclass(frozen=True)
class PodSize:
    cpu: int
    memory_gib: int

    def resources(self, extra: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
        """requests = limits (Guaranteed QoS), quantities as strings."""
        q = {"cpu": str(self.cpu), "memory": f"{self.memory_gib}Gi", **(extra or {})}
        return {"requests": dict(q), "limits": dict(q)}


def kube_reserved_cpu(vcpus: int) -> float:
    steps = [(1, 0.06), (1, 0.01), (2, 0.005)]
    reserved, left = 0.0, vcpus
    for cores, share in steps:
        take = min(left, cores)
        reserved += take * share
        left -= take
    return reserved + left * 0.0025


def allocatable_for_pods(it: catalog.InstanceType) -> tuple[float, float]:
    """(CPU cores, GiB) left for workload pods after kubelet, kernel and per-node DaemonSets."""
    cpu = it.vcpus - kube_reserved_cpu(it.vcpus) - DAEMONSET_CPU
    mem = it.memory_gib * (1 - KERNEL_MEMORY_FRACTION) - KUBE_RESERVED_MEMORY_GIB - DAEMONSET_MEMORY_GIB
    return cpu, mem


def known_instance(name: str, setting: str) -> catalog.InstanceType:
    it = catalog.instance_type(name)
    if it is None:
        raise InputError(
            f"{setting}: raydlc does not know the vCPUs, memory and EFA interfaces of {name!r}, "
            "so it cannot size pods to fit the node",
            hint=f"choose one of {', '.join(sorted(catalog.INSTANCE_TYPES))}",
        )
    return it


def _whole(cpu: float, mem: float, setting: str, name: str) -> PodSize:
    size = PodSize(math.floor(cpu), math.floor(mem))
    if size.cpu < 1 or size.memory_gib < 1:
        raise InputError(
            f"{setting}: {name} is too small to hold a Ray pod after system reservations "
            f"({cpu:.2f} CPUs, {mem:.1f} GiB left)",
            hint="choose a larger instance type",
        )
    return size


def worker_size(instance: str) -> PodSize:
    """One worker pod per GPU node: everything the node has left."""
    it = known_instance(instance, "GPU_NODE_TYPE")
    cpu, mem = allocatable_for_pods(it)
    return _whole(cpu, mem, "GPU_NODE_TYPE", instance)


def _head_fit(it: catalog.InstanceType) -> tuple[float, float]:
    cpu, mem = allocatable_for_pods(it)
    return cpu - SYSTEM_PODS_CPU, mem - SYSTEM_PODS_MEMORY_GIB


def head_needs(workers: int) -> PodSize:
    """What the head needs for a job of `workers` Ray Train workers (one per GPU)."""
    return PodSize(HEAD_BASE_CPU + workers // HEAD_WORKERS_PER_CPU, HEAD_BASE_MEMORY_GIB + math.ceil(workers / HEAD_WORKERS_PER_GIB))


def head_size(instance: str, workers: int = 0) -> PodSize:
    """The head on a system node, beside the KubeRay operator and CoreDNS: everything left, which
    must cover `head_needs(workers)`."""
    it = known_instance(instance, "SYSTEM_NODE_TYPE")
    size = _whole(*_head_fit(it), "SYSTEM_NODE_TYPE", instance)
    need = head_needs(workers)
    if size.cpu < need.cpu or size.memory_gib < need.memory_gib:
        fits = sorted(
            (t for t in catalog.INSTANCE_TYPES.values() if not t.gpus and all(a >= b for a, b in zip(_head_fit(t), (need.cpu, need.memory_gib)))),
            key=lambda t: (t.vcpus, t.memory_gib),
        )
        raise InputError(
            f"SYSTEM_NODE_TYPE: {instance} leaves the Ray head {size.cpu} CPUs and {size.memory_gib} GiB; a job of {workers} "
            f"Ray Train workers needs a head with at least {need.cpu} CPUs and {need.memory_gib} GiB",
            hint=f"set SYSTEM_NODE_TYPE={fits[0].name}" if fits else "choose a larger system node type",
        )
    return size
