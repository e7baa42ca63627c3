"""Ctrl-C in any command that does work is exit 130 and one `interrupted:` line on stderr saying what
stopped and what is kept; stdout stays empty. The use case is replaced by one that is interrupted,
as KeyboardInterrupt reaches it from the terminal."""

from __future__ import annotations

from typing import Any

import pytest

import raydlc.api as api
from raydlc.cli import main

CASES = [
    ("submit", ["submit", "--builtin", "--local"], "a job already submitted keeps running"),
    ("up", ["up"], "what exists is kept"),
    ("down", ["down"], "what is left is kept"),
    ("verify", ["verify", "--local"], "verify changes nothing"),
    ("bench_transport", ["bench-transport", "--local"], "a run already submitted keeps running"),
    ("status", ["status"], "nothing more was done"),
]


@pytest.mark.parametrize(("use_case", "args", "kept"), CASES, ids=[c[0] for c in CASES])
def test_ctrl_c_is_130_and_one_line(use_case: str, args: list[str], kept: str, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(*a: Any, **kw: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(api, use_case, interrupted)
    capsys.readouterr()
    rc = main(args)
    out, err = capsys.readouterr()
    command = args[0]
    assert rc == 130 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"interrupted: raydlc {command} stopped by Ctrl-C; {kept}"), err


def test_ctrl_c_in_train_names_the_last_checkpoint_and_the_resume_command(monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.api import _train
    from raydlc.errors import Stopped

    def stopped(**kw: Any) -> Any:
        raise Stopped("training run r1 stopped by Ctrl-C; its last checkpoint out/r1/checkpoint_000004 is kept and --resume continues from it",
                      hint="raydlc train --resume --out out")

    monkeypatch.setattr(_train, "train", stopped)
    rc = main(["train", "--steps", "9", "--out", "out"])
    out, err = capsys.readouterr()
    assert rc == 130 and out == ""
    assert err.splitlines() == ["interrupted: training run r1 stopped by Ctrl-C; its last checkpoint out/r1/checkpoint_000004 is kept "
                                "and --resume continues from it", "  hint: raydlc train --steps 9 --out out --resume"]


def test_sigint_is_noticed_whoever_handles_it() -> None:
    """Ray Train v2 installs its own SIGINT handler during fit(): the watch still sees the signal."""
    import os
    import signal
    import time

    from raydlc import interrupts

    before = signal.getsignal(signal.SIGINT)
    try:
        with interrupts.watch() as seen:
            signal.signal(signal.SIGINT, lambda *a: None)  # someone else's handler, as Ray Train's
            assert not seen.interrupted
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert seen.interrupted
        with interrupts.watch() as calm:
            time.sleep(0.01)
        assert not calm.interrupted
    finally:
        signal.signal(signal.SIGINT, before)
