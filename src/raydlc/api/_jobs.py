"""Jobs on a Ray head as use cases: submit, job_list/logs/status/stop, verify, bench_transport, down_local.

Each reaches its target once (`heads.reach`: the local head, `address`, or the cluster through
a port-forward), works through the head's `Dashboard`, and returns a frozen result whose
`to_dict()` is what the command's `--json` prints. A job's log streams through `write`; lines
for a person (warnings, what was submitted) through `notice`. Ctrl-C while a job streams raises
`raydlc.jobs.Detached` (a KeyboardInterrupt naming the job, which goes on).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.api._config import load
from raydlc.errors import InputError

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.dashboard import Job
    from raydlc.heads import Reached, Target
    from raydlc.verify import Verdict

PathLike = str | os.PathLike[str]
Write = Callable[[str], None]
EXPECT = ("efa", "socket", "ib")
MAX_BENCH_STEPS = 100_000
MAX_GPUS = 450 * 16  # config.EKS_NODEGROUP_MAX nodes per managed node group x the most GPUs of any EC2 type (16)


def _quiet(_: str) -> None:
    pass


def _job_doc(job: Job, target: Target, **extra: Any) -> dict[str, Any]:
    """The fields every job command's --json shares."""
    return {"job_id": job.submission_id, "ray_job_id": job.job_id, "status": job.status, "target": target.kind,
            "duration_s": job.duration_s, "message": job.message, "entrypoint": job.entrypoint, **extra}


@contextlib.contextmanager
def _reached(local: bool, address: str | None, config: PathLike | None, settings: Mapping[str, Any] | None, *,
             start: bool = False, notice: Write = _quiet, **named: Any) -> Iterator[tuple[Reached, Config]]:
    """The target → config → head preamble of every job command, in the order its errors are reported."""
    from raydlc import heads

    target = heads.choose(local, address)
    cfg = load(config, settings, **named)
    with heads.reach(target, cfg, start_local=start, on_start=lambda: notice(heads.STARTING)) as reached:
        yield reached, cfg


def _builtin_env(cfg: Config, local: bool, *, cluster: bool = False) -> dict[str, str]:
    """The config's training settings as the RAYDLC_* variables `python -m raydlc.train` reads; on a cluster
    USE_GPU left empty is true: a GPU group scaled to zero has no GPU yet, and the job must ask for them."""
    from raydlc.config import with_local_defaults
    from raydlc.jobenv import absolute_local_paths
    from raydlc.render.raycluster import job_env

    if local:
        return absolute_local_paths(job_env(with_local_defaults(cfg)))
    env = job_env(cfg)
    if cluster and cfg.train.use_gpu is None:  # "when the Ray cluster has GPUs": the cluster's workers are GPU nodes, even while at zero
        env.setdefault("RAYDLC_USE_GPU", "true")
    return env


def _image_versions(cfg: Config, local: bool) -> dict[str, str]:
    """The torch and ray a job must not replace: this machine's on the local target, else the image's."""
    from raydlc import catalog
    from raydlc.jobenv import installed_version

    img = catalog.IMAGES.get(cfg.images.dlc_image)
    if not local and img is not None:
        return {"torch": img.torch, "ray": img.ray}
    return {"torch": installed_version("torch") or (img.torch if img else "2.13.0"), "ray": installed_version("ray") or cfg.images.ray_version}


