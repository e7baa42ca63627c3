"""A Spot reclaim in the middle of a real run (Ray 2.58, a local head plus one extra raylet, as the drain test lays
them out): the worker node (both ranks) is drained with reason preemption and a deadline, the loop checkpoints the step the
notice arrived at and holds, Ray Train tears the workers down at the deadline, the node is killed, a replacement joins, and
Ray Train restarts the workers from that checkpoint (its PreemptionError, counted against MAX_PREEMPTIONS, not MAX_FAILURES = 0). The run ends as a normal
run, with every step's loss equal to an undrained run's (same seed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from raydlc.config import TrainConfig
from raydlc.data.corpus import bundled_corpus
from raydlc.render.raycluster import DRAIN_REASON
from raydlc.train import checkpoint as C
from raydlc.train import metrics as M
from raydlc.train.launch import run
from raydlc.train.runspec import RunTarget

pytestmark = pytest.mark.slow

STEPS = 30
DRAIN_AFTER = 4  # the first attempt's step from which the test drains the worker node
DEADLINE_S = 25  # the reclaim deadline given to `ray drain-node`


def losses(summary: dict[str, Any]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in M.read_jsonl(Path(summary["metrics"])) if "loss" in r}


def drain(address: str, node_id: str, deadline_s: int = DEADLINE_S) -> None:
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    r = subprocess.run([ray_cli, "drain-node", "--address", address, "--node-id", node_id, f"--reason={DRAIN_REASON}",
                        "--reason-message=test: Spot reclaim", f"--deadline-remaining-seconds={deadline_s}"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "RAY_ADDRESS": address})
    assert r.returncode == 0, r.stderr


def test_a_drained_worker_node_is_checkpointed_at_the_notice_and_the_run_resumes_there_on_a_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # a connection an earlier test in this worker process left: this test's cluster is its own
        ray.shutdown()
    monkeypatch.setenv("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "0.5")  # Ray Train polls GCS's draining nodes (5 s by default)
    corpus = tmp_path / "docstrings.txt"
    corpus.write_text("\n\n".join(d.text for d in bundled_corpus(max_chars=150_000)))
    base = TrainConfig(model_id="tiny", steps=STEPS, seq_len=32, batch_size=2, num_workers=2, learning_rate=2e-3, data=str(corpus),
                       checkpoint_every=0, report_every=5, max_failures=0, max_preemptions=1,
                       storage_shared=True)  # the "nodes" are processes on this machine: its disk is every node's
    # Both workers on the Spot node (the head runs only the driver and Ray Train's controller, which Ray pins to the
    # driver's node): Ray Train counts a node's workers by IP, and every raylet here has this machine's IP.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        spot = cluster.add_node(num_cpus=2)
        ray.init(address=cluster.address, runtime_env={"env_vars": {"RAY_ADDRESS": cluster.address}}, log_to_driver=False)
        events: list[dict[str, Any]] = []

        def until(pred: Any, timeout_s: float) -> dict[str, Any]:
            end = time.monotonic() + timeout_s
            while time.monotonic() < end and not job.done():
                found = next((r for r in list(events) if pred(r)), None)
                if found is not None:
                    return found
                time.sleep(0.2)
            job.result(timeout=0)  # the run's own error, if it ended
            raise AssertionError(f"not seen in {timeout_s} s; the last records: {events[-3:]}")

        # The cluster is changed from this (the main) thread: Ray starts a node's processes with signal handlers.
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(run, base.updated(storage_path=str(tmp_path / "drained")), RunTarget(log_to_driver=False), on_progress=events.append)
            until(lambda r: "loss" in r and r["step"] >= DRAIN_AFTER, 600)
            drain(cluster.address, spot.node_id)
            notice = until(lambda r: r.get("preempted"), 120)  # the checkpoint of the notice's step is uploaded by now
            time.sleep(max(0.0, notice["deadline"] - time.time()) + 3.0)  # Ray Train tears the workers down at the deadline
            replacement = cluster.add_node(num_cpus=2)  # the replacement joins, and the drained node goes
            try:
                cluster.remove_node(spot)
            except Exception as e:  # a leftover process of the old node (its raylet may have gone by itself, drained and idle)
                print(f"removing the drained node: {e!r}", flush=True)
            drained_run = job.result(timeout=600)
        k = notice["step"]
        assert DRAIN_AFTER <= k < STEPS
        assert notice["deadline"] is not None and notice["preempted_ranks"]
        resumed = [r["step"] for r in events if r.get("resumed")]
        assert resumed == [k]  # one restart, from the checkpoint taken at the notice: no step after it lost
        first_attempt = [r["step"] for r in events[: events.index(notice)] if "loss" in r]
        assert max(first_attempt) == k  # the first attempt ran no step after the notice's
        assert C.verify(Path(drained_run["run_dir"]) / C.dir_name(k)).step == k
        assert drained_run["steps"] == STEPS
        # the recorded fact: "preempted at step k, resumed from k on <the replacement>"
        [restart] = drained_run["restarts"]
        assert {k: restart[k] for k in ("cause", "at_step", "resumed_from")} == {"cause": "preemption", "at_step": k, "resumed_from": k}
        assert replacement.node_id[:12] in restart["node"] and spot.node_id[:12] not in restart["node"]

        plain = run(base.updated(storage_path=str(tmp_path / "plain")), RunTarget(log_to_driver=False))
        a, b = losses(drained_run), losses(plain)
        assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
        assert max(abs(a[s] - b[s]) for s in a) <= 1e-5, (a, b)
        assert drained_run["final_loss"] == pytest.approx(plain["final_loss"], abs=1e-5)
    finally:
        ray.shutdown()
        cluster.shutdown()
