"""Jobs on a Ray cluster, over its head's dashboard: submit (or attach by name), wait, follow, stop,
the training summary, a probe job on every node, and a failed job as one error.

The semantics live here; every call to the head goes through `raydlc.edges.ray_dashboard.Dashboard`. A
job's state always comes from the Jobs API, never from how a log stream ended — a dropped
stream is not a finished job.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from raydlc.edges import poll
from raydlc.edges.ray_dashboard import Dashboard, HeadRefused, Job
from raydlc.errors import InputError, RaydlcError, RayError

if TYPE_CHECKING:
    from raydlc.jobs.runtime_env import JobSpec

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

    def look() -> Job:
        j = dash.job(job)
        if j is None:
            raise RayError(f"job {job} disappeared from the head", hint="the head may have restarted")
        return j

    return poll.until(look, lambda j: j.terminal, what=f"job {job} to end", timeout=timeout, interval=poll_s, or_last=True)


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

    def caught_up() -> Job:
        j = wait(dash, job, timeout=0)
        text = dash.logs(job)
        if len(text) > written:
            out(text[written:])
        return j

    try:
        with contextlib.suppress(RayError):  # the stream's end says nothing; the Jobs API decides below
            dash.tail(job, out)
        return poll.until(caught_up, lambda j: j.terminal, what=f"job {job} to end", timeout=None, interval=poll_s)
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


def restarts_of(text: str) -> list[dict[str, Any]]:
    """The built-in program's restarts (jobs.restarts): its printed summary's when it printed one, else folded from its driver's lines."""
    from raydlc.jobs import restarts

    summary = training_summary(text)
    if summary is not None and isinstance(summary.get("restarts"), list):
        return list(summary["restarts"])
    return restarts.restarts(restarts.records_of_log(text))


def latest_job(dash: Dashboard) -> Job | None:
    """The job `verify` reads when none is named: the newest that is not one of raydlc's probes."""
    jobs = [j for j in list_jobs(dash) if j.metadata.get("program") != "probe"]
    return jobs[-1] if jobs else None


def probe_nodes(dash: Dashboard, *, target: str, args: Sequence[str] = ("--fi-info",), timeout: float = PROBE_TIMEOUT_S) -> list[dict[str, Any]]:
    """The per-node probes `args` asks for on every alive node, as a short job of pinned Ray tasks (`python -m raydlc.checks.node_probe`)."""
    import shlex

    from raydlc import __version__
    from raydlc.jobs.runtime_env import JobSpec, raydlc_module_dir

    name = f"raydlc-probe-{time.strftime('%Y%m%d-%H%M%S')}-{int(time.time() * 1000) % 1000:03d}"
    entry = " ".join(["python -m raydlc.checks.node_probe", *(shlex.quote(a) for a in args)])
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
