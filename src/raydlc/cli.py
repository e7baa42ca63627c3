"""The `raydlc` command line: one small function per command, nothing heavy at import time.

Commands import the module that does their work inside the function body, so that
`raydlc --help` never pays for torch, ray, transformers or kubernetes.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from raydlc.api import _data as data_use_case
from raydlc.api import _plan as plan_use_case
from raydlc.api import _train as train_use_case
from raydlc.errors import InputError, RaydlcError, Stopped
from raydlc.flags import finite as _finite
from raydlc.flags import named_settings, with_options
from raydlc.flags import option as flags_option
from raydlc.output import console, debug_requested, emit_json, err_console

if TYPE_CHECKING:
    from raydlc.config import Config

app = typer.Typer(
    name="raydlc",
    help="Verified multi-node FSDP fine-tuning on EKS with Ray Train and the AWS Ray Train DLC.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Show or write the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@dataclass
class State:
    config_path: Path | None = None
    assignments: list[str] = field(default_factory=list)
    debug: bool = False


def _state(ctx: typer.Context) -> State:
    root = ctx.find_root()
    if root.obj is None:
        root.obj = State()
    return root.obj


def load(ctx: typer.Context, **flags: Any) -> Config:
    """The effective Config for a command: global --config/--set, then the command's own flags."""
    from raydlc.config import load_config, parse_assignments

    st = _state(ctx)
    overrides: dict[str, Any] = parse_assignments(st.assignments)
    overrides.update({k: v for k, v in flags.items() if v is not None})
    return load_config(st.config_path, overrides=overrides)


def _config_args(ctx: typer.Context) -> dict[str, Any]:
    """The global --config/--set as a use case's `config`/`settings` arguments."""
    from raydlc.config import parse_assignments

    st = _state(ctx)
    return {"config": st.config_path, "settings": parse_assignments(st.assignments)}


@app.callback()
def root(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML config file (default: ./raydlc.yaml, or $RAYDLC_CONFIG)."
    ),
    set_: list[str] | None = typer.Option(
        None, "--set", help="Override a setting by its env.sh name: --set GPU_NODE_COUNT=4 (repeatable)."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
) -> None:
    ctx.obj = State(config_path=config, assignments=list(set_ or []), debug=debug)


@config_app.command("show")
def config_show(
    ctx: typer.Context,
    json_: bool = typer.Option(False, "--json", help="Print JSON: the config tree and each field's source."),
) -> None:
    """Print the effective configuration and where each value came from."""
    from raydlc import api

    shown = api.config_show(**_config_args(ctx))
    if json_:
        emit_json(shown.to_dict())
        return
    from rich.table import Table

    table = Table(title="raydlc configuration", show_lines=False)
    for col in ("setting", "env", "value", "source"):
        table.add_column(col)
    for row in shown.rows:
        value = "" if row["value"] is None else str(row["value"])
        style = None if row["source"] == "default" else "bold"
        table.add_row(row["path"], row["env"], value, row["origin"], style=style)
    console.print(table)


