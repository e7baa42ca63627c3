"""`verify` judges NCCL from the job's training workers only, found through the head's state API.

A served head answers the state API's REST routes as Ray 2.58.0 shapes them (`/api/v0/nodes`,
`/api/v0/actors` with its filter triples, `/api/v0/logs`, `/api/v0/logs/file`; a node whose
agent is gone answers 500, as `state_head.list_logs` does on DataSourceUnavailable). Its files
are laid out as on a real Ray Train v2 cluster: the head holds the job's driver log and the
`TrainController` actor's worker files (the controller is pinned to the driver's node, and a
Jobs-API driver runs on the head), with no NCCL line; the GPU nodes hold the `RayTrainWorker`
actors' files, carrying recorded real NCCL lines from the corpus.
"""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from raydlc.checks import gate
from raydlc.checks.gate import FAIL, PASS, Facts, JobFact
from raydlc.edges.ray_dashboard import Dashboard
from raydlc.jobs import worker_logs

NCCL = Path(__file__).resolve().parents[1] / "data" / "nccl"
EFA_A = NCCL / "mixed_composed_efa_and_socket" / "node-a.log"
SOCKET_B = NCCL / "mixed_composed_efa_and_socket" / "node-b.log"
EFA_B = NCCL / "efa_ofi346_fi_addr_efa_proves_provider.log"
JOB = "02000000"
HEAD, N1, N2 = "aaaa0000" * 7, "bbbb1111" * 7, "cccc2222" * 7


def _ok(result: Any) -> dict[str, Any]:
    return {"result": True, "msg": "", "data": {"result": result}}


class _Head(http.server.BaseHTTPRequestHandler):
    nodes: ClassVar[list[dict[str, Any]]] = []
    actors: ClassVar[list[dict[str, Any]]] = []
    files: ClassVar[dict[str, dict[str, bytes]]] = {}  # node id -> file name -> content
    gone: ClassVar[set[str]] = set()  # node ids whose agent no longer answers

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        q = urllib.parse.parse_qs(url.query)
        if url.path == "/api/v0/nodes":
            return self._json(200, _ok({"total": len(self.nodes), "result": self.nodes}))
        if url.path == "/api/v0/actors":
            rows = [a for a in self.actors if all(a.get(k) == v for k, v in zip(q.get("filter_keys", []), q.get("filter_values", [])))]
            return self._json(200, _ok({"total": len(rows), "result": rows}))
        node = q["node_id"][0]
        if node in self.gone:
            return self._json(500, {"result": False, "msg": f"Agent for node id: {node} doesn't exist.", "data": {}})
        if url.path == "/api/v0/logs":
            names = sorted(self.files.get(node, {}))
            return self._json(200, _ok({"worker_out": [n for n in names if n.endswith(".out")],
                                        "worker_err": [n for n in names if n.endswith(".err")],
                                        "driver": [n for n in names if n.startswith("job-driver")]}))
        body = self.files.get(node, {}).get(q["filename"][0])
        if body is None:
            return self._json(404, {"result": False, "msg": "file not found", "data": {}})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(doc).encode())

    def log_message(self, *args: Any) -> None:
        pass


def _node(node_id: str, ip: str, head: bool, gpus: int) -> dict[str, Any]:
    return {"node_id": node_id, "node_ip": ip, "is_head_node": head, "state": "ALIVE", "resources_total": {"GPU": gpus, "CPU": 8}}


def _actor(cls: str, node_id: str, pid: int, job: str = JOB) -> dict[str, Any]:
    return {"actor_id": f"{cls}-{pid}", "class_name": cls, "state": "DEAD", "job_id": job, "node_id": node_id, "pid": pid, "name": ""}


def _worker_file(pid: int, text: bytes, job: str = JOB) -> tuple[str, bytes]:
    return f"worker-{pid:056x}-{job}-{pid}.out", b":job_id:" + job.encode() + b"\n" + text


def _cluster(n2_log: Path | None) -> None:
    """Head: the driver and the controller of the job; n1 and n2: one training worker each; another job's worker on n2."""
    _Head.nodes = [_node(HEAD, "10.0.0.9", True, 0), _node(N1, "10.0.1.5", False, 8), _node(N2, "10.0.2.7", False, 8)]
    _Head.actors = [_actor("TrainController", HEAD, 300), _actor("RayTrainWorker", N1, 101), _actor("RayTrainWorker", N2, 202),
                    _actor("RayTrainWorker", N2, 909, job="03000000")]
    controller = b"(TrainController pid=300) Started training worker group of size 2.\n"
    _Head.files = {
        HEAD: dict([_worker_file(300, controller), ("job-driver-train-1.log", b"driver output, no NCCL here\n")]),
        N1: dict([_worker_file(101, EFA_A.read_bytes())]),
        N2: dict([_worker_file(909, SOCKET_B.read_bytes(), job="03000000"), *([_worker_file(202, n2_log.read_bytes())] if n2_log else [])]),
    }
    _Head.gone = set()


