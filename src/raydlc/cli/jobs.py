"""Jobs on a Ray head and their proof: submit, job list/logs/status/stop, verify, bench-transport, preflight, nccl.

Each command parses, calls its use case in raydlc.api (which reaches the head and does the work)
and prints; Ctrl-C while a job streams detaches here: the job goes on. The head is the one the
target options choose (`raydlc.cli.options`): --local, --address, or the cluster.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from raydlc.cli.app import app, config_args, notice, report
from raydlc.cli.options import ADDRESS, JSON, KUBECONFIG, LOCAL
from raydlc.config.flags import finite as _finite
from raydlc.config.flags import named_settings, with_options
from raydlc.config.flags import option as flags_option
from raydlc.errors import InputError
from raydlc.views.output import console, err_console

job_app = typer.Typer(help="Jobs on the Ray cluster: list, logs, status, stop (--local, --address URL, or the cluster).", no_args_is_help=True)

SUBMIT_OPTIONS = [flags_option("JOB_MAX_COST_USD")]  # the training settings submit takes as its own flags


def target_args(ctx: typer.Context, local: bool, address: str | None, kubeconfig: Path | None) -> dict[str, Any]:
    """The target options and the global --config/--set as a job use case takes them; --kubeconfig is the
    KUBECONFIG setting it stands for."""
    args = config_args(ctx)
    if kubeconfig is not None:
        args["settings"] = {**args["settings"], "KUBECONFIG": str(kubeconfig)}
    return {"local": local, "address": address, **args}


@app.command("submit")
@with_options(SUBMIT_OPTIONS)
def submit(
    ctx: typer.Context,
    items: list[str] | None = typer.Argument(None, metavar="[SCRIPT.py] [-- ARGS...]", help="The script to run (default: the built-in training program) and its arguments after --."),
    builtin: bool = typer.Option(False, "--builtin", help="Run raydlc's training program (python -m raydlc.train) with the config's training settings."),
    local: bool = LOCAL,
    address: str | None = ADDRESS,
    kubeconfig: Path | None = KUBECONFIG,
    name: str | None = typer.Option(None, "--name", help="Submission id: the same name again attaches to that job while it runs, instead of starting a second."),
    pip: list[str] | None = typer.Option(None, "--pip", help="A package the image lacks: NAME (pinned to the version installed here) or NAME==VERSION; repeatable."),
    env: list[str] | None = typer.Option(None, "--env", help="K=V for the job's processes, NCCL_* and FI_* too; repeatable. Secrets are refused."),
    working_dir: Path | None = typer.Option(None, "--working-dir", help="Uploaded with the job, without .git and ignored files (default: SCRIPT's directory)."),
    no_wait: bool = typer.Option(False, "--no-wait", help="Return once the job is submitted."),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs the job needs on the cluster's GPU workers: on a cold cluster submit follows them up before streaming (default: the built-in program's workers, 0 for a script)."),
    rayjob: bool = typer.Option(False, "--rayjob", help="Run the built-in program as the RayJob `render --only rayjob` makes: upload raydlc's code zip, apply it, follow its job."),
    yes: bool = typer.Option(False, "--yes", help="With --rayjob: replace a RayJob of the same name (its job is stopped first)."),
    json_: bool = typer.Option(False, "--json", help="Print one JSON object as the last line of stdout (logs go to stderr)."),
    *,
    named: dict[str, Any],
) -> None:
    """Run a job on the Ray cluster (or --local, --address) and stream its logs; the exit code follows the job.

    Ctrl-C detaches and leaves the job running. --rayjob applies the rendered RayJob instead of using the Jobs API to submit.
    """
    from raydlc import api

    args = list(items or [])
    script = None
    if builtin and args and args[0].endswith(".py"):
        raise InputError(f"--builtin and SCRIPT {args[0][:200]} cannot be combined: --builtin runs raydlc's own program",
                         hint=f"raydlc submit {shlex.quote(args[0][:200])} --local")
    if not builtin and args and not args[0].startswith("-"):
        script, args = Path(args[0]), args[1:]
    target = target_args(ctx, local, address, kubeconfig)
    target["settings"] = {**target["settings"], **named_settings(SUBMIT_OPTIONS, named, caller="submit")}
    with _detaching(local, address):
        result = api.submit(script, args, builtin=builtin, name=name, pip=pip or [], env=env or [], working_dir=working_dir,
                            no_wait=no_wait, gpus=gpus, rayjob=rayjob, yes=yes, **target, write=_writer(sys.stderr if json_ else sys.stdout),
                            notice=notice)
    job = result.job
    if no_wait:
        report(result, json_, lambda: console.print(f"follow it: raydlc job logs {job.submission_id} --follow{result.target.flag}", highlight=False))
        return
    report(result, json_, lambda: err_console.print(f"job {job.submission_id}: {job.status} after {job.duration_s or 0:.1f} s", highlight=False))
    _ended(job, result.target)


@app.command("verify")
def verify_cmd(
    ctx: typer.Context,
    job_id: str | None = typer.Option(None, "--job", help="The job to prove (default: the newest job on the target)."),
    expect: str = typer.Option("efa", "--expect", help="The transport every node must show: efa, socket or ib."),
    local: bool = LOCAL,
    address: str | None = ADDRESS,
    kubeconfig: Path | None = KUBECONFIG,
    json_: bool = JSON,
) -> None:
    """The gate: GPU nodes, pods, fi_info, NCCL from the job's own worker logs, the run prefix, the head's port, the job's status.

    Exit 0 only when no criterion fails, 3 when one does.
    """
    from raydlc import api
    from raydlc.views.jobs import print_verdict

    verdict = api.verify(job=job_id, expect=expect, **target_args(ctx, local, address, kubeconfig))
    report(verdict, json_, lambda: print_verdict(verdict, console))
    if not verdict.passed:
        raise typer.Exit(3)


@app.command("bench-transport")
def bench_transport(
    ctx: typer.Context,
    steps: int = typer.Option(20, "--steps", help="Optimizer steps of each of the two runs."),
    local: bool = LOCAL,
    address: str | None = ADDRESS,
    kubeconfig: Path | None = KUBECONFIG,
    json_: bool = JSON,
) -> None:
    """The same short training job twice, as configured and with sockets forced, each proven from its own logs.

    A run's steps/s count only once its worker logs show the transport it was meant to use; exit 3 when not.
    """
    from raydlc import api
    from raydlc.views.jobs import print_bench

    with _detaching(local, address):
        result = api.bench_transport(steps=steps, **target_args(ctx, local, address, kubeconfig), write=_writer(sys.stderr), notice=notice)
    report(result, json_, lambda: print_bench(result.to_dict(), console))
    if result.failed:
        raise typer.Exit(1)
    if result.ran and not result.applicable:
        raise typer.Exit(3)


@app.command("preflight")
def preflight_cmd(
    ctx: typer.Context,
    local: bool = typer.Option(False, "--local", help="Run on a local Ray over gloo: figures only, no network verdict."),
    workers: int | None = typer.Option(None, "--workers", help="Workers (one per GPU); default NUM_WORKERS, or 2 with --local."),
    sizes_mib: list[float] | None = typer.Option(
        None, "--size-mib", callback=_finite, help="Message size in MiB (repeatable); default 0.25/4/32 locally, 1..512 on GPUs."
    ),
    iters: int = typer.Option(5, "--iters", help="Timed calls per collective and size."),
    json_: bool = JSON,
) -> None:
    """All-reduce/all-gather bus bandwidth on the job's workers, and whether EFA is really in use."""
    from raydlc import api
    from raydlc.views.preflight import print_report

    found = api.preflight(local=local, workers=workers, size_mib=sizes_mib, iters=iters, **config_args(ctx))
    report(found, json_, lambda: print_report(found, console))
    if not found.ok:
        for f in found.findings:
            if f.level == "fail":
                err_console.print(f"[bold red]preflight failed:[/] {f.message}", highlight=False)
        raise typer.Exit(1)


