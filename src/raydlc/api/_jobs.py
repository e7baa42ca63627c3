"""Jobs on a Ray head as use cases: submit, job_list/logs/status/stop, verify, bench_transport, down_local.

Each reaches its target once (`targets.reach`: the local head, `address`, or the cluster through
a port-forward), works through the head's `Dashboard`, and returns a frozen result whose
`to_dict()` is what the command's `--json` prints. A job's log streams through `write`; lines
for a person (warnings, what was submitted) through `notice`. Ctrl-C while a job streams raises
`raydlc.jobs.control.Detached` (a KeyboardInterrupt naming the job, which goes on).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.api._config import load
from raydlc.errors import InputError

if TYPE_CHECKING:
    from raydlc.checks.gate import GateVerdict
    from raydlc.config import Config
    from raydlc.edges.ray_dashboard import Job
    from raydlc.jobs.submit import Submitted
    from raydlc.jobs.targets import JobTarget, Reached

PathLike = str | os.PathLike[str]
Write = Callable[[str], None]
EXPECT = ("efa", "socket", "ib")
MAX_BENCH_STEPS = 100_000
MAX_GPUS = 450 * 16  # config.EKS_NODEGROUP_MAX nodes per managed node group x the most GPUs of any EC2 type (16)


def _quiet(_: str) -> None:
    pass


def _job_doc(job: Job, target: JobTarget, **extra: Any) -> dict[str, Any]:
    """The fields every job command's --json shares."""
    return {"job_id": job.submission_id, "ray_job_id": job.job_id, "status": job.status, "target": target.kind,
            "duration_s": job.duration_s, "message": job.message, "entrypoint": job.entrypoint, **extra}


@contextlib.contextmanager
def _reached(local: bool, address: str | None, config: PathLike | None, settings: Mapping[str, Any] | None, *,
             start: bool = False, notice: Write = _quiet, **named: Any) -> Iterator[tuple[Reached, Config]]:
    """The target → config → head preamble of every job command, in the order its errors are reported."""
    from raydlc.jobs import targets

    target = targets.choose(local, address)
    cfg = load(config, settings, **named)
    with targets.reach(target, cfg, start_local=start, on_start=lambda: notice(targets.STARTING)) as reached:
        yield reached, cfg


# ---- submit ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitResult:
    """The job as it ended (or as submitted, with `no_wait`), and the built-in program's summary."""

    job: Job
    target: JobTarget
    attached: bool  # the name was running already: this call followed that job instead of starting one
    waited: bool
    builtin: bool  # raydlc's training program ran (so a summary is looked for)
    summary: dict[str, Any] | None = None
    cold_start: dict[str, Any] | None = None  # the GPU workers it waited for on a cold cluster: gpus, pods, waited_s
    rayjob: dict[str, Any] | None = None  # with `rayjob`: name, namespace, replaced, code_zip, code_uploaded

    @classmethod
    def of(cls, target: JobTarget, done: Submitted) -> SubmitResult:
        """What `jobs.submit` reported, with its warm-up and RayJob as the dicts `--json` prints; the built-in
        program's loss plot drawn here from its metrics where the job's end drew none (the image has no matplotlib)."""
        from raydlc.evaluate.plot import with_plot

        summary = with_plot(done.summary) if done.summary else done.summary
        return cls(done.job, target, done.attached, done.waited, done.builtin, summary,
                   asdict(done.warm_up) if done.warm_up is not None else None, asdict(done.rayjob) if done.rayjob is not None else None)

    @property
    def ok(self) -> bool:
        return self.job.status == "SUCCEEDED"

    def to_dict(self) -> dict[str, Any]:
        extra = {"summary": self.summary} if self.waited and self.builtin else {}
        if self.cold_start is not None:
            extra["cold_start"] = self.cold_start
        if self.rayjob is not None:
            extra["rayjob"] = self.rayjob
        return _job_doc(self.job, self.target, attached=self.attached, **extra)


