"""The structural schemas raydlc validates its rendered documents against, carried in the package.

They are derived by `scripts/derive_schemas.py` from the KubeRay v1.7.0 CRDs and the eksctl
v0.230.0 schema (types, properties, required fields, enums, patterns; no prose), so a fresh
install checks a manifest the way the API server or eksctl would, with nothing beside it.
CRD schemas are made strict here: a field the CRD does not list is an error, because the API
server would silently drop it and the setting would vanish without a word.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from raydlc.errors import InputError

FILES = {
    "RayCluster": "kuberay-v1.7.0-raycluster.json",
    "RayJob": "kuberay-v1.7.0-rayjob.json",
    "ClusterConfig": "eksctl-v0.230.0-clusterconfig.json",
}
_CRDS = ("RayCluster", "RayJob")


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def schema(kind: str) -> dict[str, Any]:
    """The packaged schema of a kind (RayCluster, RayJob, ClusterConfig), strict for CRDs."""
    if kind not in FILES:
        raise KeyError(f"no packaged schema for kind {kind!r}; known: {', '.join(FILES)}")
    doc = json.loads(resources.files(__package__).joinpath(FILES[kind]).read_text())
    doc.pop("x-raydlc-derived-from", None)
    return _strict(doc) if kind in _CRDS else doc


@cache
def validator(kind: str) -> Any:
    import jsonschema

    return jsonschema.Draft7Validator(schema(kind))


def problems(doc: dict[str, Any]) -> list[str]:
    """`field.path: what is wrong` for each violation; [] when valid or the kind has no schema."""
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind not in FILES:
        return []
    out = []
    for e in sorted(validator(kind).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(str(p) for p in e.absolute_path) or "(document)"
        out.append(f"{path}: {e.message}")
    return out


def check(name: str, doc: dict[str, Any]) -> None:
    """Raise InputError naming the document and each field path the schema rejects."""
    found = problems(doc)
    if found:
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        raise InputError(
            f"{name} ({doc.get('kind')}) does not match its schema: {shown}",
            hint="a setting produced a document the cluster would reject; see `raydlc config show`",
        )
