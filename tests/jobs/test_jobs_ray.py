"""Jobs against a real Ray head: the local target end to end, two nodes' worker logs, and the cluster
target through kmock and a kubectl double whose port-forward reaches the same head.

One head for the module, started the way `raydlc submit --local` starts it (a `ray start --head
--block` subprocess recorded in raydlc's state dir under a HOME of the test's own) and ended by
its PID with `raydlc down --local` at the end. The commands run as the real console script in
subprocesses. Order matters and is the file's: the second raylet joins after the local tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from raydlc.edges import local_head
from raydlc.edges.local_head import LocalHead
from raydlc.jobs import targets

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "doubles"))

import servers  # noqa: E402

NCCL = TESTS / "data" / "nccl"
RAYDLC = Path(sys.executable).with_name("raydlc")
TINY = {"RAYDLC_STEPS": "3", "RAYDLC_SEQ_LEN": "32", "RAYDLC_BATCH_SIZE": "2", "RAYDLC_EVAL_FRACTION": "0.02", "RAYDLC_NUM_WORKERS": "1"}

TICKER = """import sys, time
n = int(sys.argv[1])
for i in range(n):
    print(f"tick {i}", flush=True)
    time.sleep(0.5)
print("done", flush=True)
"""

# A run laid out as Ray Train v2 lays it out (Ray 2.58.0 train/v2/api/data_parallel_trainer.py pins its
# TrainController, num_cpus=0, to the driver's node, and a Jobs-API driver runs on the head, job_manager.py):
# the controller on the head prints no NCCL line; one RayTrainWorker per GPU node prints that node's NCCL log,
# as NCCL's INFO output lands in the worker's worker-*.out. Arguments: `<short node id>=<log file>` pairs.
NCCL_PRINTER = """import sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(address="auto")

def on(node_id):
    return NodeAffinitySchedulingStrategy(node_id, soft=False)

@ray.remote(num_cpus=0)
class TrainController:
    def run(self):
        print("controller: starting a worker group of", len(sys.argv) - 1, flush=True)

@ray.remote(num_cpus=0)
class RayTrainWorker:
    def run(self, text):
        print(text, flush=True)
        return ray.get_runtime_context().get_node_id()

alive = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
head = next(i for i, n in alive.items() if n["Resources"].get("node:__internal_head__"))
ray.get(TrainController.options(scheduling_strategy=on(head)).remote().run.remote())
pairs = [arg.split("=", 1) for arg in sys.argv[1:]]
workers = [(RayTrainWorker.options(scheduling_strategy=on(next(i for i in alive if i.startswith(short)))).remote(), open(path).read())
           for short, path in pairs]
