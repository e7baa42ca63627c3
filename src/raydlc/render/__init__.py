"""Everything the cluster needs, rendered from the one Config as data; YAML only at the edge.

`render_all` is pure: it returns {relative filename: document}, each checked against the schema
the package carries for its kind, and raises a RaydlcError naming the field path before anything
is written when the config cannot be rendered or a document would be rejected. `write` is the edge: it stages every
file under a temporary name first and renames them only when all are written, so a failure
never leaves half a manifest (or half a set) behind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from raydlc import schemas
from raydlc.config import Config
from raydlc.edges.files import write_all
from raydlc.errors import InputError

FILES = {
    "eksctl": "eksctl-cluster.yaml",
    "raycluster": "raycluster.yaml",
    "rayjob": "rayjob.yaml",
    "netpol": "networkpolicy.yaml",
    "rbac": "rbac.yaml",
}
KINDS = ("eksctl", "raycluster", "rayjob", "helm", "netpol", "rbac")


def render_all(
    cfg: Config, zones: Sequence[str] | None = None, *, only: str | None = None, prices: Mapping[str, float] | None = None,
    target: Any = None, subject: str | None = None,
) -> dict[str, dict[str, Any]]:
    """filename -> document for every manifest (or only one kind); `zones`: AZs offering the GPU type, best first;
    `prices`: USD per instance-hour the RayJob's budget deadline is priced at (the list prices by default);
    `target`: attached, the worker group as the found capacity can run it (raydlc.discovery.target.WorkerTarget);
    `subject`: who the RBAC documents grant (`User:alice`, `Group:ml-team`; default `Group:raydlc-<NAMESPACE>`), rendered
    with `only="rbac"` or, attached, with every kind."""
    from raydlc.render.eksctl import render_eksctl
    from raydlc.render.helm import render_helm
    from raydlc.render.netpol import render_netpol
    from raydlc.render.raycluster import render_raycluster, render_rayjob

    if only is not None and only not in KINDS:
        raise InputError(f"--only {only!r}: unknown kind", hint=f"choose one of {', '.join(KINDS)}")
    out: dict[str, dict[str, Any]] = {}
    if only in (None, "eksctl"):
        out[FILES["eksctl"]] = render_eksctl(cfg, zones)
    if only in (None, "helm"):
        out.update(render_helm(cfg))
    if only in (None, "raycluster"):
        out[FILES["raycluster"]] = render_raycluster(cfg, target)
    if only in (None, "rayjob"):
        out[FILES["rayjob"]] = render_rayjob(cfg, code_uri(cfg), prices)
    if only in (None, "netpol"):
        out[FILES["netpol"]] = render_netpol(cfg)
    if only == "rbac" or (only is None and cfg.cluster.attach):
        out[FILES["rbac"]] = render_rbac_list(cfg, subject)
    for name, doc in out.items():
        schemas.check(name, doc)
    return out


def render_rbac_list(cfg: Config, subject: str | None = None) -> dict[str, Any]:
    """What a platform team applies so `subject` may run raydlc attached in NAMESPACE: the Role and RoleBinding of every
    permission `up --attach` checks, and a read-only ClusterRole for discovery (raydlc.discovery.access), as a v1 List."""
    from raydlc.discovery.access import render_rbac

    ns = cfg.cluster.namespace
    items = render_rbac(ns, subject or f"Group:raydlc-{ns}", service_account_given=bool(cfg.cluster.service_account))
    return {"apiVersion": "v1", "kind": "List", "items": items}


def code_uri(cfg: Config) -> str | None:
    """Where raydlc's zip for the RayJob's `py_modules` lives: the cluster's bucket (`code/`); None without one."""
    from raydlc.render import codezip
    from raydlc.render.bucket import bucket_of

    bucket = bucket_of(cfg)
    return None if bucket is None else codezip.build().uri(bucket.name)


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings (runtimeEnvYAML) as literal blocks, never anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def to_yaml_stream(docs: dict[str, dict[str, Any]]) -> str:
    """All documents as one multi-document stream, each headed by its filename."""
    return "".join(f"---\n# {name}\n{to_yaml(doc)}" for name, doc in docs.items())


def write(docs: dict[str, dict[str, Any]], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write each document under out_dir, every file or none (`raydlc.edges.files.write_all`); returns the paths."""
    root = Path(out_dir)
    return write_all({root / name: to_yaml(doc) for name, doc in docs.items()}, "--out")
