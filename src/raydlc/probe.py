"""`python -m raydlc.probe`: per-node probes, run as a job on the cluster through the Jobs API.

One short Ray task pinned to each alive node (NodeAffinitySchedulingStrategy, not soft) runs
`fi_info -p efa` there and reports what it printed; the driver prints every node's answer as one
JSON line, the job's last. Going through Ray rather than `kubectl exec` keeps one channel to
the cluster, and reaches the node as a Ray worker sees it: the same container, devices and env.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

FI_INFO_TIMEOUT_S = 30.0
MAX_OUTPUT = 64 * 1024
EFA_FI_INFO = "/opt/amazon/efa/bin/fi_info"  # the EFA installer's, not always on PATH


def fi_info() -> dict[str, Any]:
    """`fi_info -p efa` on this node: where it is, its exit code and what it printed."""
    exe = shutil.which("fi_info") or (EFA_FI_INFO if os.path.exists(EFA_FI_INFO) else None)
    if exe is None:
        return {"fi_info": None, "returncode": None, "output": ""}
    try:
        p = subprocess.run([exe, "-p", "efa"], check=False, capture_output=True, text=True, timeout=FI_INFO_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"fi_info": exe, "returncode": None, "output": f"{type(e).__name__}: {e}"}
    return {"fi_info": exe, "returncode": p.returncode, "output": (p.stdout + p.stderr)[-MAX_OUTPUT:]}


def main() -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address="auto", log_to_driver=False)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    task = ray.remote(num_cpus=0, max_retries=0)(fi_info)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote() for n in nodes]
    answers = []
    for n, ref in zip(nodes, refs):
        try:
            got = ray.get(ref, timeout=FI_INFO_TIMEOUT_S * 2)
        except Exception as e:  # a node that cannot run the task is an answer too
            got = {"fi_info": None, "returncode": None, "output": f"the probe did not run: {type(e).__name__}: {e}"[:500], "failed": True}
        answers.append({"node_id": n["NodeID"], "ip": n.get("NodeManagerAddress"), "gpus": n["Resources"].get("GPU", 0), **got})
    sys.stdout.write(json.dumps({"probe": "fi_info", "nodes": answers}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