print(ray.get([w.run.remote(text) for w, text in workers]))
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """HOME of the test's own: raydlc's state dir (the head record, kubeconfigs) lives under it."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        yield home


@pytest.fixture(scope="module")
def head(home: Path) -> Iterator[targets.HeadRecord]:
    """Started by a process that then exits, as `raydlc submit --local` does: the head outlives it."""
    subprocess.run([sys.executable, "-c", "from raydlc.jobs import targets; targets.ensure_local_head(start=True)"], check=True, timeout=300)
    rec = targets.running_head()
    assert rec is not None
    yield rec
    if targets.running_head() is not None:  # a test failed before `down --local`
        targets.stop_local_head()


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "RAY_ADDRESS")) and k != "KUBECONFIG"}
    full.update(env or {})
    return subprocess.run([str(RAYDLC), *args], capture_output=True, text=True, cwd=cwd, env=full, timeout=timeout)


def last_json(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert p.stdout.strip(), p.stderr[-3000:]
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


# ---- the local target ---------------------------------------------------------------------------


def test_submit_the_builtin_program_with_a_pinned_package(head: targets.HeadRecord, tmp_path: Path) -> None:
    p = cli("submit", "--local", "--builtin", "--pip", "PyYAML", "--name", "builtin-1", "--json", cwd=tmp_path, env=TINY)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = last_json(p)
    assert (doc["job_id"], doc["status"], doc["target"], doc["attached"]) == ("builtin-1", "SUCCEEDED", "local", False)
    assert doc["duration_s"] > 0 and doc["ray_job_id"]
    summary = doc["summary"]
    assert summary["steps"] == 3 and summary["workers"] == 1 and summary["seq_len"] == 32
    assert Path(summary["run_dir"]).parent == tmp_path / "raydlc-out"  # written where submit ran, not in Ray's session dir
    assert [f"step {i}: loss" in p.stderr for i in (1, 2, 3)] == [True] * 3  # the log streamed (to stderr under --json)

    status = last_json(cli("job", "status", "builtin-1", "--local", "--json", cwd=tmp_path))
    assert (status["status"], status["ray_job_id"]) == ("SUCCEEDED", doc["ray_job_id"])
    env = status["runtime_env"]
    assert env["pip"]["packages"] == [f"PyYAML=={metadata.version('PyYAML')}"]
    assert env["env_vars"]["RAYDLC_STEPS"] == "3" and env["env_vars"]["RAYDLC_MODEL_ID"] == "tiny"
    assert len(env["py_modules"]) == 1 and env["py_modules"][0].startswith("gcs://")  # raydlc travelled with the job
    logs = cli("job", "logs", "builtin-1", "--local", cwd=tmp_path)
    assert logs.returncode == 0 and "step 3: loss" in logs.stdout
    assert json.loads(logs.stdout.strip().splitlines()[-1])["run_name"] == summary["run_name"]

    v = cli("verify", "--local", "--job", "builtin-1", "--json", cwd=tmp_path)
    assert v.returncode == 0, v.stderr[-2000:]
    rows = {r["criterion"]: r["status"] for r in last_json(v)["criteria"]}
    assert rows == {"gpu-nodes": "not applicable", "pods": "not applicable", "fi-info": "not applicable",
                    "nccl": "not applicable", "storage": "not applicable", "head-port": "not applicable", "job": "pass"}


def test_one_name_runs_once_stop_ends_it_and_list_shows_each_job_once(head: targets.HeadRecord, tmp_path: Path) -> None:
    (tmp_path / "ticker.py").write_text(TICKER)
    first = last_json(cli("submit", "ticker.py", "--local", "--name", "long-1", "--no-wait", "--json", "--", "600", cwd=tmp_path))
    again = last_json(cli("submit", "ticker.py", "--local", "--name", "long-1", "--no-wait", "--json", "--", "600", cwd=tmp_path))
    assert (first["attached"], again["attached"], again["job_id"]) == (False, True, "long-1")
    deadline = time.monotonic() + 60
    while "tick 1" not in cli("job", "logs", "long-1", "--local", cwd=tmp_path).stdout:
        assert time.monotonic() < deadline, "the job never printed"
        time.sleep(1)
    stopped = last_json(cli("job", "stop", "long-1", "--local", "--json", cwd=tmp_path))
    assert (stopped["status"], stopped["was_running"]) == ("STOPPED", True)
    reuse = cli("submit", "ticker.py", "--local", "--name", "long-1", cwd=tmp_path)
    assert reuse.returncode == 2 and "already ran and ended STOPPED" in reuse.stderr and reuse.stdout == ""
    listed = last_json(cli("job", "list", "--local", "--json", cwd=tmp_path))
    ids = [j["job_id"] for j in listed["jobs"]]
    assert ids.count("long-1") == 1 and ids.count("builtin-1") == 1
    assert [j["status"] for j in listed["jobs"] if j["job_id"] == "long-1"] == ["STOPPED"]


def test_ctrl_c_detaches_and_the_job_goes_on(head: targets.HeadRecord, tmp_path: Path) -> None:
    (tmp_path / "ticker.py").write_text(TICKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYDLC_")}
    proc = subprocess.Popen([str(RAYDLC), "submit", "ticker.py", "--local", "--name", "detach-1", "--", "40"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("tick 0"):
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "detached from job detach-1; it keeps running" in err
    assert "raydlc job logs detach-1 --follow --local" in err and "raydlc job stop detach-1 --local" in err
    assert last_json(cli("job", "status", "detach-1", "--local", "--json", cwd=tmp_path))["status"] == "RUNNING"  # 20 s of ticks: room for CI's load
    back = cli("job", "logs", "detach-1", "--follow", "--local", cwd=tmp_path)  # re-attach until it ends
    assert back.returncode == 0 and back.stdout.rstrip().endswith("done") and back.stdout.count("tick 0") == 1


def test_bench_transport_on_the_local_target_says_there_is_nothing_to_compare(tmp_path: Path) -> None:
    p = cli("bench-transport", "--local", "--steps", "3", "--json", cwd=tmp_path)
    doc = last_json(p)
    assert p.returncode == 0 and doc["applicable"] is False and doc["speedup"] is None and "gloo" in doc["reason"]
    people = cli("bench-transport", "--local", cwd=tmp_path)
    assert "not applicable" in people.stdout and "x steps/s" not in people.stdout


# ---- two nodes: the job's own worker logs, per node -----------------------------------------------


def _nodes(head: targets.HeadRecord, wait_s: float = 60.0) -> list[dict[str, Any]]:
    """The head's node list; a head that has just started may drop the first connections while its dashboard comes up."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return list(get(f"{head.dashboard_url}/api/v0/nodes")["data"]["result"]["result"])
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1)