def submit(
    script: PathLike | None = None, args: Sequence[str] = (), *, builtin: bool = False, local: bool = False, address: str | None = None,
    name: str | None = None, pip: Sequence[str] = (), env: Mapping[str, str] | Sequence[str] = (), working_dir: PathLike | None = None,
    no_wait: bool = False, gpus: int | None = None, rayjob: bool = False, yes: bool = False, config: PathLike | None = None,
    settings: Mapping[str, Any] | None = None, write: Write = _quiet, notice: Write = _quiet,
) -> SubmitResult:
    """Run `script` (or, with `builtin`, raydlc's training program with the config's settings) as a Ray job.

    Checks everything that travels first (script, working dir, packages, env), then reaches the
    target — on `local`, starting raydlc's local head when none runs — and submits; a `name` whose
    job still runs is attached to instead. Unless `no_wait`, the job's log streams through `write`
    until it ends; the result says how it ended (the call does not raise for a failed job).

    On the cluster target a job that needs GPUs (`gpus`; by default the built-in program's
    workers, none for a script) and finds fewer GPU worker pods running follows them from Pending
    to Running through `notice` before its log streams (docs/control.md, "A cold cluster"); a job
    the RayCluster's GPU workers can never hold is refused before it is submitted.

    With `rayjob`, the built-in program goes as the RayJob `raydlc render --only rayjob` makes
    (docs/control.md, "As a RayJob"): raydlc's code zip is uploaded to the cluster's bucket, the RayJob
    applied, and its job, once KubeRay's submitter has put it on the head, followed as above. A
    RayJob of that name that exists already is refused, or with `yes` replaced (its job stopped first).

    Example:
        import raydlc.api as api
        done = api.submit(local=True, builtin=True, settings={"STEPS": 2, "SEQ_LEN": 32, "BATCH_SIZE": 2, "NUM_WORKERS": 1})
        assert done.ok and done.summary["steps"] == 2
        print(done.job.submission_id, done.job.status, round(done.summary["final_loss"], 3))
        api.down_local()
    """
    from raydlc.jobs import submit as service
    from raydlc.jobs import targets

    if builtin and script is not None:
        raise InputError("builtin=True runs raydlc's own training program: give no script")
    if gpus is not None and not 0 <= gpus <= MAX_GPUS:
        raise InputError(f"--gpus must be between 0 and {MAX_GPUS:,}, got {gpus}", hint="the GPUs the job needs on the cluster's GPU workers")
    _check_rayjob_flags(rayjob, yes, local=local, address=address, script=script, args=args, name=name, pip=pip, env=env,
                        working_dir=working_dir)
    target = targets.choose(local, address)
    cfg = load(config, settings)
    if rayjob:
        return SubmitResult.of(target, service.submit_rayjob(cfg, yes=yes, no_wait=no_wait, gpus=gpus, write=write, notice=notice))
    request = service.JobRequest(
        target, tuple(args), name, tuple(pip), tuple(f"{k}={v}" for k, v in env.items()) if isinstance(env, Mapping) else tuple(env),
        Path(working_dir) if working_dir is not None else None, gpus, no_wait,
    )
    if builtin or script is None:
        return SubmitResult.of(target, service.submit_builtin(cfg, request, write=write, notice=notice))
    return SubmitResult.of(target, service.submit_script(cfg, Path(script), request, write=write, notice=notice))


def _check_rayjob_flags(rayjob: bool, yes: bool, *, local: bool, address: str | None, script: PathLike | None, args: Sequence[str],
                        name: str | None, pip: Sequence[str], env: Mapping[str, str] | Sequence[str], working_dir: PathLike | None) -> None:
    """`--rayjob` is the rendered RayJob on the cluster: what travels comes from the config, so the flags that shape
    a Jobs API submission, and the other targets, are refused rather than silently ignored."""
    if not rayjob:
        if yes:
            raise InputError("--yes replaces an existing RayJob: it goes with --rayjob", hint="raydlc submit --rayjob --yes")
        return
    if local or address is not None:
        raise InputError(f"--rayjob and {'--local' if local else '--address'} cannot be combined: a RayJob is applied to the "
                         "cluster's KubeRay", hint="raydlc submit --rayjob (the cluster of the config), or drop --rayjob")
    if script is not None or args:
        raise InputError(f"--rayjob runs raydlc's training program as the rendered RayJob: give no SCRIPT{' ' + str(script)[:200] if script else ''}",
                         hint="raydlc submit SCRIPT.py (a script goes through the Jobs API)")
    extra = [flag for flag, given in (("--name", name), ("--pip", pip), ("--env", env), ("--working-dir", working_dir)) if given]
    if extra:
        raise InputError(f"--rayjob takes the job from the config (`raydlc render --only rayjob`): {', '.join(extra)} cannot be combined with it",
                         hint="--set RAY_JOB_NAME=NAME names the RayJob; training settings go in the config or --set")


