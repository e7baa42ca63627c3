"""Ctrl-C, noticed: whether SIGINT arrived while a block ran, even when what it raised was not a
KeyboardInterrupt (a Ray worker or raylet in the same process group that the signal ended first
makes the driver see a Ray error instead).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType


@dataclass
class Seen:
    interrupted: bool = False


@contextlib.contextmanager
def watch() -> Iterator[Seen]:
    """SIGINT still raises KeyboardInterrupt as by default, and is remembered in the yielded `Seen`."""
    seen = Seen()
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield seen
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        already = seen.interrupted
        seen.interrupted = True
        if not already:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)
