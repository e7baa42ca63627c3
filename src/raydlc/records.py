"""Structured files raydlc reads back (checkpoint manifests, state files), parsed against a schema.

A file written by an older version, cut short, or edited by hand should fail with the field
that is wrong, not with whatever Python error the first bad lookup happens to raise. Each
reader declares its shape as a `Record` and calls `parse` or `read_json`; the error names the
field path and what was expected, and the caller wraps it in its own error class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)


class Record(BaseModel):
    """Base of every file schema: unknown keys are kept (newer writers may add some), NaN refused."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)


class RecordError(ValueError):
    """A file that is not the shape its schema says; the message names the field."""


def _field(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as a path a person can find in the file: files[".metadata"].sha256."""
    out = ""
    for part in loc:
        if isinstance(part, str) and part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out or "(the document)"


def parse(model: type[M], data: Any) -> M:
    """`data` as a `model`, or a RecordError naming the first wrong or missing field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = _field(tuple(err["loc"]))
        if err["type"] == "missing":
            raise RecordError(f"field '{where}' is missing") from None
        got = err.get("input")
        shown = type(got).__name__ if isinstance(got, (dict, list)) else repr(got)[:80]
        raise RecordError(f"field '{where}': {err['msg'][:1].lower()}{err['msg'][1:]}, got {shown}") from None


def read_json(path: str | Path, model: type[M]) -> M:
    """A JSON file parsed against `model`; unreadable, undecodable or wrong-shaped files raise RecordError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise RecordError(f"cannot read {p} ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise RecordError(f"{p} is not UTF-8 text (byte {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(f"{p} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    return parse(model, data)
