"""Command-line options built from the settings' own metadata: a setting is declared once.

A field of the Config tree carries its `Flag` (name and help) beside its env.sh name. From it
`raydlc train` (typer), `python -m raydlc.train` (argparse) and the keyword arguments of
`raydlc.api.train` are built, so a new setting is one field (and its generated README row).
A command that names a setting its own way (`plan --micro-batch` for BATCH_SIZE) gives its own
`Flag` for that setting and still takes the type, the env name and the default from the field.

typer is imported only by the typer builders: the job entrypoint runs where only the training
dependencies are installed.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from raydlc.config import FIELDS, LOCAL_DEFAULTS, FieldInfo, Flag

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Option:
    """One setting as a command shows it: its field, and the flag the command gives it."""

    field: FieldInfo
    flag: Flag

    @property
    def env(self) -> str:
        return self.field.env

    @property
    def names(self) -> tuple[str, ...]:
        """`("--bf16", "--fp32")` for a switch with its negation, else one name."""
        return tuple(self.flag.name.split("/"))

    @property
    def keyword(self) -> str:
        """The Python name: `--seq-len` -> `seq_len`, as the use cases in raydlc.api take it."""
        return self.names[0].removeprefix("--").replace("-", "_")

    @property
    def kind(self) -> type:
        """bool, int, float or str: what the command line parses (choices and `auto` stay text for the config to check)."""
        members = [a for a in (typing.get_args(self.field.annotation) or (self.field.annotation,)) if a is not type(None)]
        one = members[0] if len(members) == 1 else str
        return one if one in (bool, int, float) else str

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The words of a `Literal[...]` setting (argparse lists them; typer leaves them to the config's message)."""
        ann = self.field.annotation
        return tuple(typing.get_args(ann)) if typing.get_origin(ann) is Literal else None

    @property
    def switch(self) -> bool:
        """A flag without a value (`--resume`): a bool setting that is off by default."""
        return self.kind is bool and self.field.default is False

    def help(self, *, notes: bool = True) -> str:
        """`Optimizer steps [STEPS; local default: 300].`: the env name, and the default when `notes`."""
        note = ""
        if notes and self.env in LOCAL_DEFAULTS:
            note = f"; local default: {LOCAL_DEFAULTS[self.env]}"
        elif notes and self.flag.default:
            note = f"; default: {self.flag.default}"
        return f"{self.flag.help} [{self.env}{note}]."


def option(env: str, flag: Flag | None = None) -> Option:
    """A setting's option, named and explained as its field says unless a command gives its own `flag`."""
    field = FIELDS[env]
    chosen = flag or field.flag
    if chosen is None:
        raise KeyError(f"setting {env} has no flag; give the command's own Flag")
    return Option(field, chosen)


def options(section: str = "train") -> list[Option]:
    """Every setting of `section` that declares a flag, in the order of the fields."""
    return [Option(f, f.flag) for f in FIELDS.values() if f.section == section and f.flag is not None]


def given(opts: Iterable[Option], values: Mapping[str, Any]) -> dict[str, Any]:
    """The options a command line gave, by keyword: None and a switch left off are not given."""
    by_keyword = {o.keyword: o for o in opts}
    out: dict[str, Any] = {}
    for k, v in values.items():
        o = by_keyword[k]
        if v is None or (o.switch and v is False):
            continue
        out[k] = str(v) if isinstance(v, Path) else v
    return out


def named_settings(opts: Iterable[Option], values: Mapping[str, Any], *, caller: str) -> dict[str, Any]:
    """Keyword arguments to env.sh names (None: not given); an unknown keyword fails as Python would."""
    by_keyword = {o.keyword: o for o in opts}
    unknown = [k for k in values if k not in by_keyword]
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    for k, v in values.items():  # pydantic would read True as 1: a bool is only a bool setting's value
        if isinstance(v, bool) and bool not in typing.get_args(by_keyword[k].field.annotation) + (by_keyword[k].field.annotation,):
            from raydlc.errors import InputError

            raise InputError(f"{k}: must be {'a whole number' if by_keyword[k].kind is int else 'a ' + by_keyword[k].kind.__name__}, got bool {v}")
    return {by_keyword[k].env: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in values.items() if v is not None}


def signature(opts: Sequence[Option]) -> list[inspect.Parameter]:
    """Keyword-only parameters named like the flags, for a use case's `__signature__` (help(), IDEs)."""
    return [
        inspect.Parameter(o.keyword, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=o.kind | None) for o in opts
    ]


# ---- typer --------------------------------------------------------------------------------------


def finite(value: Any) -> Any:
    """Float flags (one or repeated): inf and nan parse as floats but mean nothing here."""
    import typer

    for v in value if isinstance(value, list) else [value]:
        if v is not None and not math.isfinite(v):
            raise typer.BadParameter(f"must be a finite number, got {v}")
    return value


def _typer_parameter(o: Option, notes: bool) -> inspect.Parameter:
    import typer

    # A storage flag stays the text given: typer's Path would make `s3://b/x` the local path `s3:/b/x`.
    kind: Any = str if o.flag.path else o.kind
    if o.switch:
        default, annotation = typer.Option(False, o.flag.name, help=o.help(notes=notes)), bool
    else:
        callback = finite if kind is float else None
        metavar = "PATH|URI" if o.flag.path else None
        default = typer.Option(None, o.flag.name, help=o.help(notes=notes), callback=callback, metavar=metavar)
        annotation = kind | None
    return inspect.Parameter(o.keyword, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation)


def with_options(opts: Sequence[Option], *, notes: bool = True) -> Callable[[F], F]:
    """A typer command with these settings' options, generated after its `ctx` and before its own.

    typer reads the command's `inspect.signature`, so the options go into a generated
    `__signature__`; the command receives what was given as `named` (keyword -> value, see `given`).
    """

    def wrap(fn: F) -> F:
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.name != "named"]
        head = own[:1] if own and own[0].name == "ctx" else []
        keywords = {o.keyword for o in opts}

        @functools.wraps(fn)
        def command(*args: Any, **kw: Any) -> Any:
            values = {k: kw.pop(k) for k in list(kw) if k in keywords}
            return fn(*args, **kw, named=given(opts, values))

        params = [*head, *(_typer_parameter(o, notes) for o in opts), *own[len(head):]]
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return command  # type: ignore[return-value]

    return wrap


# ---- argparse -----------------------------------------------------------------------------------


def add_arguments(ap: Any, opts: Sequence[Option], *, extra_names: Mapping[str, tuple[str, ...]] | None = None) -> None:
    """The same options on an argparse parser; each lands under its env.sh name (None: not given)."""
    for o in opts:
        names = (o.names[0], *(extra_names or {}).get(o.env, ()))
        help_ = o.help().replace("%", "%%")
        if len(o.names) == 2:  # a switch with its negation: --bf16 / --fp32
            ap.add_argument(*names, dest=o.env, action="store_const", const=True, default=None, help=help_)
            ap.add_argument(o.names[1], dest=o.env, action="store_const", const=False, help=f"the opposite of {o.names[0]}")
        elif o.switch:
            ap.add_argument(*names, dest=o.env, action="store_true", default=None, help=help_)
        else:
            kind = o.kind if o.kind in (int, float) else None
            ap.add_argument(*names, dest=o.env, type=kind, choices=o.choices, help=help_)
