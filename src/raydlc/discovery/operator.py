"""Whether the KubeRay found in a cluster can run what raydlc renders: CRDs served, an operator that watches
the namespace, and one new enough for every field raydlc's RayCluster and RayJob carry.

KubeRay ignores a field its CRD schema does not know (the API server prunes unknown fields of a structural
CRD), so an older operator would run a RayCluster without token auth or without Recreate, silently. The
check refuses instead, naming the version found and the feature that needs a newer one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raydlc.discovery.facts import ClusterFacts, Operator
from raydlc.errors import InputError


@dataclass(frozen=True)
class Feature:
    kind: str  # RayCluster or RayJob
    path: tuple[str, ...]  # under the object: ("spec", "authOptions")
    since: tuple[int, int, int]  # the first KubeRay release whose ray.io/v1 types have it
    what: str

    @property
    def field(self) -> str:
        return ".".join(self.path)


# From ray-operator/apis/ray/v1/raycluster_types.go and rayjob_types.go at each release tag (ray-project/kuberay):
# the first tag whose Go types carry the JSON field.
FEATURES: tuple[Feature, ...] = (
    Feature("RayCluster", ("spec", "authOptions"), (1, 6, 0), "Ray token auth from a Secret"),
    Feature("RayCluster", ("spec", "upgradeStrategy"), (1, 6, 0), "pods recreated when the spec changes (Recreate)"),
    Feature("RayCluster", ("spec", "autoscalerOptions", "version"), (1, 4, 0), "Ray's autoscaler v2"),
    Feature("RayJob", ("spec", "clusterSelector"), (1, 0, 0), "a RayJob on the standing RayCluster"),
    Feature("RayJob", ("spec", "submissionMode"), (1, 1, 0), "the RayJob's submission mode"),
    Feature("RayJob", ("spec", "activeDeadlineSeconds"), (1, 1, 0), "the RayJob's deadline"),
)
SERVED_VERSION = "v1"  # raydlc renders ray.io/v1


def parse(version: str) -> tuple[int, int, int] | None:
    parts = version.split(".")
    try:
        return (int(parts[0]), int(parts[1]), int(parts[2])) if len(parts) == 3 else None
    except ValueError:
        return None


def _has(doc: Mapping[str, Any], path: Sequence[str]) -> bool:
    node: Any = doc
    for key in path:
        if not isinstance(node, Mapping) or key not in node or node[key] is None:
            return False
        node = node[key]
    return True


def features_used(manifests: Iterable[Mapping[str, Any]]) -> tuple[Feature, ...]:
    """The features the rendered documents actually carry (an autoscaler v2 only when autoscaling is on)."""
    docs = list(manifests)
    return tuple(f for f in FEATURES if any(d.get("kind") == f.kind and _has(d, f.path) for d in docs))


def too_new(operator: Operator, features: Iterable[Feature]) -> list[Feature]:
    """The features this operator's version predates; none when its version is not known (a digest)."""
    have = parse(operator.version or "")
    return [] if have is None else [f for f in features if have < f.since]


@dataclass(frozen=True)
class OperatorCheck:
    operator: Operator | None  # the one that reconciles the namespace, when found
    problems: tuple[str, ...]  # each one refuses `up --attach`
    notes: tuple[str, ...]  # what could not be checked, said and not refused

    @property
    def ok(self) -> bool:
        return not self.problems


def check(facts: ClusterFacts, manifests: Iterable[Mapping[str, Any]]) -> OperatorCheck:
    """KubeRay in `facts` against the documents raydlc will apply in `facts.namespace`."""
    ns, problems, notes = facts.namespace, [], []
    crds = facts.kuberay.crds
    if crds.is_known:
        found = {c.name: c for c in crds.value or ()}
        for name in ("rayclusters.ray.io", "rayjobs.ray.io"):
            if name not in found:
                problems.append(f"KubeRay is not installed: no CRD {name} (attach installs no operator or CRD; "
                                "the platform team installs KubeRay >= 1.6.0)")
            elif SERVED_VERSION not in found[name].served_versions:
                problems.append(f"CRD {name} does not serve ray.io/{SERVED_VERSION} (serves {', '.join(found[name].served_versions)})")
    else:
        notes.append(f"KubeRay's CRDs could not be read ({crds.note})")
    ops = facts.kuberay.operators
    if not ops.is_known:
        notes.append(f"the KubeRay operator could not be read ({ops.note}): its version and watched namespaces are not checked")
        return OperatorCheck(None, tuple(problems), tuple(notes))
    watching = [o for o in ops.value or () if o.watch.covers(ns) is not False]
    if not ops.value:
        problems.append("no KubeRay operator runs in the cluster: a RayCluster would never get pods")
    elif not watching:
        lists = "; ".join(f"{o.namespace}/{o.name} watches {', '.join(o.watch.namespaces)}" for o in ops.value or ())
        problems.append(f"no KubeRay operator watches namespace {ns} ({lists})")
    op = next((o for o in watching if o.watch.covers(ns)), watching[0] if watching else None)
    if op is None:
        return OperatorCheck(None, tuple(problems), tuple(notes))
    if op.watch.covers(ns) is None:
        notes.append(f"{op.namespace}/{op.name} reads its watched namespaces from a config file: not checked")
    if op.version is None:
        notes.append(f"the operator image {op.image} names no version: its features are not checked")
    for f in too_new(op, features_used(manifests)):
        problems.append(f"the KubeRay operator {op.namespace}/{op.name} is v{op.version}; {f.kind} {f.field} ({f.what}) "
                        f"needs KubeRay >= {'.'.join(map(str, f.since))}")
    if not op.available:
        notes.append(f"the operator {op.namespace}/{op.name} has no available replica")
    return OperatorCheck(op, tuple(problems), tuple(notes))


def require(result: OperatorCheck) -> Operator | None:
    """Refuse (exit 2, every problem in one error) unless KubeRay can run raydlc's documents here."""
    if result.problems:
        body = result.problems[0] if len(result.problems) == 1 else "\n".join(f"  - {p}" for p in result.problems)
        raise InputError(f"the cluster's KubeRay cannot run raydlc's RayCluster:{' ' if len(result.problems) == 1 else chr(10)}{body}",
                         hint="ask the platform team for KubeRay >= 1.6.0 watching this namespace, or attach to another namespace")
    return result.operator