# ---- job list / logs / status / stop ------------------------------------------------------------------


@dataclass(frozen=True)
class JobListResult:
    target: JobTarget
    jobs: tuple[Job, ...]  # oldest first

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target.kind, "jobs": [_job_doc(j, self.target) for j in self.jobs]}


def job_list(*, local: bool = False, address: str | None = None, config: PathLike | None = None,
             settings: Mapping[str, Any] | None = None) -> JobListResult:
    """Every job the head knows, oldest first.

    Example:
        import pathlib
        import raydlc.api as api
        pathlib.Path("hello").mkdir(exist_ok=True)
        pathlib.Path("hello/hello.py").write_text("print('hello from a Ray job')")
        done = api.submit("hello/hello.py", local=True)  # starts raydlc's local head when none runs
        listed = api.job_list(local=True)
        assert done.job.submission_id in [j.submission_id for j in listed.jobs]
        print([(j.submission_id, j.status) for j in listed.jobs])
    """
    from raydlc.jobs import control

    with _reached(local, address, config, settings) as (reached, _):
        return JobListResult(reached.target, tuple(control.list_jobs(reached.dashboard)))


@dataclass(frozen=True)
class JobLogsResult:
    job: Job
    target: JobTarget
    logs: str  # the driver's output (with `follow`: all that streamed)

    @property
    def ok(self) -> bool:
        return self.job.status == "SUCCEEDED"

    def to_dict(self) -> dict[str, Any]:
        return {**_job_doc(self.job, self.target), "logs": self.logs}


def job_logs(job_id: str, *, follow: bool = False, local: bool = False, address: str | None = None, config: PathLike | None = None,
             settings: Mapping[str, Any] | None = None, write: Write = _quiet) -> JobLogsResult:
    """The job's driver output (its workers' output is folded in by Ray); with `follow`, streamed through `write` until it ends.

    Example:
        import pathlib
        import raydlc.api as api
        pathlib.Path("hello").mkdir(exist_ok=True)
        pathlib.Path("hello/hello.py").write_text("print('hello from a Ray job')")
        started = api.submit("hello/hello.py", local=True, no_wait=True)
        out = api.job_logs(started.job.submission_id, follow=True, local=True, write=print)
        assert out.ok and "hello from a Ray job" in out.logs
    """
    from raydlc.jobs import control

    with _reached(local, address, config, settings) as (reached, _):
        dash = reached.dashboard
        job = control.require(dash, job_id, reached.target.where, reached.target.flag)
        if not follow:
            return JobLogsResult(job, reached.target, dash.logs(job.submission_id))
        seen: list[str] = []

        def both(text: str) -> None:
            seen.append(text)
            write(text)

        job = control.follow(dash, job.submission_id, both)
        return JobLogsResult(job, reached.target, "".join(seen))


@dataclass(frozen=True)
class JobStatusResult:
    job: Job
    target: JobTarget
    cost: dict[str, Any] | None = None  # under a budget: the last step's spend so far and forecast to the last step, from the job's log
    restarts: list[dict[str, Any]] = field(default_factory=list)  # {cause, at_step, resumed_from, node}, from the job's log (jobs.restarts)

    def to_dict(self) -> dict[str, Any]:
        j = self.job
        return _job_doc(j, self.target, start_time=j.start_time, end_time=j.end_time, metadata=j.metadata, runtime_env=j.runtime_env,
                        driver_exit_code=j.driver_exit_code, cost=self.cost, restarts=self.restarts)


