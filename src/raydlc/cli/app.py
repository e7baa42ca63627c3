"""The root of the `raydlc` command line: the one typer app, its global flags, `config`, `version`, `main`.

The command families (`cli/cluster.py`, `cli/jobs.py`, `cli/train.py`) register their commands on
`app` when `raydlc.cli` imports them. Every command reads the global --config/--set through
`config_args` and ends with `report` (JSON or the view). Commands import the module that does their
work inside the function body, so that `raydlc --help` never pays for torch, ray, transformers or
kubernetes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import typer

from raydlc.cli.options import JSON
from raydlc.errors import InputError, RaydlcError, Stopped
from raydlc.views.output import console, debug_requested, emit_json, err_console

_option_type = typer.core.TyperOption.display_type_rich


def _switch_has_no_value(self: typer.core.TyperOption, ctx: Any) -> str | None:
    """typer 0.29 shows `<bool>` beside every switch in --help, as if `--json` took a value: a switch shows none."""
    return None if self.is_flag else _option_type(self, ctx)


typer.core.TyperOption.display_type_rich = _switch_has_no_value  # type: ignore[method-assign]

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
    """The global flags, as the root callback parsed them."""

    config_path: Path | None = None
    assignments: list[str] = field(default_factory=list)
    debug: bool = False


class Reported(Protocol):
    """A use case's result: its `to_dict()` is what `--json` prints."""

    def to_dict(self) -> dict[str, Any]: ...


def state(ctx: typer.Context) -> State:
    """The global flags of this run; their defaults when the root callback did not run."""
    root = ctx.find_root()
    if root.obj is None:
        root.obj = State()
    return root.obj


def config_args(ctx: typer.Context) -> dict[str, Any]:
    """The global --config/--set as a use case's `config` and `settings` arguments (raydlc.api's layering)."""
    from raydlc.config import parse_assignments

    st = state(ctx)
    return {"config": st.config_path, "settings": parse_assignments(st.assignments)}


def report(result: Reported, json_: bool, view: Callable[[], object]) -> None:
    """How every command ends: the result as one JSON document with --json, else its view for people."""
    if json_:
        emit_json(result.to_dict())
    else:
        view()


def notice(text: str) -> None:
    """A use case's remark for people, on stderr: `warning: …` in yellow, anything else as it is."""
    from rich.markup import escape

    warning = text.startswith("warning: ")
    err_console.print(f"[yellow]warning:[/] {escape(text.removeprefix('warning: '))}" if warning else escape(text), highlight=False)


def invoked() -> list[str]:
    """The arguments of this run of `main`: what a hint that repeats the command starts from."""
    return list(_INVOKED)


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

    shown = api.config_show(**config_args(ctx))
    report(shown, json_, lambda: _print_config(shown.rows))


def _print_config(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title="raydlc configuration", show_lines=False)
    for col in ("setting", "env", "value", "source"):
        table.add_column(col)
    for row in rows:
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
    from raydlc.edges.files import check_output_file, write_all

    check_output_file(path, "config init", force=force)
    write_all({path: render_yaml_template()}, "config init")
    console.print(f"wrote {path}")


@app.command("version")
def version(json_: bool = JSON) -> None:
    """raydlc's version, the local Ray and PyTorch, and what the DLC image ships."""
    from raydlc import api

    info = api.version()
    report(info, json_, lambda: _print_version(info))


def _print_version(info: Any) -> None:
    local, img = info.local, info.image
    console.print(f"raydlc {local['raydlc']}")
    console.print(f"local:  Ray {local['ray'] or 'not installed'}, PyTorch {local['torch'] or 'not installed'}, Python {local['python']}")
    console.print(f"image:  {img['image']}: Ray {img['ray']}, PyTorch {img['torch']}, CUDA {img['cuda']}, NCCL {img['nccl']}")
    for k in info.mismatch:
        err_console.print(f"[yellow]warning:[/] local {k} {local[k]} differs from the image's {img[k]}")


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
        from raydlc.edges.files import os_error

        return _fail(os_error(e, "" if e.filename is not None else _written_under(args)), debug, cause=e)
    except UnicodeDecodeError as e:
        return _fail(InputError(f"input is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})"), debug, cause=e)


def _written_under(args: list[str]) -> str:
    """Where a write without a file name (a full disk's ENOSPC from a file's write) was most likely going:
    the command's --out, else the current folder, named so the line says which disk filled."""
    import os

    out = next((a.split("=", 1)[1] for a in args if a.startswith("--out=")), None)
    if out is None and "--out" in args[:-1]:
        out = args[args.index("--out") + 1]
    return f"writing under {os.path.abspath(out) if out else os.getcwd()}"


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
