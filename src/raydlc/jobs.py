"""Jobs on a Ray cluster through its head's dashboard: submit, follow, status, list, stop, and the
worker logs of one job on every node.

The one channel to whatever runs on a cluster (the Kubernetes side only finds the head). The
Jobs API (`JobSubmissionClient`, passed in) owns submit/status/logs/stop; a job's state always
comes from it, never from how a log stream ended — a dropped stream is not a finished job. The
dashboard's log endpoints serve each node's log files; a job's own worker files carry its job
id in their names (`worker-<worker>-<job id>-<pid>.out`) and first line (`:job_id:<job id>`),
so another job's lines on the same cluster never reach this one's verdict.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from raydlc.errors import InputError, RayError

if TYPE_CHECKING:
    from raydlc.jobenv import JobSpec
    from raydlc.telemetry.nccl import NcclReport
    from raydlc.verify import Facts

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
HTTP_TIMEOUT_S = 30.0
WORKER_LOG = re.compile(r"^worker-[0-9a-f]+-(?P<job>[0-9a-f]+)-(?P<pid>\d+)\.(?:out|err)$")
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Job:
    """What the Jobs API says about one submission."""

    submission_id: str
    job_id: str | None  # Ray's core job id, assigned once the driver connects to Ray
    status: str
    entrypoint: str
    message: str | None
    start_time: float | None  # seconds since the epoch
    end_time: float | None
    metadata: dict[str, str]
    driver_exit_code: int | None
    runtime_env: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def duration_s(self) -> float | None:
        if self.start_time is None:
            return None
        return (self.end_time or time.time()) - self.start_time

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duration_s": self.duration_s}

    @classmethod
    def from_details(cls, d: Any) -> Job:
        def secs(ms: int | None) -> float | None:
            return ms / 1000.0 if ms else None

        status = getattr(d.status, "value", str(d.status))
        return cls(
            submission_id=d.submission_id or d.job_id or "", job_id=d.job_id, status=str(status), entrypoint=d.entrypoint or "",
            message=d.message, start_time=secs(d.start_time), end_time=secs(d.end_time), metadata=dict(d.metadata or {}),
            driver_exit_code=d.driver_exit_code, runtime_env=dict(d.runtime_env or {}),
        )


def client(url: str) -> Any:
    """A JobSubmissionClient for the dashboard at `url`; a head that does not answer is a RayError."""
    import logging

    from ray.job_submission import JobSubmissionClient

    # The SDK logs each upload and websocket close at INFO on stderr; raydlc says what matters itself.
    for name in ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk", "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return JobSubmissionClient(url)
    except Exception as e:  # requests' ConnectionError, Ray's RuntimeError/ConnectionError
        raise RayError(f"the Ray Jobs API at {url} does not answer: {_short(e)}", hint="check the head is up (raydlc status, or the --address URL)") from None


def _short(e: BaseException) -> str:
    """The first line, or for a server-side traceback (a dashboard 500) its first line and its last: the error itself."""
    text = [line for line in str(e).strip().splitlines() if line.strip()]
    if not text:
        return type(e).__name__
    if len(text) > 1 and text[0].rstrip().endswith("Traceback (most recent call last):"):
        return f"{text[0].removesuffix('Traceback (most recent call last):').rstrip()} {text[-1].strip()}"[:300]
    return text[0][:300]


def _not_found(e: BaseException) -> bool:
    return "status code 404" in str(e) or "does not exist" in str(e)


def get(c: Any, job: str) -> Job | None:
    try:
        return Job.from_details(c.get_job_info(job))
    except RuntimeError as e:
        if _not_found(e):
            return None
        raise RayError(f"cannot read job {job}: {_short(e)}") from None


def require(c: Any, job: str, where: str) -> Job:
    found = get(c, job)
    if found is None:
        raise InputError(f"no job {job!r} on {where}", hint=f"`raydlc job list{'' if where == 'the cluster' else ' ' + where}` shows the jobs there")
    return found


def list_jobs(c: Any) -> list[Job]:
    try:
        jobs = [Job.from_details(d) for d in c.list_jobs()]
    except RuntimeError as e:
        raise RayError(f"cannot list jobs: {_short(e)}") from None
    return sorted(jobs, key=lambda j: (j.start_time or 0.0, j.submission_id))


def logs(c: Any, job: str) -> str:
    try:
        return str(c.get_job_logs(job))
    except RuntimeError as e:
        raise RayError(f"cannot read the logs of job {job}: {_short(e)}") from None


def submit(c: Any, spec: JobSpec) -> tuple[Job, bool]:
    """Submit `spec`, or attach when a job of that name still runs: (job, attached).

    A name whose job has ended is refused rather than reused: re-submitting it would either fail
    on the dashboard (the id is taken) or, worse, run the job a second time under a new id.
    """
    if spec.submission_id:
        existing = get(c, spec.submission_id)
        if existing is not None:
            if not existing.terminal:
                return existing, True
            raise InputError(
                f"job {spec.submission_id!r} already ran and ended {existing.status}",
                hint=f"choose a new --name; `raydlc job logs {spec.submission_id}` shows what it did",
            )
    try:
        sid = c.submit_job(entrypoint=spec.entrypoint, submission_id=spec.submission_id, runtime_env=spec.runtime_env, metadata=spec.metadata)
    except RuntimeError as e:
        if spec.submission_id and (raced := get(c, spec.submission_id)) is not None and not raced.terminal:
            return raced, True  # another raydlc submitted the same name a moment earlier
        raise RayError(f"the dashboard refused the job: {_short(e)}", hint="the runtime_env is in `raydlc job status ID --json`; the head's logs say more") from None
    except Exception as e:  # the upload (requests) and packaging errors
        raise RayError(f"could not submit the job: {_short(e)}") from None
    job = get(c, sid)
    if job is None:
        raise RayError(f"the dashboard accepted job {sid} but does not know it")
    return job, False


def wait(c: Any, job: str, *, timeout: float | None = None, poll_s: float = 0.5) -> Job:
    """Poll until the job ends (or `timeout`, then its state at that moment)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        j = get(c, job)
        if j is None:
            raise RayError(f"job {job} disappeared from the head", hint="the head may have restarted")
        if j.terminal or (deadline is not None and time.monotonic() >= deadline):
            return j
        time.sleep(poll_s)


