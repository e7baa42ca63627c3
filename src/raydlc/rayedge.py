"""The one place raydlc starts or joins Ray, and where Ray's errors become raydlc's.

Training and the preflight reach Ray through here (jobs go through the head's dashboard, in
`raydlc.dashboard`): join an address (`RAY_ADDRESS`, `--address`, `auto` inside a job) or start an
in-process local Ray, with the workers' environment and the log settings decided once. A Ray started here is shut
down here; one already running in the process is used as it is. `LocalHead` starts a real
head as a subprocess (`ray start --head --block`) on explicit free ports, so a driver in
another process can join it by address, as it would join a cluster's head through a
port-forward; it is ended by its own PID, never by `ray stop` — also from a later process
(`end_head`, for the local head `raydlc submit --local` leaves up).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydlc.errors import InputError, RaydlcError, RayError, TrainError
from raydlc.files import make_owned_dir, remove_owned_dir

# Ray Train's controller polls its workers at this interval and a report waits for the poll:
# at the default 2 s a report costs ~1.3 s. 1 s keeps reports every N steps from waiting
# without polling a 2-core machine four times a second. A value in the environment wins.
WORKER_ENV: dict[str, str] = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "1.0",
    "TOKENIZERS_PARALLELISM": "false",
}


# A local run on one machine starts only what it uses. Ray's own background work competes with the
# training workers for the same cores (measured on 2 cores: benchmarks/ray_vs_torchrun.py --cpu), so
# what nothing reads locally is switched off: usage reporting; Ray Train's preemption watcher
# (an actor polling for node drains: one machine is not preempted) and its Prometheus metrics;
# each process's task-event stream to the GCS (the state API's task table) and metrics export
# (the dashboard's graphs; there is no dashboard). The log monitor, which forwards worker output
# only with --debug, looks for new log files every 2 s instead of 10 times a second.
# A value in the environment wins.
LOCAL_ENV: dict[str, str] = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "2",
}
LOCAL_SYSTEM_CONFIG: dict[str, Any] = {
    "task_events_report_interval_ms": 0,
    "enable_metrics_collection": False,
}


def worker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every Ray worker raydlc starts: WORKER_ENV, the caller's values, `extra`."""
    base = {k: os.environ.get(k, v) for k, v in WORKER_ENV.items()}
    return {**base, **(extra or {})}


def address_from_env() -> str | None:
    return os.environ.get("RAY_ADDRESS") or None


@contextlib.contextmanager
def connected(
    address: str | None = None,
    *,
    workers: int = 0,
    log_to_driver: bool = True,
    env: Mapping[str, str] | None = None,
) -> Iterator[None]:
    """Ray for the duration of the block: the running one, `address` (or RAY_ADDRESS), or a local one.

    A local Ray gets at least one CPU per worker (`workers`), no dashboard, none of the
    background work in LOCAL_ENV / LOCAL_SYSTEM_CONFIG, and the workers' environment as its job
    runtime env; it is shut down when the block ends.
    """
    import ray

    if ray.is_initialized():
        yield
        return
    address = address or address_from_env()
    local = not address
    env_vars = worker_env({**({k: os.environ.get(k, v) for k, v in LOCAL_ENV.items()} if local else {}), **(env or {})})
    kw: dict[str, Any] = {"runtime_env": {"env_vars": env_vars}, "log_to_driver": log_to_driver}
    if not log_to_driver:
        kw["logging_level"] = logging.WARNING
    if address:
        check_reachable(address)
    # The driver's environment too: the processes a local ray.init starts inherit it. Undone at the end.
    added = {k: v for k, v in env_vars.items() if k not in os.environ}
    os.environ.update(added)
    try:
        try:
            if address:
                ray.init(address=address, **kw)
            else:
                # "local": a new instance even when a `ray start` head on this machine is recorded in
                # /tmp/ray/ray_current_cluster (ray.init() would join that one, someone else's perhaps).
                ray.init(
                    address="local", num_cpus=max(os.cpu_count() or 1, workers), include_dashboard=False,
                    _system_config=dict(LOCAL_SYSTEM_CONFIG), **kw,  # a copy: Ray adds its own keys to the dict
                )
        except Exception as e:
            raise connect_error(e, address) from e
        try:
            yield
        finally:
            ray.shutdown()
    finally:
        for k in added:
            os.environ.pop(k, None)


