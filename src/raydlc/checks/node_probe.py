"""`python -m raydlc.checks.node_probe`: per-node probes, run as a job on the cluster through the Jobs API.

One short Ray task pinned to each alive node (NodeAffinitySchedulingStrategy, not soft) runs the
probes asked for there: `fi_info -p efa` (`--fi-info`), a probe object under the run prefix and
one outside it (`--storage URI`, `raydlc.checks.storage_access`; `--storage ""` takes the driver's own
STORAGE_PATH, which the head pod carries), a TCP connect to the head's dashboard port (`--head
HOST:PORT`, or `auto` for the dashboard address the head registered in the GCS: its pod IP and
port on a cluster; `raydlc.checks.head_isolation`). With no flag it runs `fi_info` alone. The driver prints every
node's answer as one JSON line, the job's last. Going through Ray rather than `kubectl exec` keeps
one channel to the cluster, and reaches the node as a Ray worker sees it: the same container,
devices, env and pod identity.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
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


def probe_node(checks: dict[str, Any]) -> dict[str, Any]:
    """The asked-for probes on this node; each answer under its own key (fi_info's at the top, as before)."""
    out: dict[str, Any] = {}
    if checks.get("fi_info"):
        out.update(fi_info())
    if checks.get("storage") is not None:
        from raydlc.checks import storage_access

        uri = checks["storage"]
        out["storage"] = storage_access.check(uri, checks["token"]) if uri else {"missing": "no STORAGE_PATH on the driver's node (the head pod)"}
    if checks.get("head"):
        from raydlc.checks import head_isolation

        host, _, port = checks["head"].rpartition(":")
        out["head"] = {**head_isolation.connect(host, int(port)), "address": checks["head"]}
    return out


def parse(argv: list[str]) -> dict[str, Any]:
    import argparse
    import uuid

    p = argparse.ArgumentParser(prog="python -m raydlc.checks.node_probe")
    p.add_argument("--fi-info", action="store_true")
    p.add_argument("--storage", default=None, help="s3:// URI; empty: this driver's RAYDLC_STORAGE_PATH")
    p.add_argument("--head", default=None, help="HOST:PORT to connect to; auto: the dashboard's address as the head registered it")
    a = p.parse_args(argv)
    storage = a.storage if a.storage else (os.environ.get("RAYDLC_STORAGE_PATH", "") if a.storage is not None else None)
    return {"fi_info": a.fi_info or (a.storage is None and a.head is None), "storage": storage, "head": a.head,
            "token": f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"}


def main(argv: list[str] | None = None) -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    checks = parse(sys.argv[1:] if argv is None else argv)
    ctx = ray.init(address="auto", log_to_driver=False)
    if checks["head"] == "auto":  # the head's node IP and dashboard port (localhost only on a local head)
        checks["head"] = str(ctx.dashboard_url or "").split("://")[-1] or None
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    task = ray.remote(num_cpus=0, max_retries=0)(probe_node)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
        {**checks, "token": f"{checks['token']}-{n['NodeID'][:12]}"}) for n in nodes]  # one probe object per node: no race
    answers = []
    for n, ref in zip(nodes, refs):
        try:
            got = ray.get(ref, timeout=FI_INFO_TIMEOUT_S * 2)
        except Exception as e:  # a node that cannot run the task is an answer too
            why = f"the probe did not run: {type(e).__name__}: {e}"[:500]
            got = {"fi_info": None, "returncode": None, "output": why, "failed": True, "error": why}
        answers.append({"node_id": n["NodeID"], "ip": n.get("NodeManagerAddress"), "gpus": n["Resources"].get("GPU", 0), **got})
    sys.stdout.write(json.dumps({"probe": "nodes", "nodes": answers}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