@contextlib.contextmanager
def _raylet(head: targets.HeadRecord, tmp_path_factory: pytest.TempPathFactory, tag: str) -> Iterator[tuple[str, LocalHead]]:
    """A raylet joined to the head, as Ray's own multi-node tests do; its own temp dir, so its
    logs are its own, as on another machine. It declares 4 GPUs and has the fi_info double on its
    PATH: a GPU node with an EFA device, as far as Ray and the probe can tell. Ended by its PID."""
    import tempfile

    ray_bin = Path(sys.executable).with_name("ray")
    ports = {n: local_head.free_port() for n in ("node-manager-port", "object-manager-port", "metrics-export-port",
                                             "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port")}
    temp = Path(tempfile.mkdtemp(prefix=f"raydlc-{tag}-", dir="/tmp"))
    log = tmp_path_factory.mktemp(tag) / "node.log"
    fi_bin = log.parent / "bin"
    fi_bin.mkdir()
    (fi_bin / "fi_info").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{TESTS / "doubles" / "fi_info.py"}" "$@"\n')
    (fi_bin / "fi_info").chmod(0o755)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
           "PATH": f"{fi_bin}{os.pathsep}{ray_bin.parent}{os.pathsep}{os.environ['PATH']}"}
    before = {n["node_id"] for n in _nodes(head)}
    with log.open("wb") as out:
        proc = subprocess.Popen([str(ray_bin), "start", f"--address={head.address}", "--block", "--node-ip-address=127.0.0.1",
                                 "--num-cpus=2", "--num-gpus=4", "--disable-usage-stats", f"--temp-dir={temp}",
                                 *(f"--{k}={v}" for k, v in ports.items())], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    node = LocalHead(proc, head.address, "", log, temp, ports)
    try:
        deadline = time.monotonic() + 120
        while True:
            nodes = _nodes(head)
            new = [n for n in nodes if n["state"] == "ALIVE" and not n["is_head_node"] and n["node_id"] not in before]
            if new:
                break
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-2000:]
            time.sleep(1)
        yield f"{new[0]['node_ip']}/{new[0]['node_id'][:8]}", node  # how raydlc names a Ray node: IP and short id
    finally:
        node.stop()


@pytest.fixture(scope="module")
def second_raylet(head: targets.HeadRecord, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LocalHead]]:
    with _raylet(head, tmp_path_factory, "node2") as node:
        yield node


