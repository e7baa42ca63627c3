"""The one wait: what it waited for when time runs out, the last look when the caller judges it, Ctrl-C at once."""

from __future__ import annotations

import threading
import time

import pytest

from raydlc.edges import poll
from raydlc.edges.kube import KubeTimeout


def test_a_wait_returns_the_value_that_was_done() -> None:
    seen = iter([0, 0, 3])
    assert poll.until(lambda: next(seen), lambda n: n == 3, what="x", timeout=5, interval=0.01) == 3


def test_time_running_out_names_what_was_awaited_and_what_was_last_seen() -> None:
    with pytest.raises(poll.TimedOut, match=r"^timed out after 0.2 s waiting for two nodes: 1/2 Ready$"):
        poll.until(lambda: 1, lambda n: n >= 2, what="two nodes", timeout=0.2, interval=0.05, explain=lambda n: f"{n}/2 Ready")
    with pytest.raises(KubeTimeout, match=r"waiting for pods$") as e:
        poll.until(lambda: 0, bool, what="pods", timeout=0.1, interval=0.05, error=KubeTimeout)
    assert isinstance(e.value, poll.TimedOut) and e.value.exit_code == 1


def test_a_best_effort_wait_hands_back_its_last_look() -> None:
    looks = iter(range(1000))
    t0 = time.monotonic()
    last = poll.until(lambda: next(looks), lambda n: n < 0, what="x", timeout=0.3, interval=0.05, or_last=True)
    assert last >= 2 and time.monotonic() - t0 < 2
    assert poll.until(lambda: "now", lambda s: False, what="x", timeout=0, interval=10, or_last=True) == "now"  # one look


def test_a_wait_without_a_budget_lasts_until_done_and_pauses_between_looks() -> None:
    looks, pauses = iter(range(100)), []
    assert poll.until(lambda: next(looks), lambda n: n == 6, what="x", timeout=None, interval=5, sleep=pauses.append) == 6
    assert pauses == [5] * 6


def test_a_ramped_wait_starts_short_and_doubles_up_to_its_interval() -> None:
    looks, pauses = iter(range(100)), []
    poll.until(lambda: next(looks), lambda n: n == 6, what="x", timeout=60, interval=2, ramp=True, sleep=pauses.append)
    assert pauses == [0.25, 0.5, 1, 2, 2, 2]


def test_cancel_ends_the_wait_at_the_next_look_and_wakes_its_pause() -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(poll.Cancelled, match="interrupted while waiting for the head") as e:
        poll.until(lambda: 0, bool, what="the head", timeout=60, interval=30, cancel=cancel)
    assert e.value.exit_code == 130
    later = threading.Event()
    threading.Timer(0.2, later.set).start()
    t0 = time.monotonic()
    with pytest.raises(poll.Cancelled):
        poll.until(lambda: 0, bool, what="x", timeout=60, interval=30, cancel=later)
    assert time.monotonic() - t0 < 10


def test_what_a_look_raises_ends_the_wait() -> None:
    def look() -> int:
        raise RuntimeError("gone")

    with pytest.raises(RuntimeError, match="gone"):
        poll.until(look, bool, what="x", timeout=None, interval=1)
