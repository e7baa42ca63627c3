"""The Kubernetes permissions raydlc needs on an attached cluster, checked as the API server answers them.

`namespace_needs` is what `up`/`submit`/`verify`/`status`/`down` do in the namespace; `DISCOVERY_READS` are the
cluster-scope reads discovery makes (refused, a fact is "unknown": optional). `missing` asks a
SelfSubjectAccessReview for each (what the authorizer would answer the real request, so a Role with
`resourceNames` or a wildcard counts as Kubernetes counts it), and `render_rbac` writes the Role, RoleBinding
and, optionally, the read-only ClusterRole a platform team applies to grant exactly these.

Not asked for: the Role and RoleBinding of KubeRay's autoscaler (`AUTOSCALER_RULES`): the KubeRay operator makes
them in the namespace with its own rights (v1.7.0 `common/rbac.go`), not the user's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydlc.errors import InputError

if TYPE_CHECKING:
    from raydlc.edges.kube import Kube

RBAC = "rbac.authorization.k8s.io"
PART_OF = {"app.kubernetes.io/part-of": "raydlc"}


@dataclass(frozen=True)
class Need:
    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespaced: bool = True
    why: str = ""

    @property
    def resource_name(self) -> str:
        """`rayclusters.ray.io`, `pods/log`: how Kubernetes names the resource in its messages."""
        base = self.resource + (f".{self.group}" if self.group else "")
        return base + (f"/{self.subresource}" if self.subresource else "")

    def __str__(self) -> str:
        return f"{self.verb} {self.resource_name}"


def _each(verbs: Iterable[str], group: str, resource: str, why: str, sub: str = "", namespaced: bool = True) -> list[Need]:
    return [Need(v, group, resource, sub, namespaced, why) for v in verbs]


def namespace_needs(*, service_account_given: bool = True) -> tuple[Need, ...]:
    """What raydlc does in the namespace, verb by verb; a ServiceAccount is made only when none is given."""
    needs = [
        *_each(("get",), "", "namespaces", "up: the namespace exists"),
        *_each(("get", "list", "create", "patch", "delete"), "ray.io", "rayclusters", "up/down/status: the RayCluster"),
        *_each(("get", "list", "create", "patch", "delete"), "ray.io", "rayjobs", "submit --rayjob, job status/stop"),
        *_each(("get", "list", "create", "delete"), "", "pods", "status; verify's head-port probe pod (its storage probe runs in the Ray worker pods, as SERVICE_ACCOUNT)"),
        *_each(("get",), "", "pods", "logs: the head's and the probes' logs", sub="log"),
        # kubectl port-forward: SPDY is a POST (`create`); the WebSocket upgrade (kubectl >= 1.31) is a GET (`get`),
        # and kube-apiserver >= 1.35 checks `create` on it too (kubernetes/kubernetes#134577): both, for any version
        *_each(("create", "get"), "", "pods", "submit/job/verify: the port-forward to the head", sub="portforward"),
        *_each(("get", "list"), "", "services", "the head Service the port-forward goes to"),
        *_each(("get", "create", "patch", "delete"), "", "secrets", "up: the Ray token Secret"),
        *_each(("get", "create", "patch", "delete"), "networking.k8s.io", "networkpolicies", "up: the head's NetworkPolicy"),
        *_each(("list",), "", "events", "status: why a pod is pending"),
    ]
    if not service_account_given:
        needs += _each(("get", "create", "patch", "delete"), "", "serviceaccounts", "up: the pods' ServiceAccount (none given)")
    return tuple(needs)


DISCOVERY_READS: tuple[Need, ...] = (
    *_each(("list",), "", "nodes", "discovery: GPU nodes, types, taints", namespaced=False),
    *_each(("get",), "apiextensions.k8s.io", "customresourcedefinitions", "discovery: KubeRay's CRDs", namespaced=False),
    *_each(("list",), "karpenter.sh", "nodepools", "discovery: GPU capacity that can come", namespaced=False),
    *_each(("list",), "apps", "deployments", "discovery: the KubeRay operator and a node autoscaler", namespaced=False),
    *_each(("list",), "apps", "daemonsets", "discovery: the NVIDIA and EFA device plugins", namespaced=False),
)

# The Role KubeRay v1.7.0 makes for the autoscaler sidecar (common/rbac.go BuildRole), bound to the head's
# service account: the operator creates it, so the user needs none of it.
AUTOSCALER_RULES = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]},
)


def rules(needs: Sequence[Need]) -> list[dict[str, Any]]:
    """PolicyRules granting exactly `needs`: one rule per (group, resource), its verbs in the order asked."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for n in needs:
        verbs = grouped.setdefault((n.group, n.resource + (f"/{n.subresource}" if n.subresource else "")), [])
        if n.verb not in verbs:
            verbs.append(n.verb)
    return [{"apiGroups": [g], "resources": [r], "verbs": v} for (g, r), v in grouped.items()]


