"""Storage: the cluster's S3 bucket, which `up` makes (or adopts) and `down` keeps unless told otherwise.

The bucket outlives the cluster on purpose: it holds the checkpoints a run took hours to make.
`up` leaves it private (every public-access block on), encrypted with SSE-S3, unversioned,
tagged `raydlc.io/cluster=<cluster>`, with a rule that aborts multipart uploads left incomplete
(a killed rank's half-uploaded shard bills until aborted). A bucket that exists is adopted only
when it is in this account, in the cluster's region and carries that tag; anything else is
refused before anything is made. `down` says it kept the bucket and how much it holds;
`down --delete-storage` empties it (every object version and incomplete upload) and deletes it.
The name and the run prefix come from `raydlc.render.bucket` (the config `for_cluster` resolved).

`up` also puts raydlc's own code zip under `code/` (raydlc.render.codezip), the `py_modules` entry of the
rendered RayJob, so that a `kubectl apply -f rayjob.yaml` works on its own. The zip's name carries its
hash, so a key that exists already holds those bytes: `upload_code` asks HeadObject first and uploads
only what is absent. The counts `status` and `down` report are the runs' (everything outside `code/`);
the zips are named apart (`plus N code zips`; `status --json` has their bytes), so a fresh bucket still reads "0 objects".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydlc.edges import aws
from raydlc.errors import InputError
from raydlc.lifecycle.resource import Resource, gone
from raydlc.lifecycle.types import Observation, StepFailed, StepPlan
from raydlc.render import codezip
from raydlc.render.bucket import CODE_PREFIX, Bucket, bucket_of
from raydlc.render.eksctl import OWNER_TAG

if TYPE_CHECKING:
    from raydlc.lifecycle.context import Context

ABORT_AFTER_DAYS = 7
LIFECYCLE_RULE = "raydlc-abort-incomplete-multipart"
PUBLIC_BLOCK = {"BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True}
SSE = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}


@dataclass(frozen=True)
class Contents:
    """What a bucket holds: the runs' object count and bytes (outside `code/`), the newest checkpoint of each
    run under the prefix, and apart from them raydlc's code zips (count and bytes)."""

    objects: int
    size: int
    newest: dict[str, str]
    code_objects: int = 0
    code_size: int = 0

    def describe(self) -> str:
        text = f"{self.objects} objects, {human(self.size)}"
        if self.code_objects:  # no name or size: both follow every source change, and the line is stable across them
            text += f", plus {self.code_objects} code zip{'s' if self.code_objects != 1 else ''}"
        return text


def human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _missing(e: aws.AwsCallError) -> bool:
    return e.code in ("404", "NoSuchBucket", "NotFound")


def _exists(s3: Any, name: str) -> bool:
    """True for a bucket this account can read; InputError for one another account holds."""
    try:
        aws.call(s3, "head_bucket", Bucket=name)
        return True
    except aws.AccessDeniedError as e:
        raise InputError(
            f"STORAGE_BUCKET: the S3 bucket {name} exists and belongs to another account (HeadBucket: {e.code})",
            hint="choose a name of your own: export RAYDLC_STORAGE_BUCKET=<a new bucket name>",
        ) from e
    except aws.AwsCallError as e:
        if _missing(e):
            return False
        raise


def _region(s3: Any, name: str) -> str:
    loc = aws.call(s3, "get_bucket_location", Bucket=name).get("LocationConstraint")
    return str(loc or "us-east-1")  # S3 answers null for us-east-1


def _tags(s3: Any, name: str) -> dict[str, str]:
    try:
        got = aws.call(s3, "get_bucket_tagging", Bucket=name)
    except aws.AwsCallError as e:
        if e.code == "NoSuchTagSet":
            return {}
        raise
    return {t["Key"]: t["Value"] for t in got.get("TagSet", [])}


def _optional(s3: Any, method: str, absent: str, **params: Any) -> dict[str, Any] | None:
    try:
        return aws.call(s3, method, **params)
    except aws.AwsCallError as e:
        if e.code == absent:
            return None
        raise


