"""Does `raydlc up` take as long as its longest dependency chain, not the sum of its steps?

Runs `up` against a local moto server, kmock, the eksctl/helm doubles of tests/doubles/ on PATH
and the emulated KubeRay operator, with known durations per step set in the doubles (cluster
creation, each node group, each helm install, the Ray pods' start). It prints each step's
time, the sequential sum (one step at a time), the longest chain of dependencies through the
measured step times (the least any schedule can take), up's wall time, and as its last line
`up wall / critical path: X.XX` (the aim is <= 1.10: the scheduler adds almost nothing).

    PYTHONPATH=src python benchmarks/up_critical_path.py [--scale 1.0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "doubles"))

# seconds each tool call takes in the doubles (multiplied by --scale); eksctl's real ones are
# 15-20 min for the cluster and ~5 min per node group
DELAYS = {
    "create cluster": 4.0,
    "create nodegroup system": 1.0,
    "create nodegroup gpu-workers": 3.0,
    "install kuberay-operator": 2.0,
    "install nvidia-device-plugin": 1.5,
}
POD_DELAY = 1.5  # the Ray pods' image pull and start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every known duration")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    import awsstub
    import eks_state
    import servers
    from kuberay import Operator

    import raydlc.edges.aws
    from raydlc import lifecycle
    from raydlc.config import load_config
    from raydlc.lifecycle import Timings, orders
    from raydlc.lifecycle.steps import critical_path

    tmp = Path(tempfile.mkdtemp(prefix="raydlc-bench-"))
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    servers.install_doubles(bin_dir, sys.executable)
    scenario = tmp / "scenario.json"
    scenario.write_text(json.dumps({"delays": {k: v * args.scale for k, v in DELAYS.items()}}))
    for k in [k for k in os.environ if k.startswith(("RAYDLC_", "AWS_", "KUBECONFIG"))]:
        del os.environ[k]
    timings = Timings(poll_s=0.05, cluster_s=120, nodegroup_s=120, stack_s=60, helm_s=60, nodes_s=60, plugins_s=60, pods_s=60)
    rows: list[tuple[float, float, float, dict[str, float]]] = []
    with servers.moto_server() as moto, servers.kube_server(setattr) as kube:
        os.environ.update(
            AWS_ENDPOINT_URL=moto, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_EC2_METADATA_DISABLED="true",
            AWS_MAX_ATTEMPTS="1", AWS_CONFIG_FILE=str(tmp / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp / "none"),
            KUBECONFIG=str(tmp / "no-kubeconfig"), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            DOUBLES_SCENARIO=str(scenario), DOUBLES_KUBE_URL=kube.url, DOUBLES_LOG=str(tmp / "calls.jsonl"),
        )
        cfg = load_config(env={})
        # moto lacks ListAddons and ListPodIdentityAssociations: the answers the lifecycle tests register
        # (tests/doubles/eks_state.py, from the state the eksctl double keeps beside the scenario file)
        raydlc.edges.aws.client = awsstub.hooked(raydlc.edges.aws.client, eks_state.handlers(eks_state.path_for(scenario)))
        from raydlc import capacity

        servers.reset_moto(moto, warm_regions=(cfg.cluster.region,))  # moto builds its EC2 backend; not part of up
        capacity.discover(cfg)  # moto loads its instance-type data on first use; not part of up
        for i in range(args.repeat):
            servers.reset_moto(moto)
            os.environ["HOME"] = str(tmp / f"home{i}")
            for key in list(kube.snapshot()):  # an empty API server per run
                group_version_plural, ns, name = key.rsplit("/", 2)
                _delete(kube.url, group_version_plural, None if ns == "None" else ns, name)
            with Operator(kube.url, pod_delay=POD_DELAY * args.scale):
                t0 = time.perf_counter()
                run = lifecycle.up(cfg, timings=timings)
                wall = time.perf_counter() - t0
            if not run.ok:
                sys.exit("up failed: " + "; ".join(f"{r.step}: {r.reason}" for r in run.failed))
            steps = {r.step: r.elapsed_s for r in run.results}
            chain, path = critical_path(orders.steps("up"), steps)
            rows.append((sum(steps.values()), chain, wall, steps))
            print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}s" for k, v in steps.items()), file=sys.stderr)
    seq, chain, wall = (statistics.median(r[i] for r in rows) for i in range(3))
    _, path = critical_path(orders.steps("up"), rows[-1][3])
    known = critical_path(orders.steps("up"), {
        "cluster": DELAYS["create cluster"] + DELAYS["create nodegroup system"], "gpu-nodegroup": DELAYS["create nodegroup gpu-workers"],
        "kuberay": DELAYS["install kuberay-operator"], "device-plugins": DELAYS["install nvidia-device-plugin"],
        "raycluster": POD_DELAY})[0] * args.scale
    print(f"known durations in the doubles (scale {args.scale:g}): " + ", ".join(f"{k} {v * args.scale:g}s" for k, v in DELAYS.items())
          + f", Ray pods {POD_DELAY * args.scale:g}s; their longest chain {known:.2f} s")
    print(f"median of {args.repeat} run(s):")
    print(f"  sequential sum of the steps:  {seq:6.2f} s")
    print(f"  longest dependency chain:     {chain:6.2f} s  ({' -> '.join(path)})")
    print(f"  up wall time:                 {wall:6.2f} s")
    print(f"up wall / critical path: {wall / chain:.2f}")


def _delete(url: str, gvp: str, ns: str | None, name: str) -> None:
    import urllib.request

    group, version, plural = gvp.split("/")
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    path = f"{base}/namespaces/{ns}/{plural}/{name}" if ns else f"{base}/{plural}/{name}"
    urllib.request.urlopen(urllib.request.Request(url + path, method="DELETE"), timeout=10).read()


if __name__ == "__main__":
    main()
