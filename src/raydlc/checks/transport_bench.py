"""The transport comparison: one short training job run twice, as configured and with sockets forced.

The reference compares an EFA run with a TCP run and divides their speeds; if the "EFA" run had
silently fallen back to sockets, it divides two socket runs and calls the result a speed-up.
Here a run's numbers count only once its own worker logs prove what carried it: the configured
run must show EFA on every node, the forced one sockets. On the local target every run trains
over gloo — there is no NCCL transport to compare, and the command says so instead of timing
the same thing twice and printing their ratio.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raydlc.edges.ray_dashboard import Dashboard, Job
    from raydlc.jobs.runtime_env import JobSpec
    from raydlc.jobs.worker_logs import JobLogs

# What forces NCCL onto TCP sockets, whatever the image and the pod's env say.
SOCKETS_FORCED: dict[str, str] = {"NCCL_NET": "Socket", "FI_PROVIDER": "tcp", "NCCL_NET_PLUGIN": "none"}
RUNS = (("configured", "efa", {}), ("sockets", "socket", SOCKETS_FORCED))


@dataclass(frozen=True)
class Run:
    """One of the two runs: its numbers and whether they count."""

    label: str
    expect: str  # the transport this run must show: efa | socket
    submission_id: str
    job_id: str | None
    status: str
    steps: int | None
    step_time_s: float | None
    tokens_per_s: float | None
    transport: dict[str, str] = field(default_factory=dict)  # node -> what its logs show
    counts: bool = False
    why: str = ""

    @property
    def steps_per_s(self) -> float | None:
        return 1.0 / self.step_time_s if self.step_time_s else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "steps_per_s": self.steps_per_s}


def judge(label: str, expect: str, job: Job, summary: Mapping[str, Any] | None, logs: JobLogs | None, *, target: str) -> Run:
    """A finished run, with its transport read from its own worker logs, node by node."""
    s = summary or {}
    hosts = {h.host: h for h in logs.report.hosts} if logs is not None else {}
    transport = {n: "no NCCL lines" if (h := hosts.get(n)) is None else f"{h.inter_node or 'none'} ({h.proof or 'no proof'})"
                 for n in sorted(logs.files if logs is not None else {})}
    why = _why_not(expect, job, summary, logs, hosts, target=target)
    return Run(label, expect, job.submission_id, job.job_id, job.status, s.get("steps"), s.get("step_time_s"), s.get("tokens_per_s"),
               transport, counts=why is None, why=why or "")


def _why_not(expect: str, job: Job, summary: Mapping[str, Any] | None, logs: JobLogs | None, hosts: Mapping[str, Any], *,
             target: str) -> str | None:
    """Why a run's numbers do not count, or None when its own logs prove `expect` carried it on every node."""
    if job.status != "SUCCEEDED" or summary is None:
        return f"the run {job.status}" + ("" if summary else " without a training summary")
    if target == "local":
        return "trained over gloo on one machine: no NCCL transport"
    if logs is None or not logs.files:
        return "no worker logs of this run to prove its transport"
    wrong = [n for n in logs.files if not (hosts.get(n) and hosts[n].inter_node == expect and hosts[n].proof == "carried")]
    if len(logs.files) < 2:
        return "one node: no inter-node traffic"
    if wrong or logs.report.fallback:
        return f"its logs do not show {expect} carrying the traffic on {', '.join(sorted(wrong)) or 'every node'}"
    return None


def compare(runs: list[Run], *, target: str) -> dict[str, Any]:
    """The two runs and, only when both count, the speed-up of the configured transport."""
    by = {r.label: r for r in runs}
    a, b = by.get("configured"), by.get("sockets")
    doc: dict[str, Any] = {"target": target, "runs": [r.to_dict() for r in runs], "speedup": None, "tokens_speedup": None}
    if target == "local":
        doc["applicable"] = False
        doc["reason"] = "not applicable: the local target trains over gloo, so there is no NCCL transport to compare (nothing was run)"
        return doc
    if a is None or b is None or not (a.counts and b.counts):
        doc["applicable"] = False
        doc["reason"] = "no speed-up: " + "; ".join(f"{r.label} run: {r.why}" for r in runs if not r.counts)
        return doc
    doc["applicable"] = True
    doc["reason"] = f"{a.expect} vs {b.expect}, both proven from their own worker logs"
    if a.steps_per_s and b.steps_per_s:
        doc["speedup"] = a.steps_per_s / b.steps_per_s
    if a.tokens_per_s and b.tokens_per_s:
        doc["tokens_speedup"] = a.tokens_per_s / b.tokens_per_s
    return doc


def specs(settings_env: Mapping[str, str], image: Mapping[str, str], *, target: str, stamp: str | None = None) -> dict[str, JobSpec]:
    """The two runs' jobs (by label): the built-in program with the same settings, the second with sockets forced."""
    from raydlc.jobs import runtime_env

    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    return {label: runtime_env.build(script=None, args=[], working_dir=None, pip=[], env=env, settings_env=settings_env, image=image,
                                name=f"raydlc-bench-{stamp}-{label}", target=target) for label, _, env in RUNS}


def run_both(dash: Dashboard, specs: Mapping[str, JobSpec], *, target: str, names: Mapping[str, str] | None = None,
             write: Callable[[str], None] = lambda _: None, notice: Callable[[str], None] = lambda _: None) -> list[Run]:
    """The configured job, then the socket one (`specs` by label): each submitted, followed through
    `write` until it ends, and judged from its own summary and worker logs."""
    from raydlc.jobs import control, worker_logs

    runs = []
    for label, expect, env in RUNS:
        job, _ = control.submit(dash, specs[label])
        notice(f"{label} run: job {job.submission_id}" + (f" ({', '.join(f'{k}={v}' for k, v in env.items())})" if env else ""))
        job = control.follow(dash, job.submission_id, write)
        summary = control.training_summary(dash.logs(job.submission_id))
        found = worker_logs.job_nccl(dash, job.job_id, names) if job.job_id else None
        runs.append(judge(label, expect, job, summary, found, target=target))
    return runs
