"""NetworkPolicies that keep each Ray head reachable only from its own cluster and the operator.

Once a NetworkPolicy selects a pod, all ingress not listed is denied. The head's own cluster
(workers and, for a RayJob, the submitter pod) is admitted on every port, because Ray's
node-to-node traffic (raylet, object manager, dashboard agent) uses more ports than the three
client ones; the KubeRay operator, from its namespace, only on GCS 6379, dashboard 8265 and
client 10001. Any other pod in the cluster, and anything outside it, gets nothing. Pods are
matched by raydlc's CLUSTER_LABEL, which the RayCluster puts on its pod templates and the RayJob
on its submitter pod (the RayJob runs on the standing RayCluster, so there is one head to guard).
"""

from __future__ import annotations

from typing import Any

from raydlc.config import Config
from raydlc.render import ownership
from raydlc.render.raycluster import CLUSTER_LABEL, HEAD_PORTS

OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}


def head_policy(cfg: Config, instance: str) -> dict[str, Any]:
    """The policy for the head of the Ray cluster whose pods carry CLUSTER_LABEL=instance."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{instance}-head", "namespace": cfg.cluster.namespace, "labels": ownership.labels(cfg)},
        "spec": {
            "podSelector": {"matchLabels": {CLUSTER_LABEL: instance, "ray.io/node-type": "head"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {CLUSTER_LABEL: instance}}}]},
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": cfg.ray.operator_namespace}
                            },
                            "podSelector": {"matchLabels": dict(OPERATOR_LABELS)},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": port} for port in HEAD_PORTS.values()],
                },
            ],
        },
    }


def render_netpol(cfg: Config) -> dict[str, Any]:
    """A v1 List with the policy of the standing RayCluster's head (the RayJob runs on that cluster, no head of its own)."""
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [head_policy(cfg, cfg.ray.cluster_name)],
    }