def job_status(job_id: str, *, local: bool = False, address: str | None = None, config: PathLike | None = None,
               settings: Mapping[str, Any] | None = None) -> JobStatusResult:
    """The job's state as the Jobs API reports it (never inferred from a log stream).

    Example:
        import pathlib
        import raydlc.api as api
        pathlib.Path("hello").mkdir(exist_ok=True)
        pathlib.Path("hello/hello.py").write_text("print('hello from a Ray job')")
        started = api.submit("hello/hello.py", local=True, env={"GREETING": "hi"}, no_wait=True)
        state = api.job_status(started.job.submission_id, local=True)
        assert state.job.runtime_env["env_vars"]["GREETING"] == "hi"
        print(state.job.status, state.to_dict()["entrypoint"])
    """
    from raydlc.jobs import control

    with _reached(local, address, config, settings) as (reached, _):
        job = control.require(reached.dashboard, job_id, reached.target.where, reached.target.flag)
        env = (job.runtime_env or {}).get("env_vars") or {}
        log = reached.dashboard.logs(job.submission_id)
        cost = control.latest_cost(log) if "RAYDLC_JOB_MAX_COST_USD" in env else None
        if cost is not None and "RAYDLC_GPU_USD_PER_HOUR" in env:  # submit set the Spot price the job keeps its budget at
            from raydlc.planner.budget import SPOT_LABEL

            cost = {**cost, "price": f"{SPOT_LABEL}, ${float(env['RAYDLC_GPU_USD_PER_HOUR']):.2f}/h a node"}
        return JobStatusResult(job, reached.target, cost, control.restarts_of(log))


@dataclass(frozen=True)
class JobStopResult:
    job: Job  # its state once it ended (or after the wait)
    target: JobTarget
    was_running: bool

    def to_dict(self) -> dict[str, Any]:
        return _job_doc(self.job, self.target, was_running=self.was_running)


def job_stop(job_id: str, *, local: bool = False, address: str | None = None, config: PathLike | None = None,
             settings: Mapping[str, Any] | None = None) -> JobStopResult:
    """Stop a job and wait until it has ended.

    Example:
        import pathlib
        import raydlc.api as api
        pathlib.Path("sleeper").mkdir(exist_ok=True)
        pathlib.Path("sleeper/sleep.py").write_text("import time; time.sleep(600)")
        started = api.submit("sleeper/sleep.py", local=True, no_wait=True)
        stopped = api.job_stop(started.job.submission_id, local=True)
        assert stopped.job.status == "STOPPED" and stopped.was_running
        print(stopped.job.submission_id, stopped.job.status)
    """
    from raydlc.jobs import control

    with _reached(local, address, config, settings) as (reached, _):
        control.require(reached.dashboard, job_id, reached.target.where, reached.target.flag)
        job, was_running = control.stop(reached.dashboard, job_id)
        return JobStopResult(job, reached.target, was_running)


# ---- verify and bench-transport ---------------------------------------------------------------------


def verify(*, job: str | None = None, expect: str = "efa", local: bool = False, address: str | None = None,
           config: PathLike | None = None, settings: Mapping[str, Any] | None = None) -> GateVerdict:
    """The gate: GPU nodes, pods, fi_info, NCCL from the job's own worker logs, the run prefix, the head's port, the job's status.

    `job` defaults to the newest job on the target; `verdict.passed` is False when a criterion fails.

    Example:
        import pathlib
        import raydlc.api as api
        pathlib.Path("hello").mkdir(exist_ok=True)
        pathlib.Path("hello/hello.py").write_text("print('hello from a Ray job')")
        done = api.submit("hello/hello.py", local=True)
        verdict = api.verify(job=done.job.submission_id, local=True)  # on the local target the network rows are not applicable
        assert verdict.passed and {r.criterion: r.status for r in verdict.rows}["job"] == "pass"
        print([(r.criterion, r.status) for r in verdict.rows])
    """
    from raydlc.checks import gate

    if expect not in EXPECT:
        raise InputError(f"--expect {expect!r} is not one of {', '.join(EXPECT)}")
    from raydlc.edges import aws

    with aws.command_budget("verify"), _reached(local, address, config, settings) as (reached, cfg):
        if cfg.cluster.attach and reached.kube is not None:
            from raydlc.lifecycle.attach import priced_as_found

            cfg = priced_as_found(cfg)  # GPUs per node as the RayCluster's workers were rendered on the found nodes
        facts = gate.collect(reached, cfg, job_id=job, expect=expect)
    return gate.gate(facts)


