"""The cluster's commands: capacity, render, up, status, down (and the hidden eks-token).

`up`'s step options name the steps as `raydlc.lifecycle.orders` declares them, read only when `up`
is parsed or its help is shown: importing every resource costs about a third of the CLI's start,
which the other commands need not pay.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from raydlc.cli.app import app, config_args, notice, report
from raydlc.cli.options import JSON
from raydlc.config.flags import named_settings, option, with_options
from raydlc.errors import InputError
from raydlc.views.output import console, err_console

_STEPS = "{steps}"  # in an option's help: the steps of `up`, in order
ATTACH_OPTIONS = [option("ATTACH"), option("KUBE_CONTEXT")]  # up, status, down: a cluster someone else runs


def _attach_args(ctx: typer.Context, named: dict[str, Any], caller: str, options: list[Any] = ATTACH_OPTIONS) -> dict[str, Any]:
    """The global --config/--set with the command's own flags (--attach, --kube-context, …) on top (a flag outranks --set, as everywhere)."""
    args = config_args(ctx)
    args["settings"] = {**args["settings"], **named_settings(options, named, caller=caller)}
    return args


class _NamesSteps(TyperCommand):
    """A command whose option help holds `{steps}`: filled from lifecycle.orders when its parameters are asked for."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        for p in params:
            if _STEPS in (getattr(p, "help", None) or ""):
                from raydlc.lifecycle.orders import names

                p.help = p.help.replace(_STEPS, ", ".join(names("up")))
        return params


@app.command("capacity")
def capacity(
    ctx: typer.Context,
    region: str | None = typer.Option(None, "--region", help="AWS region (REGION)."),
    instance_type: str | None = typer.Option(None, "--instance-type", help="GPU instance type (GPU_NODE_TYPE)."),
    count: int | None = typer.Option(None, "--count", help="Number of GPU nodes (GPU_NODE_COUNT)."),
    probe: bool = typer.Option(False, "--probe", help="Reserve the nodes in the best AZ for an instant, then cancel."),
    json_: bool = JSON,
    emit_env: bool = typer.Option(False, "--emit-env", help="Print only RAYDLC_GPU_AZ=<best zone>, for scripts."),
) -> None:
    """Rank the region's AZs for the GPU nodes: offerings, On-Demand quota, Spot score, subnets.

    Exit 0 when an AZ is ready (or could not be ruled out), 3 when none can take the nodes.
    """
    from raydlc import api

    if json_ and emit_env:
        raise InputError("--json and --emit-env both write stdout", hint="choose one")
    found = api.capacity(region=region, instance_type=instance_type, count=count, probe=probe, **config_args(ctx))
    report(found, json_, lambda: _print_zone(found) if emit_env else _print_capacity(found))
    if found.best_zone is None or (found.probe is not None and found.probe.outcome != "available"):
        raise typer.Exit(3)


def _print_zone(found: Any) -> None:
    """`--emit-env`: the best zone as one shell assignment on stdout, everything else on stderr."""
    for line in found.checks:
        err_console.print(f"[yellow]check:[/] {line}")
    if found.best_zone:
        sys.stdout.write(f"RAYDLC_GPU_AZ={found.best_zone}\n")
    else:
        why = found.zones[0].reason if found.zones else "no Availability Zone could be read"
        err_console.print(f"no AZ can take the GPU nodes: {why}", highlight=False)


def _print_capacity(found: Any) -> None:
    from raydlc.views.capacity import print_report

    print_report(found, console)


@app.command("render")
def render(
    ctx: typer.Context,
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the files under DIR instead of printing YAML."),
    only: str | None = typer.Option(None, "--only", help="One kind: eksctl, raycluster, rayjob, helm, netpol or rbac."),
    zones: str | None = typer.Option(
        None, "--zones", help="Availability Zones that offer the GPU type, best first (the capacity answer): us-east-2a,us-east-2b."
    ),
    json_: bool = typer.Option(False, "--json", help="Print JSON: the documents, or the files written."),
    subject: str | None = typer.Option(None, "--subject", help="rbac: who the Role is bound to, User:NAME, Group:NAME or ServiceAccount:NAME (default: Group:raydlc-NAMESPACE)."),
) -> None:
    """Render eksctl ClusterConfig, Helm values, RayCluster, RayJob, NetworkPolicy and (attach) RBAC from the config."""
    from raydlc import api

    rendered = api.render(out=out, only=only, zones=zones, subject=subject, **config_args(ctx))
    report(rendered, json_, lambda: _print_rendered(rendered))


def _print_rendered(rendered: Any) -> None:
    """The files written (with --out), else the documents as YAML; then how the RayJob's code reaches the bucket."""
    if rendered.out is not None:
        for p in rendered.files:
            console.print(f"wrote {p}")
    else:
        sys.stdout.write(rendered.to_yaml())
    if rendered.code is not None:
        notice(rendered.code.line)


LIFECYCLE_OPTIONS = [*ATTACH_OPTIONS, option("SKIP_PERMISSION_CHECK")]  # the settings up and down take as their own flags