@pytest.fixture(scope="module")
def third_raylet(head: targets.HeadRecord, second_raylet: tuple[str, LocalHead],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LocalHead]]:
    """The second GPU node: with it the head holds only the driver and the controller, as on a cluster."""
    with _raylet(head, tmp_path_factory, "node3") as node:
        yield node


@pytest.fixture
def third_node(third_raylet: tuple[str, LocalHead]) -> str:
    return third_raylet[0]


@pytest.fixture
def second_node(second_raylet: tuple[str, LocalHead]) -> str:
    return second_raylet[0]


def nccl_job(url: str, workdir: Path, logs: dict[str, Path], name: str) -> str:
    """Submit the printer with one training worker per node (`logs`: raydlc's node name -> the NCCL log it prints)."""
    workdir.mkdir()
    (workdir / "print_nccl.py").write_text(NCCL_PRINTER)
    args = []
    for i, (node, log) in enumerate(logs.items()):
        (workdir / f"{i}-{log.name}").write_bytes(log.read_bytes())
        args.append(f"{node.split('/')[1]}={i}-{log.name}")
    p = cli("submit", "print_nccl.py", "--address", url, "--name", name, "--json", "--", *args, cwd=workdir)
    assert p.returncode == 0, p.stderr[-3000:]
    return str(last_json(p)["job_id"])


def nccl_row(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return next(r for r in last_json(p)["criteria"] if r["criterion"] == "nccl")


def test_verify_names_the_node_whose_workers_fell_back_to_sockets(head: targets.HeadRecord, second_node: str, third_node: str,
                                                                   tmp_path: Path) -> None:
    """Two jobs on the same two GPU nodes, one with a node on sockets, one with EFA on both: each verdict
    reads only its own job's training workers' files, so neither leaks into the other, and the head, which
    holds the driver and the TrainController's worker files of each job, is never judged."""
    url = head.dashboard_url
    mixed = nccl_job(url, tmp_path / "a", {second_node: NCCL / "mixed_composed_efa_and_socket" / "node-b.log",
                                           third_node: NCCL / "mixed_composed_efa_and_socket" / "node-a.log"}, "nccl-mixed")
    efa = nccl_job(url, tmp_path / "b", {second_node: NCCL / "mixed_composed_efa_and_socket" / "node-a.log",
                                         third_node: NCCL / "efa_nccl527_noprefix_gdr.log"}, "nccl-efa")
    v = cli("verify", "--address", url, "--job", mixed, "--json", cwd=tmp_path)
    assert v.returncode == 3, v.stderr[-2000:]
    row = nccl_row(v)
    assert row["status"] == "fail" and row["failed_nodes"] == [second_node]
    assert any(e.startswith(f"{second_node}: socket") for e in row["evidence"])
    assert any(e.startswith(f"{third_node}: efa, carried") for e in row["evidence"]) and len(row["evidence"]) == 2
    assert not any("(head)" in e for e in row["evidence"])
    good = nccl_row(cli("verify", "--address", url, "--job", efa, "--json", cwd=tmp_path))
    assert good["status"] == "pass" and len(good["evidence"]) == 2, good
    assert not any("(head)" in e for e in good["evidence"])


# ---- the cluster target: kmock holds nodes and pods, kubectl's port-forward reaches the head ------------


@pytest.fixture(scope="module")
def cluster(head: targets.HeadRecord, home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    sys.path.insert(0, str(TESTS / "doubles"))
    import netpolicy
    import servers
    from world import Kube

    from raydlc.config import load_config
    from raydlc.render.netpol import head_policy
    from raydlc.render.raycluster import CLUSTER_LABEL

    tmp = tmp_path_factory.mktemp("cluster")
    with pytest.MonkeyPatch.context() as mp, servers.kube_server(mp.setattr) as server:
        kube = Kube(server.url)
        ns, name = "ray-train", "ray-train-cluster"
        for node, efa in (("ip-10-0-1-5", "1"), ("ip-10-0-2-7", "0")):
            kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"role": "gpu-worker"}},
                         "status": {"allocatable": {"nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": efa},
                                    "capacity": {"nvidia.com/gpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]}})
        kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ip-10-0-0-9", "labels": {"role": "system"}},
                     "status": {"allocatable": {"cpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]}})
        kube.create({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name, "namespace": ns}, "spec": {}})
        kube.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-ray-token", "namespace": ns},  # what `up` creates
                     "data": {"auth_token": "dW51c2VkLWJ5LWFuLWF1dGgtZGlzYWJsZWQtaGVhZA=="}})
        ready = [{"type": "Ready", "status": "True"}]
        for pod, role, node, ip in ((f"{name}-head", "head", "ip-10-0-0-9", "10.0.0.20"),
                                    (f"{name}-gpu-worker-0", "worker", "ip-10-0-1-5", "10.0.1.21"),
                                    (f"{name}-gpu-worker-1", "worker", "ip-10-0-2-7", "10.0.2.22")):
            kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": ns, "labels": {
                "ray.io/cluster": name, "ray.io/node-type": role, CLUSTER_LABEL: name}}, "spec": {"nodeName": node},
                "status": {"phase": "Running", "conditions": ready, "podIP": ip}})
        labels = {"ray.io/cluster": name, "ray.io/node-type": "head"}
        kube.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{name}-head-svc", "namespace": ns, "labels": labels},
                     "spec": {"selector": labels, "ports": [{"name": "gcs-server", "port": 6379}, {"name": "dashboard", "port": 8265}]}})
        servers.write_kubeconfig(home / ".raydlc" / "eks-cluster-us-east-2" / "kubeconfig", server.url)
        env, log = servers.doubles_env(tmp, sys.executable, {f"{ns}/{name}-head-svc:8265": head.dashboard_url.removeprefix("http://")})
        kube.create(head_policy(load_config(env={}, overrides={"NAMESPACE": ns, "RAY_CLUSTER_NAME": name}, cwd=tmp), name))
        with netpolicy.Kubelet(server.url) as kubelet:  # runs verify's probe pod, judged by that policy
            yield {"kube": kube, "env": env, "log": log, "ns": ns, "name": name, "kubelet": kubelet}


