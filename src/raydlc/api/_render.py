"""`raydlc render` as a function: the manifests the config makes, as data, or written under a directory."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.api._config import PATH, argument, load

if TYPE_CHECKING:
    from raydlc.config import Config


LATER = "`raydlc up` or `raydlc submit --rayjob` uploads it"


@dataclass(frozen=True)
class CodeUpload:
    """raydlc's code zip the RayJob names (`py_modules`): whether it is in the bucket now, and why not."""

    uri: str
    uploaded: bool  # this call put it there
    present: bool
    why: str | None = None

    @property
    def line(self) -> str:
        if self.uploaded:
            return f"uploaded raydlc's code zip {self.uri}"
        if self.present:
            return f"raydlc's code zip {self.uri} is in the bucket already"
        return f"raydlc's code zip {self.uri} is not uploaded ({self.why}): {LATER}"

    def to_dict(self) -> dict[str, Any]:
        return {"uri": self.uri, "uploaded": self.uploaded, "present": self.present, "why": self.why}


@dataclass(frozen=True)
class Rendered:
    """filename -> document, and, when written, the directory and the files (in the order written).

    `code` is the RayJob's code zip and whether it is in the bucket; None when no RayJob naming one was rendered.
    """

    docs: Mapping[str, dict[str, Any]]
    out: Path | None = None
    files: tuple[Path, ...] = ()
    code: CodeUpload | None = None

    def to_dict(self) -> dict[str, Any]:
        code = {"code_zip": self.code.to_dict()} if self.code is not None else {}
        if self.out is not None:
            return {"out": str(self.out), "files": [str(p.relative_to(self.out)) for p in self.files], **code}
        return {"files": dict(self.docs), **code}

    def to_yaml(self) -> str:
        """Every document as one multi-document YAML stream, each headed by its filename (what `raydlc render` prints)."""
        from raydlc.render import to_yaml_stream

        return to_yaml_stream(dict(self.docs))


def render(
    *,
    out: str | os.PathLike[str] | None = None,
    only: str | None = None,
    zones: str | Sequence[str] | None = None,
    config: str | os.PathLike[str] | None = None,
    settings: Mapping[str, Any] | None = None,
    subject: str | None = None,
) -> Rendered:
    """Render the eksctl ClusterConfig, Helm values, RayCluster, RayJob and NetworkPolicy of a config.

    `only` picks one kind (eksctl, raycluster, rayjob, helm, netpol, rbac); `subject` is who `rbac`'s Role is bound
    to (`User:alice`, `Group:ml-team`, `ServiceAccount:ci`; docs/attach.md); `zones` are the
    Availability Zones that offer the GPU type, best first (a list, or "a,b" as the flag
    takes them). With `out`, every file is written under that directory, or none is.
    With neither STORAGE_PATH nor STORAGE_BUCKET set, the runs go to the cluster's bucket,
    `s3://raydlc-<account>-<region>-<cluster>/runs`: the account is read with sts:GetCallerIdentity.
    When the RayJob is rendered and the bucket exists, raydlc's code zip it names is uploaded (once: its
    name is its hash); without credentials or a bucket the render still succeeds, and `code` says why not.

    Example:
        import raydlc.api as api

        zones = ["us-west-2a", "us-west-2b"]
        settings = {"REGION": "us-west-2", "STORAGE_PATH": "s3://my-bucket/runs"}
        r = api.render(only="eksctl", zones=zones, settings=settings)
        (doc,) = r.docs.values()
        print(list(r.docs), doc["kind"], doc["metadata"]["region"])
        written = api.render(out="manifests", zones=zones, settings=settings)
        print(written.to_dict()["files"])
    """
    from raydlc.edges import aws
    from raydlc.edges.files import check_output_dir
    from raydlc.errors import CredentialsError
    from raydlc.render import render_all, write
    from raydlc.render.bucket import for_cluster, needs_account, no_credentials

    argument("out", out, PATH, "a folder path")
    argument("only", only, (str,), "one of eksctl, raycluster, rayjob, helm, netpol")
    argument("zones", zones, (str, list, tuple), "Availability Zones, as 'a,b' or a list")
    loaded = load(config, settings)
    if out is not None:
        check_output_dir(out, "--out")
    zone_list = None if not zones else [z.strip() for z in zones.split(",") if z.strip()] if isinstance(zones, str) else list(zones)
    needs_bucket = only in (None, "eksctl", "raycluster", "rayjob")  # the Helm values and NetworkPolicies name none
    if needs_bucket and needs_account(loaded):  # no credentials is the root cause of what follows: said first
        try:
            aws.session(loaded.cluster.region)
        except CredentialsError as e:
            raise no_credentials(e, loaded.cluster.region, "render names the cluster's bucket from the AWS account") from e
    if needs_bucket:
        # Every error of the config itself first, before AWS is asked for the account: render with a
        # stand-in account (that result is never shown), then with the real one.
        render_all(for_cluster(loaded, lambda: "000000000000"), zone_list, only=only)
    cfg = for_cluster(loaded, lambda: aws.account_id(loaded.cluster.region)) if needs_bucket else loaded
    docs = render_all(cfg, zone_list, only=only, subject=subject)
    files = tuple(write(docs, out)) if out is not None else ()
    code = _offer_code(cfg) if only in (None, "rayjob") else None
    return Rendered(docs, Path(out) if out is not None else None, files, code)


def _offer_code(cfg: Config) -> CodeUpload | None:
    """Upload the RayJob's code zip when this machine may and the bucket is there; never fails the render."""
    from raydlc.edges import aws
    from raydlc.errors import RaydlcError
    from raydlc.lifecycle.resources.bucket import put_code
    from raydlc.render import codezip
    from raydlc.render.bucket import bucket_of

    bucket = bucket_of(cfg)
    if bucket is None:
        return None
    code = codezip.build()
    uri = code.uri(bucket.name)
    try:
        with aws.command_budget("render"):
            uploaded = put_code(aws.client(aws.session(cfg.cluster.region), "s3"), bucket.name, code)
    except RaydlcError as e:
        return CodeUpload(uri, uploaded=False, present=False, why=e.message)
    return CodeUpload(uri, uploaded=uploaded, present=True)
