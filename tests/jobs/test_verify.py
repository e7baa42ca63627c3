"""The gate, pure: facts in, rows out — real NCCL logs from the corpus, fi_info answers, Kubernetes facts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from raydlc.checks import gate, transport_bench
from raydlc.checks.gate import FAIL, NA, PASS, Facts, JobFact, KubeNode, Pod
from raydlc.edges.ray_dashboard import Job, RayNode
from raydlc.jobs.worker_logs import JobLogs
from raydlc.nccl.collect import analyze_node_paths
from raydlc.nccl.fabric import entries, judge

NCCL = Path(__file__).resolve().parents[1] / "data" / "nccl"
EFA_A = NCCL / "mixed_composed_efa_and_socket" / "node-a.log"
SOCKET_B = NCCL / "mixed_composed_efa_and_socket" / "node-b.log"
EFA_B = NCCL / "efa_nccl527_noprefix_gdr.log"
SELECTED_ONLY = NCCL / "efa_ofi161_provider_selected_nothing_crossed.log"

# The shape `fi_info -p efa` prints on an EFA node: the recorded double's answer, one copy for both.
_double = importlib.util.spec_from_file_location("fi_info_double", Path(__file__).resolve().parents[1] / "doubles" / "fi_info.py")
assert _double is not None and _double.loader is not None
_fi_info = importlib.util.module_from_spec(_double)
_double.loader.exec_module(_fi_info)
FI_INFO_EFA: str = _fi_info.EFA
JOB = JobFact("train-1", "02000000", "SUCCEEDED")


def _rows(v: gate.GateVerdict) -> dict[str, gate.Row]:
    return {r.criterion: r for r in v.rows}


def _nccl(groups: dict[str, list[Path]]) -> tuple[object, dict[str, list[str]]]:
    report = analyze_node_paths({n: [str(p) for p in ps] for n, ps in groups.items()})
    return report, {n: [p.name for p in ps] for n, ps in groups.items()}


def test_on_the_local_target_network_rows_are_not_applicable_never_pass() -> None:
    report, files = _nccl({"node-a": [EFA_A]})  # even EFA lines on this machine prove nothing about a cluster
    v = gate.gate(Facts("local", JOB, fabric=[judge("here", {"fi_info": "/usr/bin/fi_info", "returncode": 0, "output": FI_INFO_EFA})],
                          nccl=report, nccl_files=files))  # type: ignore[arg-type]
    rows = _rows(v)
    assert [rows[c].status for c in gate.CRITERIA] == [NA, NA, NA, NA, NA, NA, PASS]
    assert v.passed and v.to_dict()["passed"] is True
    assert "gloo" in rows["nccl"].evidence[0]


def test_the_node_that_fell_back_to_sockets_fails_the_gate_by_name() -> None:
    report, files = _nccl({"10.0.1.5/aaaa1111": [EFA_A], "10.0.2.7/bbbb2222": [SOCKET_B]})
    rows = _rows(gate.gate(Facts("address", JOB, nccl=report, nccl_files=files)))  # type: ignore[arg-type]
    assert rows["nccl"].status == FAIL and rows["nccl"].failed_nodes == ["10.0.2.7/bbbb2222"]
    assert any(e.startswith("10.0.2.7/bbbb2222: socket") for e in rows["nccl"].evidence)
    assert any(e.startswith("10.0.1.5/aaaa1111: efa, carried") for e in rows["nccl"].evidence)


def test_efa_carried_on_every_node_passes_the_nccl_row_and_selected_is_not_enough() -> None:
    report, files = _nccl({"n1": [EFA_A], "n2": [EFA_B]})
    assert _rows(gate.gate(Facts("address", JOB, nccl=report, nccl_files=files)))["nccl"].status == PASS  # type: ignore[arg-type]
    report, files = _nccl({"n1": [EFA_A], "n2": [SELECTED_ONLY]})
    row = _rows(gate.gate(Facts("address", JOB, nccl=report, nccl_files=files)))["nccl"]  # type: ignore[arg-type]
    assert row.status == FAIL and row.failed_nodes == ["n2"] and "only selected" in " ".join(row.evidence)


def test_a_node_with_worker_files_but_no_nccl_lines_fails_and_one_node_proves_nothing(tmp_path: Path) -> None:
    quiet = tmp_path / "worker-1-02000000-9.out"
    quiet.write_text(":job_id:02000000\nhello\n")
    report, files = _nccl({"n1": [EFA_A], "n2": [quiet]})
    row = _rows(gate.gate(Facts("cluster", JOB, nccl=report, nccl_files=files)))["nccl"]  # type: ignore[arg-type]
    assert row.failed_nodes == ["n2"] and "no NCCL lines" in " ".join(row.evidence)
    report, files = _nccl({"n1": [EFA_A]})
    row = _rows(gate.gate(Facts("cluster", JOB, nccl=report, nccl_files=files)))["nccl"]  # type: ignore[arg-type]
    assert row.status == FAIL and "one node" in row.evidence[-1]


def test_kubernetes_rows_name_the_node_without_efa_and_the_pod_not_running() -> None:
    nodes = [KubeNode("ip-10-0-1-5", True, 4, 1, True), KubeNode("ip-10-0-2-7", True, 4, 0, True), KubeNode("ip-10-0-0-9", False, 0, 0, True)]
    pods = [Pod("rc-head", "head", "Running", True), Pod("rc-w-0", "worker", "Running", True), Pod("rc-w-1", "worker", "Pending", False)]
    rows = _rows(gate.gate(Facts("cluster", JOB, gpus_per_node=4, gpu_node_count=2, kube_nodes=nodes, pods=pods)))
    assert rows["gpu-nodes"].status == FAIL and rows["gpu-nodes"].failed_nodes == ["ip-10-0-2-7"]
    assert "ip-10-0-2-7: vpc.amazonaws.com/efa allocatable 0" in rows["gpu-nodes"].evidence
    assert rows["pods"].status == FAIL and rows["pods"].failed_nodes == ["rc-w-1"]
    good = [KubeNode("a", True, 4, 1, True), KubeNode("b", True, 4, 2, True)]
    rows = _rows(gate.gate(Facts("cluster", JOB, gpus_per_node=4, gpu_node_count=2, kube_nodes=good, pods=pods[:2])))
    assert rows["gpu-nodes"].status == PASS and rows["pods"].status == PASS
    rows = _rows(gate.gate(Facts("cluster", JOB, gpus_per_node=4, gpu_node_count=3, kube_nodes=good, pods=pods[:2])))
    assert rows["gpu-nodes"].status == FAIL and rows["gpu-nodes"].evidence[0] == "2 GPU nodes found, GPU_NODE_COUNT is 3"


def test_fi_info_answers_are_judged_per_node() -> None:
    assert [e["type"] for e in entries(FI_INFO_EFA)] == ["FI_EP_RDM", "FI_EP_DGRAM"]
    ok = judge("gpu-1", {"fi_info": "/opt/amazon/efa/bin/fi_info", "returncode": 0, "output": FI_INFO_EFA})
    assert ok.rdm and ok.domains == ["rdmap0s31-rdm"]
    none = judge("gpu-2", {"fi_info": "/opt/amazon/efa/bin/fi_info", "returncode": 1, "output": "fi_getinfo: -61 (No data available)\n"})
    tcp = judge("gpu-3", {"fi_info": "/usr/bin/fi_info", "returncode": 0, "output": FI_INFO_EFA.replace("efa", "tcp")})
    missing = judge("gpu-4", {"fi_info": None, "returncode": None, "output": ""})
    assert not none.rdm and "-61" in none.detail and not tcp.rdm and not missing.installed
    row = _rows(gate.gate(Facts("cluster", JOB, fabric=[ok, none, tcp, missing])))["fi-info"]
    assert row.status == FAIL and row.failed_nodes == ["gpu-2", "gpu-3", "gpu-4"]
    assert _rows(gate.gate(Facts("cluster", JOB, fabric=[ok])))["fi-info"].status == PASS
    assert _rows(gate.gate(Facts("address", JOB, fabric=None, fabric_note="no GPU node in the Ray cluster to probe")))["fi-info"].status == FAIL
    assert _rows(gate.gate(Facts("cluster", JOB, expect="socket", fabric=[none])))["fi-info"].status == NA


@pytest.mark.parametrize(("job", "status"), [(JOB, PASS), (JobFact("t", "03000000", "FAILED", "exit 1"), FAIL), (None, FAIL)])
def test_the_job_row_follows_the_jobs_api(job: JobFact | None, status: str) -> None:
    assert _rows(gate.gate(Facts("cluster", job)))["job"].status == status


# ---- the transport comparison --------------------------------------------------------------


def _job(sid: str, status: str = "SUCCEEDED") -> Job:
    return Job(sid, "02000000", status, "python -m raydlc.train", None, 1.0, 2.0, {}, 0, {})


def _logs(groups: dict[str, list[Path]]) -> JobLogs:
    report, files = _nccl(groups)
    return JobLogs(report, files, [RayNode("x", "10.0.0.1", False, True, 4.0)])  # type: ignore[arg-type]


def test_a_speedup_counts_only_when_each_run_proved_its_own_transport() -> None:
    efa = transport_bench.judge("configured", "efa", _job("a"), {"steps": 20, "step_time_s": 2.0, "tokens_per_s": 1000.0},
                      _logs({"n1": [EFA_A], "n2": [EFA_B]}), target="cluster")
    tcp = transport_bench.judge("sockets", "socket", _job("b"), {"steps": 20, "step_time_s": 4.0, "tokens_per_s": 500.0},
                      _logs({"n1": [SOCKET_B], "n2": [SOCKET_B]}), target="cluster")
    assert efa.counts and tcp.counts
    doc = transport_bench.compare([efa, tcp], target="cluster")
    assert doc["applicable"] and doc["speedup"] == pytest.approx(2.0) and doc["tokens_speedup"] == pytest.approx(2.0)
    # the "EFA" run that fell back on one node is not an EFA figure
    fell = transport_bench.judge("configured", "efa", _job("c"), {"steps": 20, "step_time_s": 4.0, "tokens_per_s": 500.0},
                       _logs({"n1": [EFA_A], "n2": [SOCKET_B]}), target="cluster")
    doc = transport_bench.compare([fell, tcp], target="cluster")
    assert not fell.counts and doc["speedup"] is None and not doc["applicable"] and "n2" in doc["reason"]


def test_on_the_local_target_there_is_nothing_to_compare() -> None:
    doc = transport_bench.compare([], target="local")
    assert doc["applicable"] is False and doc["speedup"] is None and "gloo" in doc["reason"]
