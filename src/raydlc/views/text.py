"""The printed form of a use case's result (`print(result)` in raydlc.api): its rich view, rendered to plain text."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any


def rendered(draw: Callable[[Any], None], width: int = 110) -> str:
    """What `draw(console)` prints, as text without colour or markup (for `print(result)`)."""
    from rich.console import Console

    buf = io.StringIO()
    draw(Console(file=buf, width=width, color_system=None, emoji=False, highlight=False))
    return buf.getvalue().rstrip("\n")