def check_reachable(address: str) -> None:
    """A host:port that nothing answers on fails here at once: ray.init would wait for it forever."""
    from raydlc.storage import is_uri

    if address == "auto" or is_uri(address):  # ray://… goes through Ray Client and its own timeout
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"Ray address {address!r} is not host:port", hint="give the head's GCS address, e.g. 127.0.0.1:6379, or ray://host:10001")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as e:
        raise RayError(
            f"cannot reach Ray at {address}: {e.strerror or e}",
            hint="check that the head is running and the address (host:port of its GCS) is right; through a port-forward, that it is open",
        ) from e


def connect_error(e: BaseException, address: str | None) -> RaydlcError:
    """ray.init's failures, as one message a person can act on."""
    cause = root_cause(e)
    if address is None:
        return RayError(f"cannot start a local Ray: {cause}", hint="see Ray's logs under /tmp/ray/session_latest/logs")
    if isinstance(e, ValueError) and "address" in str(e).lower():
        return InputError(f"Ray address {address!r}: {cause}", hint="give the head's host:port (GCS, e.g. 127.0.0.1:6379) or ray://host:10001")
    return RayError(
        f"cannot reach Ray at {address}: {cause}",
        hint="check that the head is running and the address (host:port of its GCS) is right; through a port-forward, that it is open",
    )


def run_error(e: BaseException, what: str, hint: str) -> RaydlcError:
    """A failed Ray Train run (Ray wraps worker errors in its own types) as one raydlc error.

    A raydlc error raised on a worker (or in the controller) is that error again, with its own
    message, hint and exit code, as if it had been raised here; any other worker exception is
    its last line, with the rank that raised it.
    """
    failures = _failures(e)
    for _rank, err in failures:
        found = _raydlc_in(err)
        if found is not None:
            return found
    found = _raydlc_in(e)
    if found is not None:
        return found
    if failures:
        rank, err = failures[0]
        where = f"rank {rank}: " if rank is not None else ""
        return TrainError(f"{what} failed: {where}{root_cause(err)}", hint=hint)
    return TrainError(f"{what} failed: {root_cause(e)}", hint=hint)


def _failures(e: BaseException) -> list[tuple[int | None, BaseException]]:
    """What Ray Train's errors carry: each failed worker's exception by rank (lowest first), or the controller's."""
    seen: BaseException | None = e
    while seen is not None:
        per_rank = getattr(seen, "worker_failures", None)
        if isinstance(per_rank, dict) and per_rank:
            return [(int(r), x) for r, x in sorted(per_rank.items()) if isinstance(x, BaseException)]
        controller = getattr(seen, "controller_failure", None)
        if isinstance(controller, BaseException):
            return [(None, controller)]
        seen = seen.__cause__
    return []


def _raydlc_in(e: BaseException) -> RaydlcError | None:
    """The raydlc error `e` is or wraps (Ray's RayTaskError subclasses the user's error class too)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, RaydlcError):
            return seen
        cause = getattr(seen, "cause", None)  # RayTaskError keeps the original as .cause
        if isinstance(cause, RaydlcError):
            return cause
        seen = seen.__cause__
    return None


def root_cause(e: BaseException) -> str:
    """The last line of the innermost cause: what actually went wrong, without Ray's wrapping."""
    seen = e
    while seen.__cause__ is not None:
        seen = seen.__cause__
    text = [line for line in str(seen).strip().splitlines() if line.strip()]
    last = text[-1].strip() if text else ""
    return last if last and not last.endswith(":") else f"{type(seen).__name__}{': ' + last if last else ''}"


def cluster_resources() -> dict[str, float]:
    import ray

    return dict(ray.cluster_resources())


def node_capacities(resource: str, *, at_least: int = 0, wait_s: float = 0.0) -> list[int]:
    """How many of `resource` (GPU, CPU) each alive node has: the worker slots Ray can grant.

    With `wait_s`, waits until the nodes together have `at_least` (pods of a new cluster join
    one by one) or the time is up, then answers with what there is.
    """
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        caps = [int(n["Resources"].get(resource, 0)) for n in ray.nodes() if n.get("Alive") and n["Resources"].get(resource, 0) >= 1]
        if sum(caps) >= at_least or time.monotonic() >= deadline:
            return caps
        time.sleep(2.0)


