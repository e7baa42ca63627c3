"""Jobs on a Ray cluster, over its head's dashboard: submit (or attach by name), wait, follow, stop,
the training summary, and the worker logs of one job on every node.

The semantics live here; every call to the head goes through `raydlc.dashboard.Dashboard`. A
job's state always comes from the Jobs API, never from how a log stream ended — a dropped
stream is not a finished job. A job's own worker files carry its job id in their names
(`worker-<worker>-<job id>-<pid>.out`) and first line (`:job_id:<job id>`), so another job's
lines on the same cluster never reach this one's verdict.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raydlc.dashboard import Dashboard, HeadRefused, Job, RayNode
from raydlc.errors import InputError, RaydlcError, RayError

if TYPE_CHECKING:
    from raydlc.jobenv import JobSpec
    from raydlc.telemetry.nccl import NcclReport

WORKER_LOG = re.compile(r"^worker-[0-9a-f]+-(?P<job>[0-9a-f]+)-(?P<pid>\d+)\.(?:out|err)$")
PROBE_TIMEOUT_S = 180.0


class Detached(KeyboardInterrupt):
    """Ctrl-C while following a job: the job goes on; `job_id` says which one was left running."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


def require(dash: Dashboard, job: str, where: str, flag: str = "") -> Job:
    """The job by id, or an error whose hint lists the jobs of the same target (`flag`: ' --local', …)."""
    found = dash.job(job)
    if found is None:
        raise InputError(f"no job {job[:100]!r} on {where}", hint=f"raydlc job list{flag}")
    return found


def list_jobs(dash: Dashboard) -> list[Job]:
    """Every job the head knows, oldest first."""
    return sorted(dash.jobs(), key=lambda j: (j.start_time or 0.0, j.submission_id))


def submit(dash: Dashboard, spec: JobSpec) -> tuple[Job, bool]:
    """Submit `spec`, or attach when a job of that name still runs: (job, attached).

    A name whose job has ended is refused rather than reused: re-submitting it would either fail
    on the dashboard (the id is taken) or, worse, run the job a second time under a new id.
    """
    if spec.submission_id:
        existing = dash.job(spec.submission_id)
        if existing is not None:
            if not existing.terminal:
                return existing, True
            raise InputError(
                f"job {spec.submission_id!r} already ran and ended {existing.status}",
                hint=f"choose a new --name; `raydlc job logs {spec.submission_id}` shows what it did",
            )
    try:
        sid = dash.submit(entrypoint=spec.entrypoint, submission_id=spec.submission_id, runtime_env=spec.runtime_env, metadata=spec.metadata)
    except HeadRefused:
        if spec.submission_id and (raced := dash.job(spec.submission_id)) is not None and not raced.terminal:
            return raced, True  # another raydlc submitted the same name a moment earlier
        raise
    job = dash.job(sid)
    if job is None:
        raise RayError(f"the dashboard accepted job {sid} but does not know it")
    return job, False


def wait(dash: Dashboard, job: str, *, timeout: float | None = None, poll_s: float = 0.5) -> Job:
    """Poll until the job ends (or `timeout`, then its state at that moment)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        j = dash.job(job)
        if j is None:
            raise RayError(f"job {job} disappeared from the head", hint="the head may have restarted")
        if j.terminal or (deadline is not None and time.monotonic() >= deadline):
            return j
        time.sleep(poll_s)


def follow(dash: Dashboard, job: str, write: Callable[[str], None], *, poll_s: float = 1.0) -> Job:
    """Stream the job's log through `write` until it ends; the outcome comes from the Jobs API.

    The dashboard's websocket carries the log from its start; when it closes before the job has
    ended (a dropped port-forward, a restarted dashboard), the rest is read by polling from the
    offset already written, so nothing is shown twice and nothing is lost. Ctrl-C raises
    `Detached`: the job goes on.
    """
    written = 0

    def out(text: str) -> None:
        nonlocal written
        written += len(text)
        write(text)

    try:
        with contextlib.suppress(RayError):  # the stream's end says nothing; the Jobs API decides below
            dash.tail(job, out)
        while True:
            j = wait(dash, job, timeout=0)
            text = dash.logs(job)
            if len(text) > written:
                out(text[written:])
            if j.terminal:
                return j
            time.sleep(poll_s)
    except KeyboardInterrupt:
        raise Detached(job) from None


def stop(dash: Dashboard, job: str, *, wait_s: float = 60.0) -> tuple[Job, bool]:
    """Ask the job to stop and wait for it to end: (final state, whether it was still running)."""
    was_running = dash.stop(job)
    if was_running is None:
        raise InputError(f"no job {job!r} to stop")
    return wait(dash, job, timeout=wait_s), was_running


def training_summary(text: str) -> dict[str, Any] | None:
    """The built-in program's summary: the last JSON object it printed (its last stdout line)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and "steps" in doc:
                return doc
    return None


