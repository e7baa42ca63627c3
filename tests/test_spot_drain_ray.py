"""The preStop hook's `ray drain-node` reaches the training loop (real Ray 2.58, a local two-node cluster): a worker
node drained with reason preemption and a deadline shows in Ray Train's `ray.train.get_preemption_info()` on the
rank running there, with that node and deadline, while the node still works."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raydlc.render.raycluster import DRAIN_REASON

pytestmark = pytest.mark.slow


def test_ray_drain_node_with_reason_preemption_reaches_get_preemption_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    def _train_fn(config: dict) -> None:  # runs in the Ray Train worker on the "spot" node (pickled by value)
        import ray
        import ray.train

        # written beside, then renamed: the test polls exists() and must never read a half-written (empty) file
        part = Path(config["started"] + ".part")
        part.write_text(ray.get_runtime_context().get_node_id())
        part.rename(config["started"])
        t0 = time.monotonic()
        while time.monotonic() - t0 < config["wait_s"]:
            info = ray.train.get_preemption_info()
            if info is not None:
                Path(config["seen"]).write_text(json.dumps(
                    {"deadline_ms": info.deadline_ms, "nodes": info.preempted_node_to_ranks, "at_ms": time.time_ns() // 1_000_000}))
                return
            time.sleep(0.2)

    if ray.is_initialized():  # a connection an earlier test in this worker process left: this test's cluster is its own
        ray.shutdown()
    monkeypatch.setenv("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "0.5")  # Ray Train polls GCS's draining nodes (5 s by default)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1, resources={"spot": 1})
        # other Ray instances may run on this machine: every process of this one is told which is its own
        ray.init(address=cluster.address, runtime_env={"env_vars": {"RAY_ADDRESS": cluster.address}})
        started, seen = tmp_path / "started", tmp_path / "seen"
        trainer = DataParallelTrainer(
            _train_fn, train_loop_config={"started": str(started), "seen": str(seen), "wait_s": 90},
            scaling_config=ScalingConfig(num_workers=1, use_gpu=False, resources_per_worker={"CPU": 1, "spot": 1}),
            run_config=RunConfig(name="drain", storage_path=str(tmp_path / "runs")),
        )
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            run = pool.submit(trainer.fit)
            deadline = time.monotonic() + 120
            while not started.exists() and time.monotonic() < deadline and not run.done():
                time.sleep(0.2)
            assert started.exists(), "the Ray Train worker never started"
            node = started.read_text()
            ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
            asked_ms = time.time_ns() // 1_000_000
            r = subprocess.run([ray_cli, "drain-node", "--address", cluster.address, "--node-id", node,
                                f"--reason={DRAIN_REASON}", "--reason-message=test: Spot reclaim",
                                "--deadline-remaining-seconds=60"], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "RAY_ADDRESS": cluster.address})
            assert r.returncode == 0, r.stderr
            run.result(timeout=120)
        got = json.loads(seen.read_text())
        assert got["nodes"] == {node: [0]}
        assert abs(got["deadline_ms"] - (asked_ms + 60_000)) < 5_000
        assert got["at_ms"] < got["deadline_ms"]  # seen inside the window, with the node still up
    finally:
        ray.shutdown()
        cluster.shutdown()
