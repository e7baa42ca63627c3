"""The local stand-ins `raydlc up` talks to: a moto server and kmock with its gaps filled.

Used by tests/lifecycle/conftest.py and benchmarks/up_critical_path.py. moto 5.2's CloudFormation
keeps a stack's EnableTerminationProtection but neither honours it nor offers UpdateTerminationProtection,
its EKS accepts control-plane subnets in any zone, and its server sends a presigned STS GET (an EKS
token replayed) to S3; all three are filled here (`fill_cloudformation_gaps`, `fill_eks_gaps`,
`fill_presigned_sts_gap`), as AWS behaves. kmock 0.8's gaps are
filled here too, never in raydlc: Namespace paths are parsed as the cluster-scoped resource they
are (kmock reads /api/v1/namespaces/NAME as a namespaced path and fails), list requests
honour labelSelector and fieldSelector, and every resource raydlc lists is declared, so an
empty kind lists as [] the way a real API server answers, not 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESOURCES = [
    "v1/namespaces", "v1/nodes", "v1/pods", "v1/secrets", "v1/events", "v1/serviceaccounts", "v1/configmaps", "v1/services",
    "apps/v1/deployments", "apps/v1/daemonsets", "networking.k8s.io/v1/networkpolicies",
    "apiextensions.k8s.io/v1/customresourcedefinitions", "ray.io/v1/rayclusters", "ray.io/v1/rayjobs",
    "rbac.authorization.k8s.io/v1/roles", "rbac.authorization.k8s.io/v1/rolebindings",
]


def fill_cloudformation_gaps() -> None:
    """Termination protection as CloudFormation has it, in this process's moto (the server runs in a thread).

    DeleteStack of a protected stack is refused with AWS's 400 ValidationError ("Stack [NAME] cannot be
    deleted while TerminationProtection is enabled") and leaves the stack as it was;
    UpdateTerminationProtection sets the flag and answers the StackId. Installed once per process.
    """
    from moto.cloudformation.exceptions import ValidationError
    from moto.cloudformation.models import CloudFormationBackend
    from moto.cloudformation.responses import CloudFormationResponse
    from moto.core.responses import ActionResult

    if getattr(CloudFormationBackend, "_protection_honoured", False):
        return
    original = CloudFormationBackend.delete_stack

    def live(backend: Any, name_or_id: str) -> Any:
        return backend.stacks.get(name_or_id) or next((s for s in backend.stacks.values() if s.name == name_or_id), None)

    def delete_stack(backend: Any, name_or_stack_id: str) -> None:
        stack = live(backend, name_or_stack_id)
        if stack is not None and stack.enable_termination_protection:
            raise ValidationError(message=f"Stack [{name_or_stack_id}] cannot be deleted while TerminationProtection is enabled")
        original(backend, name_or_stack_id)

    def update_termination_protection(response: Any) -> Any:
        name = response._get_param("StackName")
        flag = response._get_param("EnableTerminationProtection")
        stack = live(response.cloudformation_backend, name)
        if stack is None:
            raise ValidationError(name)
        stack.enable_termination_protection = flag is True or str(flag).lower() == "true"
        return ActionResult({"StackId": stack.stack_id})

    CloudFormationBackend.delete_stack = delete_stack  # type: ignore[method-assign]
    CloudFormationResponse.update_termination_protection = update_termination_protection  # type: ignore[attr-defined]
    CloudFormationBackend._protection_honoured = True  # type: ignore[attr-defined]


# The zone IDs EKS refuses control-plane subnets in (eksctl v0.230.0 `pkg/az/az.go` `zoneIDsToAvoid`).
EKS_REFUSED_ZONE_IDS = {"us-east-1": {"use1-az3"}, "us-west-1": {"usw1-az2"}, "ca-central-1": {"cac1-az3"}}


def fill_eks_gaps() -> None:
    """EKS's refusal of a control plane with a subnet in those zone IDs, which moto 5.2 lacks.

    CreateCluster answers 400 UnsupportedAvailabilityZoneException with EKS's message. Under eksctl the
    control plane is a resource of the `eksctl-<name>-cluster` stack, so CloudFormation rolls that stack
    back: it is left ROLLBACK_COMPLETE (still termination-protected) with the AWS::EKS::Cluster resource's
    CREATE_FAILED event. The eksctl double creates the cluster beside its stack, so that is done here.
    """
    from moto.cloudformation.models import Event, cloudformation_backends
    from moto.ec2.models import ec2_backends
    from moto.eks.exceptions import EKSError
    from moto.eks.models import EKSBackend

    if getattr(EKSBackend, "_zones_refused", False):
        return

    class UnsupportedAvailabilityZoneException(EKSError):
        TYPE = "UnsupportedAvailabilityZoneException"
        STATUS = 400

    original = EKSBackend.create_cluster

    def create_cluster(backend: Any, name: str, role_arn: str, resources_vpc_config: dict[str, Any], *args: Any,
                       **kw: Any) -> Any:
        ec2 = ec2_backends[backend.account_id][backend.region_name]
        subnets = [ec2.get_subnet(s) for s in resources_vpc_config.get("subnetIds") or []]
        bad = sorted({s.availability_zone for s in subnets
                      if s.availability_zone_id in EKS_REFUSED_ZONE_IDS.get(backend.region_name, set())})
        if not bad:
            return original(backend, name, role_arn, resources_vpc_config, *args, **kw)
        good = sorted(z.name for z in ec2.describe_availability_zones() if z.name not in bad)
        message = (f"Cannot create cluster '{name}' because {bad[0]}, the targeted availability zone, does not currently "
                   f"have sufficient capacity to support the cluster. Retry and choose from these availability zones: "
                   f"{', '.join(good)}")
        cfn = cloudformation_backends[backend.account_id][backend.region_name]
        for st in cfn.stacks.values():
            if st.name == f"eksctl-{name}-cluster":
                st.status = "ROLLBACK_COMPLETE"
                st.events.append(Event(stack_id=st.stack_id, stack_name=st.name, logical_resource_id="ControlPlane",
                                       physical_resource_id="", resource_type="AWS::EKS::Cluster",
                                       resource_status="CREATE_FAILED", resource_status_reason=message,
                                       resource_properties=None))
        raise UnsupportedAvailabilityZoneException(clusterName=name, message=message, validZones=good)

    EKSBackend.create_cluster = create_cluster  # type: ignore[method-assign]
    EKSBackend._zones_refused = True  # type: ignore[attr-defined]


def fill_presigned_sts_gap() -> None:
    """Route a presigned STS GET (an EKS token replayed, as the EKS authenticator does) to moto's STS.

    moto's server picks the service from the Authorization header; a presigned request carries its
    credential scope in the `X-Amz-Credential` query parameter instead, so moto sent it to S3.
    """
    from urllib.parse import parse_qs

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    if getattr(DomainDispatcherApplication, "_presigned_sts", False):
        return
    original = DomainDispatcherApplication.infer_service_region_host

    def infer(app: Any, environ: dict[str, Any], path: str) -> str | None:
        scope = (parse_qs(environ.get("QUERY_STRING", "")).get("X-Amz-Credential") or [""])[0].split("/")
        if not environ.get("HTTP_AUTHORIZATION") and len(scope) == 5 and scope[3] == "sts":
            return f"sts.{scope[2]}.amazonaws.com"
        return original(app, environ, path)

    DomainDispatcherApplication.infer_service_region_host = infer  # type: ignore[method-assign]
    DomainDispatcherApplication._presigned_sts = True  # type: ignore[attr-defined]


def fill_head_bucket_gap() -> None:
    """HeadBucket authorised as `s3:ListBucket`, as S3 does (API Reference "HeadBucket", Permissions); moto 5.2
    asks its IAM enforcement for an `s3:HeadBucket` action that does not exist, which no real policy grants."""
    from moto.s3.responses import ACTION_MAP

    ACTION_MAP["BUCKET"]["HEAD"]["DEFAULT"] = "ListBucket"


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    fill_head_bucket_gap()
    fill_cloudformation_gaps()
    fill_eks_gaps()
    fill_presigned_sts_gap()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def moto_process() -> Iterator[str]:
    """`moto_server()` in a process of its own. ThreadedMotoServers in one process share moto's backends, its
    auth switch (`/moto-api/reset-auth`) and its request count, so a test that turns IAM enforcement on sees
    whatever other modules of the same pytest worker left there; this one sees only what its test made."""
    code = "import sys\nsys.path.insert(0, sys.argv[1])\nimport servers\nwith servers.moto_server() as url:\n    print(url, flush=True)\n    sys.stdin.read()\n"
    proc = subprocess.Popen([sys.executable, "-c", code, str(Path(__file__).parent)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip() if proc.stdout else ""
        if not url.startswith("http://"):
            raise RuntimeError(f"moto did not start in its own process (exit {proc.poll()})")
        yield url
    finally:
        if proc.stdin:
            proc.stdin.close()  # the server stops when its stdin ends
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def fresh_moto(url: str) -> Iterator[str]:
    """`url` reset first: moto's backends are per-process state, so a second server in one pytest worker
    still holds an earlier module's buckets (BucketAlreadyOwnedByYou on a fixture's create_bucket)."""
    reset_moto(url)
    yield url


def reset_moto(url: str, warm_regions: tuple[str, ...] = ()) -> None:
    """A fresh moto; `warm_regions` get their EC2 backend built now, with a long timeout.

    moto builds a region's EC2 backend (default VPC, AMIs, offerings) on its first request, which on a
    loaded machine outlasts raydlc's 8 s read timeout and fails the test's first real call instead.
    """
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", data=b"", method="POST"), timeout=30).read()
    for region in warm_regions:
        warm(url, region)


def warm(url: str, region: str) -> None:
    """Build moto's backends of `region` now (EC2; S3, STS, CloudFormation and IAM for the storage step and
    eksctl's pod identity role stacks), with a timeout long enough for a loaded machine."""
    import boto3
    from botocore.config import Config

    patient = Config(read_timeout=300, retries={"max_attempts": 1})

    def client(service: str) -> Any:
        return boto3.client(service, region_name=region, endpoint_url=url, aws_access_key_id="testing",
                            aws_secret_access_key="testing", config=patient)

    client("ec2").describe_availability_zones()
    client("s3").list_buckets()
    client("sts").get_caller_identity()
    client("cloudformation").list_stacks()
    client("iam").list_roles()


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
def kube_server(patch: Callable[[Any, str, Any], None], *, gate: Callable[[Any, Any], tuple[int, Any] | None] | None = None,
                resources: tuple[str, ...] = ()) -> Iterator[KubeServer]:
    """kmock in a thread of its own; `patch(obj, name, value)` installs the path fix (monkeypatch.setattr).

    `gate(request, handler)`, when given, sees every request first and may answer it itself with (status, body):
    the platform world's RBAC (tests/doubles/platform_world.py) refuses there what Kubernetes' authorizer would.
    `resources` are declared beside RESOURCES (a cluster's own custom resources: Karpenter NodePools)."""
    from kmock import KubernetesEmulator, Server
    from kmock._internal import parsing

    patch(parsing, "parse_path", parse_path_with_namespaces(parsing.parse_path))

    class Emulator(KubernetesEmulator):  # type: ignore[misc]
        async def _serve_list(self, request: Any) -> Any:
            payload = await super()._serve_list(request)
            labels, fields = request.params.get("labelSelector"), request.params.get("fieldSelector")
            payload["items"] = [o for o in payload["items"] if selected(o, labels, fields)]
            return payload

        async def _handle(self, request: Any) -> Any:
            # kmock 0.8 logs every request and matches each new one by running every reaction's filter over the
            # whole log (RawHandler._handle: `request in payload._source`): quadratic in a test that polls, and
            # most of a lifecycle test's CPU. No test reads the log, so it keeps only the requests in flight:
            # the one being matched is always among them.
            inflight.add(id(request))
            self._requests[:] = [r for r in self._requests if id(r) in inflight]
            try:
                answer = gate(request, self) if gate is not None else None
                if answer is None:
                    return await super()._handle(request)
                import aiohttp.web

                return aiohttp.web.json_response(answer[1], status=answer[0])
            finally:
                inflight.discard(id(request))

    inflight: set[int] = set()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async with Emulator() as handler, Server(handler) as srv:
            for r in (*RESOURCES, *resources):
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


