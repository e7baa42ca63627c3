"""The gate after a run: facts about the cluster and the job in, one row per criterion out.

Each row is pass, fail or "not applicable", with the evidence it rests on and the nodes that
failed it named. "Not applicable" is for a criterion that cannot exist on the target — the
local target has no Kubernetes, no EFA and no NCCL (it trains over gloo) — never a softer
"pass": a cluster's row never says it. `collect` gathers the frozen facts in one place, through
the edges it is handed (the head's `Dashboard`, on a cluster the Kubernetes gateway); `gate` is
pure: facts in, rows out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raydlc.checks.head_isolation import HeadReach
    from raydlc.checks.storage_access import StoreAnswer
    from raydlc.config import Config
    from raydlc.edges.kube import Kube
    from raydlc.edges.ray_dashboard import Dashboard, Job, RayNode
    from raydlc.jobs.targets import Reached
    from raydlc.nccl import NcclReport
    from raydlc.nccl.fabric import Fabric

PASS, FAIL, NA = "pass", "fail", "not applicable"
CRITERIA = ("gpu-nodes", "pods", "fi-info", "nccl", "storage", "head-port", "job")
TITLES = {
    "gpu-nodes": "GPU nodes: nvidia.com/gpu = GPUS_PER_NODE, vpc.amazonaws.com/efa >= 1 (with --expect efa)",
    "pods": "head Ready, every worker Running",
    "fi-info": "fi_info -p efa lists an RDM endpoint on every GPU node",
    "nccl": "NCCL carried the job over {expect} on every node",
    "storage": "every GPU node writes, reads, deletes under the run prefix; a write outside is refused",
    "head-port": "a pod without the Ray labels cannot open the head's dashboard port, the Ray pods can",
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
    service_account: str | None = None  # spec.serviceAccountName: the identity the pod's cloud calls are made as


@dataclass(frozen=True)
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
    nccl_files: dict[str, list[str]] = field(default_factory=dict)  # node -> the job's training workers' files read there
    nccl_workers: dict[str, list[int]] | None = None  # node -> the PIDs of the job's training workers; None: not looked up
    nccl_lost: dict[str, str] = field(default_factory=dict)  # node -> why some of its workers show no NCCL line
    storage_kind: str = "unset"  # s3 | path | unset: what STORAGE_PATH is where the probe looked
    storage: list[StoreAnswer] | None = None  # the GPU nodes' probe answers; None: not probed
    storage_note: str | None = None  # why there is no answer to judge
    head_reach: HeadReach | None = None  # both sides of the head-port probe; None: not probed
    head_note: str | None = None
    kube_note: str | None = None  # why the nodes could not be read (attached: a cluster read the platform refused)
    storage_identity: str | None = None  # attached: the ServiceAccount(s) the GPU workers' pods, so the probes, run as


@dataclass(frozen=True)
class KubeFacts:
    """What Kubernetes says: the nodes, the RayCluster's pods, and each pod's IP (a Ray node's name) to its pod name."""

    nodes: list[KubeNode]
    pods: list[Pod]
    names: dict[str, str]
    note: str | None = None  # why `nodes` is empty although the cluster has nodes


def collect(reached: Reached, cfg: Config, *, job_id: str | None = None, expect: str = "efa") -> Facts:
    """Every fact the gate judges, read once: the job (the named one, else the newest), Kubernetes'
    nodes and pods on a cluster, the job's training workers' logs per node, and the GPU nodes' probes
    (fi_info, the run prefix, the head's port) in one job; on a cluster, the unlabelled probe pod."""
    from raydlc.jobs import control, worker_logs

    dash, target = reached.dashboard, reached.target.kind
    job = control.require(dash, job_id, reached.target.where, reached.target.flag) if job_id else control.latest_job(dash)
    if job is None:  # the gate proves a job's own logs: with none there is nothing to judge
        from raydlc.errors import InputError

        raise InputError(f"verify needs a job, and {reached.target.where} has run none", hint=f"raydlc submit --builtin{reached.target.flag}")
    kube = kube_facts(reached.kube, cfg) if reached.kube is not None else None
    names = kube.names if kube else None
    logs = worker_logs.job_nccl(dash, job.job_id, names) if job is not None and job.job_id else None
    kind, uri = storage_target(cfg, target)
    head = f"{reached.head.service}.{reached.head.namespace}.svc:{reached.head.port}" if reached.head is not None else None
    answered = _node_answers(dash, logs.nodes if logs else dash.nodes(), target, names, fi_info=expect == "efa", storage=uri,
                    head="auto" if head else None)
    reach = _head_reach(reached, cfg, head, answered.inside) if head is not None else None
    return Facts(
        target=target, job=_job_fact(job), expect=expect,
        gpus_per_node=cfg.gpu_nodes.gpus_per_node if kube else None, gpu_node_count=cfg.gpu_nodes.count if kube else None,
        kube_nodes=kube.nodes if kube else None, pods=kube.pods if kube else None, fabric=answered.fabric, fabric_note=answered.note,
        nccl=logs.report if logs else None, nccl_files=logs.files if logs else {},
        nccl_workers=logs.workers if logs else None, nccl_lost=logs.lost if logs else {},
        storage_kind=kind, storage=answered.storage, storage_note=answered.note,
        head_reach=reach, head_note=None if head else "the head Service was not found through Kubernetes",
        kube_note=kube.note if kube else None,
        storage_identity=_worker_accounts(kube.pods) if kube and cfg.cluster.attach else None,
    )


def _worker_accounts(pods: list[Pod]) -> str | None:
    """The ServiceAccounts the worker pods run as (SERVICE_ACCOUNT attached): the identity the storage probe had."""
    return ", ".join(sorted({p.service_account for p in pods if p.role == "worker" and p.service_account})) or None


def storage_target(cfg: Config, target: str) -> tuple[str, str | None]:
    """(what STORAGE_PATH is, the URI to probe): on a cluster an unset one is the head pod's own (`""`), which `up` set."""
    from raydlc.render.bucket import bucket_of
    from raydlc.storage import scheme

    bucket = bucket_of(cfg)
    if bucket is not None:
        return "s3", bucket.uri
    if cfg.train.storage_path is not None:
        return ("s3" if scheme(cfg.train.storage_path) == "s3" else "path"), None
    # attached, raydlc made no bucket and its head pod names none: there is no run prefix to prove
    return ("s3", "") if target == "cluster" and not cfg.cluster.attach else ("unset", None)


def _job_fact(job: Job | None) -> JobFact | None:
    return JobFact(job.submission_id, job.job_id, job.status, job.message) if job else None


@dataclass(frozen=True)
class _NodeAnswers:
    """The GPU nodes' answers to the node probe job, judged: EFA (fi_info), the run prefix, the head's port."""

    fabric: list[Fabric] | None = None
    storage: list[StoreAnswer] | None = None
    inside: dict[str, dict[str, Any]] = field(default_factory=dict)  # GPU node -> its connect to the head's port
    note: str | None = None  # why there are no answers


def _node_answers(dash: Dashboard, ray_nodes: list[RayNode], target: str, names: Mapping[str, str] | None, *,
                  fi_info: bool, storage: str | None, head: str | None) -> _NodeAnswers:
    """One probe job for the GPU nodes (every node on the local target): fi_info, the run prefix, the head's port."""
    from raydlc.checks import storage_access
    from raydlc.jobs.control import probe_nodes
    from raydlc.nccl.fabric import judge

    local = target == "local"
    storage = None if local else storage
    args = (["--fi-info"] if fi_info else []) + (["--storage", storage] if storage is not None else []) + (["--head", head] if head else [])
    if not args:
        return _NodeAnswers()
    if not local and not any(n.alive and n.gpus > 0 for n in ray_nodes):
        return _NodeAnswers(note="no GPU node in the Ray cluster to probe")
    by_id = {n.node_id: n for n in ray_nodes}

    def name_of(a: dict[str, Any]) -> str:
        n = by_id.get(a["node_id"])
        return (names or {}).get(a.get("ip") or "") or (n.name if n else f"{a.get('ip')}/{a['node_id'][:8]}")

    answers = [(name_of(a), a) for a in probe_nodes(dash, target=target, args=args) if local or a.get("gpus", 0) > 0]
    failed = {"failed": True, "error": "the probe task did not run"}
    return _NodeAnswers(
        fabric=[judge(n, a) for n, a in answers] if fi_info else None,
        storage=[storage_access.judge(n, a.get("storage") or (a if a.get("failed") else failed)) for n, a in answers] if storage is not None else None,
        inside={n: a.get("head") or {"connected": False, "error": a.get("error")} for n, a in answers} if head else {},
    )


def _head_pod(kube: Kube, pod: str, namespace: str, default_image: str) -> tuple[str | None, str]:
    """The head pod's node and image: the probe pod runs there, from an image that node already holds."""
    found = kube.get("v1", "Pod", pod, namespace) or {}
    spec = found.get("spec") or {}
    image = next((c.get("image") for c in spec.get("containers") or [] if c.get("image")), None)
    return spec.get("nodeName"), image or default_image


def _head_reach(reached: Reached, cfg: Config, head: str, inside: dict[str, dict[str, Any]]) -> HeadReach:
    """The unlabelled pod's try at the head's port, beside the Ray pods' tries."""
    import secrets

    from raydlc.checks import head_isolation
    from raydlc.errors import RaydlcError

    assert reached.kube is not None and reached.head is not None
    host, _, port = head.rpartition(":")
    node, image = _head_pod(reached.kube, reached.head.pod, reached.head.namespace, cfg.images.dlc_image)
    name = f"raydlc-netprobe-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    doc = head_isolation.pod_doc(name, reached.head.namespace, image, node, host, int(port))
    try:
        outside: head_isolation.PodOutcome | None = head_isolation.run_pod(reached.kube, doc)
        note = None
    except RaydlcError as e:
        outside, note = None, f"the probe pod {name} could not be run: {e.message}"
    return head_isolation.HeadReach(head, outside, inside, note)


def kube_facts(kube: Kube, cfg: Config) -> KubeFacts:
    """Nodes with their allocatable GPUs and EFA, and the RayCluster's head and worker pods, through the gateway.

    Attached, the cluster is the platform's: only the nodes the RayCluster's workers run on are raydlc's to judge
    (another team's GPU nodes are not), and a node list the platform refuses is a note, not a failure to read."""
    from raydlc.edges import kube as k8s
    from raydlc.errors import KubeError
    from raydlc.render.nodes import EFA_RESOURCE, GPU_RESOURCE, GPU_ROLE, ROLE

    pods, names = [], {}
    for p in kube.pods(cfg.cluster.namespace, labels={"ray.io/cluster": cfg.ray.cluster_name}):
        role = k8s.labels_of(p).get("ray.io/node-type", "")
        if role not in ("head", "worker"):
            continue
        account = (p.get("spec") or {}).get("serviceAccountName")
        pods.append(Pod(k8s.name_of(p), role, k8s.pod_phase(p), k8s.pod_ready(p), k8s.pod_node(p), account))
        ip = (p.get("status") or {}).get("podIP")
        if ip:
            names[ip] = k8s.name_of(p)
    attached = cfg.cluster.attach
    held = {p.node for p in pods if p.role == "worker" and p.node}
    try:
        listed = kube.nodes()
    except KubeError as e:
        if not attached:
            raise
        return KubeFacts([], pods, names, f"the GPU nodes could not be read: {e.message} "
                                           "(`raydlc render --only rbac` prints the read-only ClusterRole that grants it)")
    nodes = []
    for n in listed:
        if attached and k8s.name_of(n) not in held:
            continue
        capacity = (n.get("status") or {}).get("capacity") or {}
        gpu_node = attached or k8s.labels_of(n).get(ROLE) == GPU_ROLE or GPU_RESOURCE in capacity
        nodes.append(KubeNode(k8s.name_of(n), gpu_node, k8s.allocatable(n, GPU_RESOURCE), k8s.allocatable(n, EFA_RESOURCE), k8s.node_ready(n)))
    return KubeFacts(nodes, pods, names)


@dataclass(frozen=True)
class Row:
    criterion: str
    title: str
    status: str
    evidence: list[str]
    failed_nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GateVerdict:
    """The gate's answer: one row per criterion, passed when no row failed; `to_dict()` is `raydlc verify --json`."""

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


def gate(f: Facts) -> GateVerdict:
    rows = [_gpu_nodes(f), _pods(f), _fi_info(f), _nccl(f), _storage(f), _head_port(f), _job(f)]
    return GateVerdict(f.target, f.job, rows)


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
        if n.efa < 1 and f.expect == "efa":  # EFA is asked of the nodes only when the run is to use it
            wrong.append(f"vpc.amazonaws.com/efa allocatable {n.efa}")
        if not n.ready:
            wrong.append("not Ready")
        if wrong:
            failed.append(n.name)
            evidence.append(f"{n.name}: {'; '.join(wrong)}")
        else:
            evidence.append(f"{n.name}: {n.gpus} GPUs, {n.efa} EFA allocatable, Ready")
    if not gpu and f.kube_note:
        return _row("gpu-nodes", FAIL, [f.kube_note])
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
    """Judged per node that held a training worker of the job (the head holds the controller and the
    driver, which print no NCCL line, and is not judged unless a worker ran there)."""
    expect = f.expect
    if f.target == "local":
        return _row("nccl", NA, _local_nccl_evidence(f), expect=expect)
    if f.job is None or f.job.job_id is None:
        return _row("nccl", FAIL, ["no job whose workers' logs could be read (the job never connected to Ray)"], expect=expect)
    if not f.nccl_files or f.nccl is None:
        return _row("nccl", FAIL, [f"no Ray Train worker (RayTrainWorker actor) of job {f.job.job_id} in the head's state API"], expect=expect)
    report = f.nccl
    hosts = {h.host: h for h in report.hosts}
    evidence, failed = [], []
    for node, files in sorted(f.nccl_files.items()):
        h, lost = hosts.get(node), f.nccl_lost.get(node)
        if h is None or lost:
            evidence.append(f"{node}: {lost or f'no NCCL lines in {len(files)} worker log files (NCCL_DEBUG=INFO unset?)'}")
        if h is not None and (h.inter_node != expect or h.proof != "carried"):
            what = h.inter_node or "no inter-node transport"
            proof = {"selected": "only selected, no channel line shows traffic", None: "no proof"}.get(h.proof, h.proof or "")
            evidence.append(f"{node}: {what} ({proof}; {_ranks(h)})" + (f" — {h.why[0]}" if h.why and h.told_by != "caller" else ""))
        elif h is not None and not lost:
            evidence.append(f"{node}: {expect}, carried by channel lines ({_ranks(h)}, {len(files)} files)")
            continue
        failed.append(node)
    missing = _missing_ranks(f)
    if missing:
        evidence.append(f"ranks {_span(missing)} of 0..{_world(f) - 1} appear in no NCCL line of the workers' logs")
    if report.fallback:
        evidence.append(f"NCCL fell back from {report.fallback_from or 'the selected network'}")
    if report.errors:
        evidence.append(f"{len(report.errors)} NCCL errors, first: {report.errors[0].text[:160]}")
    ok = not failed and not missing and not report.fallback and not report.errors
    if ok and len(f.nccl_files) < 2:
        evidence.append("one node: no inter-node traffic to prove")
        ok = False
    return _row("nccl", PASS if ok else FAIL, evidence, failed, expect=expect)


def _ranks(h: Any) -> str:
    return f"{len(h.ranks)} ranks" if h.ranks else "ranks not numbered"


def _world(f: Facts) -> int:
    return sum(len(p) for p in (f.nccl_workers or {}).values())


def _missing_ranks(f: Facts) -> list[int]:
    """The ranks 0..W-1 (W: the job's training workers) that no NCCL line of a W-rank communicator numbers.

    Only lines that number ranks within a communicator of W ranks count (`comm … rank r nRanks W`):
    a sub-communicator numbers its own ranks from 0. When no such line exists there is nothing to
    count, and each worker's own NCCL lines (`nccl_lost`) are the check.
    """
    world = _world(f)
    if f.nccl is None or world == 0:
        return []
    seen = {r.rank for r in f.nccl.ranks if r.rank is not None and r.nranks == world}
    return sorted(set(range(world)) - seen) if seen else []


def _span(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:16])) + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")


