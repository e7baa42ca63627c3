"""benchmarks/up_critical_path.py runs `up` against moto, kmock and the doubles: run here with tiny step times so
that the benchmark keeps working as `up` grows calls (it broke once on eks ListAddons, which moto lacks). Its
figure (the ratio) is printed by the benchmark, not asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_up_benchmark_runs_up_to_the_end_and_prints_its_ratio(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "AWS_", "DOUBLES_"))}
    env.update(PYTHONPATH=str(REPO / "src"), HOME=str(tmp_path))
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "up_critical_path.py"), "--scale", "0.01"],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"up wall / critical path: \d+\.\d\d", lines[-1]), lines[-5:]
    assert "longest dependency chain:" in done.stdout and "-> raycluster" in done.stdout
