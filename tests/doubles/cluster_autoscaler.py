"""The Cluster Autoscaler's GPU accounting on AWS, as data: which nodes it counts as GPU nodes and how many
nodes one scale-up loop asks for while GPU nodes' device plugins are still registering.

Modelled on cluster-autoscaler 1.36.1 (this models its rules; it is not its code):

- `node_has_gpu`: utils/gpu/gpu.go `NodeHasGpu` — the GPU label (cloudprovider/aws `GPULabel`,
  `k8s.amazonaws.com/accelerator`) present, or non-zero allocatable `nvidia.com/gpu`.
- `ready_split`: processors/customresources/gpu_processor.go `FilterOutNodesWithUnreadyResources` — a Ready node
  with the label and no allocatable GPU is treated as unready ("resource unready"); a node without the label is
  not a GPU node at all, so a Ready one with no GPU yet is just a ready node that cannot hold a GPU pod.
- `scale_up`: clusterstate/clusterstate.go `calculateUpcomingNodesInNodeGroup` (target − ready − unready past
  startup; a not-yet-started node is still upcoming) and core/static_autoscaler.go
  `addUpcomingNodesToClusterSnapshot` (each upcoming node enters the snapshot as the group's template node, so
  pending pods that fit on it trigger nothing); the rest of the pending GPU pods get new nodes, first fit, up to
  the group's maximum.
- `expand`: expander/priority/priority.go with the readme's rules (the highest priority whose regexes match a
  group's name wins, a group no regex matches is not an option) over the options that are not backed off:
  clusterstate/clusterstate.go `RegisterFailedScaleUp` / `IsNodeGroupSafeToScaleUp` — a group whose scale-up failed
  (on AWS: the ASG's launch failed, cloudprovider/aws `HandleInstanceCreationErrors` placeholder instances) is
  backed off, so the next loop expands the next option.
- `template_node`: cloudprovider/aws/aws_manager.go `buildNodeFromTemplate` — labels from the ASG's
  `node-template/label/` tags (`extractLabelsFromAsg`), extended resources from `node-template/resources/`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

GPU_LABEL = "k8s.amazonaws.com/accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
TEMPLATE = "k8s.io/cluster-autoscaler/node-template/"


def gpu_allocatable(node: Mapping[str, Any]) -> int:
    return int((node.get("status", {}).get("allocatable") or {}).get(GPU_RESOURCE, 0) or 0)


def node_has_gpu(node: Mapping[str, Any]) -> bool:
    return GPU_LABEL in (node.get("metadata", {}).get("labels") or {}) or gpu_allocatable(node) > 0


def resource_unready(node: Mapping[str, Any]) -> bool:
    """Labelled as a GPU node but no GPU allocatable yet: the CA treats the node as not ready."""
    return GPU_LABEL in (node.get("metadata", {}).get("labels") or {}) and gpu_allocatable(node) == 0


def ready_split(nodes: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(ready, not started) of the group's registered, API-Ready nodes as the CA sees them."""
    ready = [n for n in nodes if not resource_unready(n)]
    return ready, [n for n in nodes if resource_unready(n)]


def template_node(asg_tags: Mapping[str, str]) -> dict[str, Any]:
    """The node the CA imagines for the group from its ASG tags."""
    labels = {k[len(TEMPLATE) + len("label/"):]: v for k, v in asg_tags.items() if k.startswith(TEMPLATE + "label/")}
    alloc = {k[len(TEMPLATE) + len("resources/"):]: v for k, v in asg_tags.items()
             if k.startswith(TEMPLATE + "resources/")}
    return {"metadata": {"labels": labels}, "status": {"allocatable": alloc}}


def scale_up(*, target: int, max_size: int, nodes: Sequence[Mapping[str, Any]], pending_gpu_pods: Sequence[int],
             asg_tags: Mapping[str, str]) -> int:
    """The group's new target after one loop: `pending_gpu_pods` are the GPUs each unschedulable pod asks for,
    `nodes` the group's registered nodes (all Ready in the API, none holding a GPU pod yet)."""
    ready, _not_started = ready_split(nodes)
    upcoming = max(0, target - len(ready))  # not-started nodes are not subtracted: they are still upcoming
    free = [gpu_allocatable(n) for n in ready] + [gpu_allocatable(template_node(asg_tags))] * upcoming
    per_new_node = gpu_allocatable(template_node(asg_tags))
    added = 0
    for want in pending_gpu_pods:
        slot = next((i for i, f in enumerate(free) if f >= want), None)
        if slot is not None:
            free[slot] -= want
            continue
        if target + added < max_size and per_new_node >= want:
            added += 1
            free.append(per_new_node - want)
    return target + added


def expand(options: Sequence[str], priorities: Mapping[int, Sequence[str]], backed_off: Sequence[str] = ()) -> str | None:
    """The group the priority expander picks among `options` (ASG names that could take the pending pods), those
    backed off after a failed scale-up left out; None when none is left."""
    import re

    live = [o for o in options if o not in backed_off]
    for _priority, patterns in sorted(priorities.items(), key=lambda kv: -int(kv[0])):
        matched = [o for o in live if any(re.search(p, o) for p in patterns)]
        if matched:
            return sorted(matched)[0]  # the CA picks at random among equals; one here
    return None


def chart_priorities(values: Mapping[str, Any]) -> dict[int, list[str]] | None:
    """The `priorities` the chart (9.59.0 templates/priority-expander-configmap.yaml) writes into the
    cluster-autoscaler-priority-expander ConfigMap from these values, parsed as the CA parses it; None when the chart
    writes none (no `priority` in `extraArgs.expander`, or no expanderPriorities)."""
    import json

    import yaml

    extra = values.get("extraArgs") or {}
    if "expander" not in extra or "priority" not in str(extra["expander"]).split(","):
        return None
    table = values.get("expanderPriorities")
    if not table:
        return None
    if isinstance(table, str):
        text = table
    else:
        # `{{ $k | int }}:` then `toYaml $v` indented: a YAML list of the regexes (JSON strings are YAML too)
        text = "\n".join(f"{int(k)}:\n" + "".join(f"  - {json.dumps(v)}\n" for v in regexes) for k, regexes in table.items())
    parsed = yaml.safe_load(text)
    return {int(k): [str(r) for r in v] for k, v in parsed.items()}
