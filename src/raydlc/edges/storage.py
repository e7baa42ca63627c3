"""The run's storage as files: list, size, read, download and publish, on a local path or a URI alike.

Every call goes through pyarrow's file systems (which Ray Train itself uses), so s3:// and gs://
work where local paths do; which paths are URIs, and how they join, is `raydlc.storage`.

S3 is reached with bounded waits (`CONNECT_TIMEOUT_S`, `REQUEST_TIMEOUT_S`, `S3_ATTEMPTS`), and its
failures — which pyarrow raises as a bare OSError whose text holds the AWS error — become one line
naming the s3:// URI and the cause (`s3_error`): access denied (with the action S3 checked), no
credentials, no such bucket, an endpoint that cannot be reached.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from raydlc.errors import AwsError, CredentialsError, InputError, RaydlcError
from raydlc.storage import is_uri, resolved, scheme

CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 15.0  # idle time on a request, not its total: a large part upload keeps sending
S3_ATTEMPTS = 3
F = TypeVar("F", bound=Callable[..., Any])


def filesystem(path: str) -> tuple[Any, str]:
    """(pyarrow file system, path on it) for a local path or a URI; S3 with bounded connect and request waits."""
    import pyarrow.fs

    from raydlc.storage import uri_problem

    if why := uri_problem(path):  # before pyarrow: its GCS lookup hangs for minutes, others fail with ArrowInvalid
        raise InputError(f"{path}: {why}")
    if scheme(path) == "s3":
        return _s3(path)
    if is_uri(path):
        return pyarrow.fs.FileSystem.from_uri(path)
    return pyarrow.fs.LocalFileSystem(), str(resolved(Path(path).expanduser()))


def _s3(uri: str) -> tuple[Any, str]:
    """As `FileSystem.from_uri` builds it (AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL; the bucket's region when
    neither that nor AWS_REGION/AWS_DEFAULT_REGION says), plus timeouts and a bounded retry count."""
    import pyarrow.fs

    rest = uri.split("://", 1)[1]
    bucket = rest.split("/", 1)[0]
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        region = "us-east-1" if endpoint else pyarrow.fs.resolve_s3_region(bucket)
    fs = pyarrow.fs.S3FileSystem(
        region=region, endpoint_override=endpoint, connect_timeout=CONNECT_TIMEOUT_S, request_timeout=REQUEST_TIMEOUT_S,
        retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS),
    )
    return fs, rest.rstrip("/")


# ---------------------------------------------------------------------- S3's errors, named

_WHERE = (
    re.compile(r"for key '(?P<key>[^']*)' in bucket '(?P<bucket>[^']*)'"),
    re.compile(r"[Kk]ey '(?P<key>[^']*)' in bucket '(?P<bucket>[^']*)'"),
    re.compile(r"bucket '(?P<bucket>[^']*)'"),
    re.compile(r"Bucket '(?P<bucket>[^']*)'"),
)
_AWS = re.compile(r"AWS Error (?P<code>[A-Z_]+) during (?P<op>\w+) operation:?\s*(?P<detail>.*)", re.S)
# The IAM action S3 checks for each call pyarrow makes (S3 User Guide, "Required permissions for Amazon S3 API operations").
ACTIONS = {
    "HeadBucket": "s3:ListBucket", "ListObjectsV2": "s3:ListBucket", "ListObjects": "s3:ListBucket",
    "HeadObject": "s3:GetObject", "GetObject": "s3:GetObject", "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject", "UploadPart": "s3:PutObject", "CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload", "DeleteObject": "s3:DeleteObject", "DeleteObjects": "s3:DeleteObject",
    "CopyObject": "s3:GetObject on the source and s3:PutObject", "CreateBucket": "s3:CreateBucket",
}


def looks_like_s3(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, OSError) and ("AWS Error" in text or ("Bucket '" in text and "not found" in text))


def _uri_of(text: str, uri: str | None) -> str:
    for pattern in _WHERE:
        m = pattern.search(text)
        if m:
            key = m.groupdict().get("key")
            return f"s3://{m.group('bucket')}/{key}" if key else f"s3://{m.group('bucket')}"
    return uri or "s3://(unknown)"


def _has_credentials() -> bool | None:
    """Whether the AWS SDKs' chain finds credentials here; None when that cannot be told."""
    try:
        import botocore.session

        return botocore.session.get_session().get_credentials() is not None
    except Exception:
        return None


