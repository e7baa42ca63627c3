"""Submitting a job and following it to its end: a script, raydlc's built-in program, or the rendered RayJob.

Each way checks what travels first, then reaches the target once and, on the cluster, looks at
the GPU workers before it submits: a job they can never hold is refused, and a job that finds
them not yet running (a `ColdStart`) follows them from Pending to Running before its log streams
(docs/control.md, "A cold cluster"). A job's log streams through `write`; lines for a person
through `notice`. The result says how the job ended; a failed job is a result, not an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.errors import InputError
from raydlc.jobs import control, targets

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.edges.ray_dashboard import Job
    from raydlc.jobs.cold_start import Demand, Snapshot
    from raydlc.jobs.runtime_env import JobSpec
    from raydlc.jobs.targets import JobTarget, Reached
    from raydlc.jobs.warmup import AsgReader

Write = Callable[[str], None]


@dataclass(frozen=True)
class JobRequest:
    """A Jobs API submission as asked: where, what travels with the program, and how it is followed."""

    target: JobTarget
    args: tuple[str, ...] = ()
    name: str | None = None  # the submission id; a running job of that name is attached to
    pip: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # NAME=VALUE, as --env takes them
    working_dir: Path | None = None
    gpus: int | None = None  # GPUs the job needs on the cluster's GPU workers; None: see `gpus_needed`
    no_wait: bool = False  # return once submitted, without following the job


@dataclass(frozen=True)
class Submitted:
    """The job as it ended (or as submitted, unless `waited`), and the built-in program's summary."""

    job: Job
    attached: bool  # the name was running already: this call followed that job instead of starting one
    waited: bool
    builtin: bool  # raydlc's training program ran (so a summary is looked for)
    summary: dict[str, Any] | None = None
    warm_up: WarmUp | None = None
    rayjob: AppliedRayJob | None = None


def submit_script(cfg: Config, script: Path, request: JobRequest, *, write: Write, notice: Write) -> Submitted:
    """Run the user's `script` from its working dir; it needs GPU workers only when `request.gpus` says so."""
    if cfg.train.max_cost_usd is not None:  # a dollar budget is kept by raydlc's own program, on the cluster's priced nodes
        if request.target.kind != targets.CLUSTER:
            _check_budget(cfg, request.target)
        notice("warning: JOB_MAX_COST_USD is kept by raydlc's built-in program; a script's job is not stopped by it")
    _check_local_gpus(request)
    spec = _spec(cfg, request, script, notice)
    return _run(cfg, request, spec, gpus_needed(cfg, request.gpus, builtin=False), write=write, notice=notice)


def submit_builtin(cfg: Config, request: JobRequest, *, write: Write, notice: Write) -> Submitted:
    """Run raydlc's training program with the config's settings; the budget and, locally, the model and data are checked first."""
    from raydlc.render.raycluster import price_env

    if cfg.cluster.attach and request.target.kind == targets.CLUSTER:
        cfg = _as_found(cfg)
    prices = _check_budget(cfg, request.target) if cfg.train.max_cost_usd is not None else None
    if request.target.kind == targets.LOCAL:
        _check_local_inputs(cfg)
    _check_local_gpus(request)
    spec = _spec(cfg, request, None, notice, price_env(cfg, prices))
    return _run(cfg, request, spec, gpus_needed(cfg, request.gpus, builtin=True), write=write, notice=notice)


