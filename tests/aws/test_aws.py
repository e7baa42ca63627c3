"""raydlc.edges.aws against a real moto server: sessions, retries and the error mapping.

Stubbed calls: only where a test says so, via `before-call`/`before-send` handlers
(AWS error codes moto never returns: UnauthorizedOperation, Throttling, OptInRequired).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from awsstub import aws_error  # type: ignore[import-not-found]
from botocore.awsrequest import AWSResponse

from raydlc.edges import aws
from raydlc.errors import CredentialsError, InputError


def test_session_without_credentials_fails_before_any_call(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(CredentialsError, match="no AWS credentials") as e:
        aws.session("us-west-2")
    assert e.value.hint and "AWS_PROFILE" in e.value.hint and e.value.exit_code == 2


def test_unknown_profile_is_a_credentials_error(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    with pytest.raises(CredentialsError, match="'no-such-profile'"):
        aws.session("us-west-2")


def test_profile_from_config_file_is_used(aws_env: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    creds = tmp_path / "credentials"
    creds.write_text("[lab]\naws_access_key_id = AKIDLAB\naws_secret_access_key = secret\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_PROFILE", "lab")
    sess = aws.session("us-west-2")
    assert sess.get_credentials().access_key == "AKIDLAB"
    ec2 = aws.client(sess, "ec2")
    assert aws.call(ec2, "describe_availability_zones")["AvailabilityZones"]


def test_unknown_region_is_refused_before_any_call(aws_env: str) -> None:
    with pytest.raises(aws.RegionError, match="unknown AWS region 'us-west-9'"):
        aws.session("us-west-9")


def test_client_honours_endpoint_and_retry_settings(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "4")
    ec2 = aws.client(aws.session("us-west-2"), "ec2")
    assert ec2.meta.endpoint_url == aws_env
    assert ec2.meta.config.retries["total_max_attempts"] == 4
    assert ec2.meta.config.retries["mode"] == "standard"
    zones = aws.call(ec2, "describe_availability_zones")["AvailabilityZones"]
    assert {z["ZoneName"] for z in zones} >= {"us-west-2a", "us-west-2b"}
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "many")
    with pytest.raises(InputError, match="AWS_MAX_ATTEMPTS"):
        aws.client(aws.session("us-west-2"), "ec2")


def test_throttling_is_retried_then_answered_by_moto(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stubbed: the first two DescribeInstanceTypes sends answer Throttling; the third reaches moto."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    ec2 = aws.client(aws.session("us-west-2"), "ec2")
    sends: list[str] = []

    def throttle(request: Any, **kw: Any) -> AWSResponse | None:
        sends.append(request.url)
        if len(sends) <= 2:
            body = b"<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>slow down</Message></Error></Errors></Response>"
            raw = _Raw(body)
            return AWSResponse(request.url, 503, {}, raw)
        return None

    ec2.meta.events.register("before-send.ec2.DescribeInstanceTypes", throttle)
    out = aws.call(ec2, "describe_instance_types", InstanceTypes=["g6.12xlarge"])
    assert out["InstanceTypes"][0]["VCpuInfo"]["DefaultVCpus"] == 48
    assert len(sends) == 3


def test_throttling_beyond_the_retries_is_a_throttled_error(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stubbed: every DescribeInstanceTypes answers ThrottlingException."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    ec2 = aws.client(aws.session("us-west-2"), "ec2")
    ec2.meta.events.register("before-call.ec2.DescribeInstanceTypes", lambda **kw: aws_error("RequestLimitExceeded"))
    with pytest.raises(aws.ThrottledError, match="throttled") as e:
        aws.call(ec2, "describe_instance_types")
    assert e.value.code == "RequestLimitExceeded" and "AWS_MAX_ATTEMPTS" in (e.value.hint or "")


@pytest.mark.parametrize(
    ("code", "status", "cls", "hint_fragment"),
    [
        ("UnauthorizedOperation", 403, aws.AccessDeniedError, "ec2:DescribeInstanceTypes"),
        ("OptInRequired", 401, aws.RegionError, "enable the region"),
        ("AuthFailure", 401, CredentialsError, "refresh"),
        ("InvalidAction", 400, aws.UnsupportedError, "AWS_ENDPOINT_URL points at"),
    ],
)
def test_error_codes_map_to_raydlc_errors(
    aws_env: str, code: str, status: int, cls: type[Exception], hint_fragment: str
) -> None:
    """Stubbed: DescribeInstanceTypes answers the AWS error code under test."""
    ec2 = aws.client(aws.session("us-west-2"), "ec2")
    ec2.meta.events.register("before-call.ec2.DescribeInstanceTypes", lambda **kw: aws_error(code, status=status))
    with pytest.raises(cls) as e:
        aws.call(ec2, "describe_instance_types")
    assert type(e.value) is cls
    assert hint_fragment in (e.value.hint or "")  # type: ignore[attr-defined]


def test_operation_moto_lacks_is_unsupported_not_a_crash(aws_env: str) -> None:
    """Not stubbed: moto really answers GetSpotPlacementScores with an HTML 500 page."""
    ec2 = aws.client(aws.session("us-west-2"), "ec2")
    with pytest.raises(aws.UnsupportedError, match="GetSpotPlacementScores") as e:
        aws.call(ec2, "get_spot_placement_scores", TargetCapacity=1, InstanceTypes=["g6.12xlarge"])
    assert aws_env in (e.value.hint or "")


def test_unreachable_endpoint_is_an_error_naming_it_exit_1(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    ec2 = aws.client(aws.session("us-west-2"), "ec2")
    with pytest.raises(aws.UnreachableError, match=f"cannot reach the ec2 endpoint at http://127.0.0.1:{port} in us-west-2") as e:
        aws.call(ec2, "describe_availability_zones")
    assert e.value.exit_code == 1  # the network's fault, not the user's input


class _Raw:
    """The minimal urllib3-like body AWSResponse reads."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, *a: Any, **kw: Any) -> Any:
        yield self._body

    def read(self, *a: Any) -> bytes:
        return self._body