@app.command("up", cls=_NamesSteps)
@with_options(LIFECYCLE_OPTIONS)
def up(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print each step, whether it would act and why, and the exact command; change nothing."),
    json_: bool = typer.Option(False, "--json", help="Print JSON: the plan, or each step's outcome."),
    only: str | None = typer.Option(None, "--only", help=f"Run one step: {_STEPS}."),
    from_: str | None = typer.Option(None, "--from", help="Run this step and every step that needs it."),
    until: str | None = typer.Option(None, "--until", help="Run this step and every step it needs."),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="Where raydlc writes and reads the cluster's kubeconfig [KUBECONFIG]."),
    force: bool = typer.Option(False, "--force", help="Use an existing cluster that raydlc did not create."),
    yes: bool = typer.Option(False, "--yes", help="Recreate the Ray pods when their templates changed (stops running jobs) without asking."),
    *,
    named: dict[str, Any],
) -> None:
    """Create or resume the cluster: EKS, EFA GPU nodes, device plugins, KubeRay, the RayCluster.

    With --attach: only the RayCluster and its namespace's objects, on a cluster a platform team runs (docs/attach.md).
    """
    from raydlc import api
    from raydlc.views import lifecycle as view

    args = _attach_args(ctx, named, "up", LIFECYCLE_OPTIONS)
    run = lambda reporter: api.up(**args, only=only, from_=from_, until=until, dry_run=dry_run, force=force,
                                  kubeconfig=kubeconfig, reporter=reporter, yes=yes)
    raise typer.Exit(view.execute("up", run, json_=json_, dry_run=dry_run))


@app.command("status")
@with_options(ATTACH_OPTIONS)
def status(
    ctx: typer.Context,
    json_: bool = JSON,
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="The cluster's kubeconfig [KUBECONFIG]."),
    *,
    named: dict[str, Any],
) -> None:
    """Each step's state, the nodes and their GPUs/EFA, the RayCluster's pods, and the hourly cost (attached: found vs made)."""
    from raydlc import api
    from raydlc.views import lifecycle as view

    found = api.status(**_attach_args(ctx, named, "status"), kubeconfig=kubeconfig)
    report(found, json_, lambda: view.print_status(found.to_dict(), console))


@app.command("down")
@with_options(LIFECYCLE_OPTIONS)
def down(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be removed and how; change nothing."),
    json_: bool = typer.Option(False, "--json", help="Print JSON: the plan, or each step's outcome with what was removed."),
    keep_cluster: bool = typer.Option(False, "--keep-cluster", help="Stop after the node groups: keep the control plane and system node."),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="The cluster's kubeconfig [KUBECONFIG]."),
    force: bool = typer.Option(False, "--force", help="Delete a cluster that lacks raydlc's ownership tag."),
    delete_storage: bool = typer.Option(False, "--delete-storage", help="Also empty and delete the cluster's S3 bucket "
                                        "(kept otherwise, with its checkpoints)."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask before --delete-storage deletes the checkpoints."),
    local: bool = typer.Option(False, "--local", help="End raydlc's local Ray head instead (by its recorded PID and process group)."),
    *,
    named: dict[str, Any],
) -> None:
    """Remove everything `up` made, in reverse, until AWS lists nothing of the cluster that bills.

    With --attach: only what raydlc made in the namespace (selected by its labels); the cluster stays.
    """
    from raydlc import api
    from raydlc.views import lifecycle as view

    if local:
        clash = [f for f, on in (("--keep-cluster", keep_cluster), ("--force", force), ("--kubeconfig", kubeconfig is not None)) if on]
        if clash:
            raise InputError(f"--local and {', '.join(clash)} cannot be combined: --local ends only raydlc's local Ray head",
                             hint="raydlc down --local")
        ended = api.down_local(dry_run=dry_run)
        report(ended, json_, lambda: console.print(ended.message, highlight=False, soft_wrap=True))
        return
    if delete_storage and not (yes or dry_run):
        _confirm_delete_storage()
    args = _attach_args(ctx, named, "down", LIFECYCLE_OPTIONS)
    run = lambda reporter: api.down(**args, keep_cluster=keep_cluster, delete_storage=delete_storage, dry_run=dry_run,
                                    force=force, kubeconfig=kubeconfig, reporter=reporter)
    raise typer.Exit(view.execute("down", run, json_=json_, dry_run=dry_run))


def _confirm_delete_storage() -> None:
    """The checkpoints cannot be brought back: ask a person, and refuse a script that did not say --yes."""
    if sys.stdin is None or not sys.stdin.isatty():
        raise InputError("--delete-storage deletes every checkpoint in the cluster's S3 bucket; nobody is here to confirm",
                         hint="raydlc down --delete-storage --yes")
    if not typer.confirm("Delete the cluster's S3 bucket and every checkpoint in it?", default=False):
        raise InputError("--delete-storage not confirmed: nothing was removed", hint="raydlc down")


@app.command("eks-token", hidden=True)
def eks_token(
    cluster: str = typer.Option(..., "--cluster", help="The EKS cluster the token is for."),
    region: str = typer.Option(..., "--region", help="Its region."),
) -> None:
    """The exec credential plugin raydlc's kubeconfig runs: an ExecCredential on stdout, for the client only."""
    import json

    from raydlc.edges import eks_token

    sys.stdout.write(json.dumps(eks_token.exec_credential(cluster, region)) + "\n")
