"""The one gateway to boto3: sessions, clients with retries, and AWS errors as raydlc errors.

Every module that talks to AWS gets its clients here and makes its calls through `call`,
so the mapping from botocore's many failure shapes (ClientError codes, credential errors,
unreachable endpoints, a local endpoint that does not implement an operation) to a message
a person can act on is written once. boto3 is imported inside the functions: `raydlc --help`
must not pay for it.

The standard AWS environment applies unchanged: `AWS_PROFILE`, the credential chain,
`AWS_ENDPOINT_URL` (and per-service `AWS_ENDPOINT_URL_EC2`, …), `AWS_MAX_ATTEMPTS` and
`AWS_RETRY_MODE`.

A CLI must not wait minutes on a network that does not answer: each call has a budget
(`CALL_BUDGET_S`, retries and their back-off counted in), and an attempt that could not finish
within it is not started. A command that chains many calls (`status`, `capacity`, `up`, `down`)
has one more, `COMMAND_SILENCE_S`, for all its calls together (`command_budget`): the time spent
on calls AWS did not answer adds up, an endpoint that did not answer once is not asked again in
the same command, and no attempt starts that would cross the budget. An endpoint that cannot be reached is `UnreachableError` (exit 1),
naming the endpoint — never mistaken for an answer about the account.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raydlc.errors import AwsError, CredentialsError, InputError, RaydlcError

if TYPE_CHECKING:
    import boto3

DEFAULT_MAX_ATTEMPTS = 5
CONNECT_TIMEOUT_S = 3
READ_TIMEOUT_S = 8
# One call, every attempt and back-off included: a black-hole endpoint fails after two attempts.
CALL_BUDGET_S = 20

# Every call of one command together, waiting on AWS that does not answer (answers do not count:
# `up` waits minutes for stacks, through calls that answer).
COMMAND_SILENCE_S = 30

_IAM_PREFIX = {"service-quotas": "servicequotas", "ec2": "ec2", "eks": "eks", "pricing": "pricing", "sts": "sts"}
_DENIED = {
    "AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedException",
    "Forbidden", "403",
}
_BAD_CREDENTIALS = {
    "AuthFailure", "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch",
    "ExpiredToken", "ExpiredTokenException", "RequestExpired", "InvalidAccessKeyId",
}
_THROTTLED = {
    "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
    "RequestThrottled", "RequestThrottledException", "SlowDown",
}
_UNSUPPORTED = {"InvalidAction", "UnsupportedOperation", "NotImplemented", "UnknownOperationException"}
_NOT_ENABLED = {"OptInRequired"}


class AwsCallError(AwsError):
    """An AWS call failed; `code` is AWS's error code when there was one."""

    def __init__(
        self, message: str, *, hint: str | None = None, code: str | None = None,
        service: str = "", operation: str = "",
    ) -> None:
        super().__init__(message, hint=hint)
        self.code = code
        self.service = service
        self.operation = operation


class AccessDeniedError(AwsCallError):
    """The credentials work but lack the IAM permission for this call."""


class ThrottledError(AwsCallError):
    """AWS kept throttling after every retry."""


class UnsupportedError(AwsCallError):
    """The endpoint does not offer this operation (a local stand-in, an old partition)."""


class RegionError(AwsCallError):
    """The region is unknown or not enabled for the account."""

    exit_code = 2


class UnreachableError(AwsCallError):
    """No answer from the endpoint: refused, timed out, or the call's time budget spent."""


class _OutOfTime(Exception):
    """Raised inside botocore before an attempt that could not finish within `CALL_BUDGET_S`."""

    def __init__(self, endpoint: str, elapsed: float, attempts: int, why: str | None = None) -> None:
        super().__init__(why or f"no answer from {endpoint} within {elapsed:.0f} s ({attempts} attempts)")
        self.endpoint, self.elapsed, self.attempts = endpoint, elapsed, attempts


@dataclass
class _Command:
    """One command's AWS silence: seconds spent on calls that got no answer, and the endpoints that gave none."""

    name: str
    budget_s: float
    silent_s: float = 0.0
    silent: set[str] = field(default_factory=set)


