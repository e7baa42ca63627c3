"""A job's training workers' logs, read per node from the head: which files are this job's, and NCCL judged from them.

A job's own worker files carry its job id in their names (`worker-<worker>-<job id>-<pid>.out`)
and first line (`:job_id:<job id>`), so another job's lines on the same cluster never reach this
one's verdict. Every call to the head goes through `raydlc.edges.ray_dashboard.Dashboard`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raydlc.edges.ray_dashboard import Dashboard, RayNode
from raydlc.errors import RayError

if TYPE_CHECKING:
    from raydlc.nccl import NcclReport

WORKER_LOG = re.compile(r"^worker-[0-9a-f]+-(?P<job>[0-9a-f]+)-(?P<pid>\d+)\.(?:out|err)$")


# Ray Train's worker actor class: the one process per rank that joins the process group and prints NCCL's lines
# (Ray 2.58.0 train/v2/_internal/execution/worker_group/worker.py `RayTrainWorker`, made an actor in
# worker_group.py `_create_workers`). The `TrainController` actor and the job's driver hold files of the same job
# on the driver's node (the head, for a Jobs-API driver) and never print NCCL lines: they are not read.
TRAIN_WORKER = "RayTrainWorker"


@dataclass(frozen=True)
class JobLogs:
    """A job's training workers' logs, judged per node: the report, which files on which node, and what is missing.

    `files` has a key for every node that held a training worker of the job, with the files read
    there (empty when none could be read); `workers` the PIDs of the workers placed on each node;
    `lost` says, per node, why some of its workers showed no NCCL line (files gone, node gone).
    """

    report: NcclReport
    files: dict[str, list[str]]  # node name -> file names read
    nodes: list[RayNode]
    workers: dict[str, list[int]] = field(default_factory=dict)  # node name -> training worker PIDs
    lost: dict[str, str] = field(default_factory=dict)  # node name -> why some of its workers have no NCCL line

    @property
    def world_size(self) -> int:
        return sum(len(p) for p in self.workers.values())


def job_worker_files(dash: Dashboard, node_id: str, job_id: str) -> list[str]:
    """The stdout/stderr files of this job's workers on one node, and no other job's."""
    found = dash.log_files(node_id, f"*{job_id}*")
    names = [f for cat in ("worker_out", "worker_err") for f in found.get(cat, [])]
    return sorted(f for f in names if (m := WORKER_LOG.match(f)) and m["job"] == job_id)


def job_nccl(dash: Dashboard, job_id: str, names: Mapping[str, str] | None = None) -> JobLogs:
    """Find the job's training worker actors (state API: class, node, PID) and judge NCCL per node from
    exactly their files (`worker-<id>-<job>-<pid>.out/.err`, the pattern of Ray's log_manager.py).

    `names` maps a node's IP to a better name (its pod, on Kubernetes). A file whose first line
    names another job is skipped, whatever its file name says. A worker whose node no longer
    answers, or whose files hold no NCCL line, makes its node `lost`, by name.
    """
    from raydlc.nccl import NcclParser

    parser = NcclParser()
    all_nodes = dash.nodes()
    by_id = {n.node_id: n for n in all_nodes}
    actors = sorted((a for a in dash.actors(job_id=job_id, class_name=TRAIN_WORKER) if a.node_id and a.pid),
                    key=lambda a: (a.node_id or "", a.pid or 0))
    files: dict[str, list[str]] = {}
    workers: dict[str, list[int]] = {}
    lost: dict[str, list[str]] = {}
    listed: dict[str, list[str] | RayError] = {}
    for a in actors:
        node_id, pid = str(a.node_id), int(a.pid or 0)
        node = by_id.get(node_id)
        name = (names or {}).get(node.ip if node else "") or (node.name if node else f"node {node_id[:8]}")
        workers.setdefault(name, []).append(pid)
        files.setdefault(name, [])
        if node_id not in listed:
            try:
                listed[node_id] = job_worker_files(dash, node_id, job_id)
            except RayError as e:
                listed[node_id] = e
        found = listed[node_id]
        if isinstance(found, RayError):
            lost.setdefault(name, []).append(f"worker {pid}: its logs cannot be read ({found.message})")
            continue
        mine = [f for f in found if (m := WORKER_LOG.match(f)) and int(m["pid"]) == pid]
        before = parser.candidates
        for f in mine:
            if _scan_worker_file(dash, parser, node_id, f, name, job_id):
                files[name].append(f)
        if parser.candidates == before:
            lost.setdefault(name, []).append(f"worker {pid}: " + ("no NCCL line in " + ", ".join(mine) if mine else "no log file on the node"))
    return JobLogs(parser.report(), files, all_nodes, workers, {n: "; ".join(w) for n, w in lost.items()})


def _scan_worker_file(dash: Dashboard, parser: Any, node_id: str, filename: str, name: str, job_id: str) -> bool:
    """Feed one worker file to the parser; False (and nothing fed) when its first line names another job."""
    from raydlc.nccl import ChunkScanner

    scanner = ChunkScanner(parser, f"{name}:{filename}", name)
    try:
        first = True
        for chunk in dash.read_log(node_id, filename):
            if first:
                first = False
                head = chunk.split(b"\n", 1)[0]
                if head.startswith(b":job_id:") and head.removeprefix(b":job_id:").strip().decode(errors="replace") != job_id:
                    return False
            scanner.feed(chunk)
        return True
    finally:
        scanner.close()
