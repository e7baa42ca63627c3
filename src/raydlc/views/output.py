"""Where output goes: rich for people, one plain JSON document for programs."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from rich.console import Console

from raydlc.errors import RaydlcError

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


def _non_finite(obj: Any, path: str = "$") -> str | None:
    """Where the first NaN or infinity sits, as a JSON path."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return f"{path} = {obj}"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        step = f".{k}" if isinstance(k, str) and k.isidentifier() else f"[{json.dumps(k)}]"
        if found := _non_finite(v, path + step):
            return found
    return None


def to_json(obj: Any) -> str:
    """Strict JSON: NaN and Infinity are not JSON, and a program reading ours must not choke on them."""
    try:
        return json.dumps(obj, default=_default, sort_keys=False, allow_nan=False)
    except ValueError as e:
        where = _non_finite(json.loads(json.dumps(obj, default=_default))) or str(e)
        raise RaydlcError(f"refusing to print invalid JSON: {where} is not a finite number") from e


def emit_json(obj: Any) -> None:
    """One JSON document on one line of stdout (the last line, for commands that also log)."""
    sys.stdout.write(to_json(obj) + "\n")
    sys.stdout.flush()


def debug_requested(flag: bool = False) -> bool:
    """`--debug` (the flag) or RAYDLC_DEBUG=1/true: tracebacks, and Ray's worker logs while training."""
    import os

    return flag or os.environ.get("RAYDLC_DEBUG", "").strip().lower() in ("1", "true")
