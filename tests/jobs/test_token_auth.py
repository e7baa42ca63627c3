"""Ray token auth against a real local head started the way KubeRay starts a head pod with `authOptions`
(RAY_AUTH_MODE=token, RAY_AUTH_TOKEN): a request without the token is refused; raydlc with it lists,
submits and reads jobs, on an --address target and on the cluster target (the token read from the
Secret in kmock, the head reached through the kubectl double's port-forward); the token appears in no
output and no file raydlc wrote. One head for the module, ended by its PID.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raydlc.edges import local_head
from raydlc.edges.local_head import LocalHead

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
RAYDLC = Path(sys.executable).with_name("raydlc")
TOKEN = secrets.token_urlsafe(32)
HELLO = "print('hello from a token-auth head', flush=True)\n"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        yield home


@pytest.fixture(scope="module")
def head(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHead]:
    with local_head.start_head(num_cpus=1, log_dir=tmp_path_factory.mktemp("head-log"), token=TOKEN, timeout=240) as h:
        yield h


@pytest.fixture(scope="module")
def outputs() -> list[str]:
    """Every stdout and stderr of the module's raydlc commands, for the last test to search."""
    return []


def cli(outputs: list[str], *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "RAY_ADDRESS", "RAY_AUTH")) and k != "KUBECONFIG"}
    full.update(env or {})
    p = subprocess.run([str(RAYDLC), *args], capture_output=True, text=True, cwd=cwd, env=full, timeout=300)
    outputs += [p.stdout, p.stderr]
    return p