@app.command("nccl")
def nccl(
    paths: list[str] | None = typer.Argument(
        None, metavar="PATH|DIR|-", help="Log files (.gz too), directories (Ray session dirs) or - for stdin."
    ),
    json_: bool = typer.Option(False, "--json", help="Print one JSON object."),
    expect: str | None = typer.Option(
        None, "--expect", help="efa | socket | ib | single-node: exit 3 unless channel lines show exactly this, with no fallback and no error."
    ),
    accept_selected: bool = typer.Option(
        False, "--accept-selected", help="With --expect: also pass when NCCL only selected the network (no channel lines prove traffic)."
    ),
) -> None:
    """Which transport NCCL really used, per rank and node, read from NCCL_DEBUG=INFO output."""
    from raydlc import api
    from raydlc.views.nccl import render

    result = api.nccl(paths, expect=expect, accept_selected=accept_selected)
    report(result, json_, lambda: render(result.report, console, expect, accept_selected))
    if not result.ok:
        raise typer.Exit(3)


app.add_typer(job_app, name="job")


@job_app.command("list")
def job_list(
    ctx: typer.Context,
    local: bool = LOCAL,
    address: str | None = ADDRESS,
    kubeconfig: Path | None = KUBECONFIG,
    json_: bool = JSON,
) -> None:
    """Every job the head knows, oldest first."""
    from raydlc import api
    from raydlc.views.jobs import print_jobs

    result = api.job_list(**target_args(ctx, local, address, kubeconfig))
    report(result, json_, lambda: print_jobs(list(result.jobs), result.target.where, console))


