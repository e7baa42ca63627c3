"""The one place raydlc starts or joins Ray, where Ray's errors become raydlc's, and where a driver waits for resources.

Training and the preflight reach Ray through here (jobs go through the head's dashboard, in
`raydlc.edges.ray_dashboard`): join an address (`RAY_ADDRESS`, `--address`, `auto` inside a job) or start an
in-process local Ray, with the workers' environment and the log settings decided once. A Ray started here is shut
down here; one already running in the process is used as it is. A head in its own processes, which a
driver joins by address, is `raydlc.edges.local_head`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from raydlc.edges import poll
from raydlc.errors import InputError, RaydlcError, RayError, TrainError

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
    running = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    address = address or (None if running else address_from_env())
    if address and not running:  # before Ray is even imported: a head that is not there, does not answer or refuses the token
        check_reachable(address)
    token = check_token_taken(address) if address and not running and address != "auto" and "://" not in address else None
    mode = {"RAY_AUTH_MODE": "token"} if token and "RAY_AUTH_MODE" not in os.environ else {}  # the head needs it: Ray's
    os.environ.update(mode)  # client sends a token only in token mode, read as Ray loads (Ray 2.58); undone at the end
    try:
        with _joined(address, workers, log_to_driver, env):
            yield
    finally:
        for k in mode:
            os.environ.pop(k, None)


@contextlib.contextmanager
def _joined(address: str | None, workers: int, log_to_driver: bool, env: Mapping[str, str] | None) -> Iterator[None]:
    import ray

    if ray.is_initialized():
        yield
        return
    local = not address
    env_vars = worker_env({**({k: os.environ.get(k, v) for k, v in LOCAL_ENV.items()} if local else {}), **(env or {})})
    kw: dict[str, Any] = {"runtime_env": {"env_vars": env_vars}, "log_to_driver": log_to_driver}
    if not log_to_driver:
        kw["logging_level"] = logging.WARNING
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
        except BaseException as e:  # Ctrl-C while Ray starts: what it started already goes down with it
            with contextlib.suppress(Exception):
                ray.shutdown()
            if isinstance(e, Exception):
                raise connect_error(e, address) from e
            raise
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
        conn = socket.create_connection((host or "127.0.0.1", int(port)), timeout=5)
    except OSError as e:
        raise RayError(
            f"cannot reach Ray at {address}: {e.strerror or e}",
            hint="check that the head is running and the address (host:port of its GCS) is right; through a port-forward, that it is open",
        ) from e
    with conn:
        if not _answers_http2(conn, GCS_ANSWER_S):
            raise RayError(
                f"Ray at {address}: the port accepts connections but nothing answered the gRPC handshake in {GCS_ANSWER_S:.0f} s "
                "(waited for the head's GCS)",
                hint="check that the address is the head's GCS port (6379 by default), not another service's; through a port-forward, that it reaches the head",
            )


def check_token_taken(address: str, timeout_s: float = 10.0) -> str | None:
    """The token the head's GCS needs (None: it needs none), checked with one gRPC call as Ray's own client
    interceptor makes it (an `authorization: Bearer` header). A refusal is one line naming where the token
    comes from; ray.init would instead log a warning a second for ~20 s and then blame the address."""
    import grpc

    from raydlc.edges.ray_dashboard import address_token

    def refused(metadata: list[tuple[str, str]] | None) -> bool:
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId", request_serializer=bytes, response_deserializer=bytes)
            try:
                call(b"", timeout=timeout_s, metadata=metadata)
            except grpc.RpcError as e:
                return bool(e.code() == grpc.StatusCode.UNAUTHENTICATED)  # anything else: ray.init says it better
        return False

    if not refused(None):
        return None
    token = address_token()
    if token is None:
        raise InputError(f"the Ray head at {address} wants a token and none is set",
                         hint="set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to a file, to that head's token (as for Ray's own CLI)")
    if refused([("authorization", f"Bearer {token}")]):
        where = "RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN", "").strip() else "the token file (RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
        raise InputError(f"the Ray head at {address} refused the token from {where} (its GCS answered: unauthenticated)",
                         hint="set it to that head's token (`ray get-auth-token` on the head prints it)")
    return token


GCS_ANSWER_S = 10.0  # a GCS answers the HTTP/2 preface at once; ray.init would wait for a silent port forever


def _answers_http2(conn: socket.socket, timeout_s: float) -> bool:
    """Whether whatever listens answers an HTTP/2 client preface (the GCS is a gRPC server: it sends its SETTINGS
    frame, RFC 9113 section 3.4) within `timeout_s`; a close or any reply counts as an answer, only silence does not."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + an empty SETTINGS frame
    try:
        conn.settimeout(timeout_s)
        conn.sendall(preface)
        conn.recv(1)
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


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

    def capacities() -> list[int]:
        return [int(n["Resources"].get(resource, 0)) for n in ray.nodes() if n.get("Alive") and n["Resources"].get(resource, 0) >= 1]

    return poll.until(capacities, lambda caps: sum(caps) >= at_least, what=f"{at_least} {resource} in the Ray cluster",
                      timeout=wait_s, interval=2.0, or_last=True)


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


class _Mailbox:
    """The driver's mailbox: workers on any node post to it, the driver drains it (Ray Train V2 keeps only the metrics
    reported with a checkpoint, and a file is on one machine's disk). Training's ranks post records and heartbeats here (a
    heartbeat's answer carries what the driver asks of the ranks); the collectives preflight posts its figures."""

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
    """An actor owned by the driver that workers on any node post to (`put.remote([...])`), on the driver's node
    (as Ray Train places its controller): a num_cpus=0 actor may otherwise land on a worker node and die with it
    (a Spot reclaim), taking the run's progress with it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(num_cpus=0)(_Mailbox).options(scheduling_strategy=here).remote()


def drain(box: Any) -> list[Any]:
    import ray

    return list(ray.get(box.drain.remote()))
