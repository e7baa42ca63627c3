"""The job's own deadline: a RayJob carries its activeDeadlineSeconds as JOB_DEADLINE_S, and the training driver
aborts the run when it passes (KubeRay v1.7.0 only marks a clusterSelector RayJob Failed there: rayjobs.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.test_train_layout import spec

from raydlc.config import load_config
from raydlc.train import launch
from raydlc.train.__main__ import deadline_at
from raydlc.train.stall import StallGuard, Watch


class Controller:
    def __init__(self) -> None:
        self.aborted = 0
        self.abort = SimpleNamespace(remote=self._abort)

    def _abort(self) -> None:
        self.aborted += 1  # ray.get of None then fails, as the real controller's ending call does: the follower suppresses it


def follower(deadline: float | None, seen: list[dict[str, Any]]) -> tuple[launch._Follower, Controller]:
    controller = Controller()
    f = launch._Follower(box=None, on_progress=seen.append, path=None, stop=threading.Event(), guard=StallGuard.of(0, 0),
                         watch=Watch(since=time.monotonic()), spec=spec(), trainer=SimpleNamespace(controller=controller),
                         deadline_at=deadline)
    return f, controller


def test_past_its_deadline_the_driver_aborts_the_run_with_an_error_naming_the_deadline() -> None:
    seen: list[dict[str, Any]] = []
    f, controller = follower(time.time() - 1.0, seen)
    f.run()  # returns after its first look
    assert isinstance(f.stalled, launch.DeadlinePassed) and controller.aborted == 1
    assert "past its deadline" in f.stalled.message and "run-x" in f.stalled.message and "--resume" in (f.stalled.hint or "")
    assert seen == [{"stage": "deadline", "reason": str(f.stalled)}]


def test_before_its_deadline_or_without_one_the_driver_lets_the_run_go_on() -> None:
    for deadline in (time.time() + 3600.0, None):
        f, controller = follower(deadline, [])
        t = threading.Thread(target=f.run)
        t.start()
        time.sleep(launch.PROGRESS_EVERY_S * 1.5)
        f.stop.set()
        t.join(timeout=10)
        assert f.stalled is None and controller.aborted == 0


def test_the_job_has_a_deadline_only_when_it_was_given_one(tmp_path: Path) -> None:
    given = load_config(env={"RAYDLC_JOB_DEADLINE_S": "900"}, cwd=tmp_path)
    assert deadline_at(given, 1000.0) == 1900.0
    assert deadline_at(load_config(env={}, cwd=tmp_path), 1000.0) is None  # a Jobs API job or a local run: no guardrail of a RayJob
