"""A run's restarts as recorded facts (raydlc.jobs.restarts): rank 0's records folded into
`{cause, at_step, resumed_from, node}`, by the driver into its summary and by `job status` from the
driver's printed lines (or its printed summary), so `submit`, `train` and `job status` say the same."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from raydlc.edges.ray_dashboard import Job
from raydlc.jobs import control, targets
from raydlc.jobs import restarts as R
from raydlc.train import preempt as P

NODE_B = "10.0.1.6 (bbbbbbbbbbbb)"


def steps(*ns: int) -> list[dict[str, Any]]:
    return [{"step": n, "loss": 3.0 - n / 100, "tokens_per_s": 1000.0, "step_time_s": 0.1} for n in ns]


# A run preempted at 7 (saved), a failure after step 10 (resumed from the periodic checkpoint of 8), and a notice
# at 12 too short to save (resumed from 10): what rank 0 posts, in order.
RECORDS = [
    *steps(1, 2, 3, 4, 5, 6, 7),
    P.Notice(step=7, deadline_s=1.0, ranks=(0, 1)).record(),
    {"step": 7, "resumed": True, "node": NODE_B},
    *steps(8, 9, 10),
    {"step": 8, "resumed": True, "node": "10.0.1.7 (cccccccccccc)"},
    *steps(9, 10, 11, 12),
    P.Notice(step=12, deadline_s=1.0, ranks=(1,), saved=False, resume_from=10).record(),
    {"step": 10, "resumed": True, "node": None},
    *steps(11, 12, 13),
]
EXPECTED = [
    {"cause": "preemption", "at_step": 7, "resumed_from": 7, "node": NODE_B},
    {"cause": "failure", "at_step": 10, "resumed_from": 8, "node": "10.0.1.7 (cccccccccccc)"},
    {"cause": "preemption", "at_step": 12, "resumed_from": 10, "node": None},
]


def test_the_fold_names_each_restarts_cause_step_checkpoint_and_node() -> None:
    assert R.restarts(RECORDS) == EXPECTED
    assert R.restarts(steps(1, 2, 3)) == []
    half = R.fold(RECORDS[:9])
    assert R.fold(RECORDS[9:], half).restarts == tuple(EXPECTED)  # the driver folds as the records come, batch by batch
    assert [R.describe(r) for r in EXPECTED] == [
        f"preempted at step 7, resumed from 7 on {NODE_B}", "failed at step 10, resumed from 8 on 10.0.1.7 (cccccccccccc)",
        "preempted at step 12, resumed from 10"]


def test_a_resume_run_s_first_attempt_is_no_restart_but_a_second_resume_is() -> None:
    """--resume posts a resume record before any step; a stage record from the driver is no step of the run."""
    first = [{"stage": "training", "steps": 20}, {"step": 5, "resumed": True, "node": "a"}, *steps(6, 7)]
    assert R.restarts(first) == []
    again = [*first, {"step": 5, "resumed": True, "node": "b"}]
    assert R.restarts(again) == [{"cause": "failure", "at_step": 7, "resumed_from": 5, "node": "b"}]


def driver_log(records: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> str:
    from raydlc.train.__main__ import _print_progress

    capsys.readouterr()
    for r in records:
        _print_progress(r)
    return capsys.readouterr().out


def test_the_driver_s_printed_lines_fold_into_the_same_restarts(capsys: pytest.CaptureFixture[str]) -> None:
    text = driver_log(RECORDS, capsys)
    assert f"step 7: resumed from its checkpoint on {NODE_B}" in text
    assert "step 12: preempted: deadline too short to save at step 12; resuming from step 10" in text
    noisy = "(RayTrainWorker pid=1) [raydlc] resumed at step 7 from /tmp/x\n" + text + "step 99: eval loss 1.0\n"
    assert R.restarts(R.records_of_log(noisy)) == EXPECTED
    assert control.restarts_of(noisy) == EXPECTED


def test_job_status_prefers_the_printed_summary_s_restarts() -> None:
    summary = {"steps": 13, "final_loss": 2.9, "restarts": EXPECTED[:1]}
    log = "step 7: preempted\nstep 7: resumed from its checkpoint on elsewhere\n" + json.dumps(summary) + "\n"
    assert control.restarts_of(log) == EXPECTED[:1]


def test_the_driver_folds_rank_0_s_records_as_it_takes_them(tmp_path: Any) -> None:
    from raydlc.train.launch import _Follower

    shown: list[dict[str, Any]] = []
    f = _Follower(box=None, on_progress=shown.append, path=tmp_path / "progress.jsonl", stop=threading.Event(), guard=None,
                  watch=None, spec=SimpleNamespace(budget=None), trainer=None)  # type: ignore[arg-type]
    f.take(RECORDS[:9])
    f.take([{"beat": 1, "rank": 0, "step": 99}, *RECORDS[9:]])  # heartbeats are no step of the run
    assert list(f.restarts.restarts) == EXPECTED and len(shown) == len(RECORDS)


class Dash:
    """The dashboard as `job status` reads it: GET /api/jobs/{id} and its logs (raydlc.edges.ray_dashboard.Dashboard)."""

    def __init__(self, job: Job, log: str) -> None:
        self._job, self._log = job, log

    def job(self, job_id: str) -> Job | None:
        return self._job if job_id == self._job.submission_id else None

    def logs(self, job_id: str) -> str:
        assert job_id == self._job.submission_id
        return self._log


@pytest.fixture
def head(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Dash:
    job = Job("train-1", "02000000", "SUCCEEDED", "python -m raydlc.train", None, 1.0, 2.0, {"program": "builtin"}, 0, {})
    dash = Dash(job, driver_log(RECORDS, capsys))

    @contextlib.contextmanager
    def reach(target: targets.JobTarget, cfg: Any = None, **_: Any) -> Iterator[targets.Reached]:
        yield targets.Reached(target, dash)  # type: ignore[arg-type]

    monkeypatch.setattr(targets, "reach", reach)
    return dash


def test_api_job_status_and_the_cli_read_the_restarts_from_the_job_s_log(head: Dash, capsys: pytest.CaptureFixture[str]) -> None:
    import raydlc.api as api
    from raydlc.cli import main

    result = api.job_status("train-1", local=True)
    assert result.restarts == EXPECTED and result.to_dict()["restarts"] == EXPECTED
    capsys.readouterr()
    assert main(["job", "status", "train-1", "--local", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["restarts"] == EXPECTED
    assert main(["job", "status", "train-1", "--local"]) == 0
    out = capsys.readouterr().out
    assert f"restart: preempted at step 7, resumed from 7 on {NODE_B}" in out
    assert "restart: failed at step 10, resumed from 8" in out and "restart: preempted at step 12, resumed from 10" in out


def test_the_summary_shows_a_restarts_row_and_train_result_carries_them() -> None:
    from raydlc.api import TrainResult
    from raydlc.views.progress import print_summary
    from raydlc.views.text import rendered

    s = {"model": "tiny", "workers": 2, "sharding": "fsdp", "steps": 13, "first_loss": 5.0, "final_loss": 3.0, "loss_drop": 0.4,
         "eval_loss": None, "tokens_per_s": 100.0, "step_time_s": 0.5, "peak_mem_mb": 10.0, "resumed_from": None, "checkpoint": "c",
         "export": "e", "metrics": "m", "plot": "p", "wall_s": 40.0, "restarts": EXPECTED}
    text = rendered(lambda c: print_summary(s, c), width=200)
    assert "restarts" in text and f"preempted at step 7, resumed from 7 on {NODE_B}" in text and "failed at step 10" in text
    assert "restarts" not in rendered(lambda c: print_summary({**s, "restarts": []}, c), width=200)
    assert "restarts" in TrainResult.__dataclass_fields__