def drift(s3: Any, name: str) -> list[str]:
    """Which of up's settings the bucket lacks (empty: all kept)."""
    out: list[str] = []
    block = _optional(s3, "get_public_access_block", "NoSuchPublicAccessBlockConfiguration", Bucket=name)
    if (block or {}).get("PublicAccessBlockConfiguration") != PUBLIC_BLOCK:
        out.append("public access block")
    enc = _optional(s3, "get_bucket_encryption", "ServerSideEncryptionConfigurationNotFoundError", Bucket=name)
    algos = [r.get("ApplyServerSideEncryptionByDefault", {}).get("SSEAlgorithm")
             for r in ((enc or {}).get("ServerSideEncryptionConfiguration") or {}).get("Rules", [])]
    if algos != ["AES256"]:
        out.append("SSE-S3 encryption")
    rules = _optional(s3, "get_bucket_lifecycle_configuration", "NoSuchLifecycleConfiguration", Bucket=name)
    if not any(r.get("ID") == LIFECYCLE_RULE and r.get("Status") == "Enabled" for r in (rules or {}).get("Rules", [])):
        out.append("abort-incomplete-multipart rule")
    return out


def contents(s3: Any, bucket: Bucket) -> Contents:
    """Count and size of every object, the code zips apart; the newest checkpoint_<step> of each run under the run prefix."""
    objects = size = code_objects = code_size = 0
    steps: dict[str, tuple[int, str]] = {}
    head = f"{bucket.prefix}/" if bucket.prefix else ""
    for obj in aws.paginate(s3, "list_objects_v2", "Contents", Bucket=bucket.name):
        key = str(obj["Key"])
        if key.startswith(f"{CODE_PREFIX}/"):
            code_objects += 1
            code_size += int(obj.get("Size", 0))
            continue
        objects += 1
        size += int(obj.get("Size", 0))
        if not key.startswith(head):
            continue
        parts = key[len(head):].split("/")
        if len(parts) >= 3 and parts[1].startswith("checkpoint_") and parts[1][11:].isdigit():
            step = int(parts[1][11:])
            if step >= steps.get(parts[0], (-1, ""))[0]:
                steps[parts[0]] = (step, f"s3://{bucket.name}/{head}{parts[0]}/{parts[1]}")
    return Contents(objects, size, {run: uri for run, (_, uri) in sorted(steps.items())}, code_objects, code_size)


def has_object(s3: Any, bucket: str, key: str) -> bool:
    try:
        aws.call(s3, "head_object", Bucket=bucket, Key=key)
        return True
    except aws.AwsCallError as e:
        if e.code in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def put_code(s3: Any, bucket: str, code: codezip.CodeZip) -> bool:
    """`upload_code` for `render` and `submit --rayjob`, which make no bucket: one that is missing is an InputError."""
    if not _exists(s3, bucket):
        raise InputError(f"S3 bucket {bucket} does not exist yet, so raydlc's code zip has nowhere to go",
                         hint="raydlc up (its storage step makes the bucket and puts the zip there)")
    return upload_code(s3, bucket, code)


def upload_code(s3: Any, bucket: str, code: codezip.CodeZip) -> bool:
    """Put the code zip at its content-addressed key unless it is there already; True when it was uploaded.
    The key names the zip's hash, so an object found there holds the same bytes: nothing is overwritten."""
    if has_object(s3, bucket, code.key):
        return False
    aws.call(s3, "put_object", Bucket=bucket, Key=code.key, Body=code.data, ContentType="application/zip")
    return True


