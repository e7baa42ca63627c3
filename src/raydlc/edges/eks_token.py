"""EKS bearer tokens without a second tool: the token `aws eks get-token` and aws-iam-authenticator mint.

An EKS token is `k8s-aws-v1.` + the unpadded base64url of a presigned STS GetCallerIdentity URL
(valid 60 s) whose signature covers the `x-k8s-aws-id: <cluster>` header; the API server's
authenticator replays that URL to STS and maps the identity STS answers with. botocore's presigner
makes the URL from whatever credentials the session has, so raydlc's kubeconfig needs no `aws`
CLI and no aws-iam-authenticator: its exec plugin is `raydlc eks-token`, which prints the
ExecCredential the client-go exec protocol reads (on stdout, the only place a token ever goes).

`check` does what the API server will do with a token, before `up` creates anything: a
credentials problem is found while nothing bills yet. botocore is imported inside the functions.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from raydlc.edges import aws
from raydlc.errors import CredentialsError, InputError, RaydlcError

if TYPE_CHECKING:
    import boto3

PREFIX = "k8s-aws-v1."
HEADER = "x-k8s-aws-id"
URL_EXPIRES_S = 60
# The EKS authenticator accepts a token for 15 minutes from its signing time; client-go asks the
# plugin again at expirationTimestamp, which `aws eks get-token` sets 14 minutes out: so does raydlc.
TOKEN_LIFETIME_S = 14 * 60
EXEC_APIS = ("client.authentication.k8s.io/v1beta1", "client.authentication.k8s.io/v1")


def mint(sess: boto3.Session, cluster: str) -> str:
    """A token for `cluster` signed with the session's credentials (no request is sent)."""
    sts = aws.client(sess, "sts")

    def sign_cluster(request: Any, **kw: Any) -> None:
        request.headers[HEADER] = cluster  # signed: the API server checks it names its cluster

    sts.meta.events.register("before-sign.sts.GetCallerIdentity", sign_cluster)
    try:
        url = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=URL_EXPIRES_S, HttpMethod="GET")
    except Exception as e:
        if not aws._is_aws_error(e):
            raise
        raise aws.translate(e, service="sts", operation="GetCallerIdentity", region=sess.region_name) from e
    return PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def _url(token: str) -> str:
    body = token[len(PREFIX):]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


def check(sess: boto3.Session, cluster: str) -> str:
    """Mint a token and replay it to STS as the EKS authenticator does; the ARN STS names, or an error.

    The answer's identity is returned so `up` can say who the cluster will see; the token itself
    never leaves this function.
    """
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    url = _url(mint(sess, cluster))
    where = f"{urlsplit(url).scheme}://{urlsplit(url).netloc}"
    req = urllib.request.Request(url, headers={HEADER: cluster, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=aws.CONNECT_TIMEOUT_S + aws.READ_TIMEOUT_S) as resp:
            body = resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")
        raise CredentialsError(
            f"STS at {where} refused the EKS token raydlc signed with your credentials (HTTP {e.code}: {_code(detail)}); "
            "the cluster's API would refuse it too",
            hint="aws sts get-caller-identity",
        ) from None
    except (urllib.error.URLError, OSError) as e:
        raise aws.UnreachableError(
            f"sts GetCallerIdentity: cannot reach STS at {where} to check the EKS token ({getattr(e, 'reason', e)})",
            hint="check the network and any proxy; AWS_ENDPOINT_URL, if set, must point at a running endpoint",
            service="sts", operation="GetCallerIdentity",
        ) from None
    return _arn(body)


def _code(body: str) -> str:
    for tag in ("Code", "Message"):
        start = body.find(f"<{tag}>")
        if start >= 0:
            return body[start + len(tag) + 2: body.find(f"</{tag}>", start)]
    return body[:120]


def _arn(body: str) -> str:
    try:
        return str(json.loads(body)["GetCallerIdentityResponse"]["GetCallerIdentityResult"]["Arn"])
    except (ValueError, KeyError, TypeError):
        start = body.find("<Arn>")
        return body[start + 5: body.find("</Arn>", start)] if start >= 0 else "?"


def exec_api_version(environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    """The ExecCredential apiVersion the client asked for in KUBERNETES_EXEC_INFO (v1beta1 when it did not say)."""
    raw = (os.environ if environ is None else environ).get("KUBERNETES_EXEC_INFO", "")
    try:
        asked = json.loads(raw).get("apiVersion") if raw else None
    except (ValueError, AttributeError):
        asked = None
    return asked if asked in EXEC_APIS else EXEC_APIS[0]


def exec_credential(cluster: str, region: str, *, now: float | None = None) -> dict[str, Any]:
    """The ExecCredential `raydlc eks-token` prints: the token and when the client should ask again."""
    if not cluster or not region:
        raise InputError("eks-token needs --cluster and --region", hint="raydlc eks-token --cluster NAME --region REGION")
    expires = time.gmtime((time.time() if now is None else now) + TOKEN_LIFETIME_S)
    return {
        "kind": "ExecCredential", "apiVersion": exec_api_version(), "spec": {},
        "status": {"expirationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", expires),
                   "token": mint(aws.session(region), cluster)},
    }


def plugin(cluster: str, region: str) -> int:
    """`raydlc eks-token` without the CLI (`python -m raydlc`'s fast path): the ExecCredential on stdout, or
    the CLI's own `error:`/`hint:` lines on stderr and its exit code; never a traceback, never the token elsewhere."""
    try:
        doc = exec_credential(cluster, region)
    except RaydlcError as e:
        sys.stderr.write(f"error: {e.message}\n" + (f"  hint: {e.hint}\n" if e.hint else ""))
        return e.exit_code
    sys.stdout.write(json.dumps(doc) + "\n")
    return 0