def last_json(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert p.stdout.strip(), p.stderr[-3000:]
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def status_of(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def error_line(p: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    return lines[0]


def test_the_head_refuses_a_request_without_the_token_or_with_another(head: LocalHead) -> None:
    for path in ("/api/version", "/api/jobs/"):
        assert status_of(head.dashboard_url + path, {}) == 401
        assert status_of(head.dashboard_url + path, {"Authorization": "Bearer " + secrets.token_urlsafe(32)}) == 403
        assert status_of(head.dashboard_url + path, {"Authorization": f"Bearer {TOKEN}"}) == 200


def test_raydlc_without_the_token_or_with_another_stops_in_one_line(head: LocalHead, outputs: list[str], tmp_path: Path) -> None:
    p = cli(outputs, "job", "list", "--address", head.dashboard_url, cwd=tmp_path)
    assert p.returncode == 1 and "wants a Ray token and raydlc has none" in error_line(p)
    assert "RAY_AUTH_TOKEN" in p.stderr  # the hint names where the token goes
    p = cli(outputs, "job", "list", "--address", head.dashboard_url, cwd=tmp_path, env={"RAY_AUTH_TOKEN": secrets.token_urlsafe(32)})
    assert p.returncode == 1 and "refused raydlc's token" in error_line(p)


def test_with_the_token_an_address_target_submits_lists_and_reads_jobs(
    head: LocalHead, outputs: list[str], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    (tmp_path / "hello.py").write_text(HELLO)
    env = {"RAY_AUTH_TOKEN": TOKEN}
    p = cli(outputs, "submit", "hello.py", "--address", head.dashboard_url, "--name", "hello-1", "--json", cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert last_json(p)["status"] == "SUCCEEDED"
    token_file = tmp_path_factory.mktemp("token") / "auth_token"  # written by the test, as a user would
    token_file.write_text(TOKEN + "\n")
    by_file = {"RAY_AUTH_TOKEN_PATH": str(token_file)}
    listed = last_json(cli(outputs, "job", "list", "--address", head.dashboard_url, "--json", cwd=tmp_path, env=by_file))
    assert "hello-1" in {j["job_id"] for j in listed["jobs"]}
    status = last_json(cli(outputs, "job", "status", "hello-1", "--address", head.dashboard_url, "--json", cwd=tmp_path, env=by_file))
    assert status["status"] == "SUCCEEDED" and TOKEN not in json.dumps(status["runtime_env"])
    logs = cli(outputs, "job", "logs", "hello-1", "--address", head.dashboard_url, cwd=tmp_path, env=env)
    assert logs.returncode == 0 and "hello from a token-auth head" in logs.stdout
    v = cli(outputs, "verify", "--address", head.dashboard_url, "--job", "hello-1", "--json", cwd=tmp_path, env=env)
    assert v.returncode in (0, 3), v.stderr[-2000:]  # the gate judged (a print job has no NCCL): the head answered every call
    assert last_json(v)["criteria"] and "refused" not in v.stderr


@pytest.fixture(scope="module")
def cluster(head: LocalHead, home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """kmock with the RayCluster, its Ready head pod and Service, and the token Secret `up` creates; the
    kubectl double's port-forward relays to the token-auth head."""
    sys.path.insert(0, str(TESTS / "doubles"))
    import servers
    from world import Kube

    tmp = tmp_path_factory.mktemp("cluster")
    with pytest.MonkeyPatch.context() as mp, servers.kube_server(mp.setattr) as server:
        kube = Kube(server.url)
        ns, name = "ray-train", "ray-train-cluster"
        labels = {"ray.io/cluster": name, "ray.io/node-type": "head"}
        kube.create({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name, "namespace": ns}, "spec": {}})
        kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-head", "namespace": ns, "labels": labels},
                     "spec": {"nodeName": "ip-10-0-0-9"}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
        kube.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{name}-head-svc", "namespace": ns, "labels": labels},
                     "spec": {"selector": labels, "ports": [{"name": "dashboard", "port": 8265}]}})
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-ray-token", "namespace": ns},
                  "data": {"auth_token": base64.b64encode(TOKEN.encode()).decode()}}
        kube.create(secret)
        servers.write_kubeconfig(home / ".raydlc" / "eks-cluster-us-east-2" / "kubeconfig", server.url)
        env, log = servers.doubles_env(tmp, sys.executable, {f"{ns}/{name}-head-svc:8265": head.dashboard_url.removeprefix("http://")})
        yield {"kube": kube, "env": env, "ns": ns, "secret": secret, "log": log}


def test_the_cluster_target_reads_the_token_from_its_secret(cluster: dict[str, Any], outputs: list[str], tmp_path: Path) -> None:
    listed = cli(outputs, "job", "list", "--json", cwd=tmp_path, env=cluster["env"])
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "hello-1" in {j["job_id"] for j in last_json(listed)["jobs"]}


def test_the_cluster_target_without_its_secret_or_with_a_stale_one_names_the_fix(
    cluster: dict[str, Any], outputs: list[str], tmp_path: Path
) -> None:
    kube, ns, secret = cluster["kube"], cluster["ns"], cluster["secret"]
    kube.delete("Secret", secret["metadata"]["name"], ns)
    p = cli(outputs, "job", "list", cwd=tmp_path, env=cluster["env"])
    line = error_line(p)
    assert p.returncode == 1 and f"the Ray token Secret {ns}/ray-train-cluster-ray-token is missing" in line
    assert "raydlc up --yes" in p.stderr and "keeps the old one" in p.stderr  # the hint: what `up` does, and why pods restart
    stale = {**secret, "data": {"auth_token": base64.b64encode(secrets.token_urlsafe(32).encode()).decode()}}
    kube.create(stale)  # made anew by hand (or by `up` without recreating the pods): the head still holds the first token
    p = cli(outputs, "job", "list", cwd=tmp_path, env=cluster["env"])
    assert p.returncode == 1 and "refused raydlc's token" in error_line(p)
    assert "kubectl -n ray-train delete pods -l ray.io/cluster=ray-train-cluster" in p.stderr
    kube.delete("Secret", secret["metadata"]["name"], ns)
    kube.create(secret)


def test_the_token_is_in_no_output_and_no_file_raydlc_wrote(head: LocalHead, home: Path, outputs: list[str],
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    assert len(outputs) >= 16  # every command above was recorded
    assert not [o for o in outputs if TOKEN in o]
    written = [p for root in (home, tmp_path_factory.getbasetemp()) for p in root.rglob("*")
               if p.is_file() and p.name != "auth_token" and not p.is_symlink()]
    assert head.log in written  # the head's own output, which raydlc writes
    assert not [str(p) for p in written if TOKEN.encode() in p.read_bytes()]