def await_resources(resource: str, count: int, *, wait_s: float) -> list[int]:
    """`node_capacities` for a cluster whose workers may be at zero: when fewer than `count` of
    `resource` are there, ask Ray's autoscaler for `count` one-unit bundles (what a placement group
    of the run would ask; a driver that only polls `ray.nodes()` asks for nothing and would wait
    in vain), wait up to `wait_s` for them, then withdraw the request — it persists until
    overridden (Ray 2.58.0 `ray.autoscaler.sdk.request_resources`), and the run's placement
    group holds what it uses."""
    caps = node_capacities(resource)
    if sum(caps) >= count:
        return caps
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[{resource: 1.0}] * count)
    try:
        return node_capacities(resource, at_least=count, wait_s=wait_s)
    finally:
        request_resources(bundles=[])


# ---- a mailbox actor: workers post, the driver drains ------------------------------------------------


class _Mailbox:
    def __init__(self) -> None:
        self._items: list[Any] = []
        self._asked: str | None = None

    def put(self, items: list[Any]) -> None:
        self._items.extend(items)

    def beat(self, item: Any) -> str | None:
        """A rank's heartbeat; the answer is what the driver asks of the ranks now (`ask`), if anything."""
        self._items.append(item)
        return self._asked

    def ask(self, what: str | None) -> None:
        self._asked = what

    def drain(self) -> list[Any]:
        out, self._items = self._items, []
        return out


def mailbox() -> Any:
    """An actor owned by the driver that workers on any node post to (`put.remote([...])`).

    Ray Train V2 keeps only the metrics reported with a checkpoint, and a file is on one
    machine's disk; this needs neither, and lives as long as the driver holds it.
    """
    import ray

    return ray.remote(num_cpus=0)(_Mailbox).remote()


def drain(box: Any) -> list[Any]:
    import ray

    return list(ray.get(box.drain.remote()))


# ---- a local head in its own process ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# How long `ray start --block` gets to stop its own processes one by one after SIGTERM (with many idle
# workers on a busy machine that takes tens of seconds); then the whole group is sent SIGTERM at once.
HEAD_GRACE_S = 5.0
GROUP_TERM_S = 10.0  # idle workers that still run after that are killed: nothing of a head being ended is worth more


SLOW_START_ENV = {"RAY_DASHBOARD_STARTUP_TIMEOUT_S": "170", "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "120"}


@dataclass
class LocalHead:
    """A Ray head started by `start_head`; `address` is what `connected(address=...)` joins."""

    process: subprocess.Popen[bytes]
    address: str
    dashboard_url: str
    log: Path
    temp_dir: Path
    ports: dict[str, int] = field(default_factory=dict)

    def stop(self, timeout: float = 30.0) -> None:
        """End the head and everything it started, by PID: first `ray start --block` itself (it stops
        its processes), then whatever is left in its own process group (the dashboard's modules)."""
        pgid = self.process.pid
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=min(timeout, HEAD_GRACE_S))
        _end_group(pgid, timeout, self.process.poll)
        remove_owned_dir(self.temp_dir)

    def __enter__(self) -> LocalHead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def end_head(pid: int, temp_dir: Path | None = None, timeout: float = 30.0) -> None:
    """End a head `start_head` started in an earlier process, known only by its PID (which leads its
    own process group): `ray start --block` first, then whatever is left in the group."""

    def reap() -> None:  # our own child when the same process started it; otherwise init reaps it
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + min(timeout, HEAD_GRACE_S)
    while process_alive(pid) and time.monotonic() < deadline:
        reap()
        time.sleep(0.2)
    _end_group(pid, timeout, reap)
    if temp_dir is not None:
        remove_owned_dir(temp_dir)


def _end_group(pgid: int, timeout: float, reap: Any) -> None:
    """SIGTERM to every process left in the group, SIGKILL to what still runs after GROUP_TERM_S."""
    sig, deadline = signal.SIGTERM, time.monotonic() + min(timeout, GROUP_TERM_S)
    reap()
    while _group_alive(pgid) and time.monotonic() < deadline + timeout:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        reap()
        time.sleep(0.2)
    reap()
    settle = time.monotonic() + 5.0  # what is left are zombies: their new parent reaps them in a moment
    while time.monotonic() < settle:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)


