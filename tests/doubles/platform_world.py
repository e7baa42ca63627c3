"""A "platform cluster": an EKS cluster a platform team runs, which raydlc attaches to with a namespace and a Role.

On kmock (tests/doubles/servers.py), with what such a cluster holds:
- KubeRay installed by the helm double (tests/doubles/helm.py) into `kuberay-system`, its chart's CRDs and its
  operator Deployment (v1.7.0 by default, watching every namespace; an older chart, or a watch list, on request);
- GPU nodes labelled with their instance type (`node.kubernetes.io/instance-type`, HyperPod's `ml.` types too),
  tainted `nvidia.com/gpu:NoSchedule`, with `nvidia.com/gpu` and `vpc.amazonaws.com/efa` allocatable, a capacity
  type label, and the device-plugin DaemonSets that advertise them; a CPU node for the head;
- Karpenter v1 NodePools (`karpenter.sh/v1`), whose requirements may admit GPU types;
- a second team's RayCluster in the user's namespace;
- RBAC as the API server enforces it (`Rbac`): the user's bearer token names a user, every request is authorised
  against the Roles, ClusterRoles and their bindings stored in the cluster (rbac.authorization.k8s.io/v1 rule
  matching: verbs, API groups, resources with `*` and `*/subresource`, resourceNames; a RoleBinding grants only in
  its namespace), a refused request answers 403 with the API server's Forbidden Status and message, and
  `SelfSubjectAccessReview` answers from the same rules. Requests without a token are the test's own (the doubles,
  the emulated operator): a cluster admin.

`Variant` names the shapes the attach tests need: the full platform, KubeRay absent, an operator too old, no GPU
node but a NodePool that can make them, no GPU capacity at all, HyperPod nodes, and a kind-like cluster (no AWS).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm
import servers
from world import NODE_FACTS, Kube, node_allocatable

USER, USER_TOKEN = "alice", "alice-token"  # the user raydlc runs as
OWNER_LABEL = "app.kubernetes.io/managed-by"
TEAM_GROUP = "ml-team-a"
NAMESPACE = "team-a"
OTHER_TEAM_CLUSTER = "team-b-ray"
KUBERAY_NS = "kuberay-system"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
EKS_VERSION, KIND_VERSION = "v1.33.5-eks-3025e55", "v1.33.1"  # what /version answers: EKS's gitVersion carries `-eks-`
NODEPOOLS = "karpenter.sh/v1/nodepools"
EXTRA_RESOURCES = (NODEPOOLS, "rbac.authorization.k8s.io/v1/clusterroles", "rbac.authorization.k8s.io/v1/clusterrolebindings")
# What a HyperPod EKS node carries (SageMaker developer guide, "Resilience-related Kubernetes labels by SageMaker HyperPod").
HYPERPOD_LABELS = {"sagemaker.amazonaws.com/node-health-status": "Schedulable",
                   "sagemaker.amazonaws.com/deep-health-check-status": "Passed"}
# Nodes the instance-type table of world.py lacks: (vCPUs, memory GiB, GPUs, EFA interfaces, max pods).
NODE_FACTS.setdefault("p5.48xlarge", (192, 2048, 8, 32, 100))
NODE_FACTS.setdefault("ml.p5.48xlarge", NODE_FACTS["p5.48xlarge"])
NODE_FACTS.setdefault("g6e.12xlarge", (48, 384, 4, 1, 234))


# ---------------------------------------------------------------------- the API server's authorizer


def request_attributes(method: str, path: str, params: Mapping[str, str]) -> dict[str, Any]:
    """Kubernetes' request attributes from an HTTP request (apiserver RequestInfoFactory, "Request verbs" of the
    authorization docs): resource requests carry verb, apiGroup, resource, subresource, namespace and name;
    anything else is a non-resource request (a path and the HTTP verb in lower case)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return {"resource_request": False, "path": path, "verb": method.lower()}
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else ""), (rest[2] if len(rest) > 2 else "")
    if resource == "namespaces" and name:
        namespace = name  # a Namespace's own namespace attribute is its name
    watch = str(params.get("watch", "")).lower() in ("1", "true")
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method)
    if verb is None and method in ("GET", "HEAD"):
        verb = "get" if name else ("watch" if watch else "list")
    if verb is None and method == "DELETE":
        verb = "delete" if name else "deletecollection"
    return {"resource_request": True, "verb": verb or method.lower(), "group": group, "resource": resource,
            "subresource": sub, "namespace": namespace, "name": name}


