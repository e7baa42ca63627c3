"""Reaching a Ray head for one command: which target, and its dashboard for as long as the command runs.

Three targets, one channel. `--local` is a Ray head on this machine that raydlc starts when
none of its own runs, records (PID, start time, dashboard) in its state directory, leaves up for
the next `job` and `verify` commands, and ends by that PID with `raydlc down --local` — never
Ray's own stop command, which would end every Ray on the machine. `--address URL` is a dashboard the user
already reaches. The cluster is reached through a port-forward to the head Service that raydlc
opens on 127.0.0.1 and closes when the command ends. Whatever the target, `reach` yields one
`Reached`: the target, its `Dashboard` (the only HTTP edge to the head) and, on a cluster, the
Kubernetes gateway it was found through.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final, Literal

from pydantic import Field

from raydlc.edges.ray_dashboard import Dashboard, address_token
from raydlc.errors import InputError, RayError
from raydlc.records import Record, RecordError, read_json

if TYPE_CHECKING:
    from filelock import FileLock

    from raydlc.config import Config
    from raydlc.edges.kube import Kube
    from raydlc.edges.tools import Runner

TargetKind = Literal["local", "address", "cluster"]
LOCAL: Final = "local"
ADDRESS: Final = "address"
CLUSTER: Final = "cluster"
HEAD_RECORD = "head.json"
HEAD_START_TIMEOUT_S = 180.0
STARTING = "starting raydlc's local Ray head; it stays up for `job` and `verify` (`raydlc down --local` ends it)"


@dataclass(frozen=True)
class JobTarget:
    """The Ray head a job command talks to, as the flags named it (`--local`, `--address URL`, or the config's cluster)."""

    kind: TargetKind
    address: str | None = None  # the dashboard URL given with --address

    @property
    def flag(self) -> str:
        """How a later command names the same target (for hints)."""
        return {LOCAL: " --local", ADDRESS: f" --address {self.address}", CLUSTER: ""}[self.kind]

    @property
    def where(self) -> str:
        return f"the {self.kind} target"


def choose(local: bool, address: str | None) -> JobTarget:
    if local and address:
        raise InputError("--local and --address name two different targets", hint="choose one")
    if local:
        return JobTarget(LOCAL)
    if address is not None:
        return JobTarget(ADDRESS, normalize_url(address))
    return JobTarget(CLUSTER)


def normalize_url(address: str) -> str:
    """A dashboard URL from what people type: host:port, http://host:port[/]."""
    a = address.strip()
    if "://" not in a:
        a = f"http://{a}"
    scheme, _, rest = a.partition("://")
    host, _, port = rest.rstrip("/").partition(":")
    if scheme not in ("http", "https") or not host or "/" in host or (port and not port.split("/")[0].isdigit()):
        raise InputError(f"--address {address!r} is not a Ray dashboard URL", hint="e.g. --address http://127.0.0.1:8265 (the dashboard port, not the GCS port)")
    return a.rstrip("/")


# ---- the local head ------------------------------------------------------------------------------


def state_dir() -> Path:
    """raydlc's own state on this machine (the lifecycle keeps each cluster's kubeconfig beside it)."""
    return Path.home() / ".raydlc"


def local_dir() -> Path:
    return state_dir() / "local"


class HeadRecord(Record):
    """The local head raydlc started: enough to find it again and to end exactly it."""

    pid: Annotated[int, Field(gt=1)]  # 0, -1 and 1 name a group, every process or init: never a head raydlc started
    start_ticks: int | None  # the process's start time: a PID reused by another program is not taken for the head
    dashboard_url: str
    address: str
    temp_dir: str
    log: str
    python: str
    started_at: float


@dataclass(frozen=True)
class HeadClaim:
    """The head record as read and checked: `record` is used only when `doubt` is None.

    A record is a claim, not a fact: a PID that ended and was reused, a file edited by hand or
    written by an older raydlc without a start time could otherwise make raydlc end someone
    else's process or delete a directory it never made.
    """

    path: Path
    record: HeadRecord | None
    doubt: str | None  # why the record is not believed; None when it names raydlc's running head

    @property
    def report(self) -> str:
        return f"local head record {self.path}, not believed ({self.doubt}); nothing it names was touched"


def _doubt(rec: HeadRecord) -> str | None:
    """Why `rec` does not name raydlc's running head: the PID, its start time, its command line."""
    from raydlc.edges.local_head import is_head_command, process_alive, start_ticks

    if not process_alive(rec.pid):
        return f"PID {rec.pid} is not running"
    if rec.start_ticks is None:
        return f"it records no start time for PID {rec.pid}"
    if start_ticks(rec.pid) != rec.start_ticks:
        return f"PID {rec.pid} is a process that started after the head did"
    if not is_head_command(rec.pid, rec.temp_dir):
        return f"PID {rec.pid} is not raydlc's Ray head with temp dir {rec.temp_dir[:120]}"
    return None


def check_record() -> HeadClaim | None:
    """The head record checked against the process it names; None when there is no record. Reads only."""
    path = local_dir() / HEAD_RECORD
    if not path.exists() and not path.is_symlink():
        return None
    try:
        rec = read_json(path, HeadRecord)
    except RecordError as e:
        return HeadClaim(path, None, f"damaged: {e}")
    return HeadClaim(path, rec, _doubt(rec))


def running_head() -> HeadRecord | None:
    """raydlc's local head when its record's claim holds; None otherwise. Never deletes anything."""
    claim = check_record()
    return claim.record if claim is not None and claim.doubt is None else None


def forget(claim: HeadClaim) -> None:
    """Remove the head record, only the record: whatever it names is left as it is."""
    with contextlib.suppress(FileNotFoundError):
        claim.path.unlink()


def _locked() -> FileLock:
    """One raydlc at a time decides whether to start the head: two submits never start two (an flock,
    which the system drops with the process that held it)."""
    from filelock import FileLock

    d = local_dir()
    d.mkdir(parents=True, exist_ok=True)
    return FileLock(d / "head.lock")


def local_gpus(env: Mapping[str, str] | None = None, driver_dir: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    """NVIDIA GPUs a local head would see, without loading CUDA: CUDA_VISIBLE_DEVICES when set (Ray honours it),
    else the devices the NVIDIA driver lists; 0 on a machine without the driver."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return sum(1 for _ in driver_dir.iterdir())
    except OSError:
        return 0


def local_cpus() -> int:
    """CPUs the local head advertises: the machine's, and at least 4, so a job's two workers, its
    driver and a probe task or a second job fit on a small laptop (oversubscribing is harmless here)."""
    return max(os.cpu_count() or 1, 4)


def ensure_local_head(*, start: bool, on_start: Callable[[], None] | None = None,
                      on_doubt: Callable[[str], None] | None = None) -> HeadRecord:
    """raydlc's running local head; started (and recorded) when none runs and `start` is set.

    A record that is not believed stops a command that only reads (the error says which check
    failed); one that starts a head removes that record, says so through `on_doubt`, and starts anew.
    """
    with _locked() if start else contextlib.nullcontext():  # a command that only reads writes not even the lock
        claim = check_record()
        if claim is not None and claim.doubt is None and claim.record is not None:
            rec = claim.record
            with contextlib.suppress(RayError):
                Dashboard(rec.dashboard_url).version()
                return rec
            raise RayError(f"raydlc's local Ray head (PID {rec.pid}) runs but its dashboard {rec.dashboard_url} does not answer",
                           hint="raydlc down --local")
        if not start:
            if claim is not None:
                raise RayError(f"no local Ray head of raydlc runs: the {claim.report}", hint="raydlc down --local")
            raise RayError("no local Ray head of raydlc runs", hint="raydlc submit --local --builtin")
        if claim is not None:
            forget(claim)
            if on_doubt is not None:
                on_doubt(f"removed the {claim.report}")
        if on_start is not None:
            on_start()
        return _start_and_record()


def _start_and_record() -> HeadRecord:
    """Start the head and write its record atomically (the caller holds the lock)."""
    from raydlc.edges import local_head

    d = local_dir()
    head = local_head.start_head(num_cpus=local_cpus(), log_dir=d, cwd=d, timeout=HEAD_START_TIMEOUT_S)
    rec = HeadRecord(
        pid=head.process.pid, start_ticks=local_head.start_ticks(head.process.pid), dashboard_url=head.dashboard_url,
        address=head.address, temp_dir=str(head.temp_dir), log=str(head.log), python=sys.executable, started_at=time.time(),
    )
    tmp = d / f".{HEAD_RECORD}.tmp"
    tmp.write_text(rec.model_dump_json(indent=2) + "\n")
    tmp.replace(d / HEAD_RECORD)
    return rec


def stop_local_head(timeout: float = 30.0) -> HeadRecord | None:
    """End raydlc's local head by its recorded PID (and its process group); None when none runs."""
    from raydlc.edges.local_head import end_head

    with _locked():
        claim = check_record()
        if claim is None or claim.doubt is not None or claim.record is None:
            return None
        rec = claim.record
        end_head(rec.pid, Path(rec.temp_dir), timeout=timeout)  # the temp dir goes only if it holds raydlc's marker
        forget(claim)
        return rec


# ---- the cluster: the head Service through a port-forward ------------------------------------------

DASHBOARD_PORT = 8265  # KubeRay's head Service names it "dashboard"
FORWARD_TIMEOUT_S = 60.0
FORWARDED_PROBE_S = 30.0  # the first answer through a fresh port-forward can take a while


@dataclass(frozen=True)
class ClusterHead:
    """The RayCluster's head as Kubernetes shows it: what a port-forward needs."""

    namespace: str
    cluster: str
    pod: str
    service: str
    port: int


def find_head(kube: Kube, cfg: Config) -> ClusterHead:
    """The head pod (Ready) and Service of the configured RayCluster, or an error saying which is missing."""
    from raydlc.edges import kube as k8s

    ns, name = cfg.cluster.namespace, cfg.ray.cluster_name
    if kube.get("ray.io/v1", "RayCluster", name, ns) is None:
        raise InputError(f"no RayCluster {name!r} in namespace {ns!r} (RAY_CLUSTER_NAME, NAMESPACE)", hint="`raydlc up` creates it; `raydlc status` shows what exists")
    heads = kube.pods(ns, labels={"ray.io/cluster": name, "ray.io/node-type": "head"})
    if not heads:
        raise RayError(f"RayCluster {name!r} has no head pod yet", hint="is the KubeRay operator running? `raydlc status` shows the pods")
    ready = [p for p in heads if k8s.pod_ready(p)]
    if not ready:
        p = heads[0]
        raise RayError(f"the head pod {k8s.name_of(p)} of RayCluster {name!r} is not Ready ({k8s.pending_reason(p, kube.events(ns))})",
                       hint="`raydlc status` shows the pods; wait for `raydlc up` to finish")
    services = kube.list("v1", "Service", ns, labels={"ray.io/cluster": name, "ray.io/node-type": "head"})
    svc = next((s for s in services if k8s.name_of(s) == f"{name}-head-svc"), services[0] if services else None)
    if svc is None:
        raise RayError(f"RayCluster {name!r} has no head Service", hint="KubeRay creates <cluster>-head-svc with the head pod; `raydlc status` shows the cluster")
    ports = (svc.get("spec") or {}).get("ports") or []
    port = next((int(p["port"]) for p in ports if p.get("name") == "dashboard"), DASHBOARD_PORT)
    return ClusterHead(ns, name, k8s.name_of(ready[0]), k8s.name_of(svc), port)


@contextlib.contextmanager
def port_forward(runner: Runner, kubeconfig: Path, head: ClusterHead, context: str | None = None) -> Iterator[str]:
    """`kubectl port-forward` to the head Service's dashboard port on 127.0.0.1, for one command (at `context`
    of the kubeconfig when given: an attached cluster's KUBE_CONTEXT)."""
    from raydlc.edges.tools import ToolFailed, command

    at = ("--context", context) if context else ()
    cmd = command("kubectl", "--kubeconfig", str(kubeconfig), *at, "-n", head.namespace, "port-forward", f"svc/{head.service}",
                  f":{head.port}", "--address", "127.0.0.1", mutates=False)
    with runner.start(cmd) as running:
        try:
            m = running.wait_for(r"Forwarding from 127\.0\.0\.1:(\d+)", FORWARD_TIMEOUT_S)
        except ToolFailed as e:
            last = next((ln for ln in reversed(e.lines) if ln.strip()), "")
            forbidden = " is forbidden: " in last  # the API server refused this user the port-forward (RBAC)
            hint = (f"`raydlc render --only rbac` prints the Role that grants it in {head.namespace}" if forbidden
                    else "`raydlc status` shows whether the head is up; kubectl must reach the cluster")
            raise RayError(f"cannot port-forward to {head.service}:{head.port} in {head.namespace}: {e.message}" + (f" ({last.strip()})" if last else ""),
                           hint=hint) from None
        yield f"http://127.0.0.1:{m.group(1)}"


# ---- the head's token ---------------------------------------------------------------------------------


def cluster_token(kube: Kube, cfg: Config) -> str:
    """The token the RayCluster's pods started with: the Secret `raydlc up` created (render/auth.py), through the gateway."""
    import base64
    import binascii

    from raydlc.render import auth

    ns, name = cfg.cluster.namespace, auth.secret_name(cfg)
    secret = kube.get("v1", "Secret", name, ns)
    fix = ("`raydlc up --yes` creates a new token Secret and recreates the Ray pods (KubeRay reads the token into a pod's "
           "environment when it starts, so the running head keeps the old one); running jobs stop")
    if secret is None:
        raise RayError(f"the Ray token Secret {ns}/{name} is missing (deleted by hand?): raydlc cannot authenticate to the head", hint=fix)
    raw = ((secret.get("data") or {}).get(auth.SECRET_KEY) or "").strip()
    try:
        token = base64.b64decode(raw, validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        token = ""
    if not token:
        raise RayError(f"the Ray token Secret {ns}/{name} has no usable key {auth.SECRET_KEY!r}", hint=fix)
    from raydlc.edges.ray_dashboard import check_token

    return check_token(token, f"the Ray token Secret {ns}/{name}")


# ---- one head per command ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reached:
    """A target for the length of one command: its dashboard, and on a cluster its Kubernetes API."""

    target: JobTarget
    dashboard: Dashboard
    kube: Kube | None = None
    head: ClusterHead | None = None


@contextlib.contextmanager
def reach(target: JobTarget, cfg: Config | None = None, *, start_local: bool = False,
          on_start: Callable[[], None] | None = None, on_doubt: Callable[[str], None] | None = None) -> Iterator[Reached]:
    """The dashboard of `target` for one command, checked to answer; a cluster's port-forward is closed when it ends."""
    if target.kind == LOCAL:
        yield Reached(target, Dashboard(ensure_local_head(start=start_local, on_start=on_start, on_doubt=on_doubt).dashboard_url))
    elif target.kind == ADDRESS:
        assert target.address is not None
        dash = Dashboard(target.address, token=address_token(),
                         token_hint="set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to a file, to that head's token (as for Ray's own CLI)")
        dash.version()
        yield Reached(target, dash)
    else:
        from raydlc.edges.kube import Kube, load_client
        from raydlc.edges.tools import Runner
        from raydlc.lifecycle.context import kube_target, with_plain_kubeconfig
        from raydlc.render.auth import secret_name

        assert cfg is not None
        kubeconfig, context = kube_target(with_plain_kubeconfig(cfg))
        kube = Kube(load_client(kubeconfig, context))
        head = find_head(kube, cfg)
        token = cluster_token(kube, cfg)
        with port_forward(Runner(), kubeconfig, head, context) as url:
            dash = Dashboard(url, token=token, token_hint=(
                f"the head keeps the token its pod started with (KubeRay reads the Secret then): if {head.namespace}/"
                f"{secret_name(cfg)} was made anew, restart the Ray pods: kubectl -n {head.namespace} delete pods "
                f"-l ray.io/cluster={cfg.ray.cluster_name} (KubeRay creates them again; running jobs stop)"))
            dash.version(timeout=FORWARDED_PROBE_S)
            yield Reached(target, dash, kube, head)