def submit_rayjob(cfg: Config, *, yes: bool, no_wait: bool, gpus: int | None, write: Write, notice: Write) -> Submitted:
    """Render the RayJob, upload the code zip it names, apply it, and follow its Ray job as any job is followed.

    A RayJob of the same name is refused, or with `yes` replaced (its job stopped first).
    """
    from raydlc.jobs import rayjob

    cfg, bucket, doc = _rendered_rayjob(_as_found(cfg) if cfg.cluster.attach else cfg)
    target = targets.JobTarget(targets.CLUSTER)
    with targets.reach(target, cfg) as reached:
        cold = cold_start_of(reached, cfg, gpus_needed(cfg, gpus, builtin=True))
        applied = _apply_rayjob(reached, cfg, bucket, doc, yes=yes, notice=notice)
        assert reached.kube is not None
        job_id = rayjob.submission_id(reached.kube, doc)
        notice(f"applied RayJob {applied.namespace}/{applied.name}; KubeRay submits it as job {job_id}")
        job = rayjob.submitted(reached.kube, reached.dashboard, doc, job_id, notice)
        notice(f"submitted job {job_id} on {target.where}")
        if no_wait:
            return Submitted(job, attached=False, waited=False, builtin=True, rayjob=applied)
        with rayjob.DeadlineGuard(reached.kube, reached.dashboard, doc, job_id, notice).watching():  # KubeRay marks, raydlc stops
            warm_up = _warm_up(reached, cfg, cold, job, False, notice) if cold is not None else None
            job = control.follow(reached.dashboard, job_id, write)
        summary = control.training_summary(reached.dashboard.logs(job_id))
    return Submitted(job, attached=False, waited=True, builtin=True, summary=summary, warm_up=warm_up, rayjob=applied)


def _as_found(cfg: Config) -> Config:
    """Attached, the GPU type and GPUs per node of the RayCluster's workers as `up --attach` rendered them on the found
    nodes: the built-in program's workers (one per GPU) and its budget (that type's price; unknown: refused, never
    $0) follow them, not GPU_NODE_TYPE's defaults."""
    from raydlc.lifecycle.attach import priced_as_found

    return priced_as_found(cfg)  # type: ignore[no-any-return]


def gpus_needed(cfg: Config, gpus: int | None, *, builtin: bool) -> int:
    """GPUs the job needs on the GPU workers: as asked; else the built-in program's workers (one GPU each
    unless USE_GPU=false); else none — a script's needs are its own."""
    if gpus is not None:
        return gpus
    return cfg.num_workers if builtin and cfg.train.use_gpu is not False else 0


def tracker_packages(cfg: Config, kind: str, *, builtin: bool) -> list[str]:
    """The built-in program's tracker clients (MLflow, W&B) a remote Ray lacks, pinned (facts.trackers); a local job
    uses this machine's Python, where they are installed or the tracker warns."""
    from raydlc.facts.trackers import packages

    return packages(cfg.train.tracking) if builtin and kind != "local" else []


def _spec(cfg: Config, request: JobRequest, script: Path | None, notice: Write, extra_env: Mapping[str, str] | None = None) -> JobSpec:
    """What travels with the job (the built-in program when `script` is None, with `extra_env` beside its settings), checked, and said."""
    from raydlc.jobs import runtime_env

    kind = request.target.kind
    env = runtime_env.parse_env(request.env)
    spec = runtime_env.build(
        script=script, args=list(request.args), working_dir=request.working_dir, pip=[*request.pip, *tracker_packages(cfg, kind, builtin=script is None)], env=env,
        settings_env={**runtime_env.builtin_env(cfg, kind), **(extra_env or {})} if script is None else {}, image=runtime_env.image_versions(cfg, kind),
        name=request.name, target=kind,
    )
    for w in spec.warnings:
        notice(f"warning: {w}")
    if spec.upload is not None:
        notice(f"working dir {spec.upload.root}: {len(spec.upload.files)} files, {runtime_env.mib(spec.upload.size)} to upload")
    return spec


def _run(cfg: Config, request: JobRequest, spec: JobSpec, gpus: int, *, write: Write, notice: Write) -> Submitted:
    """Reach the target (starting raydlc's local head when none runs), submit or attach, warm up, follow."""
    from raydlc.jobs import cold_start

    target = request.target
    with targets.reach(target, cfg, start_local=True, on_start=lambda: notice(targets.STARTING),
                       on_doubt=lambda text: notice(f"warning: {text}")) as reached:
        dash = reached.dashboard
        cold = cold_start_of(reached, cfg, gpus) if reached.kube is not None else None
        job, attached = control.submit(dash, spec)
        notice(f"{'attached to the running job' if attached else 'submitted job'} {job.submission_id} on {target.where}")
        if request.no_wait:
            if cold is not None:
                notice(cold_start.headline(cold.first, cfg.gpu_nodes.instance_type))
            return Submitted(job, attached, waited=False, builtin=spec.builtin)
        warm_up = _warm_up(reached, cfg, cold, job, attached, notice) if cold is not None else None
        job = control.follow(dash, job.submission_id, write)
        builtin_run = (spec.builtin and not attached) or job.metadata.get("program") == "builtin"
        summary = control.training_summary(dash.logs(job.submission_id)) if builtin_run else None
    return Submitted(job, attached, waited=True, builtin=builtin_run, summary=summary, warm_up=warm_up)