def rule_allows(rule: Mapping[str, Any], attrs: Mapping[str, Any]) -> bool:
    """One PolicyRule against a request (kubernetes pkg/apis/rbac/v1/evaluation_helpers.go: VerbMatches,
    APIGroupMatches, ResourceMatches with `*` and `*/sub`, ResourceNameMatches; NonResourceURLMatches)."""
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs["verb"] not in verbs:
        return False
    if not attrs["resource_request"]:
        urls = rule.get("nonResourceURLs") or []
        return any(u == "*" or u == attrs["path"] or (u.endswith("*") and attrs["path"].startswith(u[:-1])) for u in urls)
    groups = rule.get("apiGroups") or []
    if "*" not in groups and attrs["group"] not in groups:
        return False
    combined = attrs["resource"] + (f"/{attrs['subresource']}" if attrs["subresource"] else "")
    resources = rule.get("resources") or []
    if not any(r == "*" or r == combined or (attrs["subresource"] and r == f"*/{attrs['subresource']}") for r in resources):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs["name"] in names


def bound(subjects: Sequence[Mapping[str, Any]], user: str, groups: Sequence[str]) -> bool:
    for s in subjects:
        if s.get("kind") == "User" and s.get("name") == user:
            return True
        if s.get("kind") == "Group" and s.get("name") in groups:
            return True
        if s.get("kind") == "ServiceAccount" and user == f"system:serviceaccount:{s.get('namespace')}:{s.get('name')}":
            return True
    return False


