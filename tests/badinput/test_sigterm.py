"""SIGTERM to `raydlc train` (a `kill`, a container's stop): one `interrupted:` line, exit 143, no traceback.

The run is held in its argument checks (before Ray starts) and the real process is sent SIGTERM;
after Ray starts, `ray.init` makes SIGTERM a `sys.exit(15)`, modelled here in-process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raydlc import interrupts

# The real entry point, with the run's checks held for good (Ray never starts; a marker file says they began).
HARNESS = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "marker = Path(sys.argv[1])\n"
    "from raydlc.train import launch\n"
    "def held(*a, **k):\n"
    "    marker.write_text('checking')\n"
    "    time.sleep(600)\n"
    "launch.check = held\n"
    "from raydlc.cli import run\n"
    "sys.argv[:] = ['raydlc', *sys.argv[2:]]\n"
    "run()\n"
)


def test_sigterm_before_ray_gives_one_interrupted_line_and_exit_143(tmp_path: Path) -> None:
    marker = tmp_path / "checking"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYDLC_")}
    p = subprocess.Popen(
        [sys.executable, "-c", HARNESS, str(marker), "train", "--out", str(tmp_path / "out"), "--run-name", "r1",
         "--steps", "2", "--workers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180  # a loaded machine imports slowly
        while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), p.communicate(timeout=10)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["interrupted: training run r1 stopped by SIGTERM before its first checkpoint; nothing to resume from"], err
    assert out == ""
    assert not (tmp_path / "out" / "r1" / "checkpoints").exists()


def _ray_like(signum: int, frame: object) -> None:
    sys.exit(signum)  # what ray.init installs for SIGTERM (ray/_private/worker.py, Ray 2.58.0)


def test_sigterm_under_rays_handler_is_seen_and_our_handler_restored_after() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.watch() as seen, interrupts.terminating():
        signal.signal(signal.SIGTERM, _ray_like)  # ray.init replaced it
        interrupts.reassert()  # and takes it back from a C handler installed under Python's
        with pytest.raises(SystemExit) as e:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert e.value.code == signal.SIGTERM
        assert seen.terminated and not seen.interrupted
    assert signal.getsignal(signal.SIGTERM) is before


def test_terminating_raises_terminated_and_ctrl_c_wins_over_it() -> None:
    with interrupts.watch() as seen, interrupts.terminating():
        with pytest.raises(interrupts.Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert seen.terminated
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert seen.interrupted and not seen.terminated