def subject_of(text: str, namespace: str) -> dict[str, str]:
    """`User:alice`, `Group:ml-team`, `ServiceAccount:ci` (in the namespace) as an RBAC subject."""
    kind, _, name = text.partition(":")
    if kind not in ("User", "Group", "ServiceAccount") or not name:
        raise InputError(f"RBAC subject {text!r} is not User:NAME, Group:NAME or ServiceAccount:NAME")
    if kind == "ServiceAccount":
        return {"kind": kind, "name": name, "namespace": namespace}
    return {"kind": kind, "name": name, "apiGroup": RBAC}


def render_rbac(namespace: str, subject: str, *, name: str = "raydlc", cluster_reads: bool = True,
                service_account_given: bool = True) -> list[dict[str, Any]]:
    """The Role and RoleBinding a platform team applies so `subject` may run raydlc in `namespace`; with
    `cluster_reads`, a read-only ClusterRole and its binding for discovery (optional: without it the facts it
    reads are "unknown" and the worker group falls back to GPU_NODE_TYPE)."""
    subj = subject_of(subject, namespace)
    meta = {"name": name, "namespace": namespace, "labels": dict(PART_OF)}
    docs: list[dict[str, Any]] = [
        {"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": dict(meta),
         "rules": rules(namespace_needs(service_account_given=service_account_given))},
        {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": dict(meta), "subjects": [subj],
         "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name}},
    ]
    if cluster_reads:
        cmeta = {"name": f"{name}-discovery-{namespace}", "labels": dict(PART_OF)}
        docs += [
            {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": dict(cmeta), "rules": rules(DISCOVERY_READS)},
            {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": dict(cmeta), "subjects": [subj],
             "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": cmeta["name"]}},
        ]
    return docs


def missing(kube: Kube, namespace: str, needs: Iterable[Need]) -> list[Need]:
    """The needs the API server's authorizer refuses this caller, one SelfSubjectAccessReview each."""
    return [n for n in needs if not kube.may(n.verb, n.resource, group=n.group, subresource=n.subresource,
                                             namespace=namespace if n.namespaced else None)]


def refusal(namespace: str, lacking: Sequence[Need]) -> InputError:
    """One error naming every missing permission (exit 2), and how to get the Role that grants them."""
    names = ", ".join(str(n) for n in lacking)
    return InputError(f"missing Kubernetes permissions in namespace {namespace}: {names}",
                      hint=f"`raydlc render --only rbac` prints the Role a cluster admin applies to grant them in {namespace}")


def require(kube: Kube, namespace: str, *, service_account_given: bool = True) -> list[Need]:
    """Refuse before anything is made when a namespace need is missing; the missing discovery reads are returned
    (each makes a fact "unknown"), never refused."""
    lacking = missing(kube, namespace, namespace_needs(service_account_given=service_account_given))
    if lacking:
        raise refusal(namespace, lacking)
    return missing(kube, namespace, DISCOVERY_READS)