def _local_nccl_evidence(f: Facts) -> list[str]:
    files = sum(len(v) for v in f.nccl_files.values())
    if f.job is None:
        return ["a local run trains over gloo: NCCL carries nothing"]
    lines = "no NCCL lines" if f.nccl is None or not f.nccl.ranks else f"NCCL verdict {f.nccl.verdict} on one machine"
    return [f"{files} worker log files of job {f.job.job_id or '?'} read: {lines}; a local run trains over gloo"]


def _storage(f: Facts) -> Row:
    """Judged on every GPU node: the checkpoints are written from each of them, with that pod's identity."""
    if f.target == "local":
        return _row("storage", NA, ["a local run keeps its files on this machine: no bucket, no run prefix"])
    if f.storage_kind == "path":
        return _row("storage", NA, ["STORAGE_PATH is a file system path, not S3: there is no prefix policy to prove"])
    if f.storage_kind == "unset":
        return _row("storage", NA, [f"the {f.target} target names no s3:// STORAGE_PATH (or STORAGE_BUCKET) to prove"])
    if not f.storage:
        return _row("storage", FAIL, [f.storage_note or "the storage probe did not run"])
    failed = [a.node for a in f.storage if not a.ok]
    who = [f"the GPU workers' pods run as ServiceAccount {f.storage_identity}: these answers are that identity's"] if f.storage_identity else []
    return _row("storage", FAIL if failed else PASS, [a.evidence for a in f.storage] + who, failed)


def _head_port(f: Facts) -> Row:
    if f.target == "local":
        return _row("head-port", NA, ["a local Ray head runs in no Kubernetes namespace: there is no NetworkPolicy to prove"])
    if f.target == "address":
        return _row("head-port", NA, ["--address has no Kubernetes channel to start the unlabelled probe pod from"])
    if f.head_reach is None:
        return _row("head-port", FAIL, [f.head_note or "the head-port probe did not run"])
    from raydlc.checks.head_isolation import judge

    ok, evidence, failed = judge(f.head_reach)
    if not f.head_reach.inside and f.storage_note:
        evidence.append(f.storage_note)
    return _row("head-port", PASS if ok else FAIL, evidence, failed)


def _job(f: Facts) -> Row:
    if f.job is None:
        return _row("job", FAIL, ["no job to verify: give --job ID (raydlc job list shows them)"])
    j = f.job
    if j.status == "SUCCEEDED":
        return _row("job", PASS, [f"{j.submission_id} SUCCEEDED"])
    return _row("job", FAIL, [f"{j.submission_id} is {j.status}" + (f": {j.message}" if j.message else "")])
