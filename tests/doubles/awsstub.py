"""Answers for the AWS calls moto lacks, as botocore event handlers that record each request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.awsrequest import AWSResponse


def aws_answer(status: int, parsed: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
    """What a `before-call` handler returns to answer a call instead of the endpoint."""
    parsed = {**parsed, "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": "raydlc-test"}}
    return AWSResponse("http://stub", status, {}, None), parsed


def aws_error(code: str, message: str = "", status: int = 400) -> tuple[AWSResponse, dict[str, Any]]:
    return aws_answer(status, {"Error": {"Code": code, "Message": message or code}})


class Quotas:
    """EC2 quota values served by moto's Service Quotas backend (moto only knows VPC quotas)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.asked: list[tuple[str, str]] = []


class Answer:
    """Answers one operation in place of the endpoint and records the parameters it was called with.

    `reply(params) -> (status, parsed)` decides the answer; attach with `on(client)` or through
    `client_hooks` for clients raydlc makes itself.
    """

    def __init__(self, service: str, operation: str, reply: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]) -> None:
        self.service, self.operation, self.reply = service, operation, reply
        self.calls: list[dict[str, Any]] = []

    def _record(self, params: dict[str, Any], **kw: Any) -> None:
        self.calls.append(dict(params))

    def _answer(self, **kw: Any) -> tuple[AWSResponse, dict[str, Any]]:
        return aws_answer(*self.reply(self.calls[-1]))

    def events(self) -> dict[str, Callable[..., Any]]:
        return {
            f"before-parameter-build.{self.service}.{self.operation}": self._record,
            f"before-call.{self.service}.{self.operation}": self._answer,
        }

    def on(self, client: Any) -> Answer:
        for event, handler in self.events().items():
            client.meta.events.register(event, handler)
        return self


def hooked(make: Callable[[Any, str], Any], hooks: dict[str, Callable[..., Any]]) -> Callable[[Any, str], Any]:
    """A stand-in for `raydlc.edges.aws.client` that attaches `hooks` (event name -> handler, read at each call) to every client."""

    def client(sess: Any, service: str) -> Any:
        c = make(sess, service)
        for event, handler in hooks.items():
            c.meta.events.register(event, handler)
        return c

    return client
