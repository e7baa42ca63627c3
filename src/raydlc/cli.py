"""The `raydlc` command line: one small function per command, nothing heavy at import time.

Commands import the module that does their work inside the function body, so that
`raydlc --help` never pays for torch, ray, transformers or kubernetes.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import typer

from raydlc.errors import InputError, RaydlcError
from raydlc.output import console, emit_json, err_console

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
    config_path: Optional[Path] = None
    assignments: list[str] = field(default_factory=list)
    debug: bool = False


def _state(ctx: typer.Context) -> State:
    root = ctx.find_root()
    if root.obj is None:
        root.obj = State()
    return root.obj


def load(ctx: typer.Context, **flags: Any) -> "Config":  # noqa: F821
    """The effective Config for a command: global --config/--set, then the command's own flags."""
    from raydlc.config import load_config, parse_assignments

    st = _state(ctx)
    overrides: dict[str, Any] = parse_assignments(st.assignments)
    overrides.update({k: v for k, v in flags.items() if v is not None})
    return load_config(st.config_path, overrides=overrides)


@app.callback()
def root(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", help="YAML config file (default: ./raydlc.yaml, or $RAYDLC_CONFIG)."
    ),
    set_: Optional[list[str]] = typer.Option(
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

    if path.exists() and not force:
        raise InputError(f"{path} already exists", hint="pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_yaml_template())
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


@app.command("train")
def train(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model", help="Built-in spec (tiny, qwen2.5-0.5b, qwen2.5-1.5b), hub id or local dir [local default: tiny]."),
    data: Optional[str] = typer.Option(None, "--data", help=".txt/.jsonl file or dir, or a dataset id [default: bundled stdlib-docstring corpus]."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps [local default: 300]."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Ray Train workers [local default: 2]."),
    out: Optional[Path] = typer.Option(None, "--out", help="Storage for checkpoints, export, metrics [default: ./raydlc-out]."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence [local default: 128]."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Sequences per worker per step [local default: 8]."),
    lr: Optional[float] = typer.Option(None, "--lr", help="AdamW learning rate [local default: 2e-3]."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="Steps between checkpoints; 0 = only at the end."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint under --out."),
    resume_from: Optional[Path] = typer.Option(None, "--resume-from", help="Continue from this checkpoint directory."),
    sharding: Optional[str] = typer.Option(None, "--sharding", help="fsdp | hsdp | auto."),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--fp32", help="Parameter dtype [default: bf16 on GPUs, fp32 on CPUs]."),
    activation_checkpointing: bool = typer.Option(False, "--activation-checkpointing", help="Recompute decoder blocks in backward."),
    address: Optional[str] = typer.Option(None, "--address", help="Join this Ray cluster instead of starting a local one."),
    json_: bool = typer.Option(False, "--json", help="Print the summary as one JSON object (last line of stdout)."),
) -> None:
    """Fine-tune on a local Ray (or --address): FSDP2 under Ray Train, checkpoints, HF export, loss plot."""
    from raydlc.train import progress
    from raydlc.train.launch import run, spec_from_config

    cfg = load(
        ctx,
        MODEL_ID=model,
        DATA=data,
        STEPS=steps,
        NUM_WORKERS=workers,
        STORAGE_PATH=str(out) if out is not None else None,
        SEQ_LEN=seq_len,
        BATCH_SIZE=batch_size,
        LEARNING_RATE=lr,
        CHECKPOINT_EVERY=checkpoint_every,
        SHARDING=sharding,
    )
    spec = spec_from_config(
        cfg,
        local=True,
        resume=resume or None,
        resume_from=str(resume_from) if resume_from else None,
        bf16=bf16,
        activation_checkpointing=activation_checkpointing or None,
        address=address,
    )
    summary = progress.run_with_progress(run, spec, quiet=json_)
    if json_:
        emit_json(summary)
    else:
        progress.print_summary(summary)


def main(argv: list[str] | None = None) -> int:
    """Entry point: RaydlcError becomes a message and an exit code, not a traceback."""
    try:  # typer >= 0.20 vendors click
        from typer._click.exceptions import ClickException, UsageError
    except ImportError:  # pragma: no cover
        from click.exceptions import ClickException, UsageError  # type: ignore[assignment]

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("RAYDLC_DEBUG") in ("1", "true")
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=args, prog_name="raydlc", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except RaydlcError as e:
        if debug:
            raise
        from rich.markup import escape

        err_console.print(f"[bold red]error:[/] {escape(e.message)}", highlight=False)
        if e.hint:
            err_console.print(f"  hint: {escape(e.hint)}", highlight=False)
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        err_console.print("aborted")
        return 130
    except ClickException as e:
        e.show()
        return 2 if isinstance(e, UsageError) else e.exit_code


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