@dataclass
class _Current:
    command: _Command | None = None  # one command per process; its steps may call from several threads


_lock = threading.Lock()
_now = _Current()


@contextlib.contextmanager
def command_budget(name: str, seconds: float = COMMAND_SILENCE_S) -> Iterator[None]:
    """Bound the time the AWS calls of command `name` together wait on AWS that does not answer."""
    with _lock:
        outer = _now.command
        _now.command = outer or _Command(name, seconds)
    try:
        yield
    finally:
        with _lock:
            _now.command = outer


def _refuse(endpoint: str, spent: float) -> None:
    """Before an attempt: an endpoint silent earlier in this command, or a budget an attempt would cross."""
    cmd = _now.command
    if cmd is None:
        return
    if endpoint in cmd.silent:
        raise _OutOfTime(endpoint, 0, 0, f"{endpoint} did not answer earlier in `raydlc {cmd.name}`; not asked again")
    if cmd.silent_s + spent + CONNECT_TIMEOUT_S + READ_TIMEOUT_S > cmd.budget_s and (cmd.silent_s or spent):
        raise _OutOfTime(endpoint, cmd.silent_s + spent, 0,
                         f"AWS left `raydlc {cmd.name}` without an answer for {cmd.silent_s + spent:.0f} s of its {cmd.budget_s:.0f} s budget")


def _silent(endpoint: str | None, seconds: float) -> None:
    """After a call AWS did not answer: its time counts against the command, its endpoint is not asked again."""
    with _lock:
        cmd = _now.command
        if cmd is not None:
            cmd.silent_s += seconds
            if endpoint:
                cmd.silent.add(_endpoint(endpoint))


def _budget(request: Any, **kw: Any) -> None:
    """`request-created` hook: refuse an attempt that would end past the call's or the command's budget.

    botocore keeps one context dict per call across its retries, so the first attempt's start
    time is kept there; the check runs after the back-off sleep, so that is counted too.
    """
    ctx = request.context
    now = time.monotonic()
    start = ctx.setdefault("raydlc_started", now)
    attempt = int((ctx.get("retries") or {}).get("attempt", 1))
    if attempt > 1 and now - start + CONNECT_TIMEOUT_S + READ_TIMEOUT_S > CALL_BUDGET_S:
        raise _OutOfTime(_endpoint(request.url), now - start, attempt - 1)
    _refuse(_endpoint(request.url), now - start if attempt > 1 else 0.0)