def follow(c: Any, job: str, write: Callable[[str], None], *, poll_s: float = 1.0) -> Job:
    """Stream the job's log through `write` until it ends; the outcome comes from the Jobs API.

    The dashboard's websocket carries the log from its start; when it closes before the job has
    ended (a dropped port-forward, a restarted dashboard), the rest is read by polling from the
    offset already written, so nothing is shown twice and nothing is lost.
    """
    written = 0

    def out(text: str) -> None:
        nonlocal written
        written += len(text)
        write(text)

    async def tail() -> None:
        async for chunk in c.tail_job_logs(job):
            out(chunk)

    try:
        asyncio.run(tail())
    except (TimeoutError, RuntimeError, OSError, ValueError):
        pass  # the stream's end says nothing; the Jobs API decides below
    except Exception as e:  # aiohttp's own errors
        if type(e).__module__.split(".")[0] != "aiohttp":
            raise
    while True:
        j = wait(c, job, timeout=0)
        text = logs(c, job)
        if len(text) > written:
            out(text[written:])
        if j.terminal:
            return j
        time.sleep(poll_s)


def stop(c: Any, job: str, *, wait_s: float = 60.0) -> tuple[Job, bool]:
    """Ask the job to stop and wait for it to end: (final state, whether it was still running)."""
    try:
        was_running = bool(c.stop_job(job))
    except RuntimeError as e:
        if _not_found(e):
            raise InputError(f"no job {job!r} to stop") from None
        raise RayError(f"cannot stop job {job}: {_short(e)}") from None
    return wait(c, job, timeout=wait_s), was_running


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


# ---- the dashboard's log API ---------------------------------------------------------------------


@dataclass(frozen=True)
class RayNode:
    node_id: str
    ip: str
    is_head: bool
    alive: bool
    gpus: float

    @property
    def name(self) -> str:
        """How a person tells nodes apart: IP and a short node id (two nodes of one machine share the IP)."""
        return f"{self.ip}/{self.node_id[:8]}" + (" (head)" if self.is_head else "")


