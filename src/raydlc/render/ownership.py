"""What marks a Kubernetes object as made by raydlc: two labels, the one way `down` selects what it may delete.

Every object raydlc creates in NAMESPACE carries `app.kubernetes.io/managed-by: raydlc` (the label Kubernetes'
recommended labels name for the tool that manages an object) and `raydlc.io/owner: <CLUSTER_NAME>`, so two
configs sharing a namespace (or a second team's objects beside them) are told apart. On a cluster raydlc
attaches to, `down` lists each kind it makes by these labels and deletes only what it finds: an object without
them was found, not made, and is left as found.
"""

from __future__ import annotations

from typing import Any

from raydlc.config import Config

MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
MANAGED_BY = {MANAGED_BY_KEY: "raydlc"}
OWNER_LABEL = "raydlc.io/owner"

# What raydlc may make in a namespace, by (apiVersion, kind): `down` lists each by the labels (RayJobs first,
# the ServiceAccount last, after the pods that run as it are gone).
NAMESPACED_KINDS = (
    ("ray.io/v1", "RayJob"),
    ("ray.io/v1", "RayCluster"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("v1", "Secret"),
    ("v1", "ServiceAccount"),
)


def labels(cfg: Config) -> dict[str, str]:
    """The labels of everything this config makes in Kubernetes."""
    return {**MANAGED_BY, OWNER_LABEL: cfg.cluster.name}


def selector(cfg: Config) -> str:
    """The label selector that finds them again (`kubectl get -l` takes the same text)."""
    return ",".join(f"{k}={v}" for k, v in labels(cfg).items())


def made(obj: dict[str, Any], cfg: Config) -> bool:
    """Whether an object carries this config's labels: raydlc made it (pure)."""
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels(cfg).items())


def marked(doc: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """`doc` with the labels added to its metadata (its own labels kept)."""
    meta = doc.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels(cfg)}
    return doc