@pytest.fixture
def dash() -> Iterator[Dashboard]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Head)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield Dashboard(f"http://127.0.0.1:{httpd.server_address[1]}")
    finally:
        httpd.shutdown()
        httpd.server_close()


def _nccl_row(dash: Dashboard) -> gate.Row:
    logs = worker_logs.job_nccl(dash, JOB)
    f = Facts("address", JobFact("train-1", JOB, "SUCCEEDED"), nccl=logs.report, nccl_files=logs.files,
              nccl_workers=logs.workers, nccl_lost=logs.lost)
    return next(r for r in gate.gate(f).rows if r.criterion == "nccl")


def test_a_head_with_only_the_controller_and_driver_and_two_efa_worker_nodes_passes(dash: Dashboard) -> None:
    _cluster(EFA_B)
    logs = worker_logs.job_nccl(dash, JOB)
    assert sorted(logs.files) == ["10.0.1.5/bbbb1111", "10.0.2.7/cccc2222"]  # the head is not judged at all
    assert logs.workers == {"10.0.1.5/bbbb1111": [101], "10.0.2.7/cccc2222": [202]} and logs.world_size == 2
    assert logs.files["10.0.2.7/cccc2222"] == [_worker_file(202, b"")[0]]  # not the other job's worker on the same node
    row = _nccl_row(dash)
    assert row.status == PASS, row.evidence
    assert [e.split(":")[0] for e in row.evidence] == ["10.0.1.5/bbbb1111", "10.0.2.7/cccc2222"]


def test_one_worker_node_on_sockets_fails_by_name(dash: Dashboard) -> None:
    _cluster(SOCKET_B)
    row = _nccl_row(dash)
    assert row.status == FAIL and row.failed_nodes == ["10.0.2.7/cccc2222"]
    assert any(e.startswith("10.0.2.7/cccc2222: socket") for e in row.evidence)


def test_a_worker_node_whose_logs_are_lost_fails_by_name(dash: Dashboard) -> None:
    _cluster(None)  # the worker's file is gone (its pod was replaced): the actor is known, its log is not
    row = _nccl_row(dash)
    assert row.status == FAIL and row.failed_nodes == ["10.0.2.7/cccc2222"]
    assert "10.0.2.7/cccc2222: worker 202: no log file on the node" in row.evidence
    _cluster(EFA_B)
    _Head.gone = {N2}  # the node itself is gone: its agent no longer answers
    row = _nccl_row(dash)
    assert row.failed_nodes == ["10.0.2.7/cccc2222"]
    assert any(e.startswith("10.0.2.7/cccc2222: worker 202: its logs cannot be read (") and "doesn't exist" in e for e in row.evidence)


def test_every_rank_of_the_world_must_appear_where_nccl_numbers_them(dash: Dashboard, tmp_path: Path) -> None:
    """NCCL 2.29's init line (`comm 0x.. rank R nRanks W …`, src/init.cc) numbers each worker's rank in the W-rank
    communicator: a worker that printed EFA lines but never its rank leaves that rank unproven."""

    def init(rank: int) -> bytes:
        return f"algo-1:1805{rank}:18130 [{rank}] NCCL INFO comm 0x55d5a0 rank {rank} nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n".encode()

    n2 = tmp_path / "n2.log"
    n2.write_bytes(EFA_B.read_bytes() + init(1))
    _cluster(n2)
    _Head.files[N1][_worker_file(101, b"")[0]] = b":job_id:" + JOB.encode() + b"\n" + EFA_A.read_bytes() + init(0)
    assert _nccl_row(dash).status == PASS
    n2.write_bytes(EFA_B.read_bytes())  # rank 1's file shows EFA traffic but not its rank
    _cluster(n2)
    _Head.files[N1][_worker_file(101, b"")[0]] = b":job_id:" + JOB.encode() + b"\n" + EFA_A.read_bytes() + init(0)
    row = _nccl_row(dash)
    assert row.status == FAIL and "ranks 1 of 0..1 appear in no NCCL line of the workers' logs" in row.evidence


def test_no_training_worker_actor_fails_saying_so(dash: Dashboard) -> None:
    _cluster(EFA_B)
    _Head.actors = [a for a in _Head.actors if a["class_name"] != "RayTrainWorker" or a["job_id"] != JOB]
    row = _nccl_row(dash)
    assert row.status == FAIL and row.evidence == [f"no Ray Train worker (RayTrainWorker actor) of job {JOB} in the head's state API"]
