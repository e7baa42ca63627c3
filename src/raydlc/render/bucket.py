"""The cluster's S3 bucket and the identity its Ray pods write with: names and documents, as data.

Every GPU node uploads its own checkpoint shards, so a multi-node run needs storage all of them
see; the rendered pods mount no shared file system, so on a cluster that is S3. `up` owns one
bucket per cluster (`raydlc.lifecycle.resources.bucket`), and when STORAGE_PATH is not set the
cluster's runs go to `s3://<bucket>/runs`. A local run keeps `./raydlc-out`: only the cluster
commands (render, up, down, status) call `for_cluster`.

Naming, kept stable because other parts (cost guards, dashboards) key on it:
- bucket: STORAGE_BUCKET, else the bucket of an s3:// STORAGE_PATH, else
  `raydlc-<account>-<region>-<cluster>` (S3 names are global: the account keeps it ours).
- service accounts in NAMESPACE: `SERVICE_ACCOUNT` (`raydlc-ray`) for the head, which KubeRay also binds to its
  autoscaler Role (v1.7.0 `common/rbac.go` subjects `GetHeadGroupServiceAccountName`: the head pod's
  `serviceAccountName`); `WORKER_SERVICE_ACCOUNT` (`raydlc-ray-worker`) for the GPU workers, bound to nothing:
  users' training code runs there and may write its runs, not patch pods or the RayCluster.
- IAM roles, one per service account, both with `pod_policy`: `role_name(cfg)` = `raydlc-<cluster>-<region>-ray`
  and `worker_role_name(cfg)` = `...-ray-worker` (64 characters at most), made by eksctl for the pod identity
  associations (stacks `eksctl-<cluster>-podidentityrole-<ns>-<service account>`).
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
WORKER_SERVICE_ACCOUNT = "raydlc-ray-worker"
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


def worker_role_name(cfg: Config) -> str:
    """The IAM role the GPU workers assume: the same storage rights as the head's, its own name."""
    return _capped(f"raydlc-{cfg.cluster.name}-{cfg.cluster.region}-ray-worker", _ROLE_MAX)


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

    `account` (the caller's AWS account id, read through raydlc.edges.aws) is asked only when neither
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
    if cfg.cluster.attach and chosen is None:
        return cfg  # attached: storage is the user's (STORAGE_PATH); raydlc has no bucket of its own to offer
    if chosen is None:
        chosen = default_bucket_name(cfg.cluster.name, cfg.cluster.region, _account(account, cfg.cluster.region))
    return _with(cfg, chosen, f"s3://{chosen}/{RUN_PREFIX}")


def needs_account(cfg: Config) -> bool:
    """Whether the bucket's name must come from the AWS account (neither STORAGE_BUCKET nor STORAGE_PATH names it)."""
    return cfg.train.storage_path is None and cfg.cluster.storage_bucket is None


def without_credentials(region: str) -> str:
    """The hint of a missing-credentials error: what still works without them, then how to add them."""
    return (f"without credentials these still work: raydlc --set STORAGE_BUCKET=<name> render --zones {region}a,{region}b; "
            "raydlc plan; raydlc train (on this machine). To add them: aws configure, aws sso login, or AWS_PROFILE")


def no_credentials(e: CredentialsError, region: str, needs: str) -> CredentialsError:
    """The root cause first: one line naming the missing credentials and what needed them."""
    return CredentialsError(f"{e.message}: {needs}", hint=without_credentials(region))


def _account(account: Callable[[], str] | None, region: str) -> str:
    why = "no AWS access was offered"
    if account is not None:
        try:
            return account()
        except CredentialsError as e:  # the user's setup; an unreachable STS is the world's fault and stays so
            raise no_credentials(e, region, "the cluster's bucket (STORAGE_BUCKET) is named from the AWS account") from e
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
    """What the Ray pods may do, and nothing more, as S3 authorises the calls Ray Train 2.58, pyarrow and raydlc make.

    - `ListRunPrefix`: `s3:ListBucket` on the bucket when the request's `s3:prefix` is the run prefix or under
      it, or when the request has no `s3:prefix` at all (`…IfExists`). HeadBucket is authorised as
      `s3:ListBucket` with no `s3:prefix` in its context, and pyarrow's `create_dir(recursive=True)` (which Ray
      Train's `StorageContext` calls, and raydlc's publish and data preparation) starts with HeadBucket and
      fails on anything but 404. The same permission makes S3 answer a missing key with 404, not 403 — every
      "does it exist yet" check (a checkpoint, a dataset's manifest) reads that. S3 cannot tell a HeadBucket
      from a listing sent without a prefix, so such a listing (key names only) is allowed too; a listing with
      any other prefix is refused.
    - `ReadWriteRuns`: read, write, delete and abort multipart uploads of keys under the prefix (pyarrow's
      directory markers `runs/`, `runs/<run>/` included), and read — HeadObject — the key `runs` itself, which
      `get_file_info("bucket/runs")` (listing the runs, `--resume`) asks before it lists `runs/`.
    - `ReadCode`: read, only read, the code zips a RayJob's `py_modules` names (`CODE_PREFIX`,
      raydlc.render.codezip), which Ray downloads on each node.
    """
    under = f"{bucket.arn}/{bucket.prefix}/*" if bucket.prefix else f"{bucket.arn}/*"
    prefixes = [f"{bucket.prefix}/", f"{bucket.prefix}/*"] if bucket.prefix else ["*"]
    statements: list[dict[str, Any]] = [
        {"Sid": "ListRunPrefix", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [bucket.arn],
         "Condition": {"StringLikeIfExists": {"s3:prefix": prefixes}}},
        {"Sid": "ReadWriteRuns", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
         "Resource": [under]},
        {"Sid": "ReadCode", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"{bucket.arn}/{CODE_PREFIX}/*"]},
    ]
    if bucket.prefix:
        statements.insert(2, {"Sid": "HeadRunPrefix", "Effect": "Allow", "Action": ["s3:GetObject"],
                              "Resource": [f"{bucket.arn}/{bucket.prefix}"]})
    return {"Version": "2012-10-17", "Statement": statements}


def pod_identities(cfg: Config) -> list[dict[str, Any]]:
    """The eksctl `iam.podIdentityAssociations` entries for the head's and the workers' service accounts (eksctl
    creates both accounts); none without a bucket."""
    bucket = bucket_of(cfg)
    if bucket is None:
        return []
    return [
        {
            "namespace": cfg.cluster.namespace,
            "serviceAccountName": account,
            "createServiceAccount": True,
            "roleName": role,
            "permissionPolicyName": POLICY_NAME,
            "permissionPolicy": pod_policy(bucket),
            "tags": {"raydlc.io/cluster": cfg.cluster.name},
        }
        for account, role in ((SERVICE_ACCOUNT, role_name(cfg)), (WORKER_SERVICE_ACCOUNT, worker_role_name(cfg)))
    ]
