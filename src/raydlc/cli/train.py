"""Training's commands: plan (the layout, before a GPU is paid for), train, and data prepare/show.

Their training settings come as generated flags (`raydlc.config.flags.with_options`) from the
options table of their use case in raydlc.api, which these modules import at start: the tables
are data, and importing them loads nothing of torch or ray.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer

from raydlc.api import _data as data_use_case
from raydlc.api import _plan as plan_use_case
from raydlc.api import _train as train_use_case
from raydlc.cli.app import app, config_args, invoked, report, state
from raydlc.cli.options import JSON
from raydlc.config.flags import finite as _finite
from raydlc.config.flags import with_options
from raydlc.errors import InputError, Stopped
from raydlc.views.output import console, debug_requested, err_console

data_app = typer.Typer(help="Training datasets: prepare once with Ray Data (shards + manifest), show one.", no_args_is_help=True)


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
        help="Recompute each block in backward (default: the planner's choice, off unless it fits better or only so; with --scan-nodes each node count chooses unless given).",
    ),
    scan_nodes: str | None = typer.Option(None, "--scan-nodes", help="Comma-separated node counts, e.g. 1,2,4,8,16,32,64: the recommended layout, tokens/s and scaling efficiency at each."),
    plot: Path | None = typer.Option(None, "--plot", help="With --scan-nodes: write a PNG of tokens/s and efficiency against nodes."),
    json_: bool = JSON,
    *,
    named: dict[str, Any],
) -> None:
    """Per-GPU memory, per-step traffic, step time and tokens/s for FSDP and HSDP, and the fastest layout that fits."""
    if plot is not None and scan_nodes is None:
        raise InputError("--plot draws a scale-out scan", hint="add --scan-nodes 1,2,4,8")
    if plot is not None:
        from raydlc.edges.files import check_png_path

        check_png_path(plot, "--plot", f"raydlc plan --scan-nodes {shlex.quote(scan_nodes or '')}")
    args = config_args(ctx)
    common = dict(config=args["config"], gpus_per_node=gpus_per_node, gpu=gpu, network_gbps=network_gbps, policy=policy,
                  activation_checkpointing=activation_checkpointing)
    if scan_nodes is not None:  # the step flags are checked as settings; the scan searches the step itself
        step = {o.env: named.pop(o.keyword) for o in plan_use_case.OPTIONS if o.keyword in plan_use_case.SEARCHED and o.keyword in named}
        found = plan_use_case.scan(scan_nodes, plot=plot, settings={**args["settings"], **step}, **common, **named)
        report(found, json_, lambda: _print_scan(found, plot))
        return
    from raydlc.views.plan import print_plan

    result = plan_use_case.plan(strategy=strategy, settings=args["settings"], **common, **named)
    report(result, json_, lambda: print_plan(result, console))


def _print_scan(found: Any, plot: Path | None) -> None:
    from raydlc.views.scan import print_scan

    print_scan(found, console)
    if plot is not None:
        console.print(f"plot: {plot}")


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
    Settings left at their default take the local-run values (docs/training.md#local-defaults).
    """
    from raydlc.views.progress import TrainView, print_summary

    try:
        with TrainView(quiet=json_, debug=debug_requested(state(ctx).debug)) as view:
            result = train_use_case.train(**config_args(ctx), address=address, on_progress=view, log_to_driver=view.debug, **named)
    except Stopped as e:  # the hint: this very command again, with --resume
        again = invoked()
        resume = again if "--resume" in again else [*again, "--resume"]
        again_stopped = Stopped(e.message, hint=shlex.join(["raydlc", *resume]) if e.hint else None)
        again_stopped.exit_code = e.exit_code  # 143 for SIGTERM
        raise again_stopped from None
    report(result, json_, lambda: print_summary(result.to_dict()))


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
    from raydlc.views.progress import preparing_line

    status = None if json_ else err_console.status("preparing data", spinner="dots")
    if status is not None:
        status.start()
    try:
        result = data_use_case.data_prepare(
            None if source == "bundled" else source, out=out, address=address,
            on_progress=(lambda rec: status.update(preparing_line(rec))) if status is not None else None, **config_args(ctx), **named,
        )
    finally:
        if status is not None:
            status.stop()
    report(result, json_, lambda: _print_prepared(result))


def _print_prepared(result: Any) -> None:
    c = result.manifest["counts"]
    said = "found (reused)" if result.reused else f"prepared in {result.wall_s:.1f} s"
    console.print(f"{result.dest}: {said}; {result.rows:,} blocks of {result.seq_len} tokens, "
                  f"{c['records_used']:,} records used, {c['records_skipped']:,} skipped, {result.loss_share:.0%} of tokens carry the loss")
    console.print(f"train on it: raydlc train --data {result.dest} --seq-len {result.seq_len}")


@app.command("tb")
def tb_cmd(
    run: str = typer.Argument(..., help="A run: its directory, or its name under --out."),
    out: str | None = typer.Option(None, "--out", help="Where the runs are (STORAGE_PATH) [default: raydlc-out]."),
    json_: bool = typer.Option(False, "--json", help="Print the run, its event directory and the command as JSON."),
) -> None:
    """The command that opens a run's TensorBoard events (TRACKING=tensorboard, the default)."""
    from raydlc.api._tracking import tb

    found = tb(run, out=out)
    report(found, json_, lambda: console.print(found.command, highlight=False, soft_wrap=True))


@data_app.command("show")
def data_show(
    dest: str = typer.Argument(..., help="A prepared dataset (its folder or s3:// prefix)."),
    json_: bool = typer.Option(False, "--json", help="Print the manifest, counts and decoded examples as one JSON object."),
) -> None:
    """A prepared dataset's manifest, token count, share of tokens with loss, and three decoded blocks."""
    shown = data_use_case.data_show(dest)
    report(shown, json_, lambda: _print_dataset(shown))


def _print_dataset(shown: Any) -> None:
    from rich.markup import escape

    m = shown.manifest
    console.print(f"{shown.dest}: {shown.rows:,} blocks of {m['seq_len']} tokens from {m['source']['spec']} "
                  f"(tokenizer {m['tokenizer']['name']}, template {m['chat_template']}, loss on {m['loss_on']})")
    console.print(f"{shown.tokens:,} tokens, {shown.loss_share:.1%} carry the loss", highlight=False)
    console.print("counts:", highlight=False)
    for name, n in m["counts"].items():
        console.print(f"  {name.replace('_', ' ')}: {n:,}" if isinstance(n, int) else f"  {name.replace('_', ' ')}: {n}", highlight=False, markup=False)
    for i, ex in enumerate(shown.examples, 1):
        console.print(f"[bold]example {i}[/] (no loss between ⟦ ⟧):\n{escape(ex)}", highlight=False)