@dataclass(frozen=True)
class BenchResult:
    """The two runs and the comparison `transport_bench.compare` made of them (its dict is the --json)."""

    target: JobTarget
    runs: tuple[Any, ...]  # transport_bench.Run
    comparison: dict[str, Any]

    @property
    def ran(self) -> bool:
        """False on the local target: there every run trains over gloo, so nothing was run."""
        return bool(self.runs)

    @property
    def failed(self) -> list[str]:
        """The labels of the runs whose job did not succeed."""
        return [r.label for r in self.runs if r.status != "SUCCEEDED"]

    @property
    def applicable(self) -> bool:
        return bool(self.comparison["applicable"])

    def to_dict(self) -> dict[str, Any]:
        return self.comparison


def bench_transport(*, steps: int = 20, local: bool = False, address: str | None = None, config: PathLike | None = None,
                    settings: Mapping[str, Any] | None = None, write: Write = _quiet, notice: Write = _quiet) -> BenchResult:
    """The same short training job twice, as configured and with sockets forced, each proven from its own logs.

    A run's steps/s count only once its worker logs show the transport it was meant to use.

    Example:
        import raydlc.api as api
        result = api.bench_transport(local=True, steps=3)
        assert not result.ran and result.comparison["speedup"] is None
        print(result.comparison["reason"])
    """
    from raydlc.checks import transport_bench
    from raydlc.checks.gate import kube_facts
    from raydlc.jobs import targets
    from raydlc.jobs.runtime_env import builtin_env, image_versions

    if not 1 <= steps <= MAX_BENCH_STEPS:
        raise InputError(f"--steps must be between 1 and {MAX_BENCH_STEPS:,}, got {steps}")
    target = targets.choose(local, address)
    cfg = load(config, settings, STEPS=steps)
    if target.kind == targets.LOCAL:  # every local run is gloo: two of them would only time the same thing twice
        return BenchResult(target, (), transport_bench.compare([], target=target.kind))
    runs_specs = transport_bench.specs(builtin_env(cfg, target.kind), image_versions(cfg, target.kind), target=target.kind)
    with targets.reach(target, cfg) as reached:
        names = kube_facts(reached.kube, cfg).names if reached.kube is not None else None
        runs = transport_bench.run_both(reached.dashboard, runs_specs, target=target.kind, names=names, write=write, notice=notice)
    return BenchResult(target, tuple(runs), transport_bench.compare(runs, target=target.kind))


# ---- down --local ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DownLocalResult:
    pid: int | None  # the head's PID, None when none ran
    dashboard: str | None
    ended: bool
    dry_run: bool
    doubted: str | None = None  # a head record that was not believed (and, unless dry_run, removed): why

    @property
    def message(self) -> str:
        if self.doubted is not None:
            return f"{'would remove' if self.dry_run else 'removed'} the {self.doubted}"
        if self.pid is None:
            return "no local Ray head of raydlc runs"
        if self.dry_run:
            return f"would end the local Ray head (PID {self.pid}, {self.dashboard})"
        return f"ended the local Ray head (PID {self.pid}) and everything it started"

    def to_dict(self) -> dict[str, Any]:
        return {"local": {"pid": self.pid, "dashboard": self.dashboard, "ended": self.ended, "doubted_record": self.doubted}}


def down_local(*, dry_run: bool = False) -> DownLocalResult:
    """End raydlc's local Ray head by its recorded PID and process group (never Ray's own stop command, which ends every Ray); with `dry_run`, only say which.

    The record is checked first (the PID runs, started when the record says, and is raydlc's
    head): a record that fails is removed and reported, and neither the process nor the
    directory it names is touched.

    Example:
        import raydlc.api as api
        gone = api.down_local()
        assert api.down_local().pid is None  # a second call finds nothing to end
        print(gone.message)
    """
    from raydlc.jobs import targets

    claim = targets.check_record()
    if claim is not None and claim.doubt is not None:
        if not dry_run:
            targets.forget(claim)
        return DownLocalResult(None, None, ended=False, dry_run=dry_run, doubted=claim.report)
    rec = claim.record if claim is not None else None
    if dry_run or rec is None:
        return DownLocalResult(rec.pid if rec else None, rec.dashboard_url if rec else None, ended=False, dry_run=dry_run)
    ended = targets.stop_local_head()
    return DownLocalResult(ended.pid if ended else None, ended.dashboard_url if ended else None, ended=ended is not None, dry_run=False)
