"""GPU nodes that Ray's own autoscaler adds and removes on this machine: Ray's fake multi-node provider.

Ray 2.58.0 ships `ray.cluster_utils.AutoscalingCluster` for this, but it cannot be used as it is
here: its `start()` and `shutdown()` run Ray's stop command with `--force`, which ends every Ray process on the
machine (other people's too), and its config template
(`ray/autoscaler/_private/fake_multi_node/example.yaml`) is not in the wheel, nor the defaults the
autoscaler reads for `type: fake_multinode` (the same file). So this does what
`AutoscalingCluster(head_resources, worker_node_types, autoscaler_v2=True).start()` does
(cluster_utils.py `_generate_config`, `start`) with a head of raydlc's own (`local_head.start_head`, free
ports, its own temp dir, ended by its PID): the same provider (FakeMultiNodeProvider, loaded as `type: external`),
its config (`launch_multiple`, `head_node_id`), the same environment (`RAY_FAKE_CLUSTER=1`,
`AUTOSCALER_UPDATE_INTERVAL_S=1`, autoscaler v2 with the fake head's node and instance id), and the
GCS address the provider's worker raylets join (`provider.gcs_address`; it defaults to port 6379,
which another head on the machine may hold). A worker "node" is a raylet the autoscaler's monitor
starts in its own process (fake_multi_node/node_provider.py `_create_node_with_resources_and_labels`)
and kills when it terminates the node.

The worker type is raydlc's rendered GPU worker group: `min_workers`/`max_workers` are its
`minReplicas`/`maxReplicas`, its resources the GPUs its `rayStartParams` declare.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAKE_HEAD_NODE_ID = "f" * 51 + "00000"  # fake_multi_node/node_provider.py FAKE_HEAD_NODE_ID
HEAD_TYPE = "ray.head.default"
# `type: fake_multinode` makes the autoscaler read that type's defaults from example.yaml, which the wheel
# lacks (providers.py `_get_default_config`); `type: external` loads the same provider class by name.
PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"


def worker_type(group: Mapping[str, Any]) -> dict[str, Any]:
    """The autoscaler's node type for a rendered KubeRay worker group (one CPU: this machine has two)."""
    return {"resources": {"CPU": 1, "GPU": int(group["rayStartParams"]["num-gpus"])}, "node_config": {},
            "min_workers": int(group["minReplicas"]), "max_workers": int(group["maxReplicas"])}


