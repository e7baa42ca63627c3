"""The gate after a run: facts about the cluster and the job in, one row per criterion out.

Each row is pass, fail or "not applicable", with the evidence it rests on and the nodes that
failed it named. "Not applicable" is for a criterion that cannot exist on the target — the
local target has no Kubernetes, no EFA and no NCCL (it trains over gloo) — never a softer
"pass": a cluster's row never says it. Pure: gathering the facts is the edges' job
(`raydlc.jobs` for the Ray side, the Kubernetes gateway for nodes and pods).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raydlc.telemetry.fabric import Fabric
    from raydlc.telemetry.nccl import NcclReport

PASS, FAIL, NA = "pass", "fail", "not applicable"
CRITERIA = ("gpu-nodes", "pods", "fi-info", "nccl", "job")
TITLES = {
    "gpu-nodes": "GPU nodes: nvidia.com/gpu = GPUS_PER_NODE, vpc.amazonaws.com/efa >= 1",
    "pods": "head Ready, every worker Running",
    "fi-info": "fi_info -p efa lists an RDM endpoint on every GPU node",
    "nccl": "NCCL carried the job over {expect} on every node",
    "job": "the job SUCCEEDED",
}


@dataclass(frozen=True)
class JobFact:
    submission_id: str
    job_id: str | None
    status: str
    message: str | None = None


@dataclass(frozen=True)
class KubeNode:
    name: str
    gpu_node: bool  # labelled or sized as a GPU worker node
    gpus: int  # allocatable nvidia.com/gpu
    efa: int  # allocatable vpc.amazonaws.com/efa
    ready: bool


@dataclass(frozen=True)
class Pod:
    name: str
    role: str  # head | worker
    phase: str
    ready: bool
    node: str | None = None


@dataclass
class Facts:
    target: str  # local | address | cluster
    job: JobFact | None
    expect: str = "efa"
    gpus_per_node: int | None = None
    gpu_node_count: int | None = None
    kube_nodes: list[KubeNode] | None = None  # None: this target has no Kubernetes channel
    pods: list[Pod] | None = None
    fabric: list[Fabric] | None = None  # the GPU nodes' fi_info answers; None: not probed
    fabric_note: str | None = None  # why there is no answer to judge
    nccl: NcclReport | None = None
    nccl_files: dict[str, list[str]] = field(default_factory=dict)  # node -> the job's worker files read there


@dataclass(frozen=True)
class Row:
    criterion: str
    title: str
    status: str
    evidence: list[str]
    failed_nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    target: str
    job: JobFact | None
    rows: list[Row]

    @property
    def passed(self) -> bool:
        return all(r.status != FAIL for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "job": asdict(self.job) if self.job else None,
            "passed": self.passed,
            "criteria": [asdict(r) for r in self.rows],
        }


def gate(f: Facts) -> Verdict:
    rows = [_gpu_nodes(f), _pods(f), _fi_info(f), _nccl(f), _job(f)]
    return Verdict(f.target, f.job, rows)


def _row(criterion: str, status: str, evidence: list[str], failed: list[str] | None = None, **fmt: str) -> Row:
    return Row(criterion, TITLES[criterion].format(**fmt), status, evidence, failed or [])


def _no_kube(f: Facts) -> str:
    return f"the {f.target} target has no Kubernetes API to read" if f.target != "local" else "a local Ray head runs on no Kubernetes node"


def _gpu_nodes(f: Facts) -> Row:
    if f.kube_nodes is None:
        return _row("gpu-nodes", NA, [_no_kube(f)])
    gpu = [n for n in f.kube_nodes if n.gpu_node]
    evidence, failed = [], []
    for n in gpu:
        wrong = []
        if f.gpus_per_node is not None and n.gpus != f.gpus_per_node:
            wrong.append(f"nvidia.com/gpu allocatable {n.gpus}, GPUS_PER_NODE is {f.gpus_per_node}")
        if n.efa < 1:
            wrong.append(f"vpc.amazonaws.com/efa allocatable {n.efa}")
        if not n.ready:
            wrong.append("not Ready")
        if wrong:
            failed.append(n.name)
            evidence.append(f"{n.name}: {'; '.join(wrong)}")
        else:
            evidence.append(f"{n.name}: {n.gpus} GPUs, {n.efa} EFA allocatable, Ready")
    if f.gpu_node_count is not None and len(gpu) != f.gpu_node_count:
        evidence.insert(0, f"{len(gpu)} GPU nodes found, GPU_NODE_COUNT is {f.gpu_node_count}")
        return _row("gpu-nodes", FAIL, evidence, failed)
    if not gpu:
        return _row("gpu-nodes", FAIL, ["no GPU node in the cluster"])
    return _row("gpu-nodes", FAIL if failed else PASS, evidence, failed)


def _pods(f: Facts) -> Row:
    if f.pods is None:
        return _row("pods", NA, [_no_kube(f)])
    heads = [p for p in f.pods if p.role == "head"]
    workers = [p for p in f.pods if p.role == "worker"]
    evidence, failed = [], []
    if not heads:
        evidence.append("no head pod")
    for p in heads:
        ok = p.ready and p.phase == "Running"
        evidence.append(f"head {p.name}: {p.phase}, {'Ready' if p.ready else 'not Ready'}")
        if not ok:
            failed.append(p.name)
    if not workers:
        evidence.append("no worker pod")
    for p in workers:
        evidence.append(f"worker {p.name}: {p.phase}" + (f" on {p.node}" if p.node else ""))
        if p.phase != "Running":
            failed.append(p.name)
    ok = bool(heads) and bool(workers) and not failed
    return _row("pods", PASS if ok else FAIL, evidence, failed)


def _fi_info(f: Facts) -> Row:
    if f.expect != "efa":
        return _row("fi-info", NA, [f"--expect {f.expect}: EFA is not what this run should use"])
    answers = f.fabric or []
    if f.target == "local":
        seen = [a.evidence for a in answers] or [f.fabric_note or "not probed"]
        if any(a.rdm for a in answers):
            seen.append("an EFA device on this machine still makes no multi-node run: the local target trains over gloo")
        return _row("fi-info", NA, seen)
    if f.fabric is None or not answers:
        return _row("fi-info", FAIL, [f.fabric_note or "the fi_info probe did not run"])
    failed = [a.node for a in answers if not a.rdm]
    return _row("fi-info", FAIL if failed else PASS, [a.evidence for a in answers], failed)


def _nccl(f: Facts) -> Row:
    expect = f.expect
    if f.target == "local":
        return _row("nccl", NA, _local_nccl_evidence(f), expect=expect)
    if f.job is None or f.job.job_id is None:
        return _row("nccl", FAIL, ["no job whose workers' logs could be read (the job never connected to Ray)"], expect=expect)
    if not f.nccl_files or f.nccl is None:
        return _row("nccl", FAIL, [f"no worker log file of job {f.job.job_id} on any node"], expect=expect)
    report = f.nccl
    hosts = {h.host: h for h in report.hosts}
    evidence, failed = [], []
    for node, files in sorted(f.nccl_files.items()):
        h = hosts.get(node)
        if h is None:
            failed.append(node)
            evidence.append(f"{node}: no NCCL lines in {len(files)} worker log files (NCCL_DEBUG=INFO unset?)")
            continue
        ranks = f"{len(h.ranks)} ranks" if h.ranks else "ranks not numbered"
        if h.inter_node == expect and h.proof == "carried":
            evidence.append(f"{node}: {expect}, carried by channel lines ({ranks}, {len(files)} files)")
        else:
            failed.append(node)
            what = h.inter_node or "no inter-node transport"
            proof = {"selected": "only selected, no channel line shows traffic", None: "no proof"}.get(h.proof, h.proof or "")
            evidence.append(f"{node}: {what} ({proof}; {ranks})" + (f" — {h.why[0]}" if h.why and h.told_by != "caller" else ""))
    if report.fallback:
        evidence.append(f"NCCL fell back from {report.fallback_from or 'the selected network'}")
    if report.errors:
        evidence.append(f"{len(report.errors)} NCCL errors, first: {report.errors[0].text[:160]}")
    ok = not failed and not report.fallback and not report.errors
    if ok and len(f.nccl_files) < 2:
        evidence.append("one node: no inter-node traffic to prove")
        ok = False
    return _row("nccl", PASS if ok else FAIL, evidence, failed, expect=expect)


def _local_nccl_evidence(f: Facts) -> list[str]:
    files = sum(len(v) for v in f.nccl_files.values())
    if f.job is None:
        return ["a local run trains over gloo: NCCL carries nothing"]
    lines = "no NCCL lines" if f.nccl is None or not f.nccl.ranks else f"NCCL verdict {f.nccl.verdict} on one machine"
    return [f"{files} worker log files of job {f.job.job_id or '?'} read: {lines}; a local run trains over gloo"]


def _job(f: Facts) -> Row:
    if f.job is None:
        return _row("job", FAIL, ["no job to verify: give --job ID (raydlc job list shows them)"])
    j = f.job
    if j.status == "SUCCEEDED":
        return _row("job", PASS, [f"{j.submission_id} SUCCEEDED"])
    return _row("job", FAIL, [f"{j.submission_id} is {j.status}" + (f": {j.message}" if j.message else "")])
