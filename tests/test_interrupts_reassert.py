"""`interrupts.reassert`: a Ctrl-C reaches Python again after a C library took SIGINT under it, or an
event loop moved the wakeup fd (what can happen while Ray starts in the driver)."""

from __future__ import annotations

import ctypes
import os
import signal
import time

import pytest

from raydlc import interrupts


def _c_level_ignore() -> None:
    """What a C library can do: SIGINT ignored by sigaction, while Python still believes its own handler is set."""
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal(signal.SIGINT, ctypes.c_void_p(1))  # SIG_IGN


def test_reassert_gives_sigint_back_to_python_and_to_the_watch() -> None:
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    try:
        with interrupts.watch() as seen:
            _c_level_ignore()
            signal.set_wakeup_fd(-1)  # an event loop's doing
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            assert not seen.interrupted  # lost: the case raydlc must not be in
            interrupts.reassert()
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
            assert seen.interrupted
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_an_ignored_sigint_stays_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's
    try:
        interrupts.reassert()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
