"""The S3 IAM front (tests/doubles/s3_iam.py): its evaluator, its REST-call mapping, and the front itself
between boto3 / pyarrow and a real moto server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "doubles"))
from s3_iam import Check, condition_holds, evaluate, operation, s3_front  # type: ignore[import-not-found]
from servers import moto_server  # type: ignore[import-not-found]

ARN = "arn:aws:s3:::bkt"


def _allow(action: str, resource: str, condition: dict[str, Any] | None = None, effect: str = "Allow") -> dict[str, Any]:
    stmt: dict[str, Any] = {"Effect": effect, "Action": action, "Resource": resource}
    if condition:
        stmt["Condition"] = condition
    return stmt


# ------------------------------------------------------------------ evaluator


def test_an_explicit_deny_wins_over_an_allow() -> None:
    policy = {"Statement": [_allow("s3:*", "*"), _allow("s3:DeleteObject", f"{ARN}/keep/*", effect="Deny")]}
    assert evaluate(policy, Check("s3:DeleteObject", f"{ARN}/tmp/a"))
    assert not evaluate(policy, Check("s3:DeleteObject", f"{ARN}/keep/a"))


def test_nothing_allowed_is_an_implicit_deny_and_actions_match_case_blind() -> None:
    policy = {"Statement": [_allow("S3:getobject", f"{ARN}/a/*")]}
    assert evaluate(policy, Check("s3:GetObject", f"{ARN}/a/x"))
    assert not evaluate(policy, Check("s3:GetObject", f"{ARN}/b/x"))
    assert not evaluate(policy, Check("s3:PutObject", f"{ARN}/a/x"))
    assert not evaluate({"Statement": []}, Check("s3:GetObject", f"{ARN}/a/x"))


@pytest.mark.parametrize("op, wanted, context, holds", [
    ("StringLike", ["runs/*"], {"s3:prefix": "runs/a/"}, True),
    ("StringLike", ["runs/*"], {"s3:prefix": "other/"}, False),
    ("StringLike", ["runs/*"], {}, False),  # absent key: false
    ("StringLikeIfExists", ["runs/*"], {}, True),  # ...unless IfExists
    ("StringLikeIfExists", ["runs/*"], {"s3:prefix": "other/"}, False),
    ("StringEquals", "runs/", {"s3:prefix": "runs/"}, True),
    ("StringEquals", "runs/", {"s3:prefix": "Runs/"}, False),
    ("StringEqualsIgnoreCase", "runs/", {"s3:prefix": "Runs/"}, True),
    ("StringNotEquals", "runs/", {}, True),  # negated operators hold for an absent key
    ("StringNotLike", ["runs/*"], {"s3:prefix": "runs/x"}, False),
    ("StringNotLike", ["runs/*"], {"s3:prefix": "x"}, True),
    ("Null", "true", {}, True),
    ("Null", "true", {"s3:prefix": ""}, False),
    ("Null", "false", {"s3:prefix": "a"}, True),
    ("NumericLessThanEquals", "1000", {"s3:prefix": "5"}, True),
    ("NumericLessThanEquals", "1000", {"s3:prefix": "5000"}, False),
    ("NumericLessThanEquals", "1000", {}, False),
])
def test_condition_operators_and_absent_keys(op: str, wanted: Any, context: dict[str, str], holds: bool) -> None:
    assert condition_holds(op, "s3:prefix", wanted, context) is holds


# ------------------------------------------------------------------ mapping


def _op(method: str, path: str, query: dict[str, str] | None = None, headers: dict[str, str] | None = None,
        body: bytes = b"") -> tuple[str, list[Check]]:
    bucket, _, key = path.lstrip("/").partition("/")
    return operation(method, bucket, key, query or {}, headers or {}, body)


def test_head_bucket_is_list_bucket_without_a_prefix() -> None:
    assert _op("HEAD", "/bkt") == ("HeadBucket", [Check("s3:ListBucket", ARN, {})])


def test_a_listing_carries_prefix_delimiter_and_max_keys_when_the_request_has_them() -> None:
    name, checks = _op("GET", "/bkt", {"list-type": "2", "prefix": "runs/", "delimiter": "/", "max-keys": "1"})
    assert name == "ListObjectsV2"
    assert checks == [Check("s3:ListBucket", ARN, {"s3:prefix": "runs/", "s3:delimiter": "/", "s3:max-keys": "1"})]
    assert _op("GET", "/bkt", {"list-type": "2"})[1] == [Check("s3:ListBucket", ARN, {})]


@pytest.mark.parametrize("method, query, name, action", [
    ("GET", {}, "GetObject", "s3:GetObject"),
    ("HEAD", {}, "HeadObject", "s3:GetObject"),
    ("PUT", {}, "PutObject", "s3:PutObject"),
    ("POST", {"uploads": ""}, "CreateMultipartUpload", "s3:PutObject"),
    ("PUT", {"uploadId": "u", "partNumber": "1"}, "UploadPart", "s3:PutObject"),
    ("POST", {"uploadId": "u"}, "CompleteMultipartUpload", "s3:PutObject"),
    ("DELETE", {"uploadId": "u"}, "AbortMultipartUpload", "s3:AbortMultipartUpload"),
    ("GET", {"uploadId": "u"}, "ListParts", "s3:ListMultipartUploadParts"),
    ("DELETE", {}, "DeleteObject", "s3:DeleteObject"),
])
def test_object_calls_map_to_their_actions(method: str, query: dict[str, str], name: str, action: str) -> None:
    assert _op(method, "/bkt/runs/a b", query) == (name, [Check(action, f"{ARN}/runs/a b")])


def test_copy_reads_the_source_and_writes_the_target() -> None:
    name, checks = _op("PUT", "/bkt/runs/b", headers={"x-amz-copy-source": "/src/code/a%20x?versionId=1"})
    assert name == "CopyObject"
    assert checks == [Check("s3:GetObject", "arn:aws:s3:::src/code/a x"), Check("s3:PutObject", f"{ARN}/runs/b")]


def test_delete_objects_is_one_delete_per_key() -> None:
    body = (b'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Object><Key>runs/a</Key></Object>'
            b"<Object><Key>x/b</Key></Object></Delete>")
    assert _op("POST", "/bkt", {"delete": ""}, body=body) == (
        "DeleteObjects", [Check("s3:DeleteObject", f"{ARN}/runs/a"), Check("s3:DeleteObject", f"{ARN}/x/b")])


# ------------------------------------------------------------------ the front, between boto3/pyarrow and moto

POLICY = {"Version": "2012-10-17", "Statement": [
    _allow("s3:ListBucket", ARN, {"StringLikeIfExists": {"s3:prefix": ["runs", "runs/*"]}}),
    _allow("s3:*Object", f"{ARN}/runs/*"),
]}


@pytest.fixture(scope="module")
def front() -> Iterator[Any]:
    import boto3

    with moto_server() as url, s3_front(url, POLICY) as f:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="k",
                     aws_secret_access_key="s").create_bucket(Bucket="bkt")
        yield f


def _client(url: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s",
                        config=Config(retries={"max_attempts": 1}))


def test_boto3_through_the_front_is_allowed_under_the_prefix_and_refused_beside_it(front: Any) -> None:
    from botocore.exceptions import ClientError

    s3 = _client(front.url)
    s3.put_object(Bucket="bkt", Key="runs/a", Body=b"hello")
    assert s3.get_object(Bucket="bkt", Key="runs/a")["Body"].read() == b"hello"
    assert s3.head_object(Bucket="bkt", Key="runs/a")["ContentLength"] == 5
    s3.head_bucket(Bucket="bkt")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="bkt", Key="other/a", Body=b"x")
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket="bkt", Prefix="other/")
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    assert front.refused()[-1].check == Check("s3:ListBucket", ARN, {"s3:prefix": "other/"})
    out = s3.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": "runs/a"}, {"Key": "other/b"}]})
    assert [d["Key"] for d in out["Deleted"]] == ["runs/a"]
    assert [(x["Key"], x["Code"]) for x in out["Errors"]] == [("other/b", "AccessDenied")]


def test_a_missing_key_is_404_with_list_bucket_and_403_without(front: Any) -> None:
    from botocore.exceptions import ClientError

    s3 = _client(front.url)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="bkt", Key="runs/missing")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    saved = front.policy
    front.policy = {"Statement": [POLICY["Statement"][1]]}
    try:
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket="bkt", Key="runs/missing")
        assert e.value.response["Error"]["Code"] == "AccessDenied"
        with pytest.raises(ClientError) as e:
            s3.head_bucket(Bucket="bkt")
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    finally:
        front.policy = saved


def test_multipart_upload_through_the_front(front: Any) -> None:
    s3 = _client(front.url)
    up = s3.create_multipart_upload(Bucket="bkt", Key="runs/big")
    part = s3.upload_part(Bucket="bkt", Key="runs/big", UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 10)
    s3.complete_multipart_upload(Bucket="bkt", Key="runs/big", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    assert s3.get_object(Bucket="bkt", Key="runs/big")["Body"].read() == b"x" * 10
    names = [d.operation for d in front.log[-4:]]
    assert names == ["CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "GetObject"]
