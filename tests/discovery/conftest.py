"""The platform cluster (tests/doubles/platform_world.py) as a fixture: `platform` is the full platform; parametrize it
indirectly with a variant name (`@pytest.mark.parametrize("platform", ["kind"], indirect=True)`) for another shape,
or with a dict `{"variant": ..., "grant": False, "cluster_reads": False}`."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DOUBLES = Path(__file__).resolve().parents[1] / "doubles"
sys.path.insert(0, str(DOUBLES))

import platform_world  # noqa: E402  (tests/doubles/platform_world.py: not `platform.py`, which would shadow the stdlib module in the doubles run as scripts)


@pytest.fixture
def platform(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    param = getattr(request, "param", "platform")
    knobs = dict(param) if isinstance(param, dict) else {"variant": param}
    with platform_world.platform_cluster(monkeypatch.setattr, tmp=tmp_path, **knobs) as p:
        yield p


@pytest.fixture
def user_kube(platform: Any) -> Any:
    """raydlc's Kubernetes gateway as the platform's user (bearer token, the official client)."""
    from raydlc.edges import kube

    return kube.Kube(kube.load_client(platform.kubeconfig()))