# ---- submit ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitResult:
    """The job as it ended (or as submitted, with `no_wait`), and the built-in program's summary."""

    job: Job
    target: Target
    attached: bool  # the name was running already: this call followed that job instead of starting one
    waited: bool
    builtin: bool  # raydlc's training program ran (so a summary is looked for)
    summary: dict[str, Any] | None = None
    cold_start: dict[str, Any] | None = None  # the GPU workers it waited for on a cold cluster: gpus, pods, waited_s
    rayjob: dict[str, Any] | None = None  # with `rayjob`: name, namespace, replaced, code_zip, code_uploaded

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
    to Running through `notice` before its log streams (docs/jobs.md, "A cold cluster"); a job
    the RayCluster's GPU workers can never hold is refused before it is submitted.

    With `rayjob`, the built-in program goes as the RayJob `raydlc render --only rayjob` makes
    (docs/jobs.md, "As a RayJob"): raydlc's code zip is uploaded to the cluster's bucket, the RayJob
    applied, and its job, once KubeRay's submitter has put it on the head, followed as above. A
    RayJob of that name that exists already is refused, or with `yes` replaced (its job stopped first).

    Example:
        import raydlc.api as api
        done = api.submit(local=True, builtin=True, settings={"STEPS": 2, "SEQ_LEN": 32, "BATCH_SIZE": 2, "NUM_WORKERS": 1})
        assert done.ok and done.summary["steps"] == 2
        print(done.job.submission_id, done.job.status, round(done.summary["final_loss"], 3))
        api.down_local()
    """
    from raydlc import heads, jobenv, jobs

    if builtin and script is not None:
        raise InputError("builtin=True runs raydlc's own training program: give no script")
    if gpus is not None and not 0 <= gpus <= MAX_GPUS:
        raise InputError(f"--gpus must be between 0 and {MAX_GPUS:,}, got {gpus}", hint="the GPUs the job needs on the cluster's GPU workers")
    _check_rayjob_flags(rayjob, yes, local=local, address=address, script=script, args=args, name=name, pip=pip, env=env,
                        working_dir=working_dir)
    target = heads.choose(local, address)
    cfg = load(config, settings)
    if rayjob:
        return _submit_rayjob(cfg, yes=yes, no_wait=no_wait, gpus=gpus, write=write, notice=notice)
    is_local = target.kind == heads.LOCAL
    program = None if builtin or script is None else Path(script)
    if program is None and cfg.train.max_cost_usd is not None:
        _check_budget(cfg, target)
    if program is None and is_local:
        _check_local_inputs(cfg)
    env_pairs = [f"{k}={v}" for k, v in env.items()] if isinstance(env, Mapping) else list(env)
    spec = jobenv.build(
        script=program, args=list(args), working_dir=Path(working_dir) if working_dir is not None else None, pip=list(pip),
        env=jobenv.parse_env(env_pairs), settings_env=_builtin_env(cfg, is_local, cluster=target.kind == heads.CLUSTER) if program is None else {},
        image=_image_versions(cfg, is_local), name=name, target=target.kind,
    )
    for w in spec.warnings:
        notice(f"warning: {w}")
    if spec.upload is not None:
        notice(f"working dir {spec.upload.root}: {len(spec.upload.files)} files, {jobenv.mib(spec.upload.size)} to upload")
    with heads.reach(target, cfg, start_local=True, on_start=lambda: notice(heads.STARTING),
                     on_doubt=lambda text: notice(f"warning: {text}")) as reached:
        dash = reached.dashboard
        cold = _cold(reached, cfg, _gpus_needed(cfg, gpus, builtin=program is None)) if reached.kube is not None else None
        job, attached = jobs.submit(dash, spec)
        notice(f"{'attached to the running job' if attached else 'submitted job'} {job.submission_id} on {target.where}")
        if no_wait:
            if cold is not None:
                from raydlc import coldstart

                notice(coldstart.headline(cold[2], cfg.gpu_nodes.instance_type))
            return SubmitResult(job, target, attached, waited=False, builtin=spec.builtin)
        waited = _warm_up(reached, cfg, cold, job, attached, notice) if cold is not None else None
        job = jobs.follow(dash, job.submission_id, write)
        builtin_run = (spec.builtin and not attached) or job.metadata.get("program") == "builtin"
        summary = jobs.training_summary(dash.logs(job.submission_id)) if builtin_run else None
    return SubmitResult(job, target, attached, waited=True, builtin=builtin_run, summary=summary, cold_start=waited)


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


def _submit_rayjob(cfg: Config, *, yes: bool, no_wait: bool, gpus: int | None, write: Write, notice: Write) -> SubmitResult:
    """Render the RayJob, upload the code zip it names, apply it, and follow its Ray job as `submit` follows any job."""
    from raydlc import heads, jobs, rayjobs

    cfg, bucket, doc = _rendered_rayjob(cfg)
    target = heads.choose(False, None)
    with heads.reach(target, cfg) as reached:
        cold = _cold(reached, cfg, _gpus_needed(cfg, gpus, builtin=True))
        info = _apply_rayjob(reached, cfg, bucket, doc, yes=yes, notice=notice)
        assert reached.kube is not None
        job_id = rayjobs.submission_id(reached.kube, doc)
        notice(f"applied RayJob {info['namespace']}/{info['name']}; KubeRay submits it as job {job_id}")
        job = rayjobs.submitted(reached.kube, reached.dashboard, doc, job_id, notice)
        notice(f"submitted job {job_id} on {target.where}")
        if no_wait:
            return SubmitResult(job, target, attached=False, waited=False, builtin=True, rayjob=info)
        waited = _warm_up(reached, cfg, cold, job, False, notice) if cold is not None else None
        job = jobs.follow(reached.dashboard, job_id, write)
        summary = jobs.training_summary(reached.dashboard.logs(job_id))
    return SubmitResult(job, target, attached=False, waited=True, builtin=True, summary=summary, cold_start=waited, rayjob=info)


def _rendered_rayjob(cfg: Config) -> tuple[Config, Any, dict[str, Any]]:
    """(config with the cluster's bucket, the bucket, the RayJob) exactly as `render --only rayjob` makes them."""
    from raydlc import aws
    from raydlc.render import FILES, render_all
    from raydlc.render.storage import bucket_of, for_cluster

    cfg = for_cluster(cfg, lambda: aws.account_id(cfg.cluster.region))
    bucket = bucket_of(cfg)
    if bucket is None:
        raise InputError(f"--rayjob ships raydlc to the cluster as a zip in its S3 bucket, and STORAGE_PATH ({cfg.origin('STORAGE_PATH')}) "
                         "is not on S3", hint="raydlc submit --builtin (the Jobs API uploads raydlc with the job), or STORAGE_PATH=s3://<bucket>/runs")
    return cfg, bucket, render_all(cfg, only="rayjob")[FILES["rayjob"]]


def _apply_rayjob(reached: Reached, cfg: Config, bucket: Any, doc: dict[str, Any], *, yes: bool, notice: Write) -> dict[str, Any]:
    """Refuse (or with `yes` replace) a RayJob of the same name, put the code zip in the bucket, create the RayJob."""
    from raydlc import aws, codezip, rayjobs
    from raydlc.lifecycle.resources.storage import put_code

    kube = reached.kube
    assert kube is not None
    ns, name = rayjobs.where(doc)
    old = rayjobs.existing(kube, doc)
    if old is not None and not yes:
        raise rayjobs.refuse_existing(old, doc)
    code = codezip.build()
    with aws.command_budget("submit"):
        uploaded = put_code(aws.client(aws.session(cfg.cluster.region), "s3"), bucket.name, code)
    notice(f"{'uploaded' if uploaded else 'found'} raydlc's code zip {code.uri(bucket.name)}")
    if old is not None:
        rayjobs.remove(kube, reached.dashboard, old, doc)
        notice(f"deleted the RayJob {ns}/{name} that existed ({rayjobs.describe(old)})")
    kube.create(doc)
    return {"name": name, "namespace": ns, "replaced": old is not None, "code_zip": code.uri(bucket.name), "code_uploaded": uploaded}


def _gpus_needed(cfg: Config, gpus: int | None, *, builtin: bool) -> int:
    """GPUs the job needs on the GPU workers: as asked; else the built-in program's workers (one GPU each
    unless USE_GPU=false); else none — a script's needs are its own."""
    if gpus is not None:
        return gpus
    return cfg.num_workers if builtin and cfg.train.use_gpu is not False else 0


def _cold(reached: Reached, cfg: Config, gpus: int) -> tuple[Any, Any, Any] | None:
    """(demand, ASG reader, first snapshot) when the job needs GPU worker pods that are not running yet; None when
    it needs none or they run. A job the GPU workers can never hold is refused here, before submission."""
    from raydlc import coldstart, warmup

    if gpus <= 0:
        return None
    assert reached.kube is not None
    need = warmup.demand(reached.kube, cfg, gpus)
    never = coldstart.never_fits(need)
    if never:
        raise InputError(f"{never}; nothing was submitted",
                         hint="ask for fewer GPUs (--workers, --gpus), or raise GPU_NODE_COUNT and run `raydlc up`")
    if coldstart.running_pods(warmup.look(reached.kube, cfg, need, None).pods) >= need.pods:
        return None  # warm: nothing is asked of AWS
    asg = warmup.AsgReader(cfg)
    return need, asg, warmup.look(reached.kube, cfg, need, asg)


def _warm_up(reached: Reached, cfg: Config, cold: tuple[Any, Any, Any], job: Job, attached: bool, notice: Write) -> dict[str, Any]:
    """Follow the GPU worker pods until they run; on failure stop the job this call submitted (a job left
    waiting would take the nodes whenever they come, with nobody watching) and raise."""
    import time

    from raydlc import aws, jobs, warmup

    assert reached.kube is not None
    need, asg, first = cold
    t0 = time.monotonic()
    try:
        with aws.command_budget("submit"):
            warmup.follow(reached.kube, cfg, need, notice, asg=asg, first=first)
    except warmup.ColdStartFailed as e:
        if not attached:
            jobs.stop(reached.dashboard, job.submission_id, wait_s=30)
        raise warmup.ColdStartFailed(e.message + ("" if attached else f"; job {job.submission_id} was stopped"), hint=e.hint) from None
    except KeyboardInterrupt:
        raise jobs.Detached(job.submission_id) from None
    return {"gpus": need.gpus, "pods": need.pods, "waited_s": round(time.monotonic() - t0, 1)}


def _check_budget(cfg: Config, target: Target) -> None:
    """JOB_MAX_COST_USD before submission: the cluster's GPU nodes have a list price and the budget
    must buy start-up and a step at it; a local head or a dashboard of unknown nodes has no price."""
    from raydlc import heads
    from raydlc.render.raycluster import job_deadline
    from raydlc.train.budget import check_budget

    if target.kind != heads.CLUSTER:
        check_budget(cfg.train.max_cost_usd or 0.0, None, step_s=None, where=target.where)
    job_deadline(cfg)


def _check_local_inputs(cfg: Config) -> None:
    """The built-in program on this machine reads MODEL_ID and DATA from here: a missing path fails
    now, not inside the job after a head has started."""
    from raydlc.config import with_local_defaults
    from raydlc.models import spec_for
    from raydlc.train.data import is_local, read_local

    train = with_local_defaults(cfg).train
    spec_for(train.model_id)  # a model path that does not exist, or a directory without config.json
    if train.data and is_local(train.data) and not Path(train.data).expanduser().exists():
        read_local(train.data)  # its own error, naming --data


# ---- job list / logs / status / stop ------------------------------------------------------------------


@dataclass(frozen=True)
class JobListResult:
    target: Target
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
    from raydlc import jobs

    with _reached(local, address, config, settings) as (reached, _):
        return JobListResult(reached.target, tuple(jobs.list_jobs(reached.dashboard)))


@dataclass(frozen=True)
class JobLogsResult:
    job: Job
    target: Target
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
    from raydlc import jobs

    with _reached(local, address, config, settings) as (reached, _):
        dash = reached.dashboard
        job = jobs.require(dash, job_id, reached.target.where, reached.target.flag)
        if not follow:
            return JobLogsResult(job, reached.target, dash.logs(job.submission_id))
        seen: list[str] = []

        def both(text: str) -> None:
            seen.append(text)
            write(text)

        job = jobs.follow(dash, job.submission_id, both)
        return JobLogsResult(job, reached.target, "".join(seen))


@dataclass(frozen=True)
class JobStatusResult:
    job: Job
    target: Target
    cost: dict[str, Any] | None = None  # under a budget: the last step's spend so far and forecast to the last step, from the job's log

    def to_dict(self) -> dict[str, Any]:
        j = self.job
        return _job_doc(j, self.target, start_time=j.start_time, end_time=j.end_time, metadata=j.metadata, runtime_env=j.runtime_env,
                        driver_exit_code=j.driver_exit_code, cost=self.cost)


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
    from raydlc import jobs

    with _reached(local, address, config, settings) as (reached, _):
        job = jobs.require(reached.dashboard, job_id, reached.target.where, reached.target.flag)
        budgeted = "RAYDLC_JOB_MAX_COST_USD" in ((job.runtime_env or {}).get("env_vars") or {})
        cost = jobs.latest_cost(reached.dashboard.logs(job.submission_id)) if budgeted else None
        return JobStatusResult(job, reached.target, cost)


@dataclass(frozen=True)
class JobStopResult:
    job: Job  # its state once it ended (or after the wait)
    target: Target
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
    from raydlc import jobs

    with _reached(local, address, config, settings) as (reached, _):
        jobs.require(reached.dashboard, job_id, reached.target.where, reached.target.flag)
        job, was_running = jobs.stop(reached.dashboard, job_id)
        return JobStopResult(job, reached.target, was_running)


# ---- verify and bench-transport ---------------------------------------------------------------------


def verify(*, job: str | None = None, expect: str = "efa", local: bool = False, address: str | None = None,
           config: PathLike | None = None, settings: Mapping[str, Any] | None = None) -> Verdict:
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
    from raydlc import verify as gate

    if expect not in EXPECT:
        raise InputError(f"--expect {expect!r} is not one of {', '.join(EXPECT)}")
    from raydlc import aws

    with aws.command_budget("verify"), _reached(local, address, config, settings) as (reached, cfg):
        facts = gate.collect(reached, cfg, job_id=job, expect=expect)
    return gate.gate(facts)


@dataclass(frozen=True)
class BenchResult:
    """The two runs and the comparison `bench.compare` made of them (its dict is the --json)."""

    target: Target
    runs: tuple[Any, ...]  # bench.Run
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
    from raydlc import bench, heads
    from raydlc.verify import kube_facts

    if not 1 <= steps <= MAX_BENCH_STEPS:
        raise InputError(f"--steps must be between 1 and {MAX_BENCH_STEPS:,}, got {steps}")
    target = heads.choose(local, address)
    cfg = load(config, settings, STEPS=steps)
    if target.kind == heads.LOCAL:  # every local run is gloo: two of them would only time the same thing twice
        return BenchResult(target, (), bench.compare([], target=target.kind))
    runs_specs = bench.specs(_builtin_env(cfg, False, cluster=target.kind == heads.CLUSTER), _image_versions(cfg, False), target=target.kind)
    with heads.reach(target, cfg) as reached:
        names = kube_facts(reached.kube, cfg).names if reached.kube is not None else None
        runs = bench.run_both(reached.dashboard, runs_specs, target=target.kind, names=names, write=write, notice=notice)
    return BenchResult(target, tuple(runs), bench.compare(runs, target=target.kind))


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
    """End raydlc's local Ray head by its recorded PID and process group (never `ray stop`); with `dry_run`, only say which.

    The record is checked first (the PID runs, started when the record says, and is raydlc's
    head): a record that fails is removed and reported, and neither the process nor the
    directory it names is touched.

    Example:
        import raydlc.api as api
        gone = api.down_local()
        assert api.down_local().pid is None  # a second call finds nothing to end
        print(gone.message)
    """
    from raydlc import heads

    claim = heads.check_record()
    if claim is not None and claim.doubt is not None:
        if not dry_run:
            heads.forget(claim)
        return DownLocalResult(None, None, ended=False, dry_run=dry_run, doubted=claim.report)
    rec = claim.record if claim is not None else None
    if dry_run or rec is None:
        return DownLocalResult(rec.pid if rec else None, rec.dashboard_url if rec else None, ended=False, dry_run=dry_run)
    ended = heads.stop_local_head()
    return DownLocalResult(ended.pid if ended else None, ended.dashboard_url if ended else None, ended=ended is not None, dry_run=False)