@dataclass(frozen=True)
class ColdStart:
    """GPU worker pods the job needs that do not run yet: what it needs, the node group's ASG, and the first look."""

    need: Demand
    asg: AsgReader
    first: Snapshot


def cold_start_of(reached: Reached, cfg: Config, gpus: int) -> ColdStart | None:
    """The cold start ahead when the job needs GPU worker pods that are not running yet; None when it needs none
    or they run. A job the GPU workers can never hold is refused here, before submission."""
    from raydlc.jobs import cold_start, warmup

    if gpus <= 0:
        return None
    assert reached.kube is not None
    need = warmup.demand(reached.kube, cfg, gpus)
    never = cold_start.never_fits(need)
    if never:
        raise InputError(f"{never}; nothing was submitted",
                         hint="ask for fewer GPUs (--workers, --gpus), or raise GPU_NODE_COUNT and run `raydlc up`")
    if cold_start.running_pods(warmup.look(reached.kube, cfg, need, None).pods) >= need.pods:
        return None  # warm: nothing is asked of AWS
    asg = warmup.AsgReader(cfg)
    return ColdStart(need, asg, warmup.look(reached.kube, cfg, need, asg))


@dataclass(frozen=True)
class WarmUp:
    """What a cold start cost the job before its log streamed."""

    gpus: int
    pods: int
    waited_s: float


def _warm_up(reached: Reached, cfg: Config, cold: ColdStart, job: Job, attached: bool, notice: Write) -> WarmUp:
    """Follow the GPU worker pods until they run; on failure stop the job this call submitted (a job left
    waiting would take the nodes whenever they come, with nobody watching) and raise."""
    from raydlc.edges import aws
    from raydlc.jobs import warmup

    assert reached.kube is not None
    t0 = time.monotonic()
    try:
        with aws.command_budget("submit"):
            warmup.follow(reached.kube, cfg, cold.need, notice, asg=cold.asg, first=cold.first)
    except warmup.ColdStartFailed as e:
        if not attached:
            control.stop(reached.dashboard, job.submission_id, wait_s=30)
        raise warmup.ColdStartFailed(e.message + ("" if attached else f"; job {job.submission_id} was stopped"), hint=e.hint) from None
    except KeyboardInterrupt:
        raise control.Detached(job.submission_id) from None
    return WarmUp(cold.need.gpus, cold.need.pods, round(time.monotonic() - t0, 1))


def _check_local_gpus(request: JobRequest) -> None:
    """--gpus on the local target: the job runs on this machine, which must have them (nothing follows them up)."""
    if request.target.kind == targets.LOCAL and request.gpus:
        have = targets.local_gpus()
        if request.gpus > have:
            raise InputError(f"--gpus {request.gpus}: the local target runs on this machine, which has {have} GPU{'s' if have != 1 else ''}",
                             hint="drop --gpus here, or submit to the cluster (no --local)")


def _check_budget(cfg: Config, target: JobTarget) -> Mapping[str, float] | None:
    """JOB_MAX_COST_USD before submission: the cluster's GPU nodes have a price (the list price, or Spot's read
    now) and the budget must buy start-up and a step at it; a local head or a dashboard of unknown nodes has no
    price. Returns the prices it was checked at (run_prices)."""
    from raydlc.planner.budget import check_budget
    from raydlc.render.raycluster import job_deadline

    if target.kind != targets.CLUSTER:
        check_budget(cfg.train.max_cost_usd or 0.0, None, step_s=None, where=target.where)
    prices = run_prices(cfg)
    job_deadline(cfg, prices)
    return prices