@job_app.command("logs")
def job_logs(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., metavar="ID", help="The job's id (its --name, or what submit printed)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream until the job ends; the exit code follows the job."),
    local: bool = LOCAL,
    address: str | None = ADDRESS,
    kubeconfig: Path | None = KUBECONFIG,
    json_: bool = typer.Option(False, "--json", help="Print {job_id, status, logs} as JSON."),
) -> None:
    """The job's driver output (its workers' output is folded in by Ray)."""
    from raydlc import api

    streaming = follow and not json_
    with _detaching(local, address):
        result = api.job_logs(job_id, follow=streaming, **target_args(ctx, local, address, kubeconfig), write=_writer(sys.stdout))
    if streaming:
        _ended(result.job, result.target)
    else:
        report(result, json_, lambda: sys.stdout.write(result.logs))


@job_app.command("status")
def job_status(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., metavar="ID", help="The job's id."),
    local: bool = LOCAL,
    address: str | None = ADDRESS,
    kubeconfig: Path | None = KUBECONFIG,
    json_: bool = JSON,
) -> None:
    """The job's state as the Jobs API reports it (never inferred from a log stream)."""
    from raydlc import api

    result = api.job_status(job_id, **target_args(ctx, local, address, kubeconfig))
    report(result, json_, lambda: _print_job(result))


def _print_job(result: Any) -> None:
    from raydlc.views.jobs import print_cost, print_job, print_restarts

    print_job(result.job, console)
    if result.cost:
        print_cost(result.cost, console)
    print_restarts(result.restarts, console)


@job_app.command("stop")
def job_stop(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., metavar="ID", help="The job's id."),
    local: bool = LOCAL,
    address: str | None = ADDRESS,
    kubeconfig: Path | None = KUBECONFIG,
    json_: bool = JSON,
) -> None:
    """Stop a job and wait until it has ended."""
    from raydlc import api

    result = api.job_stop(job_id, **target_args(ctx, local, address, kubeconfig))
    job = result.job
    said = f"job {job.submission_id}: {job.status}" if result.was_running else f"job {job.submission_id} had already ended: {job.status}"
    report(result, json_, lambda: console.print(said, highlight=False))


def _writer(stream: Any) -> Any:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


@contextlib.contextmanager
def _detaching(local: bool, address: str | None) -> Iterator[None]:
    """Ctrl-C while a job streams: say that it keeps running and how to come back to it, exit 130."""
    from raydlc.jobs.control import Detached

    try:
        yield
    except Detached as d:
        from raydlc.jobs.targets import choose

        flag = choose(local, address).flag
        err_console.print(f"\ndetached from job {d.job_id}; it keeps running. Re-attach: raydlc job logs {d.job_id} --follow{flag}; "
                          f"stop it: raydlc job stop {d.job_id}{flag}", highlight=False)
        raise typer.Exit(130) from None


def _ended(job: Any, target: Any) -> None:
    """The exit code follows the job: a job that did not succeed is an error line and exit 1."""
    from raydlc.jobs.control import failure

    if job.status != "SUCCEEDED":
        raise failure(job, hint=f"raydlc job logs {job.submission_id}{target.flag}")