def forwards(log: Path) -> list[dict[str, Any]]:
    recs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [r for r in recs if "port-forward" in r["argv"]]


def test_the_cluster_target_reaches_the_head_through_a_port_forward_it_closes(
    head: targets.HeadRecord, second_node: str, third_node: str, cluster: dict[str, Any], tmp_path: Path
) -> None:
    listed = cli("job", "list", "--json", cwd=tmp_path, env=cluster["env"])
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert {"builtin-1", "nccl-mixed"} <= {j["job_id"] for j in last_json(listed)["jobs"]}
    (fwd,) = forwards(cluster["log"])
    assert fwd["argv"][fwd["argv"].index("port-forward") + 1:] == ["svc/ray-train-cluster-head-svc", ":8265", "--address", "127.0.0.1"]
    assert not local_head.process_alive(fwd["pid"])  # closed when the command ended

    v = cli("verify", "--job", "nccl-mixed", "--json", cwd=tmp_path, env=cluster["env"])
    assert v.returncode == 3, v.stderr[-2000:]
    rows = {r["criterion"]: r for r in last_json(v)["criteria"]}
    assert rows["gpu-nodes"]["status"] == "fail" and rows["gpu-nodes"]["failed_nodes"] == ["ip-10-0-2-7"]
    assert "ip-10-0-2-7: vpc.amazonaws.com/efa allocatable 0" in rows["gpu-nodes"]["evidence"]
    assert rows["pods"]["status"] == "pass"
    assert rows["nccl"]["failed_nodes"] == [second_node]
    assert rows["fi-info"]["status"] == "pass" and sorted(rows["fi-info"]["evidence"]) == sorted(  # the GPU nodes' fi_info, through pinned tasks
        f"{n}: fi_info -p efa lists FI_EP_RDM on rdmap0s31-rdm" for n in (second_node, third_node))
    assert rows["job"]["status"] == "pass"
    # the same probe job's other answers: this head was started without RAYDLC_STORAGE_PATH, and its own
    # dashboard is what every GPU node's task opened; the unlabelled pod was kept out by the policy
    assert rows["storage"]["status"] == "fail" and sorted(rows["storage"]["failed_nodes"]) == sorted((second_node, third_node))
    assert all("no STORAGE_PATH on the driver's node" in e for e in rows["storage"]["evidence"])
    assert rows["head-port"]["status"] == "pass", rows["head-port"]
    assert rows["head-port"]["evidence"][0].endswith("could not open ray-train-cluster-head-svc.ray-train.svc:8265 (timeout)")
    assert [p["metadata"]["labels"] for p in cluster["kubelet"].seen][-1]["app.kubernetes.io/name"] == "raydlc-netprobe"
    assert not [p for p in cluster["kube"].list("Pod", cluster["ns"]) if "netprobe" in p["metadata"]["name"]]  # deleted


