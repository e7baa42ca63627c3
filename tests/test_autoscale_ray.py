"""Ray's own autoscaler (v2) against fake GPU nodes: the rendered GPU worker group scales from 0 for a job
that needs two nodes, and back to 0 once they are idle.

The worker type is the group raydlc renders with the defaults (min 0, max GPU_NODE_COUNT=2, 4 GPUs a
node); the idle timeout is seconds here instead of IDLE_MINUTES so the test is short. The head is
started and ended by its PID (tests/doubles/fakenodes.py says why not `AutoscalingCluster.start()`).
How long each direction took is printed by benchmarks/autoscale_fake_nodes.py, not asserted here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "doubles"))

from fakenodes import fake_gpu_cluster, run_cycle, worker_type

from raydlc.config import load_config
from raydlc.render.raycluster import WORKER_GROUP, render_raycluster

pytestmark = pytest.mark.slow  # a Ray head whose autoscaler starts two raylets


def test_a_two_node_job_brings_two_gpu_nodes_up_and_they_leave_once_idle(tmp_path: Path) -> None:
    cfg = load_config(env={}, cwd=tmp_path)
    (group,) = render_raycluster(cfg)["spec"]["workerGroupSpecs"]
    node_type = worker_type(group)
    assert (node_type["min_workers"], node_type["max_workers"], node_type["resources"]["GPU"]) == (0, 2, 4)
    with fake_gpu_cluster(WORKER_GROUP, node_type, idle_timeout_s=3, log_dir=tmp_path) as head:
        cycle = run_cycle(head, nodes=2, gpus=4, timeout_s=90)
    assert cycle.nodes_at_start == 0  # min_workers 0: no GPU node before the job
    assert len(set(cycle.job_nodes)) == 2  # one bundle per node, on the two nodes the autoscaler added
    assert cycle.nodes_at_end == 0  # idle after the job: both removed
