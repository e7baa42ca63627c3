"""Raw reads in, facts out (pure): what KubeRay, the GPU nodes, the NodePools and the plugins of a cluster are.

Every fact carries the read it came from; a read that was refused gives an *unknown* fact with the refusal as
its note, and an AWS fact on a cluster that is not EKS is *not applicable*.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from raydlc.discovery.facts import (
    AsgGroup,
    ClusterFacts,
    Crd,
    DevicePlugin,
    EksCluster,
    Fact,
    GpuNode,
    KubeRayFacts,
    NodePool,
    Operator,
    Taint,
    Watch,
)
from raydlc.discovery.gather import Raw, Reads
from raydlc.facts import instances

GPU, EFA = "nvidia.com/gpu", "vpc.amazonaws.com/efa"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
EKS_CAPACITY, KARPENTER_CAPACITY = "eks.amazonaws.com/capacityType", "karpenter.sh/capacity-type"
HYPERPOD_PREFIX = "sagemaker.amazonaws.com/"
# EKS managed node groups label ON_DEMAND, SPOT or CAPACITY_BLOCK (EKS API Nodegroup.capacityType); Karpenter v1
# labels on-demand, spot or reserved. One spelling for both.
CAPACITY = {"ON_DEMAND": "on-demand", "SPOT": "spot", "CAPACITY_BLOCK": "capacity-block",
            "on-demand": "on-demand", "spot": "spot", "reserved": "reserved"}
PLUGINS = {"aws-efa-k8s-device-plugin": EFA, "nvidia-device-plugin": GPU, "k8s-device-plugin": GPU}  # EFA first: its name holds the other
OPERATOR_IMAGE = re.compile(r"(^|/)kuberay/operator(:(?P<tag>[^@]+))?(@.*)?$")


def discover(reads: Reads, *, context: str | None = None, cluster_name: str | None = None) -> ClusterFacts:
    """The facts of one cluster from what `gather` read; nothing here asks anything."""
    eks = _eks(reads, cluster_name)
    return ClusterFacts(
        context=context,
        namespace=reads.namespace,
        server_version=_fact(reads.version, lambda items: str(items[0].get("gitVersion", "?"))),
        eks=eks,
        kuberay=KubeRayFacts(crds=_fact(reads.crds, crds), operators=_fact(reads.deployments, operators)),
        gpu_nodes=_fact(reads.nodes, gpu_nodes),
        node_pools=_nodepools(reads.nodepools),
        asg_groups=_asgs(reads.asgs, eks),
        device_plugins=_fact(reads.daemonsets, device_plugins),
        node_autoscaler=_autoscaler(reads),
    )


def _fact(raw: Raw, convert: Any) -> Fact[Any]:
    if not raw.answered:
        return Fact.unknown(raw.source, raw.refused or "not read")
    return Fact.known(convert(list(raw.items or ())), raw.source)


# ---------------------------------------------------------------------- KubeRay


def crds(items: Sequence[Mapping[str, Any]]) -> tuple[Crd, ...]:
    out = []
    for c in items:
        versions = (c.get("spec") or {}).get("versions") or []
        est = any(x.get("type") == "Established" and x.get("status") == "True" for x in (c.get("status") or {}).get("conditions") or [])
        out.append(Crd(name=str(c["metadata"]["name"]), served_versions=tuple(str(v["name"]) for v in versions if v.get("served")),
                       storage_version=next((str(v["name"]) for v in versions if v.get("storage")), None), established=est))
    return tuple(sorted(out, key=lambda c: c.name))


def operators(deployments: Sequence[Mapping[str, Any]]) -> tuple[Operator, ...]:
    """Deployments that run KubeRay's operator image, with the version its tag says and the namespaces it watches."""
    out = []
    for d in deployments:
        for c in ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
            m = OPERATOR_IMAGE.search(str(c.get("image", "")))
            if not m:
                continue
            meta, status = d.get("metadata") or {}, d.get("status") or {}
            available = int(status.get("availableReplicas") or 0) >= 1
            out.append(Operator(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), image=str(c["image"]),
                                version=version_of(m.group("tag")), watch=watch_of(c), available=available))
    return tuple(out)


