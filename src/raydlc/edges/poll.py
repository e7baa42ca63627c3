"""The one way raydlc waits for the world: look, decide, pause, within a budget, until done or Ctrl-C.

Every wait — a node group in AWS, pods in Kubernetes, a job on a Ray head, a local head's
processes, a line a tool prints — is this loop, so each wait states only its own parts: what it
waits for (said in the error when time runs out), how to look, when it is done, how often to look
and for how long. A wait that may run out of time without failing (`or_last`) hands the last
look back and its caller judges it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from raydlc.errors import RaydlcError

T = TypeVar("T")

RAMP_START_S = 0.25  # a ramped wait's first pause: quick changes are seen quickly; slow ones every `interval`


class Cancelled(RaydlcError):
    """The run was interrupted: a wait stopped at its next look, a tool's child was ended by its PID."""

    exit_code = 130


class TimedOut(RaydlcError):
    """A wait ran out of time; the message says what it waited for and what was last seen."""


def until(
    fetch: Callable[[], T],
    done: Callable[[T], bool],
    *,
    what: str,
    timeout: float | None,
    interval: float,
    cancel: threading.Event | None = None,
    explain: Callable[[T], str] | None = None,
    ramp: bool = False,
    or_last: bool = False,
    error: type[TimedOut] = TimedOut,
    sleep: Callable[[float], object] | None = None,
) -> T:
    """Look (`fetch`) until `done(value)`, pausing `interval` between looks; the value that was done.

    `timeout` None waits as long as it takes (`fetch` or `done` may raise to end it). When time
    is up, `error` (TimedOut, or the caller's kind of it) says "timed out after N s waiting for
    `what`" with `explain(last value)`; with `or_last` the last value is returned instead, for
    the caller to judge (a bounded best effort, or an error of its own).
    `cancel` (set on Ctrl-C) ends the wait at the next look with Cancelled, and wakes its pause.
    `ramp` starts the pauses short and doubles them up to `interval`. `sleep` replaces the pause
    (a condition's wait, or a test's clock).
    """
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    pause = min(interval, RAMP_START_S) if ramp else interval
    while True:
        value = fetch()
        if done(value):
            return value
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"interrupted while waiting for {what}")
        left = deadline - time.monotonic()
        if left <= 0:
            if or_last:
                return value
            why = explain(value) if explain is not None else ""
            raise error(f"timed out after {timeout:g} s waiting for {what}" + (f": {why}" if why else ""))
        _pause(min(pause, left), cancel, sleep)
        pause = min(pause * 2, interval)


def _pause(seconds: float, cancel: threading.Event | None, sleep: Callable[[float], object] | None) -> None:
    if sleep is not None:
        sleep(seconds)
    elif cancel is not None:
        cancel.wait(seconds)
    else:
        time.sleep(seconds)
