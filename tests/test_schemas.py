"""The packaged schemas: derived by the repo's script, structural facts only, strict for CRDs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raydlc import schemas
from raydlc.errors import InputError

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "derive_schemas.py"

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "spec": {
        "versions": [
            {"name": "v1alpha1", "schema": {"openAPIV3Schema": {"type": "object"}}},
            {
                "name": "v1",
                "schema": {
                    "openAPIV3Schema": {
                        "description": "Prose that must not be carried.",
                        "type": "object",
                        "properties": {
                            "spec": {
                                "description": "More prose.",
                                "type": "object",
                                "required": ["size"],
                                "x-kubernetes-validations": [{"rule": "self.size > 0", "message": "positive"}],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1, "default": 3},
                                    "mode": {"type": "string", "enum": ["a", "b"]},
                                    "description": {"type": "string", "pattern": "^x"},
                                },
                            }
                        },
                    }
                },
            },
        ]
    },
}


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    src = tmp_path / "schemas"
    for name in ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"):
        (src / "kuberay-v1.7.0").mkdir(parents=True, exist_ok=True)
        (src / "kuberay-v1.7.0" / name).write_text(yaml.safe_dump(CRD))
    (src / "eksctl-v0.230.0").mkdir()
    (src / "eksctl-v0.230.0" / "schema.json").write_text(
        json.dumps({"$ref": "#/definitions/C", "definitions": {"C": {"description": "x", "x-intellij-html-description": "y", "type": "object"}}})
    )
    return src


def test_derive_keeps_structure_and_drops_prose(upstream: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(SCRIPT), str(upstream), "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "kuberay-v1.7.0-raycluster.json").read_text())
    spec = doc["properties"]["spec"]
    assert "description" not in doc and "description" not in spec and "x-kubernetes-validations" not in spec
    assert spec["required"] == ["size"]
    assert spec["properties"]["size"] == {"type": "integer", "minimum": 1}  # default dropped, bound kept
    assert spec["properties"]["mode"]["enum"] == ["a", "b"]
    assert spec["properties"]["description"] == {"type": "string", "pattern": "^x"}  # a field named so stays
    eks = json.loads((out / "eksctl-v0.230.0-clusterconfig.json").read_text())
    assert eks["definitions"]["C"] == {"type": "object"}


def test_packaged_schemas_carry_no_prose() -> None:
    def keys(node, named=False):
        if isinstance(node, dict):
            for k, v in node.items():
                if not named:
                    yield k
                yield from keys(v, named=k in ("properties", "definitions", "patternProperties") and not named)
        elif isinstance(node, list):
            for v in node:
                yield from keys(v)

    for kind in schemas.FILES:
        found = set(keys(schemas.schema(kind)))
        assert not found & {"description", "x-intellij-html-description", "x-kubernetes-validations", "default"}, kind
        assert {"type", "properties"} <= found


def test_crd_schemas_are_strict_and_name_the_field_path() -> None:
    doc = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "x"}, "spec": {"headGroupSpec": {"rayStartParamz": {}}}}
    found = schemas.problems(doc)
    assert any(p.startswith("spec.headGroupSpec:") and "rayStartParamz" in p for p in found), found
    with pytest.raises(InputError) as e:
        schemas.check("raycluster.yaml", doc)
    assert "raycluster.yaml" in e.value.message and "spec.headGroupSpec" in e.value.message


def test_eksctl_schema_rejects_a_wrong_type_by_path() -> None:
    doc = {"apiVersion": "eksctl.io/v1alpha5", "kind": "ClusterConfig", "metadata": {"name": "c", "region": "us-east-2"},
           "managedNodeGroups": [{"name": "g", "desiredCapacity": "two"}]}
    assert any(p.startswith("managedNodeGroups.0.desiredCapacity:") for p in schemas.problems(doc))


def test_a_kind_without_a_schema_is_not_checked() -> None:
    assert schemas.problems({"apiVersion": "v1", "kind": "List", "items": []}) == []
