"""The one way a use case gets its Config: the CLI's layering, from Python arguments."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raydlc.config import Config


def load(config: str | os.PathLike[str] | None = None, settings: Mapping[str, Any] | None = None, **named: Any) -> Config:
    """default < file < RAYDLC_* env < `settings` (env.sh names) < `named` (flags, by env.sh name; None = not given)."""
    from raydlc.config import ENV_PREFIX, load_config

    argument("config", config, PATH, "a path to a YAML file")
    argument("settings", settings, (Mapping,), "a mapping of setting names to values, e.g. {'LORA_RANK': 8}")
    overrides: dict[str, Any] = {str(k).upper().removeprefix(ENV_PREFIX): v for k, v in (settings or {}).items()}
    overrides.update({k: v for k, v in named.items() if v is not None})
    return load_config(config, overrides=overrides)


PATH = (str, os.PathLike)
CALLABLE = "callable"


def argument(name: str, value: Any, kinds: tuple[type, ...] | str, what: str, *, optional: bool = True) -> None:
    """A use case's Python argument of the wrong type, refused as raydlc's InputError naming it (not a
    TypeError deep inside, nor a value silently turned into another)."""
    from raydlc.errors import InputError

    if value is None and optional:
        return
    ok = callable(value) if kinds == CALLABLE else isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise InputError(f"{name}: must be {what}, got {type(value).__name__} {shown}")