def lifecycle_world(name: str) -> Any:
    """tests/lifecycle/conftest.py (moto, kmock, the tool doubles, the emulated KubeRay operator) loaded
    as module `name`, for test modules elsewhere that reuse its fixtures."""
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "lifecycle" / "conftest.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def write_kubeconfig(path: Any, server_url: str) -> None:
    """A kubeconfig whose one context is kmock at `server_url` (where raydlc keeps a cluster's: ~/.raydlc/<name>-<region>/)."""
    import json
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": server_url}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}], "users": [{"name": "u", "user": {"token": "t"}}]}))


def doubles_env(tmp: Any, python: str, forward: dict[str, str]) -> tuple[dict[str, str], Any]:
    """The tool doubles on PATH with a scenario whose `kubectl port-forward`s go to `forward`'s addresses:
    the environment for a CLI run, and the doubles' call log."""
    import json
    import os
    from pathlib import Path

    bin_dir = Path(tmp) / "bin"
    bin_dir.mkdir()
    install_doubles(bin_dir, python)
    scenario, log = Path(tmp) / "scenario.json", Path(tmp) / "calls.jsonl"
    scenario.write_text(json.dumps({"forward": forward}))
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "DOUBLES_SCENARIO": str(scenario), "DOUBLES_LOG": str(log)}, log


@contextlib.contextmanager
def refusing_sts() -> Iterator[str]:
    """An STS that refuses every signature, as AWS does for expired or bad credentials (HTTP 403, its error XML)."""
    import http.server

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (b"<ErrorResponse><Error><Type>Sender</Type><Code>InvalidClientTokenId</Code>"
                    b"<Message>The security token included in the request is invalid.</Message></Error></ErrorResponse>")
            self.send_response(403)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # an API call (boto3 sends STS calls as POST): refused the same way
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.do_GET()

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
