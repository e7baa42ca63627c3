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
- On the system node the head gets what is left after everything else that runs there
  (`system_node_pods`, each figure with its source; `system_node_fit` adds them up).

On g6.12xlarge (48 vCPU, 192 GiB) a worker gets 47 CPUs and 176Gi; on m7i.xlarge (4 vCPU,
16 GiB) the head gets 2 CPUs and 9Gi.

The head grows with the job: it runs the GCS (a table entry and a connection for every node and
every worker actor), the dashboard (every node's agent reports to it), and the job's driver with
Ray Train's controller, which gathers every worker's report at each `ray.train.report` and
receives every worker's log lines. The rule (`head_needs`): 2 CPUs and 6 GiB, plus one CPU per
64 Ray Train workers and one GiB per 32: 2 x g6.12xlarge (8 workers) need 2 CPUs / 7 GiB,
16 x p5.48xlarge (128) 4 / 10 GiB, 64 x p5.48xlarge (512) 10 / 22 GiB. A system node too small
for the job is refused at render time, naming the smallest known type that fits.

The system node's allocatable is EKS's (the same kube-reserved CPU formula; memory as above, without the
per-node DaemonSet margin, which `system_node_pods` itemises). On m7i.xlarge with IDLE_MINUTES > 0 the other pods
request 1.85 CPUs and 3.2 GiB, which leaves the head 2 CPUs and 8 GiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from raydlc.errors import InputError
from raydlc.facts import instances

DAEMONSET_CPU = 0.5
KERNEL_MEMORY_FRACTION = 0.06
KUBE_RESERVED_MEMORY_GIB = 3.0
DAEMONSET_MEMORY_GIB = 1.0
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


def allocatable_for_pods(it: instances.InstanceType) -> tuple[float, float]:
    """(CPU cores, GiB) left for workload pods after kubelet, kernel and per-node DaemonSets."""
    cpu = it.vcpus - kube_reserved_cpu(it.vcpus) - DAEMONSET_CPU
    mem = it.memory_gib * (1 - KERNEL_MEMORY_FRACTION) - KUBE_RESERVED_MEMORY_GIB - DAEMONSET_MEMORY_GIB
    return cpu, mem


def known_instance(name: str, setting: str) -> instances.InstanceType:
    it = instances.instance_type(name)
    if it is None:
        raise InputError(
            f"{setting}: raydlc does not know the vCPUs, memory and EFA interfaces of {name!r}, "
            "so it cannot size pods to fit the node",
            hint=f"choose one of {', '.join(sorted(instances.INSTANCE_TYPES))}",
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


@dataclass(frozen=True)
class Request:
    """What one pod (times `count`) requests on the system node, and where the figure comes from."""

    name: str
    cpu_m: int
    memory_mi: int
    source: str
    count: int = 1


# The submitter of a RayJob (K8sJobMode; raydlc.render.raycluster renders its pod with these) and verify's probe pod
# (raydlc.checks.head_isolation, on the head's node): both must find room beside the head.
SUBMITTER = Request("RayJob submitter", 500, 1024, "raydlc.render.raycluster _submitter")
PROBE = Request("verify's probe pod", 50, 64, "raydlc.checks.head_isolation probe_pod")

_ALWAYS = (
    Request("kuberay-operator", 100, 512, "kuberay-operator chart v1.7.0 values.yaml `resources.limits` (no requests set: "
            "Kubernetes takes the limits); raydlc sets no resources"),
    Request("coredns", 100, 70, "EKS CoreDNS add-on: 2 replicas, requests 100m/70Mi (kubernetes cluster/addons/dns/coredns "
            "coredns.yaml.base; not read from a pinned copy); tolerates no GPU taint, so both land here", count=2),
    Request("metrics-server", 100, 200, "eksctl v0.230.0 known_addons.go (a default add-on); metrics-server chart "
            "values.yaml requests 100m/200Mi; 2 replicas counted (raydlc's assumption, not read)", count=2),
    Request("kube-proxy", 100, 0, "EKS kube-proxy add-on DaemonSet requests cpu 100m (not read from a pinned copy)"),
    Request("aws-node", 50, 0, "VPC CNI DaemonSet: aws-node 25m and, with enableNetworkPolicy, the network policy agent 25m "
            "(amazon-vpc-cni-k8s manifests; not read from a pinned copy)"),
    Request("eks-pod-identity-agent", 50, 64, "raydlc's allowance (not read from the add-on's manifest)"),
    SUBMITTER,
    PROBE,
)
_AUTOSCALING = (
    Request("Ray autoscaler sidecar", 500, 512, "KubeRay v1.7.0 ray-operator/controllers/ray/common/pod.go "
            "BuildAutoscalerContainer (requests = limits 500m/512Mi), in the head pod"),
    Request("cluster-autoscaler", 100, 600, "raydlc.render.autoscaler.RESOURCES (the chart 9.59.0 sets none)"),
)


def system_node_pods(autoscaling: bool) -> list[Request]:
    """Everything but the Ray head's container that requests CPU or memory on the system node."""
    return [*_ALWAYS, *(_AUTOSCALING if autoscaling else ())]


def node_allocatable(it: instances.InstanceType) -> tuple[float, float]:
    """(CPU cores, GiB) the kubelet offers pods: capacity less EKS's kube-reserved CPU, the kernel's share of memory,
    and the kubelet's memory reserve and eviction threshold."""
    return it.vcpus - kube_reserved_cpu(it.vcpus), it.memory_gib * (1 - KERNEL_MEMORY_FRACTION) - KUBE_RESERVED_MEMORY_GIB


@dataclass(frozen=True)
class SystemFit:
    allocatable_cpu: float
    allocatable_gib: float
    others_cpu: float
    others_gib: float

    @property
    def head_cpu(self) -> float:
        return self.allocatable_cpu - self.others_cpu

    @property
    def head_gib(self) -> float:
        return self.allocatable_gib - self.others_gib


def system_node_fit(it: instances.InstanceType, autoscaling: bool) -> SystemFit:
    """The system node's allocatable and what its other pods request; the head may take the rest."""
    pods = system_node_pods(autoscaling)
    cpu, gib = node_allocatable(it)
    return SystemFit(cpu, gib, sum(p.cpu_m * p.count for p in pods) / 1000, sum(p.memory_mi * p.count for p in pods) / 1024)


def _head_fit(it: instances.InstanceType, autoscaling: bool = True) -> tuple[float, float]:
    fit = system_node_fit(it, autoscaling)
    return fit.head_cpu, fit.head_gib


def head_needs(workers: int) -> PodSize:
    """What the head needs for a job of `workers` Ray Train workers (one per GPU)."""
    return PodSize(HEAD_BASE_CPU + workers // HEAD_WORKERS_PER_CPU, HEAD_BASE_MEMORY_GIB + math.ceil(workers / HEAD_WORKERS_PER_GIB))


def head_size(instance: str, workers: int = 0, autoscaling: bool = True) -> PodSize:
    """The head on a system node, beside the pods of `system_node_pods`: everything left, which must cover
    `head_needs(workers)`; refused (SYSTEM_NODE_TYPE) when it does not."""
    it = known_instance(instance, "SYSTEM_NODE_TYPE")
    need = head_needs(workers)
    cpu, gib = _head_fit(it, autoscaling)
    size = PodSize(max(0, math.floor(cpu)), max(0, math.floor(gib)))
    if size.cpu < need.cpu or size.memory_gib < need.memory_gib:
        fits = sorted(
            (t for t in instances.INSTANCE_TYPES.values()
             if not t.gpus and all(a >= b for a, b in zip(_head_fit(t, autoscaling), (need.cpu, need.memory_gib)))),
            key=lambda t: (t.vcpus, t.memory_gib),
        )
        fit = system_node_fit(it, autoscaling)
        raise InputError(
            f"SYSTEM_NODE_TYPE: {instance} cannot hold what runs on the system node: it offers {fit.allocatable_cpu:.2f} CPUs "
            f"and {fit.allocatable_gib:.1f} GiB, the operator, add-ons, submitter and probe request {fit.others_cpu:.2f} CPUs "
            f"and {fit.others_gib:.1f} GiB, leaving the Ray head {size.cpu} CPUs and {size.memory_gib} GiB; a job of {workers} "
            f"Ray Train workers needs a head with at least {need.cpu} CPUs and {need.memory_gib} GiB",
            hint=f"set SYSTEM_NODE_TYPE={fits[0].name}" if fits else "choose a larger system node type",
        )
    return size
