"""A recorded double of helm 3: status, get values, get metadata, upgrade --install, uninstall — for three charts.

`helm status -o json` prints the release with its chart stripped (helm v3.14–v3.19
cmd/helm/status.go: `rel.Chart = nil`, and `chart` is `omitempty` in pkg/release/release.go), so
a chart version is only read through `helm get metadata NAME -o json` (cmd/helm/get_metadata.go,
pkg/action/get_metadata.go `Metadata`: name, chart, version, appVersion, namespace, revision,
status, deployedAt, of the release's last revision).

It logs its argv, refuses flags helm does not have, checks the values file it is given (a
mapping whose keys the chart knows: nodeSelector of strings, tolerations of the Kubernetes
shape), and keeps its releases where helm does: Secrets `sh.helm.release.v1.<name>.v<N>`
labelled owner=helm in the release namespace. Installing a chart creates what the chart
would: the KubeRay operator's CRDs and Deployment (its pod on a node the nodeSelector admits),
or the NVIDIA device plugin's DaemonSet, whose pods then make GPUs allocatable, or the Cluster
Autoscaler's Deployment and pod (named by `fullnameOverride`, on a node the nodeSelector admits).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml
from world import (
    NVIDIA_DAEMONSET,
    Kube,
    delay,
    fail,
    log_call,
    pod_name,
    reconcile_daemonsets,
    running_pod,
    say,
    scenario,
    selector_matches,
    tolerated,
)

VERSION = "v3.17.3+ge4da497"
CHARTS = {
    "kuberay-operator": ("https://ray-project.github.io/kuberay-helm/", {"1.5.1", "1.6.0", "1.7.0"}),
    "nvidia-device-plugin": ("https://nvidia.github.io/k8s-device-plugin", {"0.17.0", "0.20.0"}),
    "cluster-autoscaler": ("https://kubernetes.github.io/autoscaler", {"9.58.0", "9.59.0"}),
}
# kubernetes/autoscaler charts/cluster-autoscaler 9.59.0 values.yaml: the top-level keys raydlc may set
# (the chart has no values.schema.json, so helm itself accepts any key; the double is stricter so a typo fails)
CA_KEYS = {"cloudProvider", "awsRegion", "autoDiscovery", "fullnameOverride", "nameOverride", "image", "rbac", "extraArgs",
           "nodeSelector", "tolerations", "affinity", "resources", "replicaCount", "podAnnotations", "priorityClassName",
           "expanderPriorities"}
VALUE_KEYS = {
    "kuberay-operator": {"nodeSelector", "tolerations", "affinity", "image", "resources", "replicas", "watchNamespace",
                         "singleNamespaceInstall"},
    "nvidia-device-plugin": {"nodeSelector", "tolerations", "affinity", "resources", "config", "gfd", "runtimeClassName"},
    "cluster-autoscaler": CA_KEYS,
}
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}


def check_values(chart: str, values: Any, path: str) -> None:
    if not isinstance(values, dict):
        fail(f"Error: failed to parse {path}: values must be a mapping")
    unknown = set(values) - VALUE_KEYS[chart]
    if unknown:
        fail(f"Error: values don't meet the specifications of the schema(s) in the following chart(s):\n"
             f"{chart}: additional properties {sorted(unknown)} not allowed")
    sel = values.get("nodeSelector", {})
    if not isinstance(sel, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in sel.items()):
        fail(f"Error: {chart}: nodeSelector must map strings to strings, got {sel!r}")
    for t in values.get("tolerations", []):
        if not isinstance(t, dict) or set(t) - TOLERATION_KEYS or t.get("operator", "Equal") not in ("Equal", "Exists"):
            fail(f"Error: {chart}: invalid toleration {t!r}")


def releases(kube: Kube, name: str, ns: str) -> list[dict[str, Any]]:
    out = []
    for s in kube.list("Secret", ns):
        labels = s["metadata"].get("labels") or {}
        if labels.get("owner") == "helm" and labels.get("name") == name:
            out.append(s)
    return sorted(out, key=lambda s: int(s["metadata"]["labels"]["version"]))


def decode(secret: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(base64.b64decode(secret["data"]["release"])))


def store(kube: Kube, rel: dict[str, Any]) -> None:
    name, ns, rev = rel["name"], rel["namespace"], rel["version"]
    kube.ensure({
        "apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
        "metadata": {"name": f"sh.helm.release.v1.{name}.v{rev}", "namespace": ns,
                     "labels": {"owner": "helm", "name": name, "status": rel["info"]["status"], "version": str(rev)}},
        "data": {"release": base64.b64encode(json.dumps(rel).encode()).decode()},
    })


def metadata(rel: dict[str, Any]) -> dict[str, Any]:
    """What `helm get metadata -o json` prints for a release (pkg/action/get_metadata.go `Metadata`)."""
    chart = rel["chart"]["metadata"]
    return {"name": rel["name"], "chart": chart["name"], "version": chart["version"], "appVersion": chart.get("appVersion", ""),
            "namespace": rel["namespace"], "revision": rel["version"], "status": rel["info"]["status"],
            "deployedAt": rel["info"].get("last_deployed", "")}


def schedulable_node(kube: Kube, spec: dict[str, Any]) -> str | None:
    for n in kube.list("Node"):
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in (n.get("status") or {}).get("conditions") or [])
        if ready and selector_matches(spec, n["metadata"].get("labels") or {}) and tolerated(
                (n.get("spec") or {}).get("taints") or [], spec.get("tolerations") or []):
            return str(n["metadata"]["name"])
    return None


# KubeRay's chart crds/ray.io_rayclusters.yaml and ray.io_rayjobs.yaml (v1.5.0 to v1.7.0): v1 served and stored,
# v1alpha1 still served (deprecated in v1.7.0's CRDs: "will be unavailable in KubeRay 1.9").
KUBERAY_CRD_VERSIONS = [{"name": "v1", "served": True, "storage": True}, {"name": "v1alpha1", "served": True, "storage": False}]


def kuberay_args(values: dict[str, Any], ns: str) -> list[str]:
    """The operator's args as KubeRay v1.7.0's chart renders them (templates/deployment.yaml): `--watch-namespace`
    and the list joined by commas when `watchNamespace` is set, the release namespace when only
    `singleNamespaceInstall` is; nothing otherwise, and the operator then watches every namespace (main.go)."""
    watch = ",".join(values.get("watchNamespace") or []) or (ns if values.get("singleNamespaceInstall") else "")
    return ["--watch-namespace", watch] if watch else []


def install_objects(kube: Kube, chart: str, ns: str, values: dict[str, Any], version: str = "1.7.0") -> None:
    spec = {k: values[k] for k in ("nodeSelector", "tolerations", "affinity") if k in values}
    if chart == "kuberay-operator":
        for plural, kind in (("rayclusters", "RayCluster"), ("rayjobs", "RayJob")):
            kube.ensure({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.ray.io"},
                "spec": {"group": "ray.io", "names": {"kind": kind, "plural": plural}, "scope": "Namespaced",
                         "versions": KUBERAY_CRD_VERSIONS},
                "status": {"conditions": [{"type": "Established", "status": "True"}], "storedVersions": ["v1"]},
            })
        tag = str((values.get("image") or {}).get("tag") or f"v{version}")
        container = {"name": "kuberay-operator", "image": f"quay.io/kuberay/operator:{tag}",
                     "command": ["/manager"], "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}}}
        args = kuberay_args(values, ns)
        if args:
            container["args"] = args
        pod_spec = {**spec, "containers": [container]}
        node = schedulable_node(kube, pod_spec)
        labels = {"app.kubernetes.io/name": chart, "app.kubernetes.io/instance": chart, "app.kubernetes.io/managed-by": "Helm",
                  "helm.sh/chart": f"{chart}-{version}"}
        kube.ensure({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": chart, "namespace": ns, "labels": labels},
                     "spec": {"replicas": 1, "template": {"metadata": {"labels": labels}, "spec": pod_spec}}})
        if node is None:
            kube.patch("Deployment", chart, {"status": {"availableReplicas": 0, "conditions": [
                {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"}]}}, ns)
            fail("Error: UPGRADE FAILED: context deadline exceeded (the operator pod cannot be scheduled)")
        pname = pod_name(f"{chart}-6d4f7b9c5", node)
        if kube.get("Pod", pname, ns) is None:
            kube.create(running_pod(pname, ns, node, {"app.kubernetes.io/name": chart}, pod_spec, ("ReplicaSet", chart)))
        kube.patch("Deployment", chart, {"status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1,
                                                    "conditions": [{"type": "Available", "status": "True"}]}}, ns)
    elif chart == "cluster-autoscaler":
        install_autoscaler(kube, ns, values, spec)
    else:
        kube.ensure({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": NVIDIA_DAEMONSET, "namespace": ns},
                     "spec": {"template": {"spec": {**spec, "containers": [{"name": "nvidia-device-plugin-ctr"}]}}}})
        reconcile_daemonsets(kube)


def autoscaler_name(values: dict[str, Any]) -> str:
    """The chart's `cluster-autoscaler.fullname` (templates/_helpers.tpl): fullnameOverride, else
    `<release>-<cloudProvider>-cluster-autoscaler`; the double knows only the release raydlc names."""
    return str(values.get("fullnameOverride") or "cluster-autoscaler-aws-cluster-autoscaler")


def install_autoscaler(kube: Kube, ns: str, values: dict[str, Any], spec: dict[str, Any]) -> None:
    """The chart's Deployment and its pod; with auto-discovery on AWS the chart needs autoDiscovery.clusterName
    (templates/deployment.yaml: `--node-group-auto-discovery=asg:tag=...` only when it is set). A scenario
    `autoscaler_pod` = "CrashLoopBackOff" leaves the pod crashing as a CA whose role cannot describe ASGs does."""
    for key in ("clusterName",):
        if not (values.get("autoDiscovery") or {}).get(key):
            fail(f"Error: cluster-autoscaler: autoDiscovery.{key} must be set for ASG auto-discovery")
    name = autoscaler_name(values)
    image = f"{values.get('image', {}).get('repository', 'registry.k8s.io/autoscaling/cluster-autoscaler')}:" \
            f"{values.get('image', {}).get('tag', 'v1.35.0')}"
    pod_spec = {**spec, "containers": [{"name": "aws-cluster-autoscaler", "image": image,
                                        "resources": values.get("resources") or {}}]}
    kube.ensure({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
                 "spec": {"replicas": 1, "template": {"spec": pod_spec}}})
    node = schedulable_node(kube, pod_spec)
    broken = scenario().get("autoscaler_pod")
    pname = pod_name(f"{name}-7c9d5f6b8", node or "pending")
    if kube.get("Pod", pname, ns) is None:
        pod = running_pod(pname, ns, node or "", {"app.kubernetes.io/name": "aws-cluster-autoscaler"}, pod_spec,
                          ("ReplicaSet", name))
        if broken:
            pod["status"] = {"phase": "Running", "containerStatuses": [{
                "name": "aws-cluster-autoscaler", "ready": False, "restartCount": 5,
                "state": {"waiting": {"reason": broken, "message": "back-off 5m0s restarting failed container"}}}]}
        kube.create(pod)
    if node is None or broken:
        kube.patch("Deployment", name, {"status": {"availableReplicas": 0, "conditions": [
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"}]}}, ns)
        fail("Error: UPGRADE FAILED: context deadline exceeded")  # `--wait` gives up on a Deployment never Available
    kube.patch("Deployment", name, {"status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1,
                                               "conditions": [{"type": "Available", "status": "True"}]}}, ns)


def remove_objects(kube: Kube, chart: str, ns: str, values: dict[str, Any] | None = None) -> None:
    if chart == "cluster-autoscaler":
        name = autoscaler_name(values or {})
        for p in kube.list("Pod", ns):
            if p["metadata"]["name"].startswith(f"{name}-"):
                kube.delete("Pod", p["metadata"]["name"], ns)
        kube.delete("Deployment", name, ns)
    elif chart == "kuberay-operator":
        for p in kube.list("Pod", ns):
            if p["metadata"]["name"].startswith(f"{chart}-"):
                kube.delete("Pod", p["metadata"]["name"], ns)
        kube.delete("Deployment", chart, ns)  # helm keeps CRDs installed from crds/ on uninstall
    else:
        kube.delete("DaemonSet", NVIDIA_DAEMONSET, ns)
        reconcile_daemonsets(kube)


def upgrade(args: argparse.Namespace, kube: Kube) -> None:
    if not args.install:
        fail("Error: this double supports `helm upgrade --install` only")
    repo, versions = CHARTS.get(args.chart, ("", set()))
    if args.repo != repo or args.version not in versions:
        fail(f'Error: chart "{args.chart}" version "{args.version}" not found in {args.repo} repository')
    path = (args.values or [None])[0]
    values = yaml.safe_load(Path(path).read_text()) if path else {}
    check_values(args.chart, values, str(path))
    ns = args.namespace
    if kube.get("Namespace", ns) is None:
        if not args.create_namespace:
            fail(f'Error: create: failed to create: namespaces "{ns}" not found')
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    history = releases(kube, args.name, ns)
    last = decode(history[-1]) if history else None
    if last and last["info"]["status"].startswith("pending"):
        fail("Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress")
    rev = (last["version"] + 1) if last else 1
    rel = {"name": args.name, "namespace": ns, "version": rev,
           "info": {"status": "pending-install" if not last else "pending-upgrade", "description": "Install in progress"},
           "chart": {"metadata": {"name": args.chart, "version": args.version}}, "config": values}
    store(kube, rel)
    say(f'Release "{args.name}" does not exist. Installing it now.' if not last else f'Release "{args.name}" has been upgraded.')
    delay(f"install {args.name}")
    install_objects(kube, args.chart, ns, values, args.version)
    if last:
        prev = {**last, "info": {**last["info"], "status": "superseded"}}
        store(kube, prev)
    rel["info"] = {"status": "deployed", "description": "Install complete" if not last else "Upgrade complete"}
    store(kube, rel)
    say(f"NAME: {args.name}\nNAMESPACE: {ns}\nSTATUS: deployed\nREVISION: {rev}")


def main(argv: list[str]) -> int:
    t0 = time.time()
    rc = 0
    try:
        p = argparse.ArgumentParser(prog="helm", add_help=False)
        p.add_argument("verb")
        p.add_argument("rest", nargs="*")
        p.add_argument("--kubeconfig")
        p.add_argument("--namespace", "-n", default="default")
        p.add_argument("--output", "-o")
        p.add_argument("--short", action="store_true")
        p.add_argument("--install", action="store_true")
        p.add_argument("--repo")
        p.add_argument("--version")
        p.add_argument("--create-namespace", action="store_true")
        p.add_argument("--values", "-f", action="append")
        p.add_argument("--wait", action="store_true")
        p.add_argument("--timeout")
        args = p.parse_intermixed_args(argv)
        if args.verb == "version":
            say(scenario().get("helm_version", VERSION))
            return 0
        if not args.kubeconfig:
            fail("Error: the double wants --kubeconfig: raydlc must never fall back to ~/.kube/config")
        kube = Kube.from_kubeconfig(args.kubeconfig)
        if args.verb == "status":
            history = releases(kube, args.rest[0], args.namespace)
            if not history:
                fail("Error: release: not found")
            say(json.dumps({k: v for k, v in decode(history[-1]).items() if k != "chart"}))
        elif args.verb == "get" and args.rest[:1] == ["metadata"]:
            history = releases(kube, args.rest[1], args.namespace)
            if not history:
                fail("Error: release: not found")
            say(json.dumps(metadata(decode(history[-1]))))
        elif args.verb == "get" and args.rest[:1] == ["values"]:
            history = releases(kube, args.rest[1], args.namespace)
            if not history:
                fail("Error: release: not found")
            say(json.dumps(decode(history[-1]).get("config") or None))
        elif args.verb == "upgrade":
            args.name, args.chart = args.rest[0], args.rest[1]
            upgrade(args, kube)
        elif args.verb == "uninstall":
            name = args.rest[0]
            history = releases(kube, name, args.namespace)
            if not history:
                fail(f"Error: uninstall: Release not loaded: {name}: release: not found")
            last = decode(history[-1])
            remove_objects(kube, last["chart"]["metadata"]["name"], args.namespace, last.get("config") or {})
            delay(f"uninstall {name}")
            for s in history:
                kube.delete("Secret", s["metadata"]["name"], args.namespace)
            say(f'release "{name}" uninstalled')
        else:
            fail(f"Error: unknown command {args.verb!r} for \"helm\"")
    except SystemExit as e:
        rc = int(e.code or 0)
    finally:
        log_call("helm", argv, rc, t0)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
