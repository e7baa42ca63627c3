"""Derive the structural schemas raydlc carries from the upstream KubeRay CRDs and eksctl schema.

Keeps only what validation needs — types, properties, required fields, enums, patterns,
formats, bounds, references — and drops every description and comment, so the package holds
structural facts and no upstream prose. Run it again when a pinned upstream version changes:

    python scripts/derive_schemas.py ../shared/schemas
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parents[1] / "src" / "raydlc" / "schemas"

KEEP = {
    "$ref", "$schema", "additionalProperties", "anyOf", "allOf", "oneOf", "definitions", "enum",
    "format", "items", "maxItems", "maxLength", "maximum", "minItems", "minLength", "minimum",
    "nullable", "pattern", "patternProperties", "properties", "required", "type",
    "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource",
    "x-kubernetes-list-map-keys", "x-kubernetes-list-type", "x-kubernetes-map-type",
}
NAMED_MAPS = {"properties", "definitions", "patternProperties"}  # keys here are names, not keywords


def strip(node: Any) -> Any:
    if isinstance(node, list):
        return [strip(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k not in KEEP:
            continue
        if k in NAMED_MAPS:
            out[k] = {name: strip(sub) for name, sub in v.items()}
        else:
            out[k] = strip(v)
    return out


def crd_schema(path: Path, version: str = "v1") -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are megabytes of YAML
    crd = yaml.load(path.read_text(), Loader=loader)
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return strip(v["schema"]["openAPIV3Schema"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shared_schemas", type=Path, help="the folder holding kuberay-v1.7.0/ and eksctl-v0.230.0/")
    ap.add_argument("--out", type=Path, default=OUT)
    ns = ap.parse_args(argv)
    src = ns.shared_schemas
    docs = {
        "kuberay-v1.7.0-raycluster.json": ("KubeRay v1.7.0 ray.io_rayclusters.yaml (v1)", crd_schema(src / "kuberay-v1.7.0" / "ray.io_rayclusters.yaml")),
        "kuberay-v1.7.0-rayjob.json": ("KubeRay v1.7.0 ray.io_rayjobs.yaml (v1)", crd_schema(src / "kuberay-v1.7.0" / "ray.io_rayjobs.yaml")),
        "eksctl-v0.230.0-clusterconfig.json": ("eksctl v0.230.0 schema.json", strip(json.loads((src / "eksctl-v0.230.0" / "schema.json").read_text()))),
    }
    ns.out.mkdir(parents=True, exist_ok=True)
    for name, (origin, schema) in docs.items():
        doc = {"x-raydlc-derived-from": origin, **schema}
        (ns.out / name).write_text(json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n")
        print(f"wrote {ns.out / name} ({(ns.out / name).stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