def autoscaling_config(group_name: str, node_type: Mapping[str, Any], *, gcs_port: int, idle_timeout_s: float,
                       head_cpus: int = 1) -> dict[str, Any]:
    """The cluster config `ray start --autoscaling-config` reads (ray-schema.json wants cluster_name and provider)."""
    return {
        "cluster_name": "raydlc-fake-gpu",
        "max_workers": node_type["max_workers"],
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_s / 60,
        "provider": {"type": "external", "module": PROVIDER, "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "launch_multiple": True, "head_node_id": FAKE_HEAD_NODE_ID,
                     "gcs_address": f"127.0.0.1:{gcs_port}"},
        "available_node_types": {HEAD_TYPE: {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
                                 group_name: dict(node_type)},
        "head_node_type": HEAD_TYPE,
        "auth": {"ssh_user": "ubuntu"},
        "docker": {}, "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


@contextlib.contextmanager
def fake_gpu_cluster(group_name: str, node_type: Mapping[str, Any], *, idle_timeout_s: float, log_dir: Path,
                     head_cpus: int = 1) -> Iterator[Any]:
    """A head whose autoscaler (v2) adds and removes `node_type` workers; yields the LocalHead, ends it by PID."""
    from raydlc.edges import local_head

    gcs_port = local_head.free_port()
    config = autoscaling_config(group_name, node_type, gcs_port=gcs_port, idle_timeout_s=idle_timeout_s, head_cpus=head_cpus)
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="raydlc-fake-gpu-", delete=False) as f:
        json.dump(config, f)
    env = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_enable_autoscaler_v2": "1",
           "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID}
    head = local_head.start_head(num_cpus=head_cpus, log_dir=log_dir, env=env, ports={"port": gcs_port},
                              extra_args=[f"--autoscaling-config={f.name}"])
    try:
        yield head
    finally:
        head.stop()
        Path(f.name).unlink(missing_ok=True)


def alive_gpu_nodes() -> list[str]:
    """Node ids of the live nodes with GPUs (the head declares none), as the connected driver's GCS says."""
    import ray

    return [n["NodeID"] for n in ray.nodes() if n["Alive"] and n.get("Resources", {}).get("GPU", 0) > 0]


@dataclass(frozen=True)
class Cycle:
    """One job on a cold cluster: the nodes its tasks ran on, and how long the nodes took to come and to go."""

    nodes_at_start: int
    job_nodes: tuple[str, ...]
    scale_up_s: float  # placement group asked -> ready (both nodes joined)
    scale_down_s: float  # placement group removed -> no GPU node left
    nodes_at_end: int


def job_cycle(nodes: int, gpus: int, *, timeout_s: float = 60.0) -> Cycle:
    """On the connected cluster: a placement group of `nodes` bundles of `gpus` GPUs on distinct nodes
    (Ray Train's gang), one task per bundle reporting its node; then the group removed and the GPU nodes
    watched until the autoscaler has taken them away."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0)
    def where() -> str:
        return str(ray.get_runtime_context().get_node_id())

    before = len(alive_gpu_nodes())
    t0 = time.monotonic()
    pg = placement_group([{"GPU": gpus}] * nodes, strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=timeout_s)
    up = time.monotonic() - t0
    ran = ray.get([where.options(num_gpus=gpus, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote()
                   for i in range(nodes)], timeout=timeout_s)
    remove_placement_group(pg)
    t1 = time.monotonic()
    while alive_gpu_nodes() and time.monotonic() - t1 < timeout_s:
        time.sleep(0.5)
    down = time.monotonic() - t1
    return Cycle(before, tuple(ran), up, down, len(alive_gpu_nodes()))


def run_cycle(head: Any, nodes: int, gpus: int, *, timeout_s: float = 90.0) -> Cycle:
    """`job_cycle` as a job submitted through the head's Jobs API, so the driver runs on the head as a
    raydlc job's does (a driver in this process would register with a raylet by this machine's address,
    which the 127.0.0.1 head does not answer to)."""
    import sys

    from raydlc.edges.ray_dashboard import Dashboard, HeadRefused

    dash = Dashboard(head.dashboard_url)
    entrypoint = f"{sys.executable} {Path(__file__).resolve()} {nodes} {gpus} {timeout_s}"
    job_id = None
    deadline = time.monotonic() + 120
    while job_id is None:
        try:
            job_id = dash.submit(entrypoint=entrypoint, submission_id=None, runtime_env={}, metadata={})
        except HeadRefused:  # the head's job agent is not up yet (minutes on a loaded 2-core machine)
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
    deadline = time.monotonic() + 3 * timeout_s + 60
    job = dash.job(job_id)
    while (job is None or not job.terminal) and time.monotonic() < deadline:
        time.sleep(1)
        job = dash.job(job_id)
    logs = dash.logs(job_id)
    line = next((ln for ln in logs.splitlines() if ln.startswith(MARK)), None)
    if job is None or not job.terminal or line is None:
        raise AssertionError(f"the cycle job did not finish ({job.status if job else 'unknown'}): {logs[-2000:]}")
    return Cycle(**{**json.loads(line[len(MARK):]), "job_nodes": tuple(json.loads(line[len(MARK):])["job_nodes"])})


MARK = "RAYDLC-CYCLE "

if __name__ == "__main__":  # the job's driver, on the head
    import sys
    from dataclasses import asdict

    import ray

    ray.init()
    result = job_cycle(int(sys.argv[1]), int(sys.argv[2]), timeout_s=float(sys.argv[3]))
    print(MARK + json.dumps(asdict(result)), flush=True)
