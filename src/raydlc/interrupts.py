"""Ctrl-C and SIGTERM, noticed: whether SIGINT or SIGTERM arrived while a block ran, whatever handled it.

Ray Train v2 replaces the SIGINT handler while `fit()` runs (it aborts the run and may
`sys.exit(0)`), and a Ray worker or raylet in the same process group may die of the signal
first, so the driver can see a Ray error, a SystemExit or a normal return instead of a
KeyboardInterrupt. Python's C-level handler writes every signal that has a Python handler to the
wakeup fd before any handler runs, so the fd tells whether SIGINT came, whoever took it.

SIGTERM (a `kill`, a container's stop) would end the process unannounced before Ray starts, and
after `ray.init` (whose handler is `sys.exit(15)`) Ray's C++ failure handler prints its stack dump:
`terminating` makes it an exception raydlc can answer with one line, and `reassert` takes the
signal back from Ray's C++ handler.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Seen:
    _fd: int | None = None
    _seen: bool = False
    _bytes: bytearray = field(default_factory=bytearray)

    @property
    def interrupted(self) -> bool:
        """Whether SIGINT arrived since the block began."""
        if not self._seen:
            self._seen = signal.SIGINT in self._read()
        return self._seen

    @property
    def terminated(self) -> bool:
        """Whether SIGTERM arrived since the block began (and SIGINT did not: Ctrl-C's answer wins)."""
        return not self.interrupted and signal.SIGTERM in self._bytes

    def _read(self) -> bytearray:
        if self._fd is not None:
            with contextlib.suppress(BlockingIOError, OSError):
                self._bytes += os.read(self._fd, 512)
        return self._bytes


class Terminated(BaseException):
    """SIGTERM arrived (raised by `terminating`'s handler); like KeyboardInterrupt, no `except Exception` takes it."""


_WRITE_ENDS: list[int] = []  # the wakeup fds of the watches in force, innermost last


def reassert() -> None:
    """Python's SIGINT handling back in force, where a library started in between may have taken it.

    A C library can install its own SIGINT action (sigaction) under Python, and an event loop run
    in the main thread moves the wakeup fd to its own pipe; either way a Ctrl-C would reach neither
    Python's handler nor `watch`. Re-installing the handler Python holds restores the C-level
    action; an ignored SIGINT (a background job's) stays ignored. Main thread only; harmless when
    nothing was taken. SIGTERM likewise, where Python holds a handler for it."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGINT)
    if handler is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, handler if handler is not None else signal.default_int_handler)
    term = signal.getsignal(signal.SIGTERM)
    if callable(term):  # a Python handler (ours, or ray.init's sys.exit): back in force over Ray's C++ one
        signal.signal(signal.SIGTERM, term)
    if _WRITE_ENDS:
        signal.set_wakeup_fd(_WRITE_ENDS[-1], warn_on_full_buffer=False)


@contextlib.contextmanager
def watch() -> Iterator[Seen]:
    """The yielded `Seen` says whether SIGINT arrived while the block ran; SIGINT itself behaves as before."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield Seen()
        return
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    seen = Seen(r)
    _WRITE_ENDS.append(w)
    try:
        yield seen
    finally:
        _WRITE_ENDS.remove(w)
        _ = seen.interrupted  # read what arrived before the pipe closes
        signal.set_wakeup_fd(previous)
        seen._fd = None
        os.close(r)
        os.close(w)


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextlib.contextmanager
def terminating() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread while the block runs, instead of ending the process
    without a word; outside the block it behaves as before. A SIGTERM that was ignored stays ignored."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