_COST = re.compile(r"^step (\d+): .*\$([0-9.]+) spent of \$([0-9.]+)(?:, forecast \$([0-9.]+))?\s*$")


def latest_cost(text: str) -> dict[str, Any] | None:
    """The built-in program's last spend line under a budget (`step 12: … $1.20 spent of $5.00, forecast $4.10`)."""
    for line in reversed(text.splitlines()):
        m = _COST.match(line.strip())
        if m:
            return {"step": int(m[1]), "spent_usd": float(m[2]), "budget_usd": float(m[3]), "forecast_usd": float(m[4]) if m[4] else None}
    return None


def latest_job(dash: Dashboard) -> Job | None:
    """The job `verify` reads when none is named: the newest that is not one of raydlc's probes."""
    jobs = [j for j in list_jobs(dash) if j.metadata.get("program") != "probe"]
    return jobs[-1] if jobs else None


# ---- a job's worker logs, per node -------------------------------------------------------------------


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
    from raydlc.telemetry.nccl import NcclParser

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
    from raydlc.telemetry.nccl import ChunkScanner

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


def probe_nodes(dash: Dashboard, *, target: str, args: Sequence[str] = ("--fi-info",), timeout: float = PROBE_TIMEOUT_S) -> list[dict[str, Any]]:
    """The per-node probes `args` asks for on every alive node, as a short job of pinned Ray tasks (`python -m raydlc.probe`)."""
    import shlex

    from raydlc import __version__
    from raydlc.jobenv import JobSpec, raydlc_module_dir

    name = f"raydlc-probe-{time.strftime('%Y%m%d-%H%M%S')}-{int(time.time() * 1000) % 1000:03d}"
    entry = " ".join(["python -m raydlc.probe", *(shlex.quote(a) for a in args)])
    spec = JobSpec(entry, {"py_modules": [str(raydlc_module_dir())]}, {"raydlc": __version__, "program": "probe", "target": target}, name)
    job, _ = submit(dash, spec)
    done = wait(dash, job.submission_id, timeout=timeout)
    text = dash.logs(job.submission_id)
    if not done.terminal:
        stop(dash, job.submission_id, wait_s=10)
        raise RayError(f"the probe job {name} did not end within {timeout:.0f} s", hint=f"`raydlc job logs {name}` shows how far it got")
    for line in reversed(text.splitlines()):
        if line.startswith('{"probe"'):
            return list(json.loads(line)["nodes"])
    raise RayError(f"the probe job {name} ended {done.status} without an answer", hint=f"`raydlc job logs {name}` shows why")


def failure(job: Job, hint: str) -> RaydlcError:
    """A job that did not succeed as one line: the program's own `error:` line when it printed one
    (raydlc's program does, with exit 2 for the user's input), else the first line of Ray's message
    and the last line of the log it quotes; never the whole log again."""
    from raydlc.errors import TrainError

    lines = [ln.strip() for ln in (job.message or "").splitlines() if ln.strip()]
    own = [i for i, ln in enumerate(lines) if ln.startswith("error: ")]
    if own:
        i = own[-1]
        said = lines[i].removeprefix("error: ")
        own_hint = lines[i + 1].removeprefix("hint: ") if i + 1 < len(lines) and lines[i + 1].startswith("hint: ") else None
        cls = InputError if job.driver_exit_code == 2 else TrainError
        return cls(f"job {job.submission_id} {job.status}: {said}", hint=own_hint or hint)
    head = lines[0][:300] if lines else ""
    last = lines[-1][:300] if len(lines) > 1 else ""
    detail = f": {head}" + (f" ... {last}" if last else "") if head else ""
    return TrainError(f"job {job.submission_id} {job.status}{detail}", hint=hint)