def version_of(tag: str | None) -> str | None:
    """`v1.7.0` -> "1.7.0"; a digest, `latest` or a branch build is no version."""
    m = re.fullmatch(r"v?(\d+\.\d+\.\d+)(-[0-9A-Za-z.-]+)?", tag or "")
    return m.group(1) if m else None


def watch_of(container: Mapping[str, Any]) -> Watch:
    """The operator's watch as its args give it (KubeRay v1.7.0 main.go `--watch-namespace`, comma-separated;
    unset or empty: every namespace). With `--config` the list is in the chart's ConfigMap: not read here."""
    args = [str(a) for a in (container.get("command") or [])[1:]] + [str(a) for a in container.get("args") or []]
    value = None
    for i, a in enumerate(args):
        if a in ("--watch-namespace", "-watch-namespace") and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(("--watch-namespace=", "-watch-namespace=")):
            value = a.split("=", 1)[1]
    if value is None and any(a in ("--config", "-config") or a.startswith(("--config=", "-config=")) for a in args):
        return Watch(all_namespaces=False, configured_by_file=True)
    names = tuple(n.strip() for n in (value or "").split(",") if n.strip())
    return Watch(all_namespaces=not names, namespaces=names)


# ---------------------------------------------------------------------- nodes


def taints_of(items: Iterable[Mapping[str, Any]]) -> tuple[Taint, ...]:
    return tuple(Taint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", ""))) for t in items or ())


def quantity(v: Any) -> int:
    try:
        return int(str(v)) if v is not None else 0
    except ValueError:
        return 0


UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}


def cpu_millis(v: Any) -> int:
    """A CPU quantity (`47810m`, `48`) in millicores; 0 when absent or unreadable."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(m?)", str(v or ""))
    return 0 if not m else int(float(m.group(1)) * (1 if m.group(2) else 1000))


def mebibytes(v: Any) -> int:
    """A memory quantity (`190000Mi`, `200Gi`, bytes) in MiB; 0 when absent or unreadable."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T|)", str(v or ""))
    return 0 if not m else int(float(m.group(1)) * UNITS[m.group(2)] // 2**20)


def capacity_type(labels: Mapping[str, str]) -> str | None:
    raw = labels.get(EKS_CAPACITY) or labels.get(KARPENTER_CAPACITY)
    return CAPACITY.get(raw, raw.lower()) if raw else None


def gpu_nodes(nodes: Sequence[Mapping[str, Any]]) -> tuple[GpuNode, ...]:
    out = []
    for n in nodes:
        alloc = (n.get("status") or {}).get("allocatable") or {}
        if quantity(alloc.get(GPU)) <= 0:
            continue
        labels = {str(k): str(v) for k, v in ((n.get("metadata") or {}).get("labels") or {}).items()}
        itype = labels.get(INSTANCE_TYPE) or labels.get("beta.kubernetes.io/instance-type")
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in (n.get("status") or {}).get("conditions") or [])
        out.append(GpuNode(
            name=str(n["metadata"]["name"]), instance_type=itype, gpus=quantity(alloc.get(GPU)), efa=quantity(alloc.get(EFA)),
            taints=taints_of((n.get("spec") or {}).get("taints") or []), labels=tuple(sorted(labels.items())), ready=ready,
            capacity_type=capacity_type(labels),
            hyperpod=any(k.startswith(HYPERPOD_PREFIX) for k in labels) or (itype or "").startswith("ml."),
            cpu_m=cpu_millis(alloc.get("cpu")), memory_mi=mebibytes(alloc.get("memory"))))
    return tuple(sorted(out, key=lambda g: g.name))


def device_plugins(daemonsets: Sequence[Mapping[str, Any]]) -> tuple[DevicePlugin, ...]:
    """The NVIDIA and EFA device-plugin DaemonSets, known by their name or image."""
    out = []
    for d in daemonsets:
        meta, status = d.get("metadata") or {}, d.get("status") or {}
        images = " ".join(str(c.get("image", "")) for c in ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or [])
        text = f"{meta.get('name', '')} {images}"
        resource = next((r for key, r in PLUGINS.items() if key in text), None)
        if resource is None:
            continue
        out.append(DevicePlugin(name=str(meta.get("name", "")), namespace=str(meta.get("namespace", "")), resource=resource,
                                desired=int(status.get("desiredNumberScheduled") or 0), ready=int(status.get("numberReady") or 0)))
    return tuple(sorted(out, key=lambda p: (p.resource, p.name)))