def run_prices(cfg: Config) -> Mapping[str, float] | None:
    """The prices a budget is kept at: None (the list prices) unless the GPU nodes may be Spot and a budget is
    set; then the GPU type at the price it is bought at now (raydlc.capacity.prices.cluster_gpu_prices)."""
    from raydlc.capacity.prices import cluster_gpu_prices
    from raydlc.planner.budget import prices_at

    if cfg.train.max_cost_usd is None or cfg.gpu_nodes.capacity_type == "on-demand":
        return None
    return prices_at(cfg.gpu_nodes.instance_type, cluster_gpu_prices(cfg).run_usd_per_node_hour)


def _check_local_inputs(cfg: Config) -> None:
    """The built-in program on this machine reads MODEL_ID and DATA from here: a missing path fails
    now, not inside the job after a head has started."""
    from raydlc.config import with_local_defaults
    from raydlc.data.sources import is_local, read_local
    from raydlc.facts.models import spec_for

    train = with_local_defaults(cfg).train
    spec_for(train.model_id)  # a model path that does not exist, or a directory without config.json
    if train.data and is_local(train.data) and not Path(train.data).expanduser().exists():
        read_local(train.data)  # its own error, naming --data


# ---- the RayJob -------------------------------------------------------------------------------------


def _rendered_rayjob(cfg: Config) -> tuple[Config, Any, dict[str, Any]]:
    """(config with the cluster's bucket, the bucket, the RayJob) exactly as `render --only rayjob` makes them."""
    from raydlc.edges import aws
    from raydlc.render import FILES, render_all
    from raydlc.render.bucket import bucket_of, for_cluster

    cfg = for_cluster(cfg, lambda: aws.account_id(cfg.cluster.region))
    bucket = bucket_of(cfg)
    if bucket is None:
        raise InputError(f"--rayjob ships raydlc to the cluster as a zip in its S3 bucket, and STORAGE_PATH ({cfg.origin('STORAGE_PATH')}) "
                         "is not on S3", hint="raydlc submit --builtin (the Jobs API uploads raydlc with the job), or STORAGE_PATH=s3://<bucket>/runs")
    return cfg, bucket, render_all(cfg, only="rayjob", prices=run_prices(cfg))[FILES["rayjob"]]


@dataclass(frozen=True)
class AppliedRayJob:
    """The RayJob `submit_rayjob` applied, and whether raydlc's code zip had to be uploaded for it."""

    name: str
    namespace: str
    replaced: bool  # a RayJob of that name existed and was deleted first
    code_zip: str
    code_uploaded: bool  # False: the bucket held the same zip already


def _apply_rayjob(reached: Reached, cfg: Config, bucket: Any, doc: dict[str, Any], *, yes: bool, notice: Write) -> AppliedRayJob:
    """Refuse (or with `yes` replace) a RayJob of the same name, put the code zip in the bucket, create the RayJob."""
    from raydlc.edges import aws
    from raydlc.jobs import rayjob
    from raydlc.lifecycle.resources.bucket import put_code
    from raydlc.render import codezip

    kube = reached.kube
    assert kube is not None
    ns, name = rayjob.where(doc)
    old = rayjob.existing(kube, doc)
    if old is not None and not yes:
        raise rayjob.refuse_existing(old, doc)
    code = codezip.build()
    with aws.command_budget("submit"):
        uploaded = put_code(aws.client(aws.session(cfg.cluster.region), "s3"), bucket.name, code)
    notice(f"{'uploaded' if uploaded else 'found'} raydlc's code zip {code.uri(bucket.name)}")
    if old is not None:
        rayjob.remove(kube, reached.dashboard, old, doc)
        notice(f"deleted the RayJob {ns}/{name} that existed ({rayjob.describe(old)})")
    kube.create(doc)
    return AppliedRayJob(name, ns, old is not None, code.uri(bucket.name), uploaded)
