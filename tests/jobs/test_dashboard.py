"""The dashboard edge's one error mapping, against real sockets on 127.0.0.1: nothing listening, a server
that accepts and never answers, and one that answers with errors, garbage or a state-API reply."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from raydlc.edges.local_head import free_port
from raydlc.edges.ray_dashboard import Dashboard, HeadRefused, HeadUnreachable
from raydlc.errors import RayError

ACTORS = {"result": True, "msg": "", "data": {"result": {"total": 1, "result": [
    {"actor_id": "a1", "class_name": "RayTrainWorker", "state": "ALIVE", "job_id": "02000000", "node_id": "n1", "pid": 4242, "name": ""}]}}}


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Handler.seen.append(self.path)
        routes: dict[str, tuple[int, str]] = {
            "/api/version": (200, json.dumps({"version": "4", "ray_version": "2.58.0", "ray_commit": "x", "session_name": "s"})),
            "/api/v0/nodes": (500, "Traceback (most recent call last):\n  File x\nValueError: the GCS is gone"),
            "/api/v0/actors": (200, json.dumps(ACTORS)),
            "/api/v0/logs": (200, "not json"),
        }
        status, body = routes.get(self.path.split("?")[0], (404, "no such route"))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    _Handler.seen = []
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def silent() -> Iterator[str]:
    """Accepts connections and never answers (a wedged head, a port-forward to nowhere)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


def test_nothing_listening_is_unreachable_with_the_url_and_a_hint() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(HeadUnreachable) as e:
        Dashboard(url).version()
    assert e.value.message.startswith(f"no Ray dashboard answers at {url} (") and "port 8265" in (e.value.hint or "")
    with pytest.raises(HeadUnreachable, match=f"cannot list the Ray nodes: the dashboard at {url} did not answer"):
        Dashboard(url).nodes()
    with pytest.raises(HeadUnreachable, match=f"the Ray Jobs API at {url} does not answer"):
        Dashboard(url).jobs()  # the SDK's own connection error, mapped by the same chokepoint


def test_a_head_that_never_answers_fails_within_the_timeout(silent: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(HeadUnreachable, match="did not answer"):
        Dashboard(silent, timeout_s=1.0).nodes()
    with pytest.raises(HeadUnreachable, match="no Ray dashboard answers"):
        Dashboard(silent).version(timeout=1.0)
    assert time.monotonic() - t0 < 10


def test_answers_are_typed_and_errors_say_what_the_head_said(server: str) -> None:
    dash = Dashboard(server)
    v = dash.version()
    assert (v.ray_version, v.api_version, v.session_name) == ("2.58.0", "4", "s")
    (actor,) = dash.actors(job_id="02000000", class_name="RayTrainWorker")
    assert (actor.class_name, actor.pid, actor.node_id, actor.name) == ("RayTrainWorker", 4242, "n1", None)
    assert "filter_keys=job_id&filter_predicates=%3D&filter_values=02000000" in _Handler.seen[-1]  # the state API's filter triple
    with pytest.raises(HeadRefused, match=r"^cannot list the Ray nodes: HTTP 500: ValueError: the GCS is gone$"):
        dash.nodes()
    with pytest.raises(RayError, match="cannot list the logs of node abcdefgh: ") as e:
        dash.log_files("abcdefgh12345")
    assert not isinstance(e.value, HeadRefused | HeadUnreachable)  # it answered 200 with no JSON: neither refused nor silent
    with pytest.raises(HeadRefused, match="HTTP 404: no such route"):
        list(dash.read_log("n1", "worker-x.out"))


def test_a_server_that_is_not_ray_is_told_apart(server: str) -> None:
    with pytest.raises(RayError, match="no Ray dashboard answers"):
        Dashboard(server + "/nothing-here").version()
