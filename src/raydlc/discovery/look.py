"""One call for what `up --attach` and `status` need: read the cluster as the user may, and say what it holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from raydlc.discovery.facts import ClusterFacts, Fact
from raydlc.discovery.gather import gather
from raydlc.discovery.read import discover

if TYPE_CHECKING:
    from raydlc.edges.kube import Kube


def look(kube: Kube, namespace: str, *, context: str | None = None, cluster_name: str | None = None,
         asgs: Callable[[], list[dict[str, Any]]] | None = None) -> ClusterFacts:
    """The cluster's facts; `asgs` reads its Auto Scaling groups (raydlc.discovery.gather.auto_scaling_groups) and is
    called only when the cluster runs on AWS."""
    return discover(gather(kube, namespace, asgs=asgs), context=context, cluster_name=cluster_name)


def _said(fact: Fact[Any], say: Callable[[Any], str]) -> str:
    if fact.state.value == "unknown":
        return f"unknown: {fact.note}"
    if fact.state.value == "not-applicable":
        return f"not applicable: {fact.note}"
    return say(fact.value) + (f" ({fact.note})" if fact.note else "")


def _nodes(nodes: Any) -> str:
    if not nodes:
        return "none"
    by_type: dict[str, list[Any]] = {}
    for n in nodes:
        by_type.setdefault(str(n.instance_type), []).append(n)
    parts = []
    for t, group in sorted(by_type.items()):
        ready = sum(1 for n in group if n.ready)
        caps = ",".join(sorted({n.capacity_type or "capacity unknown" for n in group}))
        taints = ",".join(sorted({f"{x.key}={x.value}:{x.effect}" if x.value else f"{x.key}:{x.effect}" for n in group for x in n.taints}))
        parts.append(f"{ready}/{len(group)} Ready {t} ({group[0].gpus} GPU, {group[0].efa} EFA, {caps}"
                     + (f"; taints {taints}" if taints else "") + ")")
    return "; ".join(parts)


def rows(facts: ClusterFacts) -> list[tuple[str, str, str]]:
    """(what, found, read from) for people: every fact, unknown ones with why."""
    kr = facts.kuberay
    return [
        ("Kubernetes", _said(facts.server_version, str), facts.server_version.source),
        ("EKS", _said(facts.eks, lambda e: e.version or "yes"), facts.eks.source),
        ("KubeRay CRDs", _said(kr.crds, lambda cs: ", ".join(f"{c.name} ({'/'.join(c.served_versions)})" for c in cs) or "none"),
         kr.crds.source),
        ("KubeRay operator", _said(kr.operators, lambda ops: "; ".join(
            f"v{o.version or '?'} in {o.namespace}, watches "
            + ("all namespaces" if o.watch.all_namespaces else ("(config file)" if o.watch.configured_by_file else ", ".join(o.watch.namespaces)))
            for o in ops) or "none"), kr.operators.source),
        ("GPU nodes", _said(facts.gpu_nodes, _nodes), facts.gpu_nodes.source),
        ("GPU NodePools", _said(facts.node_pools, lambda ps: "; ".join(
            f"{p.name}: {', '.join(p.instance_types)}" + (f" ({', '.join(p.capacity_types)})" if p.capacity_types else "")
            for p in ps) or "none"), facts.node_pools.source),
        ("GPU node groups at 0", _said(facts.asg_groups, lambda gs: "; ".join(f"{g.name}: {g.instance_type} (max {g.max_size})"
                                                                                for g in gs) or "none"), facts.asg_groups.source),
        ("Device plugins", _said(facts.device_plugins, lambda ps: "; ".join(f"{p.resource} {p.namespace}/{p.name} {p.ready}/{p.desired} ready"
                                                                             for p in ps) or "none"), facts.device_plugins.source),
        ("Node autoscaler", _said(facts.node_autoscaler, str), facts.node_autoscaler.source),
    ]