def test_the_cluster_target_refuses_a_missing_raycluster_and_a_head_not_ready(cluster: dict[str, Any], tmp_path: Path) -> None:
    kube, ns, name = cluster["kube"], cluster["ns"], cluster["name"]
    before = len(forwards(cluster["log"]))
    kube.patch("Pod", f"{name}-head", {"status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}}, ns)
    p = cli("submit", "--builtin", "--json", cwd=tmp_path, env=cluster["env"])
    assert p.returncode == 1 and p.stdout == "" and f"the head pod {name}-head of RayCluster '{name}' is not Ready" in p.stderr
    kube.delete("RayCluster", name, ns)
    p = cli("job", "list", cwd=tmp_path, env=cluster["env"])
    assert p.returncode == 2 and p.stdout == "" and f"no RayCluster '{name}' in namespace '{ns}'" in p.stderr
    assert len(forwards(cluster["log"])) == before  # nothing was forwarded, let alone submitted


# ---- the whole reference path: up -> submit -> verify -> down --------------------------------------


_world = servers.lifecycle_world("lifecycle_world")  # the lifecycle tests' world, reused
moto_server, kube_server, world = _world.moto_server, _world.kube_server, _world.world


def test_up_submit_verify_down_offline(head: targets.HeadRecord, second_node: str, third_node: str, world: Any, tmp_path: Path) -> None:
    """`up` against moto, kmock and the doubles; the job runs on the local head standing in for the
    cluster's, reached through the kubectl double's port-forward; the gate passes on every criterion."""
    from raydlc import lifecycle
    from raydlc.lifecycle import Timings

    fast = Timings(poll_s=0.1, cluster_s=120, nodegroup_s=120, stack_s=120, helm_s=120, nodes_s=60, plugins_s=60, pods_s=90)  # limits matter only under load
    assert lifecycle.up(world.config(), timings=fast).ok
    world.scenario(forward={"ray-train/ray-train-cluster-head-svc:8265": head.dashboard_url.removeprefix("http://")})
    work = tmp_path / "job"
    work.mkdir()
    (work / "print_nccl.py").write_text(NCCL_PRINTER)
    (work / "efa_a.log").write_bytes((NCCL / "mixed_composed_efa_and_socket" / "node-a.log").read_bytes())
    (work / "efa_b.log").write_bytes((NCCL / "efa_nccl527_noprefix_gdr.log").read_bytes())
    args = [f"{second_node.split('/')[1]}=efa_a.log", f"{third_node.split('/')[1]}=efa_b.log"]
    p = cli("submit", "print_nccl.py", "--name", "reference-path", "--json", "--", *args, cwd=work)
    assert p.returncode == 0 and last_json(p)["target"] == "cluster", p.stderr[-3000:]
    sys.path.insert(0, str(TESTS / "doubles"))
    import netpolicy

    with netpolicy.Kubelet(world.kube.url) as kubelet:  # runs verify's probe pod against the NetworkPolicy `up` applied
        v = cli("verify", "--job", "reference-path", "--json", cwd=tmp_path)
    doc = last_json(v)
    statuses = {r["criterion"]: r["status"] for r in doc["criteria"]}
    # Every criterion passes but storage: the local head standing in for the cluster's was started
    # without the head pod's RAYDLC_STORAGE_PATH and pod identity, so its nodes have no run prefix to prove.
    assert statuses == {**dict.fromkeys(("gpu-nodes", "pods", "fi-info", "nccl", "head-port", "job"), "pass"), "storage": "fail"}, json.dumps(doc, indent=1)
    assert v.returncode == 3 and len(kubelet.seen) == 1 and not kubelet.errors
    storage = next(r for r in doc["criteria"] if r["criterion"] == "storage")
    assert all("no STORAGE_PATH on the driver's node" in e for e in storage["evidence"]), storage
    assert [a for a in world.calls("kubectl") if "port-forward" in a] and all("--address" in a for a in world.calls("kubectl") if "port-forward" in a)
    assert lifecycle.down(world.config(), timings=fast).ok
    assert world.tagged("eks-cluster") == {}


def test_attach_submit_verify_down_on_the_platform_world(head: targets.HeadRecord, second_node: str, third_node: str,
                                                         moto_server: str, tmp_path: Path) -> None:
    """The same path on a cluster a platform team runs (tests/doubles/platform_world.py): `up --attach` with the
    user's namespaced Role, then `submit` and `verify` as that user through KUBE_CONTEXT (the kubectl double's
    port-forward authorised as the user), the job on the local head and its two GPU raylets standing in for the
    RayCluster's pods; the gate proves the transport (EFA carried on both nodes, fi_info, the found GPU nodes, the
    head's port kept by the NetworkPolicy) with only raydlc's namespaced rights; `down --attach` leaves the platform's
    release, CRDs, nodes and the other team's RayCluster as they were. Without STORAGE_PATH the storage row is not
    applicable (raydlc made no bucket); the pods run as the SERVICE_ACCOUNT given."""
    import netpolicy
    import platform_world
    from kuberay import Operator

    from raydlc.config import load_config
    from raydlc.lifecycle import Timings, orders
    from raydlc.lifecycle.context import with_plain_kubeconfig

    ns, ray = platform_world.NAMESPACE, "ray-train-cluster"
    settings = {"ATTACH": "true", "KUBE_CONTEXT": "platform", "NAMESPACE": ns, "SERVICE_ACCOUNT": "team-a-ray",
                "IDLE_MINUTES": "0", "GPU_NODE_COUNT": "2"}
    fast = Timings(poll_s=0.1, pods_s=90, stuck_s=60)
    servers.reset_moto(moto_server)
    with pytest.MonkeyPatch.context() as mp:
        for k in list(os.environ):
            if k.startswith(("RAYDLC_", "AWS_", "KUBECONFIG")):
                mp.delenv(k)
        aws = {"AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_MAX_ATTEMPTS": "1", "AWS_EC2_METADATA_DISABLED": "true"}
        for k, v in aws.items():
            mp.setenv(k, v)
        with platform_world.platform_cluster(mp.setattr, tmp=tmp_path) as p, Operator(p.server.url) as op:
            mp.setenv("KUBECONFIG", str(p.kubeconfig()))
            p.kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "team-a-ray", "namespace": ns}})
            p.settled()
            before = p.outside(ray)
            cfg = load_config(env={f"RAYDLC_{k}": v for k, v in settings.items()})
            assert orders.up(with_plain_kubeconfig(cfg), timings=fast).ok
            pods = [x for x in p.kube.list("Pod", ns) if (x["metadata"].get("labels") or {}).get("ray.io/cluster") == ray]
            assert pods and {x["spec"].get("serviceAccountName") for x in pods} == {"team-a-ray"}
            p.rbac.refused.clear()  # from here on, every refusal would be submit's or verify's

            work = tmp_path / "job"
            work.mkdir()
            (work / "print_nccl.py").write_text(NCCL_PRINTER)
            (work / "efa_a.log").write_bytes((NCCL / "mixed_composed_efa_and_socket" / "node-a.log").read_bytes())
            (work / "efa_b.log").write_bytes((NCCL / "efa_nccl527_noprefix_gdr.log").read_bytes())
            env, log = servers.doubles_env(tmp_path, sys.executable, {f"{ns}/{ray}-head-svc:8265": head.dashboard_url.removeprefix("http://")})
            env.update({f"RAYDLC_{k}": v for k, v in settings.items()}, KUBECONFIG=str(p.kubeconfig()), **aws)
            args = [f"{second_node.split('/')[1]}=efa_a.log", f"{third_node.split('/')[1]}=efa_b.log"]
            s = cli("submit", "print_nccl.py", "--name", "attached-path", "--json", "--", *args, cwd=work, env=env)
            assert s.returncode == 0 and last_json(s)["target"] == "cluster", s.stderr[-3000:]
            with netpolicy.Kubelet(p.server.url) as kubelet:  # runs verify's probe pod against the NetworkPolicy up made
                v = cli("verify", "--job", "attached-path", "--json", cwd=work, env=env)
            doc = last_json(v)
            rows = {r["criterion"]: r for r in doc["criteria"]}
            assert {c: r["status"] for c, r in rows.items()} == {
                **dict.fromkeys(("gpu-nodes", "pods", "fi-info", "nccl", "head-port", "job"), "pass"), "storage": "not applicable"}, json.dumps(doc, indent=1)
            assert v.returncode == 0 and doc["passed"] and len(kubelet.seen) == 1 and not kubelet.errors
            assert sorted(e.split(":")[0] for e in rows["gpu-nodes"]["evidence"]) == ["gpu-0", "gpu-1"]  # the nodes its workers hold
            assert all("efa, carried" in e for e in rows["nccl"]["evidence"]) and len(rows["nccl"]["evidence"]) == 2
            assert not p.rbac.refused, p.rbac.refused  # every read and write of submit and verify was the user's Role's
            forwards = [json.loads(line)["argv"] for line in log.read_text().splitlines() if "port-forward" in line]
            assert len(forwards) == 2 and all(a[a.index("--context") + 1] == "platform" for a in forwards)
            assert not [x for x in p.kube.list("Pod", ns) if "netprobe" in x["metadata"]["name"]]  # the probe pod is gone
            assert p.outside(ray) == before  # submit and verify made nothing outside raydlc's objects in the namespace

            assert orders.down(with_plain_kubeconfig(cfg), timings=fast).ok
            assert p.made() == [] and p.outside(ray) == before
            assert p.kube.get("RayCluster", platform_world.OTHER_TEAM_CLUSTER, ns) is not None
        assert not op.errors, op.errors[:3]


# ---- down --local, last -------------------------------------------------------------------------


def test_down_local_ends_the_head_and_everything_it_started(head: targets.HeadRecord, second_raylet: tuple[str, LocalHead],
                                                              third_raylet: tuple[str, LocalHead], tmp_path: Path) -> None:
    for node in (second_raylet, third_raylet):
        node[1].stop()  # the worker nodes leave first, as a cluster's worker pods do
    p = cli("down", "--local", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert last_json(p)["local"] == {"pid": head.pid, "dashboard": head.dashboard_url, "ended": True, "doubted_record": None}
    with pytest.raises(ProcessLookupError):
        os.killpg(head.pid, 0)  # no process of the head's group is left
    assert not Path(head.temp_dir).exists() and targets.check_record() is None  # no record left, not even a doubted one
    gone = cli("job", "list", "--local", cwd=tmp_path)
    assert gone.returncode == 1 and "no local Ray head of raydlc runs" in gone.stderr
