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

    overrides: dict[str, Any] = {str(k).upper().removeprefix(ENV_PREFIX): v for k, v in (settings or {}).items()}
    overrides.update({k: v for k, v in named.items() if v is not None})
    return load_config(config, overrides=overrides)