def _endpoint(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url


def _max_attempts() -> int:
    raw = os.environ.get("AWS_MAX_ATTEMPTS")
    if raw is None:
        return DEFAULT_MAX_ATTEMPTS
    try:
        value = int(raw)
    except ValueError as e:
        raise InputError(
            f"AWS_MAX_ATTEMPTS must be a whole number, got {raw!r}", hint="unset it or set e.g. AWS_MAX_ATTEMPTS=5"
        ) from e
    return max(1, value)


@functools.cache
def _data_loader() -> Any:
    """One botocore data loader per process: it caches the parsed service models and endpoint
    data, which every new session would otherwise parse again (~0.5 s per client)."""
    from botocore.loaders import create_loader

    return create_loader()


def _boto3_session(region: str | None = None, profile: str | None = None) -> boto3.Session:
    import boto3
    import botocore.session

    core = botocore.session.get_session()
    loader = _data_loader()
    core.register_component("data_loader", loader)
    sess = boto3.Session(botocore_session=core, region_name=region, profile_name=profile)
    loader.search_paths[:] = list(dict.fromkeys(loader.search_paths))  # boto3 appends its path per session
    return sess


@functools.cache
def known_regions(service: str = "ec2") -> frozenset[str]:
    """Regions botocore's endpoint data lists for a service, in every partition."""
    sess = _boto3_session()
    regions: set[str] = set()
    for partition in sess.get_available_partitions():
        regions.update(sess.get_available_regions(service, partition_name=partition))
    return frozenset(regions)


def session(region: str, profile: str | None = None) -> boto3.Session:
    """A session with usable credentials, or a CredentialsError before anything is sent.

    `profile` defaults to `AWS_PROFILE` (boto3 reads it itself). The region must be one
    botocore knows: a typo would otherwise surface as an unreachable endpoint much later.
    """
    from botocore import exceptions as bx

    try:
        sess = _boto3_session(region, profile or None)
        creds = sess.get_credentials()
    except bx.ProfileNotFound as e:
        name = profile or os.environ.get("AWS_PROFILE", "")
        raise CredentialsError(
            f"AWS profile {name!r} is not in ~/.aws/config or ~/.aws/credentials",
            hint="check AWS_PROFILE; `aws configure list-profiles` shows the profiles",
        ) from e
    except (bx.BotoCoreError, ValueError) as e:
        raise CredentialsError(
            f"AWS credentials could not be loaded: {e}",
            hint="for SSO run `aws sso login`; otherwise check AWS_PROFILE and ~/.aws/config",
        ) from e
    if creds is None:
        raise CredentialsError(
            "no AWS credentials found (environment, AWS_PROFILE, ~/.aws, SSO, instance role)",
            hint="set AWS_PROFILE to a configured profile, or export AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or run `aws configure` / `aws sso login`",
        )
    if region not in known_regions():
        raise RegionError(
            f"unknown AWS region {region!r}",
            hint="check REGION (e.g. us-east-2, us-west-2); if the region is new, upgrade boto3/botocore",
        )
    return sess


def client(sess: boto3.Session, service: str) -> Any:
    """A client with standard-mode retries (throttling, 5xx) and bounded timeouts."""
    from botocore.config import Config

    from raydlc import __version__

    config = Config(
        retries={"mode": os.environ.get("AWS_RETRY_MODE", "standard"), "total_max_attempts": _max_attempts()},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        user_agent_extra=f"raydlc/{__version__}",
    )
    cli = sess.client(service, config=config)
    cli.meta.events.register("request-created", _budget)
    return cli


def _service(cli: Any) -> str:
    return str(cli.meta.service_model.service_name)


def translate(
    exc: BaseException, *, service: str, operation: str, region: str | None = None, endpoint: str | None = None,
) -> RaydlcError:
    """The raydlc error for a failed call; the message names the call, the hint says what to do."""
    from botocore import exceptions as bx
    from botocore.parsers import ResponseParserError

    what = f"{service} {operation}"
    action = f"{_IAM_PREFIX.get(service, service)}:{operation}"
    where = f" in {region}" if region else ""
    if isinstance(exc, RaydlcError):
        return exc
    unreachable_hint = "check the network and any proxy; AWS_ENDPOINT_URL, if set, must point at a running endpoint"
    if isinstance(exc, _OutOfTime):
        return UnreachableError(
            f"{what}: could not reach AWS{where}: {exc}", hint=unreachable_hint, service=service, operation=operation,
        )
    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        msg = str(err.get("Message", "")).strip()
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        kw: dict[str, Any] = {"code": code, "service": service, "operation": operation}
        if code in _DENIED:
            return AccessDeniedError(
                f"{what}: access denied{where} ({code})",
                hint=f"grant the IAM action {action} to the identity you run as (`aws sts get-caller-identity`)",
                **kw,
            )
        if code in _BAD_CREDENTIALS:
            return CredentialsError(
                f"{what}: AWS rejected the credentials ({code}: {msg})",
                hint="refresh them (`aws sso login`, new access keys) and check the clock is right",
            )
        if code in _THROTTLED:
            return ThrottledError(
                f"{what}: throttled by AWS{where} after {_max_attempts()} attempts ({code})",
                hint="wait a minute and retry, or raise AWS_MAX_ATTEMPTS",
                **kw,
            )
        if code in _NOT_ENABLED:
            return RegionError(
                f"{what}: region{where or ''} is not enabled for this account ({code})",
                hint="enable the region in the AWS console (Account > AWS Regions) or choose another REGION",
                **kw,
            )
        if code in _UNSUPPORTED or status == 501 or (code.isdigit() and msg.startswith("<")):
            return UnsupportedError(
                f"{what}: the endpoint does not offer this operation ({code or status})",
                hint=_endpoint_hint(service),
                **kw,
            )
        return AwsCallError(f"{what} failed{where}: {code}: {_short(msg)}", hint=None, **kw)
    if isinstance(exc, ResponseParserError):
        return UnsupportedError(
            f"{what}: the endpoint answered with something that is not an AWS response "
            "(it probably does not implement this operation)",
            hint=_endpoint_hint(service),
            service=service,
            operation=operation,
        )
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.CredentialRetrievalError,
                        bx.SSOError, bx.TokenRetrievalError)):
        return CredentialsError(
            f"{what}: no usable AWS credentials ({exc})",
            hint="set AWS_PROFILE, or export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run `aws sso login`",
        )
    if isinstance(exc, bx.NoRegionError):
        return RegionError(f"{what}: no region set", hint="set REGION (or pass --region)", service=service, operation=operation)
    if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError,
                        bx.ConnectionClosedError, bx.HTTPClientError)):
        at = f" at {endpoint}" if endpoint else ""
        return UnreachableError(
            f"{what}: cannot reach the {service} endpoint{at}{where} ({exc})",
            hint=unreachable_hint, service=service, operation=operation,
        )
    if isinstance(exc, bx.BotoCoreError):
        return AwsCallError(f"{what} failed{where}: {exc}", service=service, operation=operation)
    raise TypeError(f"not an AWS error: {exc!r}")


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _endpoint_hint(service: str) -> str:
    override = os.environ.get(f"AWS_ENDPOINT_URL_{service.upper().replace('-', '_')}") or os.environ.get("AWS_ENDPOINT_URL")
    if override:
        return f"AWS_ENDPOINT_URL points at {override}, which lacks it; unset it to ask AWS itself"
    return "this operation may not exist in this partition or region"