class Storage(Resource):
    name = "storage"
    scope = "aws"
    fact = "the storage at STORAGE_PATH"
    summary = "S3 bucket for checkpoints (private, SSE-S3, tagged)"
    removal = "keep the S3 bucket (--delete-storage removes it)"

    def found(self, ctx: Context) -> Observation:
        from raydlc.lifecycle import attach

        return attach.found_storage(ctx)

    def __init__(self, delete: bool = False) -> None:
        self.delete = delete

    def _bucket(self, ctx: Context) -> Bucket | None:
        return bucket_of(ctx.cfg)

    # ------------------------------------------------------------------ up

    def look(self, ctx: Context) -> Observation:
        bucket = self._bucket(ctx)
        if bucket is None:
            return Observation("ready", "STORAGE_PATH is not on S3: no bucket to make")
        s3, cfg = ctx.aws("s3"), ctx.cfg
        if not _exists(s3, bucket.name):
            return Observation("absent", f"S3 bucket {bucket.name} does not exist yet", {"bucket": bucket.name})
        region = _region(s3, bucket.name)
        if region != cfg.cluster.region:
            raise InputError(
                f"STORAGE_PATH/STORAGE_BUCKET: bucket {bucket.name} is in {region}, the cluster in {cfg.cluster.region} "
                "(cross-region checkpoint traffic is slow and billed)",
                hint=f"use a bucket in {cfg.cluster.region}: export RAYDLC_STORAGE_BUCKET=<a new bucket name>",
            )
        owner = _tags(s3, bucket.name).get(OWNER_TAG)
        if owner != cfg.cluster.name:
            raise InputError(
                f"STORAGE_BUCKET: bucket {bucket.name} is not tagged {OWNER_TAG}={cfg.cluster.name} "
                f"({'tagged for ' + owner if owner else 'no such tag'}): raydlc adopts only a bucket made for this cluster",
                hint=f"aws s3api put-bucket-tagging --bucket {bucket.name} --tagging "
                f"'TagSet=[{{Key={OWNER_TAG},Value={cfg.cluster.name}}}]' (replaces its tags), or choose another STORAGE_BUCKET",
            )
        lacks = drift(s3, bucket.name)
        code = codezip.build()
        if not has_object(s3, bucket.name, code.key):
            lacks.append(f"raydlc's code zip {code.key}")
        facts = {"bucket": bucket.name, "lacks": lacks}
        if lacks:
            return Observation("degraded", f"S3 bucket {bucket.name} lacks: {', '.join(lacks)}", facts)
        return Observation("ready", f"S3 bucket {bucket.name} private, encrypted", facts)

    def plan_up(self, ctx: Context, obs: Observation) -> StepPlan:
        if obs.state == "ready":
            return StepPlan("none", obs.reason)
        name = obs.facts["bucket"]
        put = f"s3:PutObject s3://{name}/{codezip.build().key}"
        calls = ("s3:PutPublicAccessBlock", "s3:PutBucketEncryption", "s3:PutBucketTagging",
                 "s3:PutBucketLifecycleConfiguration")
        if obs.state == "absent":
            return StepPlan("create", f"create S3 bucket {name}", (f"s3:CreateBucket {name}", *calls, put))
        settings = calls if self._settings_lacking(obs) else ()
        return StepPlan("repair", obs.reason, (*settings, put) if self._code_lacking(obs) else settings)

    @staticmethod
    def _code_lacking(obs: Observation) -> bool:
        return obs.state == "absent" or any(x.startswith("raydlc's code zip") for x in obs.facts.get("lacks", ()))

    @staticmethod
    def _settings_lacking(obs: Observation) -> bool:
        return obs.state == "absent" or any(not x.startswith("raydlc's code zip") for x in obs.facts.get("lacks", ()))

    def ensure(self, ctx: Context, obs: Observation) -> None:
        if self._settings_lacking(obs):
            self._settings(ctx, obs)
        if self._code_lacking(obs):
            upload_code(ctx.aws("s3"), obs.facts["bucket"], codezip.build())

    def _settings(self, ctx: Context, obs: Observation) -> None:
        s3, cfg = ctx.aws("s3"), ctx.cfg
        name = obs.facts["bucket"]
        if obs.state == "absent":
            params: dict[str, Any] = {"Bucket": name}
            if cfg.cluster.region != "us-east-1":
                params["CreateBucketConfiguration"] = {"LocationConstraint": cfg.cluster.region}
            aws.call(s3, "create_bucket", **params)
        aws.call(s3, "put_public_access_block", Bucket=name, PublicAccessBlockConfiguration=PUBLIC_BLOCK)
        aws.call(s3, "put_bucket_encryption", Bucket=name, ServerSideEncryptionConfiguration=SSE)
        if obs.state == "absent":
            aws.call(s3, "put_bucket_tagging", Bucket=name,
                     Tagging={"TagSet": [{"Key": OWNER_TAG, "Value": cfg.cluster.name},
                                         {"Key": "app.kubernetes.io/managed-by", "Value": "raydlc"}]})
        rule = {"ID": LIFECYCLE_RULE, "Status": "Enabled", "Filter": {"Prefix": ""},
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": ABORT_AFTER_DAYS}}
        aws.call(s3, "put_bucket_lifecycle_configuration", Bucket=name, LifecycleConfiguration={"Rules": [rule]})

    def kept(self, ctx: Context) -> str:
        obs = self.look(ctx)
        if obs.state != "ready":
            raise StepFailed(obs.reason, hint="raydlc up --only storage")
        bucket = self._bucket(ctx)
        if bucket is None:
            return obs.reason
        return f"{obs.reason}; runs go to {bucket.uri} ({contents(ctx.aws('s3'), bucket).describe()})"

    # ------------------------------------------------------------------ down

    def left(self, ctx: Context) -> Observation:
        bucket = self._bucket(ctx)
        if bucket is None or not _exists(ctx.aws("s3"), bucket.name):
            return gone(f"no S3 bucket{' ' + bucket.name if bucket else ''}")
        if _tags(ctx.aws("s3"), bucket.name).get(OWNER_TAG) != ctx.cfg.cluster.name:
            return gone(f"S3 bucket {bucket.name} is not this cluster's (no {OWNER_TAG} tag): left alone")
        held = contents(ctx.aws("s3"), bucket)
        return Observation("ready", f"S3 bucket {bucket.name} ({held.describe()})", {"bucket": bucket.name})

    def plan_down(self, ctx: Context, obs: Observation) -> StepPlan:
        if obs.state == "absent":
            return StepPlan("none", obs.reason)
        name = obs.facts["bucket"]
        if not self.delete:
            return StepPlan("none", f"kept {obs.reason} with its checkpoints; `raydlc down --delete-storage` removes it")
        return StepPlan("delete", f"empty and delete {obs.reason}",
                    (f"s3:DeleteObjects (every version) {name}", f"s3:AbortMultipartUpload {name}",
                     f"s3:DeleteBucket {name}"))

    def remove(self, ctx: Context, obs: Observation) -> None:
        s3 = ctx.aws("s3")
        name = obs.facts["bucket"]
        empty(s3, name)
        aws.call(s3, "delete_bucket", Bucket=name)
        ctx.note(self.name, f"removed S3 bucket {name}")

    def cleared(self, ctx: Context) -> str:
        bucket = self._bucket(ctx)
        if bucket is None:
            return "no S3 bucket"
        s3 = ctx.aws("s3")
        exists = _exists(s3, bucket.name)
        if exists and self.delete:
            raise StepFailed(f"S3 bucket {bucket.name} still exists", hint="raydlc down --delete-storage --yes")
        if exists and _tags(s3, bucket.name).get(OWNER_TAG) == ctx.cfg.cluster.name:
            text = f"S3 bucket {bucket.name} ({contents(s3, bucket).describe()})"
            ctx.note(self.name, f"kept {text}")
            return f"kept {text}; `raydlc down --delete-storage` removes it"
        return f"S3 bucket {bucket.name} {'removed' if self.delete else 'not this cluster’s'}"

    def status(self, ctx: Context) -> Observation:
        obs = super().status(ctx)
        bucket = self._bucket(ctx)
        if obs.state not in ("ready", "degraded") or bucket is None:
            return obs
        held = contents(ctx.aws("s3"), bucket)
        return Observation(obs.state, f"{obs.reason}; {held.describe()}", {**obs.facts, "contents": held})


def empty(s3: Any, name: str) -> None:
    """Delete every object version, delete marker and incomplete multipart upload (DeleteBucket needs it empty)."""
    for up in aws.paginate(s3, "list_multipart_uploads", "Uploads", Bucket=name):
        aws.call(s3, "abort_multipart_upload", Bucket=name, Key=up["Key"], UploadId=up["UploadId"])
    batch: list[dict[str, str]] = []
    for key in ("Versions", "DeleteMarkers"):
        for v in aws.paginate(s3, "list_object_versions", key, Bucket=name):
            batch.append({"Key": v["Key"], "VersionId": v["VersionId"]})
    for obj in aws.paginate(s3, "list_objects_v2", "Contents", Bucket=name):
        batch.append({"Key": obj["Key"]})
    for i in range(0, len(batch), 1000):  # DeleteObjects takes at most 1000 keys
        aws.call(s3, "delete_objects", Bucket=name, Delete={"Objects": batch[i:i + 1000], "Quiet": True})