def process_alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie has exited; only its parent's wait is missing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def is_head_command(pid: int, temp_dir: str | Path) -> bool:
    """Whether `pid` runs `ray start --head --block` with this temp dir: the command `start_head` gave it."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return ({"start", "--head", "--block", f"--temp-dir={Path(temp_dir)}"} <= set(argv)
            and any(Path(a).name == "ray" for a in argv[:2]))


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs; zombies (exited, waiting for a parent that is
    not us to reap them) do not count, where /proc tells them apart."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def start_head(
    *, num_cpus: int, log_dir: Path, timeout: float = 120.0, env: Mapping[str, str] | None = None, cwd: Path | None = None,
    token: str | None = None,
    ports: Mapping[str, int] | None = None, extra_args: Sequence[str] = (),
) -> LocalHead:
    """`ray start --head --block` on free 127.0.0.1 ports, ready when its dashboard answers.

    Every port is chosen here so heads of different people on one machine never collide, and
    its own temp dir keeps it out of /tmp/ray/ray_current_cluster, where a plain `ray.init()`
    elsewhere on the machine would find and join it; token auth is off explicitly (a
    `~/.ray/auth_token` would otherwise switch it on) unless `token` is given: then the head runs with
    Ray's token auth (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN, as KubeRay sets them in a head pod).
    """
    from raydlc.dashboard import Dashboard

    ray_bin = Path(sys.executable).with_name("ray")
    exe = str(ray_bin) if ray_bin.exists() else shutil.which("ray")
    if exe is None:
        raise RayError("the `ray` command is not installed next to this Python", hint="pip install 'ray[default]'")
    names = ("port", "dashboard-port", "ray-client-server-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
             "runtime-env-agent-port", "metrics-export-port", "node-manager-port", "object-manager-port")
    ports = {name: (ports or {}).get(name) or free_port() for name in names}  # `ports`: ones the caller chose
    temp_dir = make_owned_dir("raydlc-head-", "/tmp")  # short: Ray's socket paths live under it
    cmd = [exe, "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--temp-dir={temp_dir}",
           "--include-dashboard=true", "--disable-usage-stats", f"--num-cpus={num_cpus}", "--num-gpus=0",
           *(f"--{name}={port}" for name, port in ports.items()), *extra_args]
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "ray-head.log"
    # No drain on SIGTERM: it holds a head up to 30 s for Serve replicas that a head raydlc ends has none of.
    # `ray start` ends the whole head when its dashboard has not registered within 60 s
    # (_private/services.py, RAY_DASHBOARD_STARTUP_TIMEOUT_S) or one of the dashboard's nine module
    # processes is not ready within 30 s (dashboard/subprocesses/handle.py): a busy 2-core machine
    # misses both. The head gets `timeout` from here anyway; a value in the environment wins.
    slow_start = {k: os.environ.get(k, v) for k, v in SLOW_START_ENV.items()}
    child_env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", **slow_start, **worker_env(), **(env or {})}
    child_env.pop("RAY_ADDRESS", None)
    # A job's entrypoint runs through the head's shell: `python` there must be this environment's.
    child_env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + child_env.get("PATH", "")
    if token:
        child_env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        child_env.pop("RAY_AUTH_TOKEN_PATH", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env, start_new_session=True, cwd=cwd)
    head = LocalHead(proc, f"127.0.0.1:{ports['port']}", f"http://127.0.0.1:{ports['dashboard-port']}", log, temp_dir, ports)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                head.stop()
                raise RayError(f"the local Ray head exited with {proc.returncode}: {' | '.join(tail)}", hint=f"full log: {log}")
            try:
                Dashboard(head.dashboard_url, token=token).version(timeout=2)
                return head
            except RayError:
                pass
            time.sleep(0.5)
    except BaseException:  # Ctrl-C while it starts: no half-started head is left behind
        head.stop()
        raise
    head.stop()
    raise RayError(f"the local Ray head did not answer on {head.dashboard_url} within {timeout:.0f} s", hint=f"see {log}")
