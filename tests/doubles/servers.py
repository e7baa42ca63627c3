"""The local stand-ins `raydlc up` talks to: a moto server and kmock with its gaps filled.

Used by tests/lifecycle/conftest.py and benchmarks/up_critical_path.py. kmock 0.8's gaps are
filled here, never in raydlc: Namespace paths are parsed as the cluster-scoped resource they
are (kmock reads /api/v1/namespaces/NAME as a namespaced path and fails), list requests
honour labelSelector and fieldSelector, and every resource raydlc lists is declared, so an
empty kind lists as [] the way a real API server answers, not 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

RESOURCES = [
    "v1/namespaces", "v1/nodes", "v1/pods", "v1/secrets", "v1/events", "v1/serviceaccounts", "v1/configmaps", "v1/services",
    "apps/v1/deployments", "apps/v1/daemonsets", "networking.k8s.io/v1/networkpolicies",
    "apiextensions.k8s.io/v1/customresourcedefinitions", "ray.io/v1/rayclusters", "ray.io/v1/rayjobs",
]


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def reset_moto(url: str, warm_regions: tuple[str, ...] = ()) -> None:
    """A fresh moto; `warm_regions` get their EC2 backend built now, with a long timeout.

    moto builds a region's EC2 backend (default VPC, AMIs, offerings) on its first request, which on a
    loaded machine outlasts raydlc's 8 s read timeout and fails the test's first real call instead.
    """
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", data=b"", method="POST"), timeout=30).read()
    if warm_regions:
        import boto3
        from botocore.config import Config

        patient = Config(read_timeout=300, retries={"max_attempts": 1})
        for region in warm_regions:
            def warm(service: str, region: str = region) -> object:
                return boto3.client(service, region_name=region, endpoint_url=url, aws_access_key_id="testing",
                                    aws_secret_access_key="testing", config=patient)

            warm("ec2").describe_availability_zones()
            # the storage step and eksctl's pod identity role stack: S3, STS, CloudFormation and IAM built now too
            warm("s3").list_buckets()
            warm("sts").get_caller_identity()
            warm("cloudformation").list_stacks()
            warm("iam").list_roles()


def parse_path_with_namespaces(original: Callable[[str], Any]) -> Callable[[str], Any]:
    from kmock._internal.parsing import ParsedPath

    def parse(path: str) -> Any:
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and (len(parts) in (3, 4) or (len(parts) == 5 and parts[4] in ("status", "finalize"))):
            return ParsedPath(group="", version="v1", plural="namespaces", namespace=None,
                              name=parts[3] if len(parts) > 3 else None, subresource=parts[4] if len(parts) > 4 else None)
        return original(path)

    return parse


def selected(obj: dict[str, Any], labels: str | None, fields: str | None) -> bool:
    """Equality-based label and field selectors, as the API server applies them to a list."""
    meta = obj.get("metadata") or {}
    for term in filter(None, (labels or "").split(",")):
        key, _, value = term.partition("=")
        if (meta.get("labels") or {}).get(key) != value:
            return False
    for term in filter(None, (fields or "").split(",")):
        path, _, value = term.partition("=")
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if str(node) != value:
            return False
    return True


@dataclass
class KubeServer:
    url: str
    handler: Any
    loop: asyncio.AbstractEventLoop

    def snapshot(self) -> dict[str, Any]:
        """Every live object, keyed group/version/plural/namespace/name."""

        async def read() -> dict[str, Any]:
            return {f"{r.group}/{r.version}/{r.plural}/{ns}/{name}": obj.raw
                    for (r, ns, name), obj in self.handler.objects.items() if not obj.deleted}

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(10)


@contextlib.contextmanager
def kube_server(patch: Callable[[Any, str, Any], None]) -> Iterator[KubeServer]:
    """kmock in a thread of its own; `patch(obj, name, value)` installs the path fix (monkeypatch.setattr)."""
    from kmock import KubernetesEmulator, Server
    from kmock._internal import parsing

    patch(parsing, "parse_path", parse_path_with_namespaces(parsing.parse_path))

    class Emulator(KubernetesEmulator):  # type: ignore[misc]
        async def _serve_list(self, request: Any) -> Any:
            payload = await super()._serve_list(request)
            labels, fields = request.params.get("labelSelector"), request.params.get("fieldSelector")
            payload["items"] = [o for o in payload["items"] if selected(o, labels, fields)]
            return payload

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async with Emulator() as handler, Server(handler) as srv:
            for r in RESOURCES:
                handler.resources[r] = {}
            box.update(handler=handler, url=str(srv.url).rstrip("/"), stop=asyncio.Event())
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), name="kmock", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("kmock did not start")
    try:
        yield KubeServer(box["url"], box["handler"], loop)
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)


def install_doubles(bin_dir: Any, python: str) -> None:
    """`eksctl`, `helm` and `kubectl` shims in bin_dir that run the doubles with this Python."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    for tool in ("eksctl", "helm", "kubectl"):
        shim = Path(bin_dir) / tool
        shim.write_text(f'#!/bin/sh\nexec "{python}" "{here / (tool + ".py")}" "$@"\n')
        shim.chmod(0o755)
