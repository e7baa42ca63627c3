#!/usr/bin/env python
"""The reference part of docs/commands.md, generated from the typer app (raydlc.cli: cli/app.py and its families).

    python scripts/commands_doc.py           # print it
    python scripts/commands_doc.py --write   # put it into docs/commands.md, between its markers

Every command, its arguments and every flag with its help come from the command objects typer
builds for `raydlc --help`, never from a copy, so the page cannot drift from it: tests/test_docs.py
fails when docs/commands.md differs from what this prints. Those objects are read by their
attributes only (typer 0.29 carries its own copy of click, older releases use click itself).
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docgen import DOCS, cell, escape, write_block

PAGE = DOCS / "commands.md"
BLOCK = "commands"
_TYPES = {"text": "TEXT", "str": "TEXT", "integer": "INTEGER", "int": "INTEGER", "float": "FLOAT", "path": "PATH",
          "boolean": "BOOLEAN", "bool": "BOOLEAN"}


def leaves(group: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every command that runs something, in the order `--help` lists them, with its full name."""
    ctx = group.make_context(path, [], resilient_parsing=True)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        if hasattr(cmd, "list_commands"):
            yield from leaves(cmd, f"{path} {name}")
        else:
            yield f"{path} {name}", cmd


def shown_params(path: str, cmd: Any) -> list[Any]:
    """The command's parameters as its --help shows them, without --help itself: a command may fill in its
    help text only then (`up` names its steps from raydlc.lifecycle.orders)."""
    ctx = cmd.make_context(path, [], resilient_parsing=True)
    return [p for p in cmd.get_params(ctx) if p.name != "help"]


def _is_argument(p: Any) -> bool:
    return p.param_type_name == "argument"


def _metavar(p: Any) -> str:
    name = p.metavar or (p.name or "").upper()
    if name.startswith("["):
        return name
    name = name if p.required else f"[{name}]"
    return f"{name}..." if p.nargs == -1 else name


def usage(path: str, params: list[Any]) -> str:
    args = [_metavar(p) for p in params if _is_argument(p)]
    has_options = any(not _is_argument(p) for p in params)
    return " ".join([path, *(["[OPTIONS]"] if has_options else []), *args])


def _type_name(p: Any) -> str:
    """click's `type.name` where typer uses click; typer 0.29's own parameters carry the annotation."""
    t = getattr(p, "type", None)
    if t is not None:
        return "integer" if type(t).__name__ == "IntRange" else str(t.name)
    ann = p.type_descriptor.annotation
    if typing.get_origin(ann) in (list, tuple):
        ann = typing.get_args(ann)[0]
    return getattr(ann, "__name__", str(ann))


def _value(p: Any) -> str:
    if p.is_flag:
        return ""
    name = _type_name(p)
    kind = _TYPES.get(name, name.upper())
    bounds = getattr(p, "type", None) or p
    low, high = getattr(bounds, "min", None), getattr(bounds, "max", None)
    kind += (f" ≥ {low}" if low is not None else "") + (f" ≤ {high}" if high is not None else "")
    return kind + (", repeatable" if p.multiple else "")


def _default(p: Any) -> str:
    d = p.default
    if d is None or d is False or (p.multiple and not d) or callable(d):
        return ""
    return f"`{d}`"


def option_row(p: Any) -> str:
    names = ", ".join(f"`{o}`" for o in p.opts)
    if p.secondary_opts:
        names = "`" + "/".join([*p.opts, *p.secondary_opts]) + "`"
    return f"| {names} | {cell(_value(p))} | {cell(_default(p))} | {cell(p.help or '')} |"


def argument_row(p: Any) -> str:
    return f"| `{cell(_metavar(p))}` | argument | {cell(_default(p))} | {cell(getattr(p, 'help', None) or '')} |"


def params_table(params: list[Any]) -> list[str]:
    rows = [argument_row(p) for p in params if _is_argument(p)]
    rows += [option_row(p) for p in params if not _is_argument(p)]
    return ["| argument or flag | value | default | meaning |", "|---|---|---|---|", *rows] if rows else []


def section(path: str, cmd: Any) -> list[str]:
    params = shown_params(path, cmd)
    lines = [f"### `{path}`", "", "```", usage(path, params), "```", ""]
    lines += [escape(part) + "\n" for part in (cmd.help or "").strip().split("\n\n")]
    table = params_table(params)
    return lines + ([*table, ""] if table else [])


def reference() -> str:
    from raydlc.cli import app

    root = typer.main.get_command(app)
    found = list(leaves(root, "raydlc"))
    out = ["| command | what it does |", "|---|---|"]
    out += [f"| [`{path}`](#{path.replace(' ', '-')}) | {cell((cmd.help or '').strip().splitlines()[0])} |" for path, cmd in found]
    out += ["", "### Global options", "", "Given before the command: `raydlc [GLOBAL OPTIONS] COMMAND …`.", ""]
    out += [*params_table(root.params), ""]
    for path, cmd in found:
        out += section(path, cmd)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print(f"{PAGE}: {'updated' if write_block(PAGE, BLOCK, 'scripts/commands_doc.py', reference()) else 'unchanged'}")
    else:
        print(reference(), end="")
