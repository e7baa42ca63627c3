"""S3 failures name the s3:// URI and the real cause — access denied (with the action), no credentials, no such
bucket, an endpoint that cannot be reached (within a bounded wait) — and never a full disk's hint. Through the
S3 IAM front (tests/doubles/s3_iam.py) before a real moto, a closed port, and an environment without credentials."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "doubles"))
from s3_iam import s3_front  # type: ignore[import-not-found]
from servers import moto_server  # type: ignore[import-not-found]

from raydlc.cli import main
from raydlc.edges import storage as store
from raydlc.edges.files import os_error
from raydlc.errors import AwsError, CredentialsError, InputError

POLICY = {"Statement": [
    {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::bkt", "Condition": {"StringLikeIfExists": {"s3:prefix": "runs/*"}}},
    {"Effect": "Allow", "Action": "s3:*Object", "Resource": "arn:aws:s3:::bkt/runs/*"},
]}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, Any]]:
    import boto3

    with moto_server() as url, s3_front(url, POLICY) as front:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="k",
                     aws_secret_access_key="s").create_bucket(Bucket="bkt")
        yield url, front


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_WEB_IDENTITY_TOKEN_FILE",
              "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(k, raising=False)
    for k, v in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
                 "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
                 "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
        monkeypatch.setenv(k, v)
    return monkeypatch


def _no_disk_hint(e: BaseException) -> None:
    assert "free space" not in str(e) and "(unnamed file)" not in str(e)


def test_access_denied_names_the_uri_and_the_action(servers: tuple[str, Any], aws: pytest.MonkeyPatch, tmp_path: Path) -> None:
    aws.setenv("AWS_ENDPOINT_URL", servers[1].url)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "a.txt").write_text("a")
    with pytest.raises(CredentialsError) as e:
        store.publish(tmp_path / "x", "s3://bkt/other/x")
    assert "access denied to s3://bkt" in str(e.value) and "s3:PutObject" in str(e.value)
    with pytest.raises(CredentialsError) as e:
        store.list_dirs("s3://bkt/elsewhere")
    assert "access denied to s3://bkt/elsewhere" in str(e.value) and "s3:GetObject" in str(e.value)
    _no_disk_hint(e.value)


def test_no_credentials_is_named(servers: tuple[str, Any], aws: pytest.MonkeyPatch) -> None:
    aws.setenv("AWS_ENDPOINT_URL", servers[1].url)
    aws.delenv("AWS_ACCESS_KEY_ID")
    aws.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(CredentialsError) as e:
        store.read_text("s3://bkt/runs/r1/manifest.json")
    assert str(e.value).startswith("no AWS credentials") and "s3://bkt/runs/r1/manifest.json" in str(e.value)
    _no_disk_hint(e.value)


def test_no_such_bucket_is_named(servers: tuple[str, Any], aws: pytest.MonkeyPatch, tmp_path: Path) -> None:
    aws.setenv("AWS_ENDPOINT_URL", servers[0])
    (tmp_path / "x").mkdir()
    with pytest.raises(InputError) as e:
        store.publish(tmp_path / "x", "s3://no-such-bkt/runs/x")
    assert "s3://no-such-bkt: no such bucket" in str(e.value)


def test_an_unreachable_endpoint_is_named_within_a_bounded_wait(aws: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    aws.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(AwsError) as e:
        store.list_dirs("s3://bkt/runs")
    assert time.monotonic() - t0 < store.CONNECT_TIMEOUT_S * store.S3_ATTEMPTS + 5
    assert "s3://bkt/runs" in str(e.value) and f"cannot reach http://127.0.0.1:{port}" in str(e.value)
    _no_disk_hint(e.value)


def test_an_s3_oserror_escaping_to_the_cli_boundary_is_named_not_a_full_disk(aws: pytest.MonkeyPatch) -> None:
    raw = OSError("When initiating multiple part upload for key 'other/a' in bucket 'bkt': AWS Error ACCESS_DENIED during "
                  "CreateMultipartUpload operation: Access Denied")
    mapped = os_error(raw)
    assert isinstance(mapped, CredentialsError) and mapped.exit_code == 2
    assert str(mapped).startswith("access denied to s3://bkt/other/a: the identity in use lacks s3:PutObject")
    _no_disk_hint(mapped)
    assert "free space" in str(os_error(OSError(28, "No space left on device", "/x")))  # a real disk error keeps its hint


def test_data_show_on_a_denied_uri_prints_one_line_naming_it(servers: tuple[str, Any], aws: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    aws.setenv("AWS_ENDPOINT_URL", servers[1].url)
    code = main(["data", "show", "s3://bkt/elsewhere/ds"])
    err = capsys.readouterr().err
    assert code == 2 and "s3://bkt/elsewhere/ds" in err and "access denied" in err, err
    assert "Traceback" not in err and "free space" not in err


def test_an_endpoint_that_accepts_and_never_answers_is_given_up_within_the_request_timeout(
        aws: pytest.MonkeyPatch) -> None:
    """Issue 35: an s3:// endpoint that never answers was silent for 100 s. The waits are the module's bounds
    (shortened here so the test is quick; the bound is what is tested, not its size)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepts (the kernel completes the handshake), never reads or answers
        aws.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
        aws.setattr(store, "REQUEST_TIMEOUT_S", 1.0)
        aws.setattr(store, "S3_ATTEMPTS", 2)
        t0 = time.monotonic()
        with pytest.raises(AwsError) as e:
            store.read_text("s3://bkt/runs/manifest.json")
        waited = time.monotonic() - t0
    assert waited < 10, waited
    assert "s3://bkt/runs/manifest.json" in str(e.value) and "cannot reach" in str(e.value)


def test_publishing_onto_a_file_where_a_folder_goes_is_one_line_naming_the_path(tmp_path: Path) -> None:
    """shutil.copytree's Error (a list of (source, destination, why)) becomes raydlc's one line (issue 44)."""
    from raydlc.edges.storage import publish
    from raydlc.errors import InputError

    local = tmp_path / "local"
    (local / "export").mkdir(parents=True)
    (local / "export" / "config.json").write_text("{}")
    dest = tmp_path / "run"
    dest.mkdir()
    (dest / "export").write_text("my notes\n")
    with pytest.raises(InputError, match=rf"cannot publish the run into {dest / 'export'}") as e:
        publish(local, str(dest))
    assert "\n" not in e.value.message and str(local) in (e.value.hint or "")
    assert (dest / "export").read_text() == "my notes\n"
