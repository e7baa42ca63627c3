"""The cluster's S3 bucket and the identity its Ray pods write with: names and documents, as data.

Every GPU node uploads its own checkpoint shards, so a multi-node run needs storage all of them
see; the rendered pods mount no shared file system, so on a cluster that is S3. `up` owns one
bucket per cluster (`raydlc.lifecycle.resources.storage`), and when STORAGE_PATH is not set the
cluster's runs go to `s3://<bucket>/runs`. A local run keeps `./raydlc-out`: only the cluster
commands (render, up, down, status) call `for_cluster`.

Naming, kept stable because other parts (cost guards, dashboards) key on it:
- bucket: STORAGE_BUCKET, else the bucket of an s3:// STORAGE_PATH, else
  `raydlc-<account>-<region>-<cluster>` (S3 names are global: the account keeps it ours).
- service account: `SERVICE_ACCOUNT` (`raydlc-ray`) in NAMESPACE; the head and every worker run as it.
- IAM role: `role_name(cfg)` = `raydlc-<cluster>-<region>-ray` (64 characters at most), made by
  eksctl for the pod identity association (its stack `eksctl-<cluster>-podidentityrole-<ns>-raydlc-ray`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raydlc.config import Config
from raydlc.errors import CredentialsError, InputError
from raydlc.storage import scheme

RUN_PREFIX = "runs"
CODE_PREFIX = "code"
SERVICE_ACCOUNT = "raydlc-ray"
POLICY_NAME = "raydlc-run-storage"
_BUCKET_MAX = 63
_ROLE_MAX = 64


@dataclass(frozen=True)
class Bucket:
    """The bucket and the run prefix (no leading or trailing slash) the pods may write under."""

    name: str
    prefix: str

    @property
    def uri(self) -> str:
        return f"s3://{self.name}/{self.prefix}" if self.prefix else f"s3://{self.name}"

    @property
    def arn(self) -> str:
        return f"arn:aws:s3:::{self.name}"


def _capped(name: str, limit: int) -> str:
    """`name`, or when longer than `limit` its head and an 8-character hash of the whole (still unique)."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-.')}-{digest}"


def default_bucket_name(cluster: str, region: str, account: str) -> str:
    return _capped(f"raydlc-{account}-{region}-{cluster}".lower(), _BUCKET_MAX)


def role_name(cfg: Config) -> str:
    """The IAM role the Ray pods assume (IAM names are account-wide: the region keeps two clusters apart)."""
    return _capped(f"raydlc-{cfg.cluster.name}-{cfg.cluster.region}-ray", _ROLE_MAX)


def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key prefix without slashes) of `s3://bucket/a/b/`."""
    rest = uri.split("://", 1)[1]
    name, _, key = rest.partition("/")
    return name, key.strip("/")


def bucket_of(cfg: Config) -> Bucket | None:
    """The cluster's bucket as the (resolved) config names it; None when the runs are not on S3."""
    path = cfg.train.storage_path
    if path is not None and scheme(path) == "s3":
        name, prefix = split_s3(path)
        return Bucket(name, prefix)
    if path is None and cfg.cluster.storage_bucket:
        return Bucket(cfg.cluster.storage_bucket, RUN_PREFIX)
    return None


def for_cluster(cfg: Config, account: Callable[[], str] | None) -> Config:
    """The config with the cluster's bucket filled in: STORAGE_BUCKET and, when unset, STORAGE_PATH.

    `account` (the caller's AWS account id, read through raydlc.aws) is asked only when neither
    STORAGE_BUCKET nor an s3:// STORAGE_PATH names the bucket; its failure becomes one InputError.
    """
    path, chosen = cfg.train.storage_path, cfg.cluster.storage_bucket
    if path is not None and scheme(path) == "s3":
        name, _ = split_s3(path)
        if chosen and chosen != name:
            raise InputError(
                f"STORAGE_PATH ({cfg.origin('STORAGE_PATH')}) is in bucket {name}, STORAGE_BUCKET "
                f"({cfg.origin('STORAGE_BUCKET')}) names {chosen}",
                hint=f"unset one of them, e.g. export RAYDLC_STORAGE_BUCKET={name}",
            )
        return _with(cfg, name, path)
    if path is not None:
        return cfg  # a shared file system or a local path: no bucket (render's rules decide if it may serve)
    if chosen is None:
        chosen = default_bucket_name(cfg.cluster.name, cfg.cluster.region, _account(account))
    return _with(cfg, chosen, f"s3://{chosen}/{RUN_PREFIX}")


def _account(account: Callable[[], str] | None) -> str:
    why = "no AWS access was offered"
    if account is not None:
        try:
            return account()
        except CredentialsError as e:  # the user's setup; an unreachable STS is the world's fault and stays so
            why = e.message
    raise InputError(
        f"STORAGE_BUCKET: the cluster's bucket is named from the AWS account, which could not be read ({why})",
        hint="export RAYDLC_STORAGE_BUCKET=<a bucket name> (or RAYDLC_STORAGE_PATH=s3://<bucket>/runs), "
        "or run with AWS credentials",
    )


def _with(cfg: Config, bucket: str, path: str) -> Config:
    if (cfg.cluster.storage_bucket, cfg.train.storage_path) == (bucket, path):
        return cfg
    new = cfg.model_copy(update={
        "cluster": cfg.cluster.model_copy(update={"storage_bucket": bucket}),
        "train": cfg.train.model_copy(update={"storage_path": path}),
    })
    new._sources = dict(cfg._sources)
    new._origins = dict(cfg._origins)
    for key, origin in (("STORAGE_BUCKET", "the cluster's bucket"), ("STORAGE_PATH", "the cluster's bucket")):
        if cfg.value(key) is None:
            new._origins[key] = f"default ({origin})"
    return new


# ---------------------------------------------------------------------- the pods' identity


def pod_policy(bucket: Bucket) -> dict[str, Any]:
    """What the Ray pods may do, and nothing more: list the run prefix; read, write and delete under it;
    abort their own multipart uploads (large shards are uploaded in parts); and read, only read, the code zips
    a RayJob's `py_modules` names (`CODE_PREFIX`, raydlc.codezip), which Ray downloads on each node."""
    under = f"{bucket.arn}/{bucket.prefix}/*" if bucket.prefix else f"{bucket.arn}/*"
    prefixes = [f"{bucket.prefix}/", f"{bucket.prefix}/*"] if bucket.prefix else ["*"]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ListRunPrefix", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [bucket.arn],
             "Condition": {"StringLike": {"s3:prefix": prefixes}}},
            {"Sid": "ReadWriteRuns", "Effect": "Allow",
             "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
             "Resource": [under]},
            {"Sid": "ReadCode", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"{bucket.arn}/{CODE_PREFIX}/*"]},
        ],
    }


def pod_identity(cfg: Config) -> dict[str, Any] | None:
    """The eksctl `iam.podIdentityAssociations` entry for the Ray pods' service account; None without a bucket."""
    bucket = bucket_of(cfg)
    if bucket is None:
        return None
    return {
        "namespace": cfg.cluster.namespace,
        "serviceAccountName": SERVICE_ACCOUNT,
        "createServiceAccount": True,
        "roleName": role_name(cfg),
        "permissionPolicyName": POLICY_NAME,
        "permissionPolicy": pod_policy(bucket),
        "tags": {"raydlc.io/cluster": cfg.cluster.name},
    }