@config_app.command("init")
def config_init(
    path: Path = typer.Argument(Path("raydlc.yaml"), help="Where to write the file."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented raydlc.yaml with every field at its default."""
    from raydlc.config import render_yaml_template
    from raydlc.files import check_output_file, write_all

    check_output_file(path, "config init", force=force)
    write_all({path: render_yaml_template()}, "config init")
    console.print(f"wrote {path}")


@app.command("version")
def version(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """raydlc's version, the local Ray and PyTorch, and what the DLC image ships."""
    from raydlc import api

    info = api.version()
    if json_:
        emit_json(info.to_dict())
        return
    local, img = info.local, info.image
    console.print(f"raydlc {local['raydlc']}")
    console.print(f"local:  Ray {local['ray'] or 'not installed'}, PyTorch {local['torch'] or 'not installed'}, Python {local['python']}")
    console.print(f"image:  {img['image']}: Ray {img['ray']}, PyTorch {img['torch']}, CUDA {img['cuda']}, NCCL {img['nccl']}")
    for k in info.mismatch:
        err_console.print(f"[yellow]warning:[/] local {k} {local[k]} differs from the image's {img[k]}")


@app.command("render")
def render(
    ctx: typer.Context,
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the files under DIR instead of printing YAML."),
    only: str | None = typer.Option(None, "--only", help="One kind: eksctl, raycluster, rayjob, helm or netpol."),
    zones: str | None = typer.Option(
        None, "--zones", help="Availability Zones that offer the GPU type, best first (the capacity answer): us-east-2a,us-east-2b."
    ),
    json_: bool = typer.Option(False, "--json", help="Print JSON: the documents, or the files written."),
) -> None:
    """Render eksctl ClusterConfig, Helm values, RayCluster, RayJob and NetworkPolicy from the config."""
    from raydlc import api

    rendered = api.render(out=out, only=only, zones=zones, **_config_args(ctx))
    if json_:
        emit_json(rendered.to_dict())
    elif out is not None:
        for p in rendered.files:
            console.print(f"wrote {p}")
    else:
        sys.stdout.write(rendered.to_yaml())
    if rendered.code is not None and not json_:
        _notice(rendered.code.line)


@app.command("capacity")
def capacity(
    ctx: typer.Context,
    region: str | None = typer.Option(None, "--region", help="AWS region (REGION)."),
    instance_type: str | None = typer.Option(None, "--instance-type", help="GPU instance type (GPU_NODE_TYPE)."),
    count: int | None = typer.Option(None, "--count", help="Number of GPU nodes (GPU_NODE_COUNT)."),
    probe: bool = typer.Option(False, "--probe", help="Reserve the nodes in the best AZ for an instant, then cancel."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
    emit_env: bool = typer.Option(False, "--emit-env", help="Print only RAYDLC_GPU_AZ=<best zone>, for scripts."),
) -> None:
    """Rank the region's AZs for the GPU nodes: offerings, On-Demand quota, Spot score, subnets.

    Exit 0 when an AZ is ready (or could not be ruled out), 3 when none can take the nodes.
    """
    from raydlc import api

    if json_ and emit_env:
        raise InputError("--json and --emit-env both write stdout", hint="choose one")
    report = api.capacity(region=region, instance_type=instance_type, count=count, probe=probe, **_config_args(ctx))
    if json_:
        emit_json(report.to_dict())
    elif emit_env:
        for line in report.checks:
            err_console.print(f"[yellow]check:[/] {line}")
        if report.best_zone:
            sys.stdout.write(f"RAYDLC_GPU_AZ={report.best_zone}\n")
        else:
            why = report.zones[0].reason if report.zones else "no Availability Zone could be read"
            err_console.print(f"no AZ can take the GPU nodes: {why}", highlight=False)
    else:
        from raydlc.views.capacity import print_report

        print_report(report, console)
    if report.best_zone is None or (report.probe is not None and report.probe.outcome != "available"):
        raise typer.Exit(3)


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

    result = api.nccl(paths, expect=expect, accept_selected=accept_selected)
    if json_:
        emit_json(result.to_dict())
    else:
        from raydlc.views.nccl import render

        render(result.report, console, expect, accept_selected)
    if not result.ok:
        raise typer.Exit(3)


@app.command("plan")
@with_options(plan_use_case.OPTIONS, notes=False)
def plan_cmd(
    ctx: typer.Context,
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", max=16, help="GPUs per node (what-if; default GPUS_PER_NODE)."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU model (l4, a10g, l40s, a100-40gb, a100-80gb, h100, h200, b200); default: GPU_NODE_TYPE's."),
    network_gbps: float | None = typer.Option(
        None, "--network-gbps", callback=_finite, help="Node network bandwidth, Gb/s; default: GPU_NODE_TYPE's."
    ),
    policy: str = typer.Option("bf16-mixed", "--policy", help="Precision: bf16-mixed (fp32 shards, bf16 compute), pure-bf16 or fp32."),
    strategy: str | None = typer.Option(None, "--strategy", help="Which strategy's figures to show first: fsdp or hsdp (both are computed); default fsdp, or the recommended one with --grad-accum auto."),
    activation_checkpointing: bool | None = typer.Option(
        None, "--activation-checkpointing/--no-activation-checkpointing",
        help="Recompute each block in backward (default off; with --scan-nodes each node count chooses unless given).",
    ),
    scan_nodes: str | None = typer.Option(None, "--scan-nodes", help="Comma-separated node counts, e.g. 1,2,4,8,16,32,64: the recommended layout, tokens/s and scaling efficiency at each."),
    plot: Path | None = typer.Option(None, "--plot", help="With --scan-nodes: write a PNG of tokens/s and efficiency against nodes."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
    *,
    named: dict[str, Any],
) -> None:
    """Per-GPU memory, per-step traffic, step time and tokens/s for FSDP and HSDP, and the fastest layout that fits."""
    if plot is not None and scan_nodes is None:
        raise InputError("--plot draws a scale-out scan", hint="add --scan-nodes 1,2,4,8")
    if plot is not None:
        from raydlc.files import check_png_path

        check_png_path(plot, "--plot", f"raydlc plan --scan-nodes {shlex.quote(scan_nodes or '')}")
    from raydlc.config import parse_assignments

    st = _state(ctx)
    settings = parse_assignments(st.assignments)
    common = dict(config=st.config_path, gpus_per_node=gpus_per_node, gpu=gpu, network_gbps=network_gbps, policy=policy,
                  activation_checkpointing=activation_checkpointing)
    if scan_nodes is not None:  # the step flags are checked as settings; the scan searches the step itself
        step = {o.env: named.pop(o.keyword) for o in plan_use_case.OPTIONS if o.keyword in plan_use_case.SEARCHED and o.keyword in named}
        found = plan_use_case.scan(scan_nodes, plot=plot, settings={**settings, **step}, **common, **named)
        if json_:
            emit_json(found.to_dict())
            return
        from raydlc.views.scan import print_scan

        print_scan(found, console)
        if plot is not None:
            console.print(f"plot: {plot}")
        return
    result = plan_use_case.plan(strategy=strategy, settings=settings, **common, **named)
    if json_:
        emit_json(result.to_dict())
        return
    from raydlc.views.plan import print_plan

    print_plan(result, console)




@app.command("preflight")
def preflight_cmd(
    ctx: typer.Context,
    local: bool = typer.Option(False, "--local", help="Run on a local Ray over gloo: figures only, no network verdict."),
    workers: int | None = typer.Option(None, "--workers", help="Workers (one per GPU); default NUM_WORKERS, or 2 with --local."),
    sizes_mib: list[float] | None = typer.Option(
        None, "--size-mib", callback=_finite, help="Message size in MiB (repeatable); default 0.25/4/32 locally, 1..512 on GPUs."
    ),
    iters: int = typer.Option(5, "--iters", help="Timed calls per collective and size."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """All-reduce/all-gather bus bandwidth on the job's workers, and whether EFA is really in use."""
    from raydlc import api

    report = api.preflight(local=local, workers=workers, size_mib=sizes_mib, iters=iters, **_config_args(ctx))
    if json_:
        emit_json(report.to_dict())
    else:
        from raydlc.views.preflight import print_report

        print_report(report, console)
    if not report.ok:
        for f in report.findings:
            if f.level == "fail":
                err_console.print(f"[bold red]preflight failed:[/] {f.message}", highlight=False)
        raise typer.Exit(1)


@app.command("train")
@with_options(train_use_case.OPTIONS)
def train(
    ctx: typer.Context,
    address: str | None = typer.Option(None, "--address", help="Join this Ray cluster (host:port of its head) instead of starting a local one."),
    json_: bool = typer.Option(False, "--json", help="Print the summary as one JSON object (last line of stdout)."),
    *,
    named: dict[str, Any],
) -> None:
    """Fine-tune on a local Ray (or --address): FSDP2 under Ray Train, checkpoints, HF export, loss plot.

    Every setting is a RAYDLC_<NAME> (or --set NAME=VALUE); `raydlc config show` lists them.
    Settings left at their default take the local-run values (README: local defaults).
    """
    from raydlc.config import parse_assignments
    from raydlc.train.progress import TrainView, print_summary

    st = _state(ctx)
    try:
        with TrainView(quiet=json_, debug=debug_requested(st.debug)) as view:
            result = train_use_case.train(
                config=st.config_path, settings=parse_assignments(st.assignments), address=address, on_progress=view,
                log_to_driver=view.debug, **named,
            )
    except Stopped as e:  # the hint: this very command again, with --resume
        resume = _INVOKED if "--resume" in _INVOKED else [*_INVOKED, "--resume"]
        raise Stopped(e.message, hint=shlex.join(["raydlc", *resume]) if e.hint else None) from None
    if json_:
        emit_json(result.to_dict())
    else:
        print_summary(result.to_dict())


data_app = typer.Typer(help="Training datasets: prepare once with Ray Data (shards + manifest), show one.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("prepare")
@with_options(data_use_case.OPTIONS)
def data_prepare(
    ctx: typer.Context,
    source: str = typer.Argument(..., help="A .jsonl/.parquet/.txt file, a directory of them, an s3:// prefix, or 'bundled'."),
    out: str | None = typer.Option(None, "--out", help="Where the shards and manifest go (a dir or s3://); default: ./raydlc-out/datasets/<key>."),
    address: str | None = typer.Option(None, "--address", help="Prepare on this Ray cluster (host:port of its head) instead of a local Ray."),
    json_: bool = typer.Option(False, "--json", help="Print the result and its manifest as one JSON object."),
    *,
    named: dict[str, Any],
) -> None:
    """Tokenize and pack documents into fixed-length blocks (shards + manifest) that `raydlc train --data DEST` reads."""
    from raydlc.train.progress import preparing_line

    status = None if json_ else err_console.status("preparing data", spinner="dots")
    if status is not None:
        status.start()
    try:
        result = data_use_case.data_prepare(
            None if source == "bundled" else source, out=out, address=address,
            on_progress=(lambda rec: status.update(preparing_line(rec))) if status is not None else None, **_config_args(ctx), **named,
        )
    finally:
        if status is not None:
            status.stop()
    if json_:
        emit_json(result.to_dict())
        return
    c = result.manifest["counts"]
    said = "found (reused)" if result.reused else f"prepared in {result.wall_s:.1f} s"
    console.print(f"{result.dest}: {said}; {result.rows:,} blocks of {result.seq_len} tokens, "
                  f"{c['records_used']:,} records used, {c['records_skipped']:,} skipped, {result.loss_share:.0%} of tokens carry the loss")
    console.print(f"train on it: raydlc train --data {result.dest} --seq-len {result.seq_len}")


@data_app.command("show")
def data_show(
    dest: str = typer.Argument(..., help="A prepared dataset (its folder or s3:// prefix)."),
    json_: bool = typer.Option(False, "--json", help="Print the manifest, counts and decoded examples as one JSON object."),
) -> None:
    """A prepared dataset's manifest, token count, share of tokens with loss, and three decoded blocks."""
    from rich.markup import escape

    shown = data_use_case.data_show(dest)
    if json_:
        emit_json(shown.to_dict())
        return
    m = shown.manifest
    console.print(f"{shown.dest}: {shown.rows:,} blocks of {m['seq_len']} tokens from {m['source']['spec']} "
                  f"(tokenizer {m['tokenizer']['name']}, template {m['chat_template']}, loss on {m['loss_on']})")
    console.print(f"{shown.tokens:,} tokens, {shown.loss_share:.1%} carry the loss; counts: {m['counts']}", highlight=False)
    for i, ex in enumerate(shown.examples, 1):
        console.print(f"[bold]example {i}[/] (no loss between ⟦ ⟧):\n{escape(ex)}", highlight=False)


_STEP_HELP = "capacity, storage, cluster, gpu-nodegroup, kuberay, device-plugins, raycluster"


def _layers(ctx: typer.Context) -> dict[str, Any]:
    """The global --config/--set as a use case's `config` and `settings` (raydlc.api's layering)."""
    from raydlc.config import parse_assignments

    st = _state(ctx)
    return {"config": st.config_path, "settings": parse_assignments(st.assignments)}


@app.command("up")
def up(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print each step, whether it would act and why, and the exact command; change nothing."),
    json_: bool = typer.Option(False, "--json", help="Print JSON: the plan, or each step's outcome."),
    only: str | None = typer.Option(None, "--only", help=f"Run one step: {_STEP_HELP}."),
    from_: str | None = typer.Option(None, "--from", help="Run this step and every step that needs it."),
    until: str | None = typer.Option(None, "--until", help="Run this step and every step it needs."),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="Where raydlc writes and reads the cluster's kubeconfig [KUBECONFIG]."),
    force: bool = typer.Option(False, "--force", help="Use an existing cluster that raydlc did not create."),
    yes: bool = typer.Option(False, "--yes", help="Recreate the Ray pods when their templates changed (stops running jobs) without asking."),
) -> None:
    """Create or resume the cluster: EKS, EFA GPU nodes, device plugins, KubeRay, the RayCluster."""
    from raydlc import api
    from raydlc.views import lifecycle as view

    layers = _layers(ctx)
    run = lambda reporter: api.up(**layers, only=only, from_=from_, until=until, dry_run=dry_run, force=force,
                                  kubeconfig=kubeconfig, reporter=reporter, yes=yes)
    raise typer.Exit(view.execute("up", run, json_=json_, dry_run=dry_run))


@app.command("down")
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
) -> None:
    """Remove everything `up` made, in reverse, until AWS lists nothing of the cluster that bills."""
    from raydlc import api
    from raydlc.views import lifecycle as view

    if local:
        clash = [f for f, on in (("--keep-cluster", keep_cluster), ("--force", force), ("--kubeconfig", kubeconfig is not None)) if on]
        if clash:
            raise InputError(f"--local and {', '.join(clash)} cannot be combined: --local ends only raydlc's local Ray head",
                             hint="raydlc down --local")
        _down_local(json_, dry_run)
        return
    if delete_storage and not (yes or dry_run):
        _confirm_delete_storage()
    layers = _layers(ctx)
    run = lambda reporter: api.down(**layers, keep_cluster=keep_cluster, delete_storage=delete_storage, dry_run=dry_run,
                                    force=force, kubeconfig=kubeconfig, reporter=reporter)
    raise typer.Exit(view.execute("down", run, json_=json_, dry_run=dry_run))


def _confirm_delete_storage() -> None:
    """The checkpoints cannot be brought back: ask a person, and refuse a script that did not say --yes."""
    import sys

    if sys.stdin is None or not sys.stdin.isatty():
        raise InputError("--delete-storage deletes every checkpoint in the cluster's S3 bucket; nobody is here to confirm",
                         hint="raydlc down --delete-storage --yes")
    if not typer.confirm("Delete the cluster's S3 bucket and every checkpoint in it?", default=False):
        raise InputError("--delete-storage not confirmed: nothing was removed", hint="raydlc down")


def _down_local(json_: bool, dry_run: bool) -> None:
    from raydlc import api

    result = api.down_local(dry_run=dry_run)
    if json_:
        emit_json(result.to_dict())
    else:
        console.print(result.message, highlight=False, soft_wrap=True)


@app.command("status")
def status(
    ctx: typer.Context,
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="The cluster's kubeconfig [KUBECONFIG]."),
) -> None:
    """Each step's state, the nodes and their GPUs/EFA, the RayCluster's pods, and the hourly cost."""
    from raydlc import api
    from raydlc.views import lifecycle as view

    doc = api.status(**_layers(ctx), kubeconfig=kubeconfig).to_dict()
    if json_:
        emit_json(doc)
    else:
        view.print_status(doc, console)


@app.command("eks-token", hidden=True)
def eks_token(
    cluster: str = typer.Option(..., "--cluster", help="The EKS cluster the token is for."),
    region: str = typer.Option(..., "--region", help="Its region."),
) -> None:
    """The exec credential plugin raydlc's kubeconfig runs: an ExecCredential on stdout, for the client only."""
    import json

    from raydlc import ekstoken

    sys.stdout.write(json.dumps(ekstoken.exec_credential(cluster, region)) + "\n")


# ---- jobs on the Ray cluster: submit, job …, verify, bench-transport ------------------------------
# Each command parses, calls its use case in raydlc.api (which reaches the head and does the work)
# and prints; Ctrl-C while a job streams detaches here: the job goes on.

job_app = typer.Typer(help="Jobs on the Ray cluster: list, logs, status, stop (--local, --address URL, or the cluster).", no_args_is_help=True)
app.add_typer(job_app, name="job")


def _local_opt() -> Any:
    return typer.Option(False, "--local", help="raydlc's local Ray head on this machine (`submit --local` starts it; `down --local` ends it).")


def _address_opt() -> Any:
    return typer.Option(None, "--address", help="A Ray dashboard you already reach, e.g. http://127.0.0.1:8265.")


def _kubeconfig_opt() -> Any:
    return typer.Option(None, "--kubeconfig", help="The cluster's kubeconfig, for the cluster target [RAYDLC_KUBECONFIG, else KUBECONFIG].")


def _reaching(ctx: typer.Context, kubeconfig: Path | None) -> dict[str, Any]:
    """The global --config/--set, and --kubeconfig as the KUBECONFIG setting it stands for."""
    layers = _layers(ctx)
    if kubeconfig is not None:
        layers["settings"] = {**layers["settings"], "KUBECONFIG": str(kubeconfig)}
    return layers


def _layers(ctx: typer.Context) -> dict[str, Any]:
    """The global --config/--set as a use case takes them."""
    from raydlc.config import parse_assignments

    st = _state(ctx)
    return {"config": st.config_path, "settings": parse_assignments(st.assignments)}


def _notice(text: str) -> None:
    from rich.markup import escape

    warning = text.startswith("warning: ")
    err_console.print(f"[yellow]warning:[/] {escape(text.removeprefix('warning: '))}" if warning else escape(text), highlight=False)


def _writer(stream: Any) -> Any:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


@contextlib.contextmanager
def _detaching(local: bool, address: str | None) -> Iterator[None]:
    """Ctrl-C while a job streams: say that it keeps running and how to come back to it, exit 130."""
    from raydlc.jobs import Detached

    try:
        yield
    except Detached as d:
        from raydlc.heads import choose

        flag = choose(local, address).flag
        err_console.print(f"\ndetached from job {d.job_id}; it keeps running. Re-attach: raydlc job logs {d.job_id} --follow{flag}; "
                          f"stop it: raydlc job stop {d.job_id}{flag}", highlight=False)
        raise typer.Exit(130) from None


def _ended(job: Any, target: Any) -> None:
    """The exit code follows the job: a job that did not succeed is an error line and exit 1."""
    from raydlc.jobs import failure

    if job.status != "SUCCEEDED":
        raise failure(job, hint=f"raydlc job logs {job.submission_id}{target.flag}")


SUBMIT_OPTIONS = [flags_option("JOB_MAX_COST_USD")]  # the training settings submit takes as its own flags


@app.command("submit")
@with_options(SUBMIT_OPTIONS)
def submit(
    ctx: typer.Context,
    items: list[str] | None = typer.Argument(None, metavar="[SCRIPT.py] [-- ARGS...]", help="The script to run (default: the built-in training program) and its arguments after --."),
    builtin: bool = typer.Option(False, "--builtin", help="Run raydlc's training program (python -m raydlc.train) with the config's training settings."),
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    kubeconfig: Path | None = _kubeconfig_opt(),
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
    layers = _reaching(ctx, kubeconfig)
    layers["settings"] = {**layers["settings"], **named_settings(SUBMIT_OPTIONS, named, caller="submit")}
    with _detaching(local, address):
        result = api.submit(script, args, builtin=builtin, local=local, address=address, name=name, pip=pip or [], env=env or [], working_dir=working_dir,
                            no_wait=no_wait, gpus=gpus, rayjob=rayjob, yes=yes, **layers, write=_writer(sys.stderr if json_ else sys.stdout),
                            notice=_notice)
    job = result.job
    if json_:
        emit_json(result.to_dict())
    elif no_wait:
        console.print(f"follow it: raydlc job logs {job.submission_id} --follow{result.target.flag}", highlight=False)
    else:
        err_console.print(f"job {job.submission_id}: {job.status} after {job.duration_s or 0:.1f} s", highlight=False)
    if not no_wait:
        _ended(job, result.target)


@job_app.command("list")
def job_list(
    ctx: typer.Context,
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    kubeconfig: Path | None = _kubeconfig_opt(),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Every job the head knows, oldest first."""
    from raydlc import api

    result = api.job_list(local=local, address=address, **_reaching(ctx, kubeconfig))
    if json_:
        emit_json(result.to_dict())
        return
    from raydlc.views.jobs import print_jobs

    print_jobs(list(result.jobs), result.target.where, console)


@job_app.command("logs")
def job_logs(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., metavar="ID", help="The job's id (its --name, or what submit printed)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream until the job ends; the exit code follows the job."),
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    kubeconfig: Path | None = _kubeconfig_opt(),
    json_: bool = typer.Option(False, "--json", help="Print {job_id, status, logs} as JSON."),
) -> None:
    """The job's driver output (its workers' output is folded in by Ray)."""
    from raydlc import api

    streaming = follow and not json_
    with _detaching(local, address):
        result = api.job_logs(job_id, follow=streaming, local=local, address=address, **_reaching(ctx, kubeconfig), write=_writer(sys.stdout))
    if streaming:
        _ended(result.job, result.target)
    elif json_:
        emit_json(result.to_dict())
    else:
        sys.stdout.write(result.logs)


@job_app.command("status")
def job_status(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., metavar="ID", help="The job's id."),
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    kubeconfig: Path | None = _kubeconfig_opt(),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The job's state as the Jobs API reports it (never inferred from a log stream)."""
    from raydlc import api

    result = api.job_status(job_id, local=local, address=address, **_reaching(ctx, kubeconfig))
    if json_:
        emit_json(result.to_dict())
        return
    from raydlc.views.jobs import print_cost, print_job

    print_job(result.job, console)
    if result.cost:
        print_cost(result.cost, console)


@job_app.command("stop")
def job_stop(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., metavar="ID", help="The job's id."),
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    kubeconfig: Path | None = _kubeconfig_opt(),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Stop a job and wait until it has ended."""
    from raydlc import api

    result = api.job_stop(job_id, local=local, address=address, **_reaching(ctx, kubeconfig))
    job = result.job
    if json_:
        emit_json(result.to_dict())
    elif result.was_running:
        console.print(f"job {job.submission_id}: {job.status}", highlight=False)
    else:
        console.print(f"job {job.submission_id} had already ended: {job.status}", highlight=False)


@app.command("verify")
def verify_cmd(
    ctx: typer.Context,
    job_id: str | None = typer.Option(None, "--job", help="The job to prove (default: the newest job on the target)."),
    expect: str = typer.Option("efa", "--expect", help="The transport every node must show: efa, socket or ib."),
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    kubeconfig: Path | None = _kubeconfig_opt(),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The gate: GPU nodes, pods, fi_info, NCCL from the job's own worker logs, the run prefix, the head's port, the job's status.

    Exit 0 only when no criterion fails, 3 when one does.
    """
    from raydlc import api

    verdict = api.verify(job=job_id, expect=expect, local=local, address=address, **_reaching(ctx, kubeconfig))
    if json_:
        emit_json(verdict.to_dict())
    else:
        from raydlc.views.jobs import print_verdict

        print_verdict(verdict, console)
    if not verdict.passed:
        raise typer.Exit(3)


@app.command("bench-transport")
def bench_transport(
    ctx: typer.Context,
    steps: int = typer.Option(20, "--steps", help="Optimizer steps of each of the two runs."),
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    kubeconfig: Path | None = _kubeconfig_opt(),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The same short training job twice, as configured and with sockets forced, each proven from its own logs.

    A run's steps/s count only once its worker logs show the transport it was meant to use; exit 3 when not.
    """
    from raydlc import api

    with _detaching(local, address):
        result = api.bench_transport(steps=steps, local=local, address=address, **_reaching(ctx, kubeconfig), write=_writer(sys.stderr), notice=_notice)
    if json_:
        emit_json(result.to_dict())
    else:
        from raydlc.views.jobs import print_bench

        print_bench(result.to_dict(), console)
    if result.failed:
        raise typer.Exit(1)
    if result.ran and not result.applicable:
        raise typer.Exit(3)


def main(argv: list[str] | None = None) -> int:
    """Entry point, and the one rule for failures: one line `error: …` (and maybe `  hint: …`), no traceback.

    Exit 2 for what the user can fix (config, flags, paths, files), 1 for the world's or the
    machine's faults; typer itself turns Ctrl-C into 130 and a closed stdout into a quiet 1.
    `--debug` (or RAYDLC_DEBUG=1) re-raises instead.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    _INVOKED[:] = args
    debug = debug_requested("--debug" in args)
    command = typer.main.get_command(app)
    invoke = command.invoke

    def invoked(ctx: Any) -> Any:  # typer turns a KeyboardInterrupt into a silent exit 130: say what stopped first
        try:
            return invoke(ctx)
        except KeyboardInterrupt:
            raise _CtrlC from None

    command.invoke = invoked  # type: ignore[method-assign]
    try:
        rv = command.main(args=args, prog_name="raydlc", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt, _CtrlC):
        return _fail(Stopped(_stopped_line(args)), debug)
    except typer.TyperException as e:  # usage errors from the command-line parser
        if type(e).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as typer shows it
            e.show()  # type: ignore[attr-defined]
            return 2
        ctx = getattr(e, "ctx", None)
        usage = InputError(e.format_message(), hint=f"see '{ctx.command_path} --help'" if ctx else None)
        usage.exit_code = e.exit_code  # 2 for usage errors, as the parser says
        return _fail(usage, False)
    except RaydlcError as e:
        return _fail(e, debug)
    except OSError as e:
        from raydlc.files import os_error

        return _fail(os_error(e), debug, cause=e)
    except UnicodeDecodeError as e:
        return _fail(InputError(f"input is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})"), debug, cause=e)


# What Ctrl-C leaves, by command, when the command itself did not say (before its work began, or in between).
_KEPT = {
    "train": "nothing more is written; checkpoints already written are kept (--resume continues from the last)",
    "submit": "a job already submitted keeps running (raydlc job list shows it)",
    "up": "what exists is kept; running raydlc up again continues",
    "down": "what is left is kept; running raydlc down again continues",
    "verify": "verify changes nothing",
    "bench-transport": "a run already submitted keeps running (raydlc job list shows it)",
}


class _CtrlC(Exception):
    """Ctrl-C in a command, carried past typer (which would swallow a KeyboardInterrupt) to `main`."""


_INVOKED: list[str] = []  # the arguments of this run of `main`: what a hint repeats


def _stopped_line(args: list[str]) -> str:
    """One line for Ctrl-C: which command stopped, and what it leaves."""
    rest = list(args)
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] in ("--config", "-c", "--set") else rest[1:]
    cmd = " ".join(rest[:2]) if rest and rest[0] in ("config", "job") else (rest[0] if rest else "")
    kept = _KEPT.get(cmd, "nothing more was done")
    return f"raydlc {cmd} stopped by Ctrl-C; {kept}" if cmd else f"stopped by Ctrl-C; {kept}"


def _fail(e: RaydlcError, debug: bool, cause: BaseException | None = None) -> int:
    if debug:
        if cause is not None:
            raise e from cause
        raise e
    from rich.markup import escape

    label = "[bold yellow]interrupted:[/]" if isinstance(e, Stopped) else "[bold red]error:[/]"
    err_console.print(f"{label} {escape(e.message)}", highlight=False)
    if e.hint:
        err_console.print(f"  hint: {escape(e.hint)}", highlight=False)
    return e.exit_code


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