def _is_aws_error(exc: BaseException) -> bool:
    from botocore import exceptions as bx
    from botocore.parsers import ResponseParserError

    return isinstance(exc, (bx.ClientError, bx.BotoCoreError, ResponseParserError, _OutOfTime))


def _operation(cli: Any, method: str) -> str:
    """boto3's snake_case method as the API's operation name (`GetServiceQuota`)."""
    return str(cli.meta.method_to_api_mapping.get(method, method))


def call(cli: Any, method: str, **params: Any) -> dict[str, Any]:
    """`cli.<method>(**params)` with any AWS failure raised as a RaydlcError."""
    operation = _operation(cli, method)
    t0 = time.monotonic()
    try:
        return dict(getattr(cli, method)(**params))
    except Exception as e:
        if not _is_aws_error(e):
            raise
        raise _mapped(e, cli, operation, t0) from e


def _mapped(e: BaseException, cli: Any, operation: str, t0: float) -> RaydlcError:
    """The error as raydlc's; an unanswered call's time counts against the command's budget."""
    err = translate(e, service=_service(cli), operation=operation, region=cli.meta.region_name, endpoint=cli.meta.endpoint_url)
    if isinstance(err, UnreachableError):
        _silent(cli.meta.endpoint_url, time.monotonic() - t0)
    return err


