"""Where output goes: rich for people, one plain JSON document for programs."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

console = Console(emoji=False)  # log lines hold host:pid:tid, and ":1234:" is an emoji code
err_console = Console(stderr=True, soft_wrap=True, emoji=False)


def _default(o: Any) -> Any:
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    return str(o)


def to_json(obj: Any) -> str:
    return json.dumps(obj, default=_default, sort_keys=False)


def emit_json(obj: Any) -> None:
    """One JSON document on one line of stdout (the last line, for commands that also log)."""
    sys.stdout.write(to_json(obj) + "\n")
    sys.stdout.flush()


def debug_requested(flag: bool = False) -> bool:
    """`--debug` (the flag) or RAYDLC_DEBUG=1/true: tracebacks, and Ray's worker logs while training."""
    import os

    return flag or os.environ.get("RAYDLC_DEBUG", "").strip().lower() in ("1", "true")
