"""The `raydlc` command line: one small function per command, nothing heavy at import time.

Commands import the module that does their work inside the function body, so that
`raydlc --help` never pays for torch, ray, transformers or kubernetes.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from raydlc.errors import InputError, RaydlcError
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


def _finite(value: Any) -> Any:
    """Float flags (one or repeated): inf and nan parse as floats but mean nothing here."""
    for v in value if isinstance(value, list) else [value]:
        if v is not None and not math.isfinite(v):
            raise typer.BadParameter(f"must be a finite number, got {v}")
    return value


def load(ctx: typer.Context, **flags: Any) -> Config:
    """The effective Config for a command: global --config/--set, then the command's own flags."""
    from raydlc.config import load_config, parse_assignments

    st = _state(ctx)
    overrides: dict[str, Any] = parse_assignments(st.assignments)
    overrides.update({k: v for k, v in flags.items() if v is not None})
    return load_config(st.config_path, overrides=overrides)


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
    cfg = load(ctx)
    if json_:
        emit_json({"config": cfg.as_dict(), "fields": cfg.rows()})
        return
    from rich.table import Table

    table = Table(title="raydlc configuration", show_lines=False)
    for col in ("setting", "env", "value", "source"):
        table.add_column(col)
    for row in cfg.rows():
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
    from importlib import metadata

    from raydlc import __version__, catalog

    def installed(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    img = catalog.IMAGES[catalog.DEFAULT_IMAGE]
    local = {"raydlc": __version__, "ray": installed("ray"), "torch": installed("torch"), "python": sys.version.split()[0]}
    image = {"image": img.image, "ray": img.ray, "torch": img.torch, "cuda": img.cuda, "nccl": img.nccl}
    mismatch = [k for k in ("ray", "torch") if local[k] and local[k].split("+")[0] != image[k]]
    if json_:
        emit_json({"local": local, "image": image, "mismatch": mismatch})
        return
    console.print(f"raydlc {__version__}")
    console.print(f"local:  Ray {local['ray'] or 'not installed'}, PyTorch {local['torch'] or 'not installed'}, Python {local['python']}")
    console.print(f"image:  {img.image}: Ray {img.ray}, PyTorch {img.torch}, CUDA {img.cuda}, NCCL {img.nccl}")
    for k in mismatch:
        err_console.print(f"[yellow]warning:[/] local {k} {local[k]} differs from the image's {image[k]}")


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
    from raydlc.files import check_output_dir
    from raydlc.render import render_all, to_yaml_stream, write

    cfg = load(ctx)
    if out is not None:
        check_output_dir(out, "--out")
    zone_list = [z.strip() for z in zones.split(",") if z.strip()] if zones else None
    docs = render_all(cfg, zone_list, only=only)
    if out is not None:
        paths = write(docs, out)
        if json_:
            emit_json({"out": str(out), "files": [str(p.relative_to(out)) for p in paths]})
        else:
            for p in paths:
                console.print(f"wrote {p}")
        return
    if json_:
        emit_json({"files": docs})
        return
    sys.stdout.write(to_yaml_stream(docs))


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
    from raydlc import capacity as cap

    if json_ and emit_env:
        raise InputError("--json and --emit-env both write stdout", hint="choose one")
    flags: dict[str, Any] = {"REGION": region, "GPU_NODE_TYPE": instance_type, "GPU_NODE_COUNT": count}
    gpus = _catalog_gpus(ctx, instance_type)
    if gpus is not None:
        flags["GPUS_PER_NODE"] = gpus
    report = cap.discover(load(ctx, **flags), with_probe=probe)
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


def _catalog_gpus(ctx: typer.Context, instance_type: str | None) -> int | None:
    """GPUS_PER_NODE for a --instance-type raydlc knows, unless the user set GPUS_PER_NODE."""
    from raydlc import catalog
    from raydlc.config import load_config, parse_assignments
    from raydlc.errors import ConfigError

    known = catalog.instance_type(instance_type) if instance_type else None
    if known is None or known.gpus == 0:
        return None
    st = _state(ctx)
    try:
        current = load_config(st.config_path, overrides=parse_assignments(st.assignments))
    except ConfigError:
        return known.gpus  # the final load reports whatever is still wrong
    return None if current.source("GPUS_PER_NODE") != "default" else known.gpus


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
    from raydlc.telemetry.collect import analyze_paths
    from raydlc.telemetry.nccl import EXPECTABLE, expect_ok

    if expect is not None and expect not in EXPECTABLE:
        raise InputError(f"--expect {expect!r} is not one of {', '.join(EXPECTABLE)}")
    if accept_selected and expect is None:
        raise InputError("--accept-selected only changes what --expect accepts", hint="add --expect efa|socket|ib|single-node")
    if not paths:
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("no input given", hint="raydlc nccl PATH|DIR|- (for example: kubectl logs POD | raydlc nccl -)")
        paths = ["-"]
    report = analyze_paths(paths)
    ok = expect is None or expect_ok(report, expect, accept_selected)
    if json_:
        doc = report.as_dict()
        if expect is not None:
            doc["expect"], doc["expect_ok"], doc["accept_selected"] = expect, ok, accept_selected
        emit_json(doc)
    else:
        from raydlc.views.nccl import render

        render(report, console, expect, accept_selected)
    if not ok:
        raise typer.Exit(3)


@app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    model: str | None = typer.Option(None, "--model", help="Built-in spec (qwen2.5-0.5b…72b, llama-3.2-1b…llama-3.3-70b, tiny), its hub id, or a dir with config.json [MODEL_ID]."),
    nodes: int | None = typer.Option(None, "--nodes", help="GPU nodes [GPU_NODE_COUNT]."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", max=16, help="GPUs per node (what-if; default GPUS_PER_NODE)."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU model (l4, a10g, l40s, a100-40gb, a100-80gb, h100, h200, b200); default: GPU_NODE_TYPE's."),
    network_gbps: float | None = typer.Option(
        None, "--network-gbps", callback=_finite, help="Node network bandwidth, Gb/s; default: GPU_NODE_TYPE's."
    ),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Tokens per sequence [SEQ_LEN]."),
    micro_batch: int | None = typer.Option(None, "--micro-batch", help="Sequences per GPU per micro-batch [BATCH_SIZE]."),
    grad_accum: str | None = typer.Option(None, "--grad-accum", help="Micro-batches per optimizer step, or auto: the figures of the recommended layout [GRAD_ACCUM]."),
    sync: str | None = typer.Option(None, "--sync", help="Gradient sync with accumulation: every, once, all-reduce-once (HSDP), auto [GRAD_SYNC]."),
    max_global_batch: int | None = typer.Option(None, "--max-global-batch", help="Most tokens per optimizer step the recommendation may use [MAX_GLOBAL_BATCH]."),
    policy: str = typer.Option("bf16-mixed", "--policy", help="Precision: bf16-mixed (fp32 shards, bf16 compute), pure-bf16 or fp32."),
    strategy: str | None = typer.Option(None, "--strategy", help="Which strategy's figures to show first: fsdp or hsdp (both are computed); default fsdp, or the recommended one with --grad-accum auto."),
    activation_checkpointing: bool | None = typer.Option(
        None, "--activation-checkpointing/--no-activation-checkpointing",
        help="Recompute each block in backward (default off; with --scan-nodes each node count chooses unless given).",
    ),
    instance_type: str | None = typer.Option(None, "--instance-type", help="GPU instance type whose catalogue facts to plan with [GPU_NODE_TYPE]."),
    scan_nodes: str | None = typer.Option(None, "--scan-nodes", help="Comma-separated node counts, e.g. 1,2,4,8,16,32,64: the recommended layout, tokens/s and scaling efficiency at each."),
    plot: Path | None = typer.Option(None, "--plot", help="With --scan-nodes: write a PNG of tokens/s and efficiency against nodes."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Per-GPU memory, per-step traffic, step time and tokens/s for FSDP and HSDP, and the fastest layout that fits."""
    from raydlc import catalog
    from raydlc import plan as planner
    from raydlc.models import get_spec

    if plot is not None and scan_nodes is None:
        raise InputError("--plot draws a scale-out scan", hint="add --scan-nodes 1,2,4,8")
    known = catalog.instance_type(instance_type) if instance_type else None
    cfg = load(
        ctx, MODEL_ID=model, GPU_NODE_COUNT=nodes, SEQ_LEN=seq_len, BATCH_SIZE=micro_batch, GRAD_ACCUM=grad_accum,
        GRAD_SYNC=sync, MAX_GLOBAL_BATCH=max_global_batch, GPU_NODE_TYPE=instance_type, GPUS_PER_NODE=known.gpus if known else None,
    )
    gpn = cfg.gpu_nodes.gpus_per_node if gpus_per_node is None else gpus_per_node
    t = cfg.train
    spec = get_spec(t.model_id)
    if scan_nodes is not None:
        _plan_scan(spec, scan_nodes, gpn, gpu, cfg.gpu_nodes.instance_type, network_gbps, t.seq_len, policy,
                   activation_checkpointing, t.max_global_batch, plot, json_)
        return
    activation_checkpointing = bool(activation_checkpointing)
    layout = planner.layout_for(cfg.gpu_nodes.count, gpn, gpu=gpu, instance_type=cfg.gpu_nodes.instance_type, network_gbps=network_gbps)
    result = planner.plan(
        spec, layout, seq_len=t.seq_len, micro_batch=t.batch_size, grad_accum=t.grad_accum, sync=t.grad_sync,
        max_global_batch=t.max_global_batch, policy=policy, activation_checkpointing=activation_checkpointing, strategy=strategy,
    )
    if json_:
        emit_json(result.to_dict())
        return
    from raydlc.views.plan import print_plan

    print_plan(result, console)


def _plan_scan(
    spec: Any, node_counts: str, gpus_per_node: int, gpu: str | None, instance_type: str, network_gbps: float | None,
    seq_len: int, policy: str, activation_checkpointing: bool | None, max_global_batch: int, plot: Path | None, json_: bool,
) -> None:
    from raydlc import plan as planner
    from raydlc import scaleout

    counts = scaleout.parse_node_counts(node_counts)
    if plot is not None:
        from raydlc.files import check_output_file

        check_output_file(plot, "--plot", force=True)

    def layout_at(n: int) -> planner.Layout:
        return planner.layout_for(n, gpus_per_node, gpu=gpu, instance_type=instance_type, network_gbps=network_gbps)

    result = scaleout.scan(spec, counts, layout_at, seq_len=seq_len, policy=policy, activation_checkpointing=activation_checkpointing,
                           max_global_batch=max_global_batch)
    if plot is not None:
        from raydlc.views.scan import plot_scan

        plot_scan(result, plot)
    if json_:
        emit_json(result.to_dict() | {"plot": str(plot) if plot else None})
        return
    from raydlc.views.scan import print_scan

    print_scan(result, console)
    if plot is not None:
        console.print(f"plot: {plot}")


MAX_ITERS = 1000
MAX_SIZE_MIB = 16384


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
    from raydlc import preflight

    cfg = load(ctx, NUM_WORKERS=workers)
    if iters < 1 or any(s <= 0 for s in sizes_mib or []):
        raise InputError("--iters and --size-mib must be positive", hint="e.g. --size-mib 4 --size-mib 64 --iters 5")
    if iters > MAX_ITERS or any(s > MAX_SIZE_MIB for s in sizes_mib or []):
        raise InputError(
            f"--iters must be at most {MAX_ITERS} and --size-mib at most {MAX_SIZE_MIB} (16 GiB): "
            "bus bandwidth saturates far below that",
            hint="e.g. --size-mib 512 --iters 20",
        )
    n = workers if workers is not None else ((cfg.train.num_workers or 2) if local else cfg.num_workers)
    if n < 1:
        raise InputError(f"--workers must be at least 1, got {n}", hint="pass --workers 2 for a local run")
    every_gpu = cfg.gpu_nodes.gpus_per_node if n == cfg.total_gpus else None
    expectation = None if local else preflight.expectation_for(cfg.gpu_nodes.instance_type, every_gpu)
    report = preflight.run_preflight(
        num_workers=n, use_gpu=not local, expectation=expectation, iters=iters,
        sizes=[int(s * 2**20) for s in sizes_mib] if sizes_mib else None,
    )
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
def train(
    ctx: typer.Context,
    model: str | None = typer.Option(None, "--model", help="Built-in spec (random init), hub id or local dir (weights loaded shard by shard) [MODEL_ID; local default: tiny]."),
    data: str | None = typer.Option(None, "--data", help=".txt/.jsonl file or dir, or a dataset id [DATA; default: bundled stdlib-docstring corpus]."),
    steps: int | None = typer.Option(None, "--steps", help="Optimizer steps [STEPS; local default: 300]."),
    workers: int | None = typer.Option(None, "--workers", help="Ray Train workers [NUM_WORKERS; local default: 2]."),
    out: Path | None = typer.Option(None, "--out", help="Storage for checkpoints, export, metrics [STORAGE_PATH; default: ./raydlc-out]."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Tokens per sequence [SEQ_LEN; default: 128]."),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Sequences per worker per step [BATCH_SIZE; local default: 8]."),
    grad_accum: str | None = typer.Option(None, "--grad-accum", help="Micro-batches per optimizer step, or auto: the planner's micro-batch and accumulation on a known GPU cluster [GRAD_ACCUM]."),
    lr: float | None = typer.Option(None, "--lr", callback=_finite, help="AdamW learning rate [LEARNING_RATE; local default: 0.002]."),
    checkpoint_every: int | None = typer.Option(None, "--checkpoint-every", help="Steps between checkpoints; 0 = only at the end [CHECKPOINT_EVERY; local default: 100]."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the model init, data order and eval split [SEED]."),
    run_name: str | None = typer.Option(None, "--run-name", help="Run folder under --out [RUN_NAME; default: run-<UTC time>]."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint under --out [RESUME]."),
    resume_from: str | None = typer.Option(None, "--resume-from", help="Continue from this checkpoint directory or URI [RESUME_FROM]."),
    sharding: str | None = typer.Option(None, "--sharding", help="fsdp | hsdp | auto [SHARDING]."),
    bf16: bool | None = typer.Option(None, "--bf16/--fp32", help="Compute dtype [BF16; default: bf16 on GPUs, fp32 on CPUs]."),
    activation_checkpointing: bool = typer.Option(False, "--activation-checkpointing", help="Recompute decoder blocks in backward [ACTIVATION_CHECKPOINTING]."),
    address: str | None = typer.Option(None, "--address", help="Join this Ray cluster (host:port of its head) instead of starting a local one."),
    preflight: bool = typer.Option(False, "--preflight", help="Measure collective bandwidth on the same workers first; stop if it fails [PREFLIGHT]."),
    json_: bool = typer.Option(False, "--json", help="Print the summary as one JSON object (last line of stdout)."),
) -> None:
    """Fine-tune on a local Ray (or --address): FSDP2 under Ray Train, checkpoints, HF export, loss plot.

    Every setting is a RAYDLC_<NAME> (or --set NAME=VALUE); `raydlc config show` lists them.
    Settings left at their default take the local-run values (README: local defaults).
    """
    from functools import partial

    from raydlc import storage
    from raydlc.train import launch, progress

    cfg = load(
        ctx,
        MODEL_ID=model,
        DATA=data,
        STEPS=steps,
        NUM_WORKERS=workers,
        STORAGE_PATH=str(out) if out is not None else None,
        SEQ_LEN=seq_len,
        BATCH_SIZE=batch_size,
        GRAD_ACCUM=grad_accum,
        LEARNING_RATE=lr,
        CHECKPOINT_EVERY=checkpoint_every,
        SEED=seed,
        RUN_NAME=run_name,
        RESUME=resume or None,
        RESUME_FROM=resume_from,
        SHARDING=sharding,
        BF16=bf16,
        ACTIVATION_CHECKPOINTING=activation_checkpointing or None,
        PREFLIGHT=preflight or None,
    )
    settings = launch.settings(cfg, local=True)
    where = launch.target(cfg, local=True, address=address)
    if not storage.is_uri(settings.storage_path or launch.DEFAULT_OUT):  # fail now, not after data preparation and Ray's start
        from raydlc.files import check_output_dir

        check_output_dir(settings.storage_path or launch.DEFAULT_OUT, "--out" if out is not None else "STORAGE_PATH")
    prepared = None
    if settings.num_workers > 0:  # with 0 (one per GPU) the data waits for the cluster's size
        with err_console.status("preparing data and tokenizer", spinner="dots"):
            prepared = launch.prepare(settings, where)  # bad input fails here, before a progress bar or a worker
    run = partial(launch.run, prepared=prepared)
    summary = progress.run_with_progress(run, settings, where, quiet=json_, debug=debug_requested(_state(ctx).debug))
    if json_:
        emit_json(summary)
    else:
        progress.print_summary(summary)


_STEP_HELP = "capacity, cluster, gpu-nodegroup, kuberay, device-plugins, raycluster"


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
) -> None:
    """Create or resume the cluster: EKS, EFA GPU nodes, device plugins, KubeRay, the RayCluster."""
    from raydlc import api
    from raydlc.views import lifecycle as view

    layers = _layers(ctx)
    run = lambda reporter: api.up(**layers, only=only, from_=from_, until=until, dry_run=dry_run, force=force,
                                  kubeconfig=kubeconfig, reporter=reporter)
    raise typer.Exit(view.execute("up", run, json_=json_, dry_run=dry_run))


@app.command("down")
def down(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be removed and how; change nothing."),
    json_: bool = typer.Option(False, "--json", help="Print JSON: the plan, or each step's outcome with what was removed."),
    keep_cluster: bool = typer.Option(False, "--keep-cluster", help="Stop after the node groups: keep the control plane and system node."),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="The cluster's kubeconfig [KUBECONFIG]."),
    force: bool = typer.Option(False, "--force", help="Delete a cluster that lacks raydlc's ownership tag."),
    local: bool = typer.Option(False, "--local", help="End raydlc's local Ray head instead (by its recorded PID and process group)."),
) -> None:
    """Remove everything `up` made, in reverse, until AWS lists nothing of the cluster that bills."""
    from raydlc import api
    from raydlc.views import lifecycle as view

    if local:
        _down_local(json_, dry_run)
        return
    layers = _layers(ctx)
    run = lambda reporter: api.down(**layers, keep_cluster=keep_cluster, dry_run=dry_run, force=force,
                                    kubeconfig=kubeconfig, reporter=reporter)
    raise typer.Exit(view.execute("down", run, json_=json_, dry_run=dry_run))


def _down_local(json_: bool, dry_run: bool) -> None:
    from raydlc import targets

    rec = targets.running_head()
    if dry_run or rec is None:
        what = "no local Ray head of raydlc runs" if rec is None else f"would end the local Ray head (PID {rec.pid}, {rec.dashboard_url})"
        doc = {"local": {"pid": rec.pid if rec else None, "dashboard": rec.dashboard_url if rec else None, "ended": False}}
    else:
        ended = targets.stop_local_head()
        what = "no local Ray head of raydlc runs" if ended is None else f"ended the local Ray head (PID {ended.pid}) and everything it started"
        doc = {"local": {"pid": ended.pid if ended else None, "dashboard": ended.dashboard_url if ended else None, "ended": ended is not None}}
    if json_:
        emit_json(doc)
    else:
        console.print(what, highlight=False)


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


# ---- jobs on the Ray cluster: submit, job …, verify, bench-transport ------------------------------

job_app = typer.Typer(help="Jobs on the Ray cluster: list, logs, status, stop (--local, --address URL, or the cluster).", no_args_is_help=True)
app.add_typer(job_app, name="job")
_EXPECT = ("efa", "socket", "ib")
MAX_BENCH_STEPS = 100_000


def _local_opt() -> Any:
    return typer.Option(False, "--local", help="raydlc's local Ray head on this machine (`submit --local` starts it; `down --local` ends it).")


def _address_opt() -> Any:
    return typer.Option(None, "--address", help="A Ray dashboard you already reach, e.g. http://127.0.0.1:8265.")


def _builtin_env(cfg: Config, local: bool) -> dict[str, str]:
    """The config's training settings as the RAYDLC_* variables `python -m raydlc.train` reads."""
    from raydlc.config import with_local_defaults
    from raydlc.jobenv import absolute_local_paths
    from raydlc.render.raycluster import job_env

    return absolute_local_paths(job_env(with_local_defaults(cfg))) if local else job_env(cfg)


def _image_versions(cfg: Config, local: bool) -> dict[str, str]:
    """The torch and ray a job must not replace: this machine's on the local target, else the image's."""
    from raydlc import catalog
    from raydlc.jobenv import installed_version

    img = catalog.IMAGES.get(cfg.images.dlc_image)
    if not local and img is not None:
        return {"torch": img.torch, "ray": img.ray}
    return {"torch": installed_version("torch") or (img.torch if img else "2.13.0"), "ray": installed_version("ray") or cfg.images.ray_version}


def _job_doc(job: Any, target: Any, **extra: Any) -> dict[str, Any]:
    return {"job_id": job.submission_id, "ray_job_id": job.job_id, "status": job.status, "target": target.kind,
            "duration_s": job.duration_s, "message": job.message, "entrypoint": job.entrypoint, **extra}


def _follow(c: Any, job_id: str, target: Any, write: Any) -> Any:
    """Stream a job until it ends; Ctrl-C detaches (the job goes on) and says how to come back."""
    from raydlc import jobs

    try:
        return jobs.follow(c, job_id, write)
    except KeyboardInterrupt:
        err_console.print(f"\ndetached from job {job_id}; it keeps running. Re-attach: raydlc job logs {job_id} --follow{target.flag}; "
                          f"stop it: raydlc job stop {job_id}{target.flag}", highlight=False)
        raise typer.Exit(130) from None


def _writer(stream: Any) -> Any:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


def _ended(job: Any, target: Any) -> None:
    """The exit code follows the job: a job that did not succeed is an error line and exit 1."""
    from raydlc.errors import TrainError

    if job.status != "SUCCEEDED":
        raise TrainError(f"job {job.submission_id} {job.status}" + (f": {job.message}" if job.message else ""),
                         hint=f"raydlc job logs {job.submission_id}{target.flag}")


@app.command("submit")
def submit(
    ctx: typer.Context,
    items: list[str] | None = typer.Argument(None, metavar="[SCRIPT.py] [-- ARGS...]", help="The script to run (default: the built-in training program) and its arguments after --."),
    builtin: bool = typer.Option(False, "--builtin", help="Run raydlc's training program (python -m raydlc.train) with the config's training settings."),
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    name: str | None = typer.Option(None, "--name", help="Submission id: the same name again attaches to that job while it runs, instead of starting a second."),
    pip: list[str] | None = typer.Option(None, "--pip", help="A package the image lacks: NAME (pinned to the version installed here) or NAME==VERSION; repeatable."),
    env: list[str] | None = typer.Option(None, "--env", help="K=V for the job's processes, NCCL_* and FI_* too; repeatable. Secrets are refused."),
    working_dir: Path | None = typer.Option(None, "--working-dir", help="Uploaded with the job, without .git and ignored files (default: SCRIPT's directory)."),
    no_wait: bool = typer.Option(False, "--no-wait", help="Return once the job is submitted."),
    json_: bool = typer.Option(False, "--json", help="Print one JSON object as the last line of stdout (logs go to stderr)."),
) -> None:
    """Run a job on the Ray cluster (or --local, --address) and stream its logs; the exit code follows the job.

    Ctrl-C detaches and leaves the job running.
    """
    from raydlc import jobenv, jobs, targets

    args = list(items or [])
    script = None
    if not builtin and args and not args[0].startswith("-"):
        script, args = Path(args[0]), args[1:]
    tgt = targets.choose(local, address)
    cfg = load(ctx)
    is_local = tgt.kind == targets.LOCAL
    spec = jobenv.build(
        script=script, args=args, working_dir=working_dir, pip=pip or [], env=jobenv.parse_env(env or []),
        settings_env=_builtin_env(cfg, is_local) if script is None else {}, image=_image_versions(cfg, is_local), name=name, target=tgt.kind,
    )
    for w in spec.warnings:
        err_console.print(f"[yellow]warning:[/] {w}", highlight=False)
    if spec.upload is not None:
        err_console.print(f"working dir {spec.upload.root}: {len(spec.upload.files)} files, {jobenv.mib(spec.upload.size)} to upload", highlight=False)
    starting = lambda: err_console.print("starting raydlc's local Ray head; it stays up for `job` and `verify` (`raydlc down --local` ends it)")
    with targets.reach(tgt, cfg, start_local=True, on_start=starting) as where:
        c = jobs.client(where.url)
        job, attached = jobs.submit(c, spec)
        verb = "attached to the running job" if attached else "submitted job"
        err_console.print(f"{verb} {job.submission_id} on the {tgt.kind} target", highlight=False)
        if no_wait:
            if json_:
                emit_json(_job_doc(job, tgt, attached=attached))
            else:
                console.print(f"follow it: raydlc job logs {job.submission_id} --follow{tgt.flag}", highlight=False)
            return
        job = _follow(c, job.submission_id, tgt, _writer(sys.stderr if json_ else sys.stdout))
        builtin_run = (spec.builtin and not attached) or job.metadata.get("program") == "builtin"
        summary = jobs.training_summary(jobs.logs(c, job.submission_id)) if builtin_run else None
    if json_:
        emit_json(_job_doc(job, tgt, attached=attached, **({"summary": summary} if builtin_run else {})))
    else:
        err_console.print(f"job {job.submission_id}: {job.status} after {job.duration_s or 0:.1f} s", highlight=False)
    _ended(job, tgt)


@job_app.command("list")
def job_list(
    ctx: typer.Context,
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Every job the head knows, oldest first."""
    from raydlc import jobs, targets

    tgt = targets.choose(local, address)
    with targets.reach(tgt, load(ctx)) as where:
        found = jobs.list_jobs(jobs.client(where.url))
    if json_:
        emit_json({"target": tgt.kind, "jobs": [_job_doc(j, tgt) for j in found]})
        return
    from raydlc.views.jobs import print_jobs

    print_jobs(found, f"the {tgt.kind} target", console)


@job_app.command("logs")
def job_logs(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., metavar="ID", help="The job's id (its --name, or what submit printed)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream until the job ends; the exit code follows the job."),
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    json_: bool = typer.Option(False, "--json", help="Print {job_id, status, logs} as JSON."),
) -> None:
    """The job's driver output (its workers' output is folded in by Ray)."""
    from raydlc import jobs, targets

    tgt = targets.choose(local, address)
    with targets.reach(tgt, load(ctx)) as where:
        c = jobs.client(where.url)
        job = jobs.require(c, job_id, f"the {tgt.kind} target")
        if follow and not json_:
            job = _follow(c, job.submission_id, tgt, _writer(sys.stdout))
            _ended(job, tgt)
            return
        text = jobs.logs(c, job.submission_id)
    if json_:
        emit_json({**_job_doc(job, tgt), "logs": text})
    else:
        sys.stdout.write(text)


@job_app.command("status")
def job_status(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., metavar="ID", help="The job's id."),
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The job's state as the Jobs API reports it (never inferred from a log stream)."""
    from raydlc import jobs, targets

    tgt = targets.choose(local, address)
    with targets.reach(tgt, load(ctx)) as where:
        job = jobs.require(jobs.client(where.url), job_id, f"the {tgt.kind} target")
    if json_:
        emit_json(_job_doc(job, tgt, start_time=job.start_time, end_time=job.end_time, metadata=job.metadata, runtime_env=job.runtime_env,
                           driver_exit_code=job.driver_exit_code))
        return
    from raydlc.views.jobs import print_job

    print_job(job, console)


@job_app.command("stop")
def job_stop(
    ctx: typer.Context,
    job_id: str = typer.Argument(..., metavar="ID", help="The job's id."),
    local: bool = _local_opt(),
    address: str | None = _address_opt(),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Stop a job and wait until it has ended."""
    from raydlc import jobs, targets

    tgt = targets.choose(local, address)
    with targets.reach(tgt, load(ctx)) as where:
        c = jobs.client(where.url)
        jobs.require(c, job_id, f"the {tgt.kind} target")
        job, was_running = jobs.stop(c, job_id)
    if json_:
        emit_json(_job_doc(job, tgt, was_running=was_running))
    elif was_running:
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
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The gate: GPU nodes, pods, fi_info per node, NCCL per node from the job's own worker logs, the job's status.

    Exit 0 only when no criterion fails, 3 when one does.
    """
    from raydlc import jobs, targets, verify

    if expect not in _EXPECT:
        raise InputError(f"--expect {expect!r} is not one of {', '.join(_EXPECT)}")
    tgt = targets.choose(local, address)
    cfg = load(ctx)
    with targets.reach(tgt, cfg) as where:
        c = jobs.client(where.url)
        job = jobs.require(c, job_id, f"the {tgt.kind} target") if job_id else jobs.latest_job(c)
        kube = targets.cluster_facts(where.kube, cfg) if where.kube is not None else None
        facts = jobs.ray_facts(c, where.url, job, target=tgt.kind, expect=expect, names=kube[2] if kube else None)
    if kube is not None:
        facts.kube_nodes, facts.pods = kube[0], kube[1]
        facts.gpus_per_node, facts.gpu_node_count = cfg.gpu_nodes.gpus_per_node, cfg.gpu_nodes.count
    verdict = verify.gate(facts)
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
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The same short training job twice, as configured and with sockets forced, each proven from its own logs.

    A run's steps/s count only once its worker logs show the transport it was meant to use; exit 3 when not.
    """
    import time

    from raydlc import bench, jobenv, jobs, targets

    if not 1 <= steps <= MAX_BENCH_STEPS:
        raise InputError(f"--steps must be between 1 and {MAX_BENCH_STEPS:,}, got {steps}")
    tgt = targets.choose(local, address)
    cfg = load(ctx, STEPS=steps)
    is_local = tgt.kind == targets.LOCAL
    if is_local:  # every local run is gloo: two of them would only time the same thing twice
        _print_bench(bench.compare([], target=tgt.kind), json_)
        return
    settings, image = _builtin_env(cfg, is_local), _image_versions(cfg, is_local)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    specs = {label: jobenv.build(script=None, args=[], working_dir=None, pip=[], env=env, settings_env=settings, image=image,
                                 name=f"raydlc-bench-{stamp}-{label}", target=tgt.kind) for label, _, env in bench.RUNS}
    with targets.reach(tgt, cfg, start_local=True) as where:
        c = jobs.client(where.url)
        names = targets.cluster_facts(where.kube, cfg)[2] if where.kube is not None else None

        def execute(label: str, expect: str, env: dict[str, str]) -> bench.Run:
            job, _ = jobs.submit(c, specs[label])
            err_console.print(f"{label} run: job {job.submission_id}" + (f" ({', '.join(f'{k}={v}' for k, v in env.items())})" if env else ""), highlight=False)
            job = _follow(c, job.submission_id, tgt, _writer(sys.stderr))
            summary = jobs.training_summary(jobs.logs(c, job.submission_id))
            found = jobs.job_nccl(where.url, job.job_id, names) if job.job_id else None
            return bench.judge(label, expect, job, summary, found, target=tgt.kind)

        runs = bench.run_both(execute)
    doc = bench.compare(runs, target=tgt.kind)
    _print_bench(doc, json_)
    if any(r.status != "SUCCEEDED" for r in runs):
        raise typer.Exit(1)
    if not doc["applicable"]:
        raise typer.Exit(3)


def _print_bench(doc: dict[str, Any], json_: bool) -> None:
    if json_:
        emit_json(doc)
        return
    from raydlc.views.jobs import print_bench

    print_bench(doc, console)

def main(argv: list[str] | None = None) -> int:
    """Entry point, and the one rule for failures: one line `error: …` (and maybe `  hint: …`), no traceback.

    Exit 2 for what the user can fix (config, flags, paths, files), 1 for the world's or the
    machine's faults; typer itself turns Ctrl-C into 130 and a closed stdout into a quiet 1.
    `--debug` (or RAYDLC_DEBUG=1) re-raises instead.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested("--debug" in args)
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=args, prog_name="raydlc", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        err_console.print("aborted")
        return 130
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


def _fail(e: RaydlcError, debug: bool, cause: BaseException | None = None) -> int:
    if debug:
        if cause is not None:
            raise e from cause
        raise e
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(e.message)}", highlight=False)
    if e.hint:
        err_console.print(f"  hint: {escape(e.hint)}", highlight=False)
    return e.exit_code


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