# ---------------------------------------------------------------------- capacity that can come


def _nodepools(raw: Raw) -> Fact[tuple[NodePool, ...]]:
    if not raw.answered:
        return Fact.unknown(raw.source, raw.refused or "not read")
    if not raw.served:
        return Fact.known((), raw.source, "Karpenter v1 is not installed (nodepools.karpenter.sh/v1 not served)")
    pools = [p for p in (nodepool(x) for x in raw.items or ()) if p.instance_types]
    return Fact.known(tuple(pools), raw.source)


# What Karpenter's AWS provider knows of an instance type, by the requirement keys it offers (well-known labels:
# https://karpenter.sh/docs/concepts/scheduling/#well-known-labels), for the GPU types raydlc knows.
def type_labels(it: instances.InstanceType) -> dict[str, str]:
    return {INSTANCE_TYPE: it.name, "karpenter.k8s.aws/instance-family": it.family,
            "karpenter.k8s.aws/instance-category": re.sub(r"\d.*", "", it.family),
            "karpenter.k8s.aws/instance-generation": re.sub(r"\D", "", it.family) or "0",
            "karpenter.k8s.aws/instance-gpu-count": str(it.gpus), "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia",
            "karpenter.k8s.aws/instance-gpu-name": (it.gpu or "").split("-")[0],
            "karpenter.k8s.aws/instance-cpu": str(it.vcpus), "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}


def admits(requirements: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> bool:
    """Whether a type with these labels meets every requirement (operators In, NotIn, Exists, DoesNotExist, Gt,
    Lt); a requirement on a key the type has no label for (a zone, a custom label) does not rule it out."""
    for r in requirements:
        key = str(r.get("key"))
        if key in labels and not meets(labels[key], str(r.get("operator")), [str(v) for v in r.get("values") or []]):
            return False
    return True


def meets(have: str, op: str, values: Sequence[str]) -> bool:
    """One node-selector requirement against a label's value (an operator raydlc does not know rules nothing out)."""
    if op in ("Gt", "Lt"):
        a, b = _num(have), _num(values[0]) if values else None
        return a is not None and b is not None and (a > b if op == "Gt" else a < b)
    return {"In": have in values, "NotIn": have not in values, "Exists": True, "DoesNotExist": False}.get(op, True)


def _num(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


def nodepool(obj: Mapping[str, Any]) -> NodePool:
    """A Karpenter v1 NodePool with the GPU types (of those raydlc knows) its requirements admit."""
    tmpl = ((obj.get("spec") or {}).get("template") or {})
    spec = tmpl.get("spec") or {}
    reqs = spec.get("requirements") or []
    gpu_types = tuple(sorted(it.name for it in instances.INSTANCE_TYPES.values() if it.gpus and admits(reqs, type_labels(it))))
    caps = next((tuple(r.get("values") or ()) for r in reqs if r.get("key") == KARPENTER_CAPACITY and r.get("operator") == "In"), ())
    limit = ((obj.get("spec") or {}).get("limits") or {}).get(GPU)
    return NodePool(name=str(obj["metadata"]["name"]), instance_types=gpu_types, capacity_types=tuple(str(c) for c in caps),
                    taints=taints_of(spec.get("taints") or []),
                    labels=tuple(sorted((str(k), str(v)) for k, v in ((tmpl.get("metadata") or {}).get("labels") or {}).items())),
                    gpu_limit=quantity(limit) if limit is not None else None)


CA_TEMPLATE = "k8s.io/cluster-autoscaler/node-template/"


def asg_group(asg: Mapping[str, Any]) -> AsgGroup:
    """An Auto Scaling group as the Cluster Autoscaler sees it for scale-from-zero: its node-template tags
    (`.../label/<key>`, `.../taint/<key>` = `value:Effect`) and its instance type (launch template overrides,
    or the `.../label/node.kubernetes.io/instance-type` tag)."""
    tags = {str(t["Key"]): str(t.get("Value", "")) for t in asg.get("Tags") or []}
    labels = {k[len(CA_TEMPLATE) + len("label/"):]: v for k, v in tags.items() if k.startswith(CA_TEMPLATE + "label/")}
    taints = []
    for k, v in tags.items():
        if k.startswith(CA_TEMPLATE + "taint/"):
            value, _, effect = v.rpartition(":")
            taints.append(Taint(k[len(CA_TEMPLATE) + len("taint/"):], value, effect))
    overrides = (((asg.get("MixedInstancesPolicy") or {}).get("LaunchTemplate") or {}).get("Overrides") or [])
    itype = labels.get(INSTANCE_TYPE) or next((str(o["InstanceType"]) for o in overrides if o.get("InstanceType")), None)
    return AsgGroup(name=str(asg.get("AutoScalingGroupName", "")), instance_type=itype, min_size=int(asg.get("MinSize") or 0),
                    max_size=int(asg.get("MaxSize") or 0), desired=int(asg.get("DesiredCapacity") or 0),
                    labels=tuple(sorted(labels.items())), taints=tuple(taints))


def _asgs(raw: Raw | None, eks: Fact[EksCluster]) -> Fact[tuple[AsgGroup, ...]]:
    source = "autoscaling:DescribeAutoScalingGroups"
    if eks.state.value == "not-applicable":
        return Fact.not_applicable(source, "not an EKS cluster: no Auto Scaling groups")
    if raw is None:
        return Fact.unknown(source, "AWS was not read")
    if not raw.answered:
        return Fact.unknown(raw.source, raw.refused or "not read")
    groups = [asg_group(a) for a in raw.items or ()]
    gpu = [g for g in groups if g.max_size > 0 and g.desired == 0 and _gpu_type(g.instance_type)]
    return Fact.known(tuple(gpu), raw.source)


def _gpu_type(name: str | None) -> bool:
    it = instances.instance_type(base_type(name)) if name else None
    return it is not None and it.gpus > 0


def base_type(name: str) -> str:
    """HyperPod's `ml.p5.48xlarge` is EC2's p5.48xlarge underneath (for its GPUs, not its price)."""
    return name.removeprefix("ml.")


# ---------------------------------------------------------------------- what kind of cluster


def _eks(reads: Reads, cluster_name: str | None) -> Fact[EksCluster]:
    version = str((reads.version.items or [{}])[0].get("gitVersion", "")) if reads.version.answered else ""
    nodes = list(reads.nodes.items or ()) if reads.nodes.answered else []
    on_aws = any(str((n.get("spec") or {}).get("providerID", "")).startswith("aws://") for n in nodes)
    eks_labels = any(any(str(k).startswith("eks.amazonaws.com/") for k in (n.get("metadata") or {}).get("labels") or {}) for n in nodes)
    source = "GET /version, list nodes"
    if "-eks-" in version or eks_labels:
        region = next((str(n["metadata"]["labels"]["topology.kubernetes.io/region"]) for n in nodes
                       if "topology.kubernetes.io/region" in (n["metadata"].get("labels") or {})), None)
        return Fact.known(EksCluster(name=cluster_name or "", region=region, version=version or None), source)
    if not reads.version.answered and not nodes:
        return Fact.unknown(source, "neither the server version nor the nodes could be read")
    if on_aws:
        return Fact.known(EksCluster(name=cluster_name or "", region=None, version=version or None), source,
                          "nodes run on EC2 but the server is not EKS's (a self-managed cluster)")
    return Fact.not_applicable(source, f"not EKS (server {version or 'unknown'}): AWS facts do not apply")


def _autoscaler(reads: Reads) -> Fact[str]:
    """Who adds nodes: Karpenter (its NodePools are served), the Cluster Autoscaler (its Deployment), or none."""
    if reads.nodepools.answered and reads.nodepools.served and reads.nodepools.items:
        return Fact.known("karpenter", reads.nodepools.source)
    if not reads.deployments.answered:
        return Fact.unknown(reads.deployments.source, reads.deployments.refused or "not read")
    for d in reads.deployments.items or ():
        images = " ".join(str(c.get("image", "")) for c in ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or [])
        if "cluster-autoscaler" in images:
            return Fact.known("cluster-autoscaler", reads.deployments.source, f"{d['metadata'].get('namespace')}/{d['metadata']['name']}")
    return Fact.known("none", reads.deployments.source, "no Karpenter NodePool and no Cluster Autoscaler found: idle GPU nodes stay")