def _get_json(url: str, path: str, params: Mapping[str, str] | None = None) -> Any:
    q = f"?{urllib.parse.urlencode(params)}" if params else ""
    try:
        with urllib.request.urlopen(f"{url}{path}{q}", timeout=HTTP_TIMEOUT_S) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")[:300]
        raise RayError(f"the dashboard at {url} answered {path} with {e.code}: {body}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise RayError(f"the dashboard at {url} did not answer {path}: {getattr(e, 'reason', e)}") from None


def _result(doc: Any, path: str) -> Any:
    try:
        return doc["data"]["result"]
    except (KeyError, TypeError):
        raise RayError(f"the dashboard's {path} answer has no data.result: {str(doc)[:200]}") from None


def nodes(url: str) -> list[RayNode]:
    """Every node the head knows, alive or not (a dead node's logs may still be asked for)."""
    doc = _result(_get_json(url, "/api/v0/nodes", {"detail": "1", "limit": "10000"}), "/api/v0/nodes")
    rows = doc.get("result", []) if isinstance(doc, dict) else doc
    out = []
    for n in rows:
        res = n.get("resources_total") or {}
        out.append(RayNode(n["node_id"], n.get("node_ip", "?"), bool(n.get("is_head_node")), n.get("state") == "ALIVE", float(res.get("GPU", 0))))
    return sorted(out, key=lambda n: (not n.is_head, n.ip, n.node_id))


def job_worker_files(url: str, node_id: str, job_id: str) -> list[str]:
    """The stdout/stderr files of this job's workers on one node, and no other job's."""
    doc = _result(_get_json(url, "/api/v0/logs", {"node_id": node_id, "glob": f"*{job_id}*"}), "/api/v0/logs")
    names = [f for cat in ("worker_out", "worker_err") for f in (doc.get(cat) or [])]
    return sorted(f for f in names if (m := WORKER_LOG.match(f)) and m["job"] == job_id)


def read_log(url: str, node_id: str, filename: str) -> Iterator[bytes]:
    """One log file of one node, streamed in chunks (worker logs can be gigabytes)."""
    q = urllib.parse.urlencode({"node_id": node_id, "filename": filename, "lines": "-1"})
    try:
        with urllib.request.urlopen(f"{url}/api/v0/logs/file?{q}", timeout=HTTP_TIMEOUT_S) as r:
            while chunk := r.read(READ_CHUNK):
                yield chunk
    except (urllib.error.URLError, OSError) as e:
        raise RayError(f"cannot read {filename} of node {node_id[:8]} through the dashboard: {getattr(e, 'reason', e)}") from None


@dataclass(frozen=True)
class JobLogs:
    """A job's own worker logs, judged per node: the report and which files on which node."""

    report: NcclReport
    files: dict[str, list[str]]  # node name -> file names read
    nodes: list[RayNode]


def job_nccl(url: str, job_id: str, names: Mapping[str, str] | None = None) -> JobLogs:
    """Read this job's worker files on every node through the dashboard and judge NCCL per node.

    `names` maps a node's IP to a better name (its pod, on Kubernetes). A file whose first line
    names another job is skipped, whatever its file name says.
    """
    from raydlc.telemetry.nccl import ChunkScanner, NcclParser

    parser = NcclParser()
    seen: dict[str, list[str]] = {}
    all_nodes = nodes(url)
    for node in all_nodes:
        name = (names or {}).get(node.ip) or node.name
        for f in job_worker_files(url, node.node_id, job_id):
            scanner = ChunkScanner(parser, f"{name}:{f}", name)
            first = True
            for chunk in read_log(url, node.node_id, f):
                if first:
                    first = False
                    head = chunk.split(b"\n", 1)[0]
                    if head.startswith(b":job_id:") and head.removeprefix(b":job_id:").strip().decode(errors="replace") != job_id:
                        break
                scanner.feed(chunk)
            else:
                seen.setdefault(name, []).append(f)
            scanner.close()
    return JobLogs(parser.report(), seen, all_nodes)


# ---- what `verify` reads from the head ----------------------------------------------------------------

PROBE_TIMEOUT_S = 180.0


def probe_fabric(c: Any, *, target: str, timeout: float = PROBE_TIMEOUT_S) -> list[dict[str, Any]]:
    """fi_info on every alive node, as a short job of pinned Ray tasks (`python -m raydlc.probe`)."""
    from raydlc import __version__
    from raydlc.jobenv import JobSpec, raydlc_module_dir

    name = f"raydlc-probe-{time.strftime('%Y%m%d-%H%M%S')}-{int(time.time() * 1000) % 1000:03d}"
    spec = JobSpec("python -m raydlc.probe", {"py_modules": [str(raydlc_module_dir())]}, {"raydlc": __version__, "program": "probe", "target": target}, name)
    job, _ = submit(c, spec)
    done = wait(c, job.submission_id, timeout=timeout)
    text = logs(c, job.submission_id)
    if not done.terminal:
        stop(c, job.submission_id, wait_s=10)
        raise RayError(f"the fi_info probe job {name} did not end within {timeout:.0f} s", hint=f"`raydlc job logs {name}` shows how far it got")
    for line in reversed(text.splitlines()):
        if line.startswith('{"probe"'):
            return list(json.loads(line)["nodes"])
    raise RayError(f"the fi_info probe job {name} ended {done.status} without an answer", hint=f"`raydlc job logs {name}` shows why")


def latest_job(c: Any) -> Job | None:
    """The job `verify` reads when none is named: the newest that is not one of raydlc's probes."""
    jobs = [j for j in list_jobs(c) if j.metadata.get("program") != "probe"]
    return jobs[-1] if jobs else None


def ray_facts(c: Any, url: str, job: Job | None, *, target: str, expect: str, names: Mapping[str, str] | None = None) -> Facts:
    """The Ray side of the gate: the job, its worker logs per node, and fi_info on the GPU nodes."""
    from raydlc.telemetry.fabric import judge
    from raydlc.verify import Facts, JobFact

    facts = Facts(target=target, expect=expect, job=JobFact(job.submission_id, job.job_id, job.status, job.message) if job else None)
    if job is not None and job.job_id:
        found = job_nccl(url, job.job_id, names)
        facts.nccl, facts.nccl_files, ray_nodes = found.report, found.files, found.nodes
    else:
        ray_nodes = nodes(url)
    if expect != "efa":
        return facts
    local = target == "local"
    if not local and not any(n.alive and n.gpus > 0 for n in ray_nodes):
        facts.fabric_note = "no GPU node in the Ray cluster to probe"
        return facts
    by_id = {n.node_id: n for n in ray_nodes}

    def name_of(a: dict[str, Any]) -> str:
        n = by_id.get(a["node_id"])
        return (names or {}).get(a.get("ip") or "") or (n.name if n else f"{a.get('ip')}/{a['node_id'][:8]}")

    facts.fabric = [judge(name_of(a), a) for a in probe_fabric(c, target=target) if local or a.get("gpus", 0) > 0]
    return facts