def s3_error(e: BaseException, uri: str | None = None) -> RaydlcError | None:
    """One line for a pyarrow S3 failure naming the s3:// URI and the cause; None when `e` is not one."""
    if not looks_like_s3(e):
        return None
    text = str(e)
    where = _uri_of(text, uri)
    if "not found" in text and "Bucket '" in text:
        return InputError(f"{where}: no such bucket", hint="check the bucket name (raydlc up creates the cluster's bucket)")
    m = _AWS.search(text)
    code, op, detail = (m.group("code"), m.group("op"), m.group("detail").strip()) if m else ("UNKNOWN", "?", text)
    if code == "NO_SUCH_BUCKET":
        return InputError(f"{where.split('/', 3)[0]}//{where.split('/', 3)[2]}: no such bucket",
                          hint="check the bucket name (raydlc up creates the cluster's bucket)")
    if code == "NETWORK_CONNECTION":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the S3 endpoint"
        return AwsError(f"{where}: cannot reach {endpoint} ({detail.split(';')[0].strip()[:160]}) during {op}",
                        hint="check the network and AWS_ENDPOINT_URL / the region, then retry")
    if code in ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH") or "HTTP status 403" in text:
        return _denied(where, code, op)
    return AwsError(f"{where}: S3 refused {op} ({code}: {detail[:200]})")


def _denied(where: str, code: str, op: str) -> RaydlcError:
    if _has_credentials() is False:
        return CredentialsError(f"no AWS credentials: S3 refused the anonymous {op} of {where}",
                                hint="set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run where a role is attached")
    if code != "ACCESS_DENIED":
        return CredentialsError(f"S3 did not accept the credentials for {where} ({code} during {op})",
                                hint="check the access key and secret (aws sts get-caller-identity)")
    action = ACTIONS.get(op, f"the permission {op} needs")
    return CredentialsError(f"access denied to {where}: the identity in use lacks {action} there (S3 answered 403 to {op})",
                            hint=f"grant {action} on {where} to this identity, or use a path it may write")


def named(fn: F) -> F:
    """Turn a pyarrow S3 failure inside `fn(path, …)` into `s3_error`'s line; other errors pass unchanged."""

    @functools.wraps(fn)
    def wrapper(path: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(path, *args, **kw)
        except OSError as e:
            mapped = s3_error(e, path if isinstance(path, str) else None)
            if mapped is None:
                raise
            raise mapped from e

    return wrapper  # type: ignore[return-value]


@named
def list_dirs(path: str) -> list[str]:
    """Names of the directories directly under `path`; none when it does not exist."""
    import pyarrow.fs

    fs, root = filesystem(path)
    if fs.get_file_info(root).type != pyarrow.fs.FileType.Directory:
        return []
    infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=False))
    return sorted(i.base_name for i in infos if i.type == pyarrow.fs.FileType.Directory)


@named
def file_sizes(path: str) -> dict[str, int]:
    """name -> size of the files directly under `path`."""
    import pyarrow.fs

    fs, root = filesystem(path)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=False, allow_not_found=True))
    return {i.base_name: int(i.size) for i in infos if i.type == pyarrow.fs.FileType.File}


@named
def read_bytes(path: str) -> bytes:
    fs, p = filesystem(path)
    with fs.open_input_stream(p) as f:
        return bytes(f.read())


def read_text(path: str) -> str:
    return read_bytes(path).decode()


@named
def write_text(path: str, text: str) -> None:
    """A small file at `path` (a URI), its folder made first."""
    fs, p = filesystem(path)
    fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(p) as f:
        f.write(text.encode())


@named
def download(path: str, local: Path) -> Path:
    """Copy the directory at `path` (a URI) into the local folder `local`."""
    import pyarrow.fs

    fs, p = filesystem(path)
    local.mkdir(parents=True, exist_ok=True)
    pyarrow.fs.copy_files(p, str(local), source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
    return local


def publish(local: Path, dest: str) -> None:
    """Copy a finished local folder to `dest` (a path, or a URI such as s3://)."""
    if is_uri(dest):
        _publish(dest, local)
    else:
        Path(dest).mkdir(parents=True, exist_ok=True)
        try:
            shutil.copytree(local, dest, dirs_exist_ok=True)
        except shutil.Error as e:  # a list of (source, destination, why): the first, in one line
            _src, dst, why = e.args[0][0] if e.args and e.args[0] and len(e.args[0][0]) == 3 else ("", dest, str(e))
            raise InputError(f"cannot publish the run into {dst}: {why}",
                             hint=f"the run's products are kept in {local}; move what is in the way and copy them") from e


@named
def _publish(dest: str, local: Path) -> None:
    import pyarrow.fs

    fs, path = filesystem(dest)
    fs.create_dir(path, recursive=True)
    pyarrow.fs.copy_files(str(local), path, destination_filesystem=fs)