def paginate(cli: Any, method: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
    """Every item under `key` across all pages, errors mapped as in `call`."""
    operation = _operation(cli, method)
    t0 = time.monotonic()
    try:
        for page in cli.get_paginator(method).paginate(**params):
            yield from page.get(key, [])
            t0 = time.monotonic()  # the next page's wait starts now
    except Exception as e:
        if not _is_aws_error(e):
            raise
        raise _mapped(e, cli, operation, t0) from e


def account_id(region: str) -> str:
    """The AWS account the credentials belong to (sts:GetCallerIdentity, which needs no permission)."""
    return str(call(client(session(region), "sts"), "get_caller_identity")["Account"])


# ---------------------------------------------------------------------- the caller's own permissions


def principal_arn(caller: str) -> str | None:
    """The IAM principal IAM's policy simulator takes for a `sts:GetCallerIdentity` ARN: a user as it is, an assumed
    role's session as its role (`arn:aws:sts::A:assumed-role/R/S` -> `arn:aws:iam::A:role/R`; a role path is not in the
    session ARN, `caller_principal` asks IAM for it). None for what the simulator cannot take (root, federated users)."""
    parts = caller.split(":", 5)
    if len(parts) != 6:
        return None
    partition, service, account, resource = parts[1], parts[2], parts[4], parts[5]
    if service == "iam" and resource.startswith(("user/", "role/")):
        return caller
    if service == "sts" and resource.startswith("assumed-role/"):
        role = resource.split("/")[1]
        return f"arn:{partition}:iam::{account}:role/{role}"
    return None


def caller_principal(sess: Any) -> tuple[str, str | None]:
    """(the caller's ARN, the principal to simulate or None); an assumed role's path is read with iam:GetRole when
    allowed (a role the caller may not read keeps the path-less ARN, which the simulator takes for a role at `/`)."""
    caller = str(call(client(sess, "sts"), "get_caller_identity")["Arn"])
    principal = principal_arn(caller)
    if principal and ":role/" in principal and caller.split(":")[2] == "sts":
        with contextlib.suppress(AwsCallError):
            principal = str(call(client(sess, "iam"), "get_role", RoleName=principal.rsplit("/", 1)[1])["Role"]["Arn"])
    return caller, principal


@dataclass(frozen=True)
class Decision:
    """IAM's policy simulator's answer for one action on one resource: `allowed`, `explicitDeny` or `implicitDeny`,
    and the condition keys the matching policies needed but the request did not carry (MissingContextValues)."""

    decision: str
    missing_keys: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.decision == "allowed"

    @property
    def unknown(self) -> bool:
        """Not allowed only for want of a condition key: the simulator cannot tell what the real call would get."""
        return self.decision == "implicitDeny" and bool(self.missing_keys)


def _context_entries(context: Mapping[str, Sequence[str] | bool]) -> list[dict[str, Any]]:
    out = []
    for key, value in context.items():
        if isinstance(value, bool):
            out.append({"ContextKeyName": key, "ContextKeyValues": [str(value).lower()], "ContextKeyType": "boolean"})
        else:
            values = list(value)
            kind = "string" if len(values) == 1 else "stringList"
            out.append({"ContextKeyName": key, "ContextKeyValues": values, "ContextKeyType": kind})
    return out


def simulate(sess: Any, principal: str, actions: list[str], resources: list[str],
             context: Mapping[str, Sequence[str] | bool] | None = None) -> dict[tuple[str, str], Decision]:
    """IAM's policy simulator (iam:SimulatePrincipalPolicy) for `principal`, with `context` as the real calls carry it
    (ContextEntries: `iam:PassedToService`, `aws:RequestedRegion`, ...): {(action, resource): Decision}. IAM answers
    one EvaluationResult per action with a ResourceSpecificResult per resource (older answers: one result per pair);
    both are read. AccessDeniedError when the caller may not simulate."""
    iam = client(sess, "iam")
    out: dict[tuple[str, str], Decision] = {}
    extra = {"ContextEntries": _context_entries(context)} if context else {}
    for result in paginate(iam, "simulate_principal_policy", "EvaluationResults", PolicySourceArn=principal,
                           ActionNames=actions, ResourceArns=resources, **extra):
        action = result["EvalActionName"]
        per_resource = result.get("ResourceSpecificResults") or []
        for r in per_resource:
            out[(action, r["EvalResourceName"])] = Decision(r["EvalResourceDecision"], tuple(r.get("MissingContextValues") or ()))
        if not per_resource:
            out[(action, result.get("EvalResourceName", "*"))] = Decision(
                result["EvalDecision"], tuple(result.get("MissingContextValues") or ()))
    return out
