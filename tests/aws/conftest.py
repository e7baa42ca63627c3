"""A real moto server on 127.0.0.1 for the AWS tests, and helpers to shape its state.

boto3 reaches the server over HTTP through `AWS_ENDPOINT_URL`, exactly as it would reach
AWS. Scenarios change moto's backend in this process (the server thread shares it).
What moto does not implement (EC2 Service Quotas, Spot placement scores, capacity
reservations) is filled by botocore event handlers that check the request they answer;
each test says which calls are answered that way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles"))  # servers, awsstub

from awsstub import Quotas, hooked

import raydlc.edges.aws


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    """The moto server of tests/doubles/servers.py, with its gaps filled as AWS behaves."""
    import servers

    with servers.moto_server() as url:
        yield url


@pytest.fixture
def aws_env(moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Fake credentials, boto3 pointed at moto, no RAYDLC_* or ~/.aws leaking in.

    moto's state lives as long as the session and is not reset (a reset costs ~0.7 s and every
    region's backend is rebuilt on next use): tests create resources (instances, VPCs, an EKS
    cluster) only in eu-central-1, and never in us-west-2, which the acceptance test reads.
    """
    for k in list(os.environ):
        if k.startswith(("RAYDLC_", "AWS_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # moto answers unimplemented calls with HTTP 500, which standard mode retries with backoff;
    # the retry tests set their own value.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.chdir(tmp_path)
    return moto_url


@pytest.fixture
def clients(aws_env: str) -> Callable[[str], tuple[Any, Any, Any]]:
    """(ec2, service-quotas, eks) clients made by raydlc.edges.aws for a region."""

    def make(region: str) -> tuple[Any, Any, Any]:
        sess = raydlc.edges.aws.session(region)
        return tuple(raydlc.edges.aws.client(sess, s) for s in ("ec2", "service-quotas", "eks"))  # type: ignore[return-value]

    return make


@pytest.fixture
def quotas(monkeypatch: pytest.MonkeyPatch) -> Quotas:
    from moto.servicequotas.exceptions import NoSuchResource
    from moto.servicequotas.models import ServiceQuotasBackend

    q = Quotas()
    original = ServiceQuotasBackend.get_service_quota

    def get_service_quota(self: Any, service_code: str, quota_code: str) -> dict[str, Any]:
        q.asked.append((service_code, quota_code))
        if service_code == "ec2":
            if quota_code not in q.values:
                raise NoSuchResource
            return {"ServiceCode": "ec2", "QuotaCode": quota_code, "QuotaName": f"quota {quota_code}",
                    "Value": q.values[quota_code], "Unit": "None", "Adjustable": True}
        return original(self, service_code, quota_code)

    monkeypatch.setattr(ServiceQuotasBackend, "get_service_quota", get_service_quota)
    return q


@pytest.fixture
def offerings(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str, list[str]], None]:
    """Offer an instance type only in the given zones of a region (moto's real data otherwise)."""
    from moto.ec2.models.instance_types import INSTANCE_TYPE_OFFERINGS

    def offer(region: str, instance_type: str, zones: list[str]) -> None:
        table = INSTANCE_TYPE_OFFERINGS["availability-zone"]
        rows = [o for o in table[region] if o["InstanceType"] != instance_type]
        rows += [{"InstanceType": instance_type, "Location": z, "LocationType": "availability-zone"} for z in zones]
        monkeypatch.setitem(table, region, rows)

    return offer


@pytest.fixture
def client_hooks(monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[..., Any]]:
    """Event handlers (event name -> handler) attached to every client raydlc.edges.aws makes."""
    hooks: dict[str, Callable[..., Any]] = {}
    monkeypatch.setattr(raydlc.edges.aws, "client", hooked(raydlc.edges.aws.client, hooks))
    return hooks
