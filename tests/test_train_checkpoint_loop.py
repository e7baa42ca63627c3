"""The loop's asynchronous checkpoints, in one process (gloo, world size 1) without Ray: each one
reported complete (with its manifest), the newest CHECKPOINT_KEEP kept, and a run resumed from one
takes the same steps as the run that never stopped."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.test_train_cadence import Hooks, Session, loop, one_worker
from tests.test_train_step import world_of_one

from raydlc.train import checkpoint as C
from raydlc.train.runspec import RunSpec


class Storing(Session):
    """A session that stores each reported checkpoint under `root`, as Ray's upload does, and prunes to `keep`."""

    def __init__(self, root: Path, keep: int) -> None:
        super().__init__()
        self.root, self.keep = root, keep

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None = None, name: str | None = None, *, wait: bool = False) -> None:
        if checkpoint_dir is not None and name is not None:
            shutil.copytree(checkpoint_dir, self.root / name)
            C.prune(self.root, self.keep)
        super().report(metrics, checkpoint_dir, name, wait=wait)


def losses(history: list[dict[str, Any]]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in history if "loss" in r}


def run_to_end(run: RunSpec, session: Session, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    with world_of_one():
        return loop(run, Hooks(session), monkeypatch)


def test_async_checkpoints_are_complete_pruned_to_keep_and_resume_the_same_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = one_worker(steps=6, report_every=1, checkpoint_every=2, checkpoint_keep=2, learning_rate=2e-3)
    store = tmp_path / "run"
    store.mkdir()
    session = Storing(store, keep=2)
    whole = run_to_end(run, session, monkeypatch)
    saved = [(step, name) for step, name, sealed in session.reports if name is not None and sealed]
    assert saved == [(2, C.dir_name(2)), (4, C.dir_name(4)), (6, C.dir_name(6))]  # every one reported whole
    assert sorted(p.name for p in store.iterdir()) == [C.dir_name(4), C.dir_name(6)]
    assert C.verify(store / C.dir_name(4)).step == 4

    resumed_session = Session()
    resumed = run_to_end(run.model_copy(update={"resume_from": str(store / C.dir_name(4))}), resumed_session, monkeypatch)
    assert [r["step"] for r in resumed_session.posted if "loss" in r] == [5, 6]  # only the steps after the checkpoint ran
    a, b = losses(whole["history"]), losses(resumed["history"])
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-6, (a, b)


def test_a_resume_at_the_last_step_still_reports_the_runs_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = one_worker(steps=4, report_every=2, checkpoint_every=4, learning_rate=2e-3)
    store = tmp_path / "run"
    store.mkdir()
    whole = run_to_end(run, Storing(store, keep=1), monkeypatch)
    session = Session()
    run_to_end(run.model_copy(update={"resume_from": str(store / C.dir_name(4))}), session, monkeypatch)
    assert not [r for r in session.posted if "loss" in r]  # no step ran
    assert session.reports == [(4, C.dir_name(4), True)]  # this run's own checkpoint of the step, whole, with the summary
    assert session.last["summary_steps"] == 4
    assert session.last["summary_first_loss"] == losses(whole["history"])[1]  # from the restored records
    assert session.last["summary_final_loss"] == losses(whole["history"])[4]