@dataclass
class Rbac:
    """The authorizer and the token authenticator of the platform's API server, reading RBAC objects from kmock."""

    users: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=lambda: {USER_TOKEN: (USER, (TEAM_GROUP,))})
    server_version: str = EKS_VERSION
    refused: list[str] = field(default_factory=list)  # the Forbidden messages sent, for a test to read
    absent_groups: set[str] = field(default_factory=set)  # API groups not installed (Karpenter on kind): 404

    def __call__(self, request: Any, handler: Any) -> tuple[int, Any] | None:
        method = str(getattr(request.method, "value", request.method)).upper()
        path = request.url.path
        if method == "GET" and path == "/version":
            return 200, {"major": "1", "minor": "33", "gitVersion": self.server_version, "platform": "linux/amd64"}
        absent = any(path.startswith(f"/apis/{g}/") or path == f"/apis/{g}" for g in self.absent_groups)
        # the API server's answer for a group no CRD or aggregated API serves; authorization comes first (its filter
        # runs before the handler), so a caller refused the request is told 403 whether or not the group exists
        not_served = (404, "404 page not found")
        auth = (request.headers or {}).get("Authorization", "")
        if not auth:
            return not_served if absent else None  # the test's own request: a cluster admin
        token = auth.removeprefix("Bearer ").strip()
        if token not in self.users:
            return 401, status(401, "Unauthorized", "Unauthorized")
        user, groups = self.users[token][0], (*self.users[token][1], "system:authenticated")
        if method == "POST" and path.rstrip("/").endswith("/selfsubjectaccessreviews"):
            return 201, self.review(handler, request.data or {}, user, groups)
        attrs = request_attributes(method, path, request.params or {})
        if not attrs["resource_request"] and method == "GET":
            return not_served if absent else None  # discovery: system:discovery grants it to every authenticated user
        if self.allowed(handler, attrs, user, groups) is not None:
            return not_served if absent else None
        message = forbidden(attrs, user)
        self.refused.append(message)
        details = {"name": attrs.get("name", ""), "group": attrs.get("group", ""), "kind": attrs.get("resource", "")}
        return 403, {**status(403, "Forbidden", message), "details": details}

    def allowed(self, handler: Any, attrs: Mapping[str, Any], user: str, groups: Sequence[str]) -> str | None:
        """The reason RBAC allows it (as the RBAC authorizer words it), or None: no rule allows it."""
        objs = objects(handler)
        roles = {("Role", o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objs.get("roles", [])}
        roles.update({("ClusterRole", None, o["metadata"]["name"]): o for o in objs.get("clusterroles", [])})
        for b in objs.get("clusterrolebindings", []):
            role = roles.get(("ClusterRole", None, b["roleRef"]["name"]))
            if role and bound(b.get("subjects") or [], user, groups) and any(rule_allows(r, attrs) for r in role.get("rules") or []):
                return f'RBAC: allowed by ClusterRoleBinding "{b["metadata"]["name"]}" of ClusterRole "{role["metadata"]["name"]}" to User "{user}"'
        for b in objs.get("rolebindings", []):
            ns = b["metadata"].get("namespace")
            if not attrs.get("resource_request") or attrs.get("namespace") != ns:
                continue  # a RoleBinding grants only inside its own namespace, never cluster-scoped reads
            ref = b["roleRef"]
            role = roles.get((ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"]))
            if role and bound(b.get("subjects") or [], user, groups) and any(rule_allows(r, attrs) for r in role.get("rules") or []):
                return f'RBAC: allowed by RoleBinding "{b["metadata"]["name"]}/{ns}" of {ref["kind"]} "{ref["name"]}" to User "{user}"'
        return None

    def review(self, handler: Any, body: Mapping[str, Any], user: str, groups: Sequence[str]) -> dict[str, Any]:
        """SelfSubjectAccessReview (authorization.k8s.io/v1): the same decision as a real request, in status.allowed."""
        spec = body.get("spec") or {}
        ra, nra = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if ra is not None:
            attrs = {"resource_request": True, "verb": ra.get("verb", ""), "group": ra.get("group", ""),
                     "resource": ra.get("resource", ""), "subresource": ra.get("subresource", ""),
                     "namespace": ra.get("namespace", ""), "name": ra.get("name", "")}
        else:
            attrs = {"resource_request": False, "verb": (nra or {}).get("verb", ""), "path": (nra or {}).get("path", "")}
        reason = self.allowed(handler, attrs, user, groups)
        st: dict[str, Any] = {"allowed": reason is not None}
        if reason:
            st["reason"] = reason
        return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "metadata": {"creationTimestamp": None},
                "spec": spec, "status": st}


def objects(handler: Any) -> dict[str, list[dict[str, Any]]]:
    """Live RBAC objects in kmock, by plural (read in kmock's own thread, inside the request)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for (r, _ns, _name), obj in handler.objects.items():
        if r.group == "rbac.authorization.k8s.io" and not obj.deleted:
            out.setdefault(r.plural, []).append(obj.raw)
    return out


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message, "reason": reason,
            "code": code}


def forbidden(attrs: Mapping[str, Any], user: str) -> str:
    """The API server's Forbidden message (apiserver endpoints/handlers/responsewriters/errors.go forbiddenMessage,
    apimachinery errors.NewForbidden): `<resource>[.<group>] ["<name>"] is forbidden: User "<u>" cannot <verb> ...`."""
    if not attrs["resource_request"]:
        return f'forbidden: User "{user}" cannot {attrs["verb"]} path "{attrs["path"]}"'
    resource = attrs["resource"] + (f"/{attrs['subresource']}" if attrs["subresource"] else "")
    where = f'in the namespace "{attrs["namespace"]}"' if attrs["namespace"] else "at the cluster scope"
    reason = f'User "{user}" cannot {attrs["verb"]} resource "{resource}" in API group "{attrs["group"]}" {where}'
    qualified = attrs["resource"] + (f".{attrs['group']}" if attrs["group"] else "")
    named = f' "{attrs["name"]}"' if attrs["name"] else ""
    return f"{qualified}{named} is forbidden: {reason}"


# ---------------------------------------------------------------------- the objects a platform holds


def rule(groups: Sequence[str], resources: Sequence[str], verbs: Sequence[str]) -> dict[str, Any]:
    return {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}


class Platform:
    """Shapes the platform cluster through kmock as an admin (no token: the test's own requests)."""

    def __init__(self, server: servers.KubeServer, rbac: Rbac, tmp: Path) -> None:
        self.server, self.rbac, self.tmp = server, rbac, tmp
        self.kube = Kube(server.url)
        self.admin_kubeconfig = tmp / "admin.kubeconfig"
        servers.write_kubeconfig(self.admin_kubeconfig, server.url)

    # -- the user's view

    def kubeconfig(self, path: Path | None = None, token: str = USER_TOKEN, context: str = "platform") -> Path:
        """The user's kubeconfig: the platform's API server, the user's bearer token, `context` current."""
        path = path or self.tmp / "user.kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "platform", "cluster": {"server": self.server.url}}],
            "contexts": [{"name": context, "context": {"cluster": "platform", "user": USER, "namespace": NAMESPACE}}],
            "users": [{"name": USER, "user": {"token": token}}]}))
        return path

    # -- namespaces and RBAC

    def namespace(self, name: str) -> None:
        if self.kube.get("Namespace", name) is None:
            self.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def grant(self, namespace: str, rules: Sequence[Mapping[str, Any]], *, name: str = "raydlc-user",
              subject: Mapping[str, str] | None = None) -> None:
        """A namespaced Role and its RoleBinding to the user (or `subject`)."""
        subj = dict(subject or {"kind": "User", "name": USER, "apiGroup": "rbac.authorization.k8s.io"})
        self._ensure({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                      "metadata": {"name": name, "namespace": namespace}, "rules": [dict(r) for r in rules]})
        self._ensure({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                      "metadata": {"name": name, "namespace": namespace}, "subjects": [subj],
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}})

    def grant_cluster(self, rules: Sequence[Mapping[str, Any]], *, name: str = "raydlc-discovery") -> None:
        """A ClusterRole and a ClusterRoleBinding to the user: reads at the cluster scope."""
        subj = {"kind": "User", "name": USER, "apiGroup": "rbac.authorization.k8s.io"}
        self._ensure({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
                      "rules": [dict(r) for r in rules]})
        self._ensure({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
                      "subjects": [subj], "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}})

    def apply(self, docs: Sequence[Mapping[str, Any]]) -> None:
        """What a platform team does with `raydlc render --only rbac`: apply the documents as an admin."""
        for d in docs:
            self._ensure(dict(d))

    def _ensure(self, doc: dict[str, Any]) -> None:
        meta = doc["metadata"]
        base = f"/apis/{doc['apiVersion']}"
        plural = {"Role": "roles", "RoleBinding": "rolebindings", "ClusterRole": "clusterroles",
                  "ClusterRoleBinding": "clusterrolebindings", "NodePool": "nodepools"}.get(doc["kind"])
        if plural is None:
            self.kube.ensure(doc)
            return
        coll = base + (f"/namespaces/{meta['namespace']}" if meta.get("namespace") else "") + f"/{plural}"
        code, _ = self.kube.call("GET", f"{coll}/{meta['name']}")
        if code == 200:
            self.kube.call("PATCH", f"{coll}/{meta['name']}", doc, "application/merge-patch+json")
        else:
            code, body = self.kube.call("POST", coll, doc)
            assert code < 300, (code, body)

    # -- KubeRay

    def install_kuberay(self, version: str = "1.7.0", *, watch: Sequence[str] = (), single_namespace: bool = False,
                        namespace: str = KUBERAY_NS) -> None:
        """`helm upgrade --install kuberay-operator` of the chart `version` into `namespace`, as the platform did."""
        values: dict[str, Any] = {}
        if watch:
            values["watchNamespace"] = list(watch)
        if single_namespace:
            values["singleNamespaceInstall"] = True
        vfile = self.tmp / "kuberay-values.yaml"
        vfile.write_text(json.dumps(values))
        argv = ["upgrade", "--install", "kuberay-operator", "kuberay-operator", "--repo", helm.CHARTS["kuberay-operator"][0],
                "--version", version, "--namespace", namespace, "--create-namespace", "--kubeconfig",
                str(self.admin_kubeconfig), "--values", str(vfile), "--wait"]
        rc = helm.main(argv)
        assert rc == 0, f"helm double refused: {argv}"

    def team_raycluster(self, name: str = OTHER_TEAM_CLUSTER, namespace: str = NAMESPACE) -> dict[str, Any]:
        """A second team's RayCluster in the same namespace, labelled as theirs (not raydlc's)."""
        return self.kube.create({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "team-b"}},
            "spec": {"rayVersion": "2.58.0", "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.58.0"}]}}}, "workerGroupSpecs": []}})

    # -- nodes

    def node(self, name: str, instance_type: str, *, labels: Mapping[str, str] | None = None,
             taints: Sequence[Mapping[str, str]] = (), ready: bool = True, aws: bool = True,
             capacity_type: str | None = "ON_DEMAND", zone: str = "us-east-2a") -> dict[str, Any]:
        """A node as the kubelet registers it: instance-type and zone labels, taints, allocatable from world.NODE_FACTS
        (GPUs and EFA interfaces too: the device plugins on this platform already run), Ready or not."""
        gpus, efa = NODE_FACTS[instance_type][2:4]
        alloc = node_allocatable(instance_type)
        if gpus:
            alloc["nvidia.com/gpu"] = str(gpus)
        if efa and aws:
            alloc["vpc.amazonaws.com/efa"] = str(efa)
        lab = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
               "node.kubernetes.io/instance-type": instance_type, "topology.kubernetes.io/zone": zone}
        if aws and capacity_type:
            lab["eks.amazonaws.com/capacityType"] = capacity_type
        lab.update(labels or {})
        iid = hashlib.sha1(name.encode()).hexdigest()[:17]
        spec: dict[str, Any] = {"providerID": f"aws:///{zone}/i-{iid}" if aws else f"kind://docker/kind/{name}"}
        if taints:
            spec["taints"] = [dict(t) for t in taints]
        return self.kube.create({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab}, "spec": spec,
            "status": {"allocatable": alloc, "capacity": dict(alloc),
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})

    def gpu_nodes(self, instance_type: str = "g6.12xlarge", count: int = 2, *, prefix: str = "gpu",
                  labels: Mapping[str, str] | None = None, capacity_type: str | None = "ON_DEMAND",
                  taints: Sequence[Mapping[str, str]] = (GPU_TAINT,), aws: bool = True) -> list[str]:
        names = [f"{prefix}-{i}" for i in range(count)]
        for n in names:
            self.node(n, instance_type, labels=labels, taints=taints, capacity_type=capacity_type, aws=aws)
        return names

    def device_plugins(self, *, efa: bool = True) -> None:
        """The NVIDIA plugin (as its chart names it for release `nvdp`) and the EKS EFA add-on's DaemonSet, Ready
        on every GPU node."""
        gpus = [n for n in self.kube.list("Node") if ((n.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu")]
        plugins = [("nvdp-nvidia-device-plugin", "nvcr.io/nvidia/k8s-device-plugin:v0.17.0")]
        if efa:
            plugins.append(("aws-efa-k8s-device-plugin-daemonset",
                            "602401143452.dkr.ecr.us-east-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.6"))
        for name, image in plugins:
            self.kube.ensure({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": "kube-system"},
                              "spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}],
                                                             "containers": [{"name": "plugin", "image": image}]}}}})
            self.kube.patch("DaemonSet", name, {"status": {"desiredNumberScheduled": len(gpus), "numberReady": len(gpus),
                                                           "currentNumberScheduled": len(gpus)}}, "kube-system")

    def nodepool(self, name: str, requirements: Sequence[Mapping[str, Any]], *, taints: Sequence[Mapping[str, str]] = (GPU_TAINT,),
                 labels: Mapping[str, str] | None = None, gpu_limit: int | None = 16) -> None:
        """A Karpenter v1 NodePool (karpenter.sh/v1: spec.template.spec.requirements/taints/nodeClassRef, spec.limits)."""
        spec: dict[str, Any] = {"template": {"metadata": {"labels": dict(labels or {})}, "spec": {
            "requirements": [dict(r) for r in requirements], "taints": [dict(t) for t in taints],
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}}
        if gpu_limit is not None:
            spec["limits"] = {"cpu": "1000", "nvidia.com/gpu": str(gpu_limit)}
        self._ensure({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": spec})

    def snapshot(self) -> dict[str, Any]:
        return self.server.snapshot()

    def outside(self, ray_cluster: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        """Every object of the cluster outside the namespace (cluster scope and other namespaces), as stored,
        and the namespace's objects not labelled as raydlc's: what attach must never touch."""
        out = {}
        for key, obj in self.snapshot().items():
            ns = (obj.get("metadata") or {}).get("namespace")
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if ns != namespace or labels.get(OWNER_LABEL) != "raydlc":
                if "/pods/" in key or "/events/" in key:  # the other team's and the operator's pods come and go
                    continue
                if labels.get("ray.io/cluster") == ray_cluster or key.endswith(f"/{namespace}/{ray_cluster}"):  # KubeRay's, for raydlc's cluster
                    continue
                meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")}
                out[key] = {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}  # status: the controllers'
        return out

    def settled(self, namespace: str = NAMESPACE) -> None:
        """The emulated operator has reconciled the other team's RayCluster (its head Service exists): what it does
        to the platform's objects is not raydlc's doing, so the inventory is taken after it."""
        import time

        until = time.monotonic() + 30
        while self.kube.get("Service", f"{OTHER_TEAM_CLUSTER}-head-svc", namespace) is None:
            assert time.monotonic() < until, "the operator never reconciled the other team's RayCluster"
            time.sleep(0.1)

    def made(self) -> list[str]:
        """The objects labelled as raydlc's."""
        return sorted(k for k, o in self.snapshot().items() if ((o.get("metadata") or {}).get("labels") or {}).get(OWNER_LABEL) == "raydlc")


# ---------------------------------------------------------------------- the variants

# The Role a platform team grants a raydlc user in its namespace (what `raydlc render --only rbac` should print),
# written here by hand from the issue's list so the world does not depend on the code under test.
TEAM_RULES = [
    rule(["ray.io"], ["rayclusters", "rayjobs"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
    rule(["ray.io"], ["rayclusters/status", "rayjobs/status"], ["get"]),
    rule([""], ["pods", "services", "secrets", "serviceaccounts", "configmaps"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
    rule([""], ["pods/log"], ["get"]), rule([""], ["pods/portforward"], ["create", "get"]),
    rule([""], ["events"], ["get", "list", "watch"]),
    rule(["networking.k8s.io"], ["networkpolicies"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
    rule(["rbac.authorization.k8s.io"], ["roles", "rolebindings"], ["get", "list", "watch", "create", "update", "patch", "delete"]),
]
DISCOVERY_RULES = [
    rule([""], ["nodes", "namespaces"], ["get", "list"]),
    rule(["apiextensions.k8s.io"], ["customresourcedefinitions"], ["get", "list"]),
    rule(["karpenter.sh"], ["nodepools"], ["get", "list"]),
    rule(["apps"], ["deployments", "daemonsets"], ["get", "list"]),
]
GPU_POOL_REQUIREMENTS = [
    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["g6.12xlarge", "g6e.12xlarge"]},
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]},
]
CPU_POOL_REQUIREMENTS = [
    {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["c", "m", "r"]},
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
]
VARIANTS = ("platform", "no-kuberay", "old-operator", "nodepool-only", "no-gpu", "hyperpod", "kind")


def build(p: Platform, variant: str = "platform", *, grant: bool = True, cluster_reads: bool = True) -> Platform:
    """The platform cluster in `variant`; `grant` gives the user TEAM_RULES in the namespace, `cluster_reads` the
    discovery reads cluster-wide (a platform may refuse them: discovery then says "unknown")."""
    if variant not in VARIANTS:
        raise ValueError(f"no platform variant {variant!r}; one of {VARIANTS}")
    aws = variant != "kind"
    p.rbac.server_version = EKS_VERSION if aws else KIND_VERSION
    if not aws:
        p.rbac.absent_groups.add("karpenter.sh")  # no Karpenter on kind
    p.namespace(NAMESPACE)
    p.node("system-0", "m7i.2xlarge", aws=aws)
    if variant != "no-kuberay":
        p.install_kuberay("1.5.1" if variant == "old-operator" else "1.7.0")
    if variant in ("platform", "no-kuberay", "old-operator"):
        p.gpu_nodes("g6.12xlarge", 2)
    elif variant == "hyperpod":
        p.gpu_nodes("ml.p5.48xlarge", 2, prefix="hyperpod-i-0a1b2c3d4e", labels=HYPERPOD_LABELS, capacity_type=None)
    elif variant == "kind":
        pass  # a GPU-less kind cluster: CPU Ray only
    if variant in ("platform", "nodepool-only", "old-operator", "no-kuberay"):
        p.nodepool("gpu", GPU_POOL_REQUIREMENTS)
    if aws:
        p.nodepool("general", CPU_POOL_REQUIREMENTS, taints=(), gpu_limit=None)
    if variant in ("platform", "old-operator", "hyperpod", "no-kuberay"):
        p.device_plugins(efa=True)
    if variant not in ("no-kuberay",):
        p.team_raycluster()
    if grant:
        p.grant(NAMESPACE, TEAM_RULES)
    if cluster_reads:
        p.grant_cluster(DISCOVERY_RULES)
    return p


@contextlib.contextmanager
def platform_server(patch: Callable[[Any, str, Any], None]) -> Iterator[tuple[servers.KubeServer, Rbac]]:
    """kmock with the platform's authorizer in front and Karpenter's and RBAC's cluster kinds declared."""
    rbac = Rbac()
    with servers.kube_server(patch, gate=rbac, resources=EXTRA_RESOURCES) as server:
        yield server, rbac


@contextlib.contextmanager
def platform_cluster(patch: Callable[[Any, str, Any], None], variant: str = "platform", tmp: Path | None = None,
                     **knobs: Any) -> Iterator[Platform]:
    """The platform cluster, built (`build`) in `variant`; the helm double's calls go to DOUBLES_LOG if one is set."""
    with contextlib.ExitStack() as stack:
        if tmp is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="platform-")))
        server, rbac = stack.enter_context(platform_server(patch))
        yield build(Platform(server, rbac, tmp), variant, **knobs)
