"""A Ray head on this machine in its own processes: started on free ports, found again, ended by PID.

`start_head` runs `ray start --head --block` as a subprocess on explicit free ports, so a driver
in another process can join it by address (`raydlc.edges.ray_runtime.connected`), as it would
join a cluster's head through a port-forward. It is ended by its own PID and process group,
never by Ray's own stop command (which ends every Ray on the machine) — also from a later process
(`end_head`, for the local head `raydlc submit --local` leaves up). The questions a head record
asks of a PID (`process_alive`, `start_ticks`, `is_head_command`) are answered through psutil.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import psutil

from raydlc.edges import poll
from raydlc.edges.files import make_owned_dir, remove_owned_dir
from raydlc.edges.ray_runtime import worker_env
from raydlc.errors import RayError

# How long `ray start --block` gets to stop its own processes one by one after SIGTERM (with many idle
# workers on a busy machine that takes tens of seconds); then the whole group is sent SIGTERM at once.
HEAD_GRACE_S = 5.0
GROUP_TERM_S = 10.0  # idle workers that still run after that are killed: nothing of a head being ended is worth more
ZOMBIE_SETTLE_S = 5.0  # what is left are zombies: their new parent reaps them in a moment

SLOW_START_ENV = {"RAY_DASHBOARD_STARTUP_TIMEOUT_S": "170", "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "120"}
PORT_NAMES = ("port", "dashboard-port", "ray-client-server-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
              "runtime-env-agent-port", "metrics-export-port", "node-manager-port", "object-manager-port")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    def ended() -> bool:
        reap()
        return not process_alive(pid)

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    poll.until(ended, bool, what=f"the head's PID {pid} to end", timeout=min(timeout, HEAD_GRACE_S), interval=0.2, or_last=True)
    _end_group(pid, timeout, reap)
    if temp_dir is not None:
        remove_owned_dir(temp_dir)


def _end_group(pgid: int, timeout: float, reap: Callable[[], object]) -> None:
    """SIGTERM to every process left in the group, SIGKILL to what still runs after GROUP_TERM_S."""
    reap()
    for sig, within in ((signal.SIGTERM, min(timeout, GROUP_TERM_S)), (signal.SIGKILL, timeout)):
        if poll.until(partial(_signal_group, pgid, sig, reap), bool, what=f"process group {pgid} to end", timeout=within,
                      interval=0.2, or_last=True):
            break
    reap()
    poll.until(partial(_group_gone, pgid), bool, what=f"process group {pgid} to be reaped", timeout=ZOMBIE_SETTLE_S,
               interval=0.1, or_last=True)


def _signal_group(pgid: int, sig: signal.Signals, reap: Callable[[], object]) -> bool:
    """True when no process of the group runs any more; otherwise `sig` to the group, and False."""
    if not _group_alive(pgid):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
    reap()
    return False


def _group_gone(pgid: int) -> bool:
    """Whether the group has no process left at all, zombies included."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return True
    return False


def process_alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie has exited; only its parent's wait is missing)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ZombieProcess is one too
        return False
    except psutil.AccessDenied:
        return True


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (what a head record keeps): a PID that ended and
    was given to another program has another start time. None when the process cannot be read."""
    try:
        since_boot = psutil.Process(pid).create_time() - psutil.boot_time()
    except psutil.Error:
        return None
    return round(since_boot * os.sysconf("SC_CLK_TCK"))


def is_head_command(pid: int, temp_dir: str | Path) -> bool:
    """Whether `pid` runs `ray start --head --block` with this temp dir: the command `start_head` gave it."""
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return ({"start", "--head", "--block", f"--temp-dir={Path(temp_dir)}"} <= set(argv)
            and any(Path(a).name == "ray" for a in argv[:2]))


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs; zombies (exited, waiting for a parent that is
    not us to reap them) and dead processes do not count."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return True
        except (OSError, psutil.Error):
            continue
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
    ray_bin = Path(sys.executable).with_name("ray")
    exe = str(ray_bin) if ray_bin.exists() else shutil.which("ray")
    if exe is None:
        raise RayError("the `ray` command is not installed next to this Python", hint="pip install 'ray[default]'")
    chosen = {name: (ports or {}).get(name) or free_port() for name in PORT_NAMES}  # `ports`: ones the caller chose
    temp_dir = make_owned_dir("raydlc-head-", "/tmp")  # short: Ray's socket paths live under it
    cmd = [exe, "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--temp-dir={temp_dir}",
           "--include-dashboard=true", "--disable-usage-stats", f"--num-cpus={num_cpus}", "--num-gpus=0",
           *(f"--{name}={port}" for name, port in chosen.items()), *extra_args]
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "ray-head.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_head_env(env, token), start_new_session=True, cwd=cwd)
    head = LocalHead(proc, f"127.0.0.1:{chosen['port']}", f"http://127.0.0.1:{chosen['dashboard-port']}", log, temp_dir, chosen)
    try:  # Ctrl-C while it starts, or a head that exits: no half-started head is left behind
        answered = poll.until(partial(_answers, head, token), bool, what=f"the local Ray head on {head.dashboard_url}",
                              timeout=timeout, interval=0.5, or_last=True)
    except BaseException:
        head.stop()
        raise
    if not answered:
        head.stop()
        raise RayError(f"the local Ray head did not answer on {head.dashboard_url} within {timeout:.0f} s", hint=f"see {log}")
    return head


def _head_env(env: Mapping[str, str] | None, token: str | None) -> dict[str, str]:
    """The head's environment: this one, the workers' (`ray_runtime.worker_env`), `env`, and token auth only with `token`.

    No drain on SIGTERM: it holds a head up to 30 s for Serve replicas that a head raydlc ends has none of.
    `ray start` ends the whole head when its dashboard has not registered within 60 s
    (_private/services.py, RAY_DASHBOARD_STARTUP_TIMEOUT_S) or one of the dashboard's nine module
    processes is not ready within 30 s (dashboard/subprocesses/handle.py): a busy 2-core machine
    misses both. The head gets `timeout` from `start_head` anyway; a value in the environment wins.
    """
    slow_start = {k: os.environ.get(k, v) for k, v in SLOW_START_ENV.items()}
    child_env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", **slow_start, **worker_env(), **(env or {})}
    child_env.pop("RAY_ADDRESS", None)
    # A job's entrypoint runs through the head's shell: `python` there must be this environment's.
    child_env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + child_env.get("PATH", "")
    if token:
        child_env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        child_env.pop("RAY_AUTH_TOKEN_PATH", None)
    return child_env


def _answers(head: LocalHead, token: str | None) -> bool:
    """Whether the head's dashboard answers; a head that exited is an error quoting its log's last lines."""
    from raydlc.edges.ray_dashboard import Dashboard

    if head.process.poll() is not None:
        tail = head.log.read_text(errors="replace").strip().splitlines()[-5:]
        raise RayError(f"the local Ray head exited with {head.process.returncode}: {' | '.join(tail)}", hint=f"full log: {head.log}")
    try:
        Dashboard(head.dashboard_url, token=token).version(timeout=2)
    except RayError:
        return False
    return True
