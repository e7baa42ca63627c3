"""Collective bandwidth and per-node facts on the job's own workers, judged before training starts.

A job whose NCCL silently fell back from EFA to TCP sockets still trains, only at half the
speed, and nobody notices until the bill. The cure is to measure what the process group
really gets across nodes and compare it with what the instance's network should give over
EFA. This module holds the data and the verdict (pure); `raydlc.preflight_run` measures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from raydlc.planner import DEFAULT_ASSUMPTIONS

Scope = Literal["world", "intra", "cross"]


@dataclass(frozen=True)
class Measurement:
    """One collective at one size over one group; bus bandwidth as nccl-tests defines it."""

    op: str  # all_reduce | all_gather
    scope: str  # world | intra (ranks of one node) | cross (one rank per node)
    size_bytes: int
    group_size: int
    time_s: float
    nodes: tuple[str, ...]

    @property
    def algbw_gbytes_s(self) -> float:
        return self.size_bytes / self.time_s / 1e9 if self.time_s > 0 else 0.0

    @property
    def busbw_gbytes_s(self) -> float:
        n = self.group_size
        factor = 2 * (n - 1) / n if self.op == "all_reduce" else (n - 1) / n
        return self.algbw_gbytes_s * factor

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "nodes": list(self.nodes),
            "algbw_gbytes_s": round(self.algbw_gbytes_s, 4),
            "busbw_gbytes_s": round(self.busbw_gbytes_s, 4),
        }


@dataclass(frozen=True)
class NodeFacts:
    node: str
    hostname: str
    ranks: tuple[int, ...]
    gpus_visible: int
    infiniband: bool  # /dev/infiniband exists: the EFA device is in the container
    fi_provider: str | None
    nccl_net: str | None
    net_plugin_files: tuple[str, ...]  # libnccl-net*.so found on disk
    net_plugin_loaded: str | None  # the one mapped into the worker after the collectives

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ranks": list(self.ranks), "net_plugin_files": list(self.net_plugin_files)}


@dataclass(frozen=True)
class Expectation:
    """What the network should give; built from the instance type when it is known."""

    network_gbps: float
    efa: bool = True
    gpus_per_node: int | None = None
    efa_efficiency: float = DEFAULT_ASSUMPTIONS.efa_efficiency
    min_fraction: float = 0.5  # below this share of the EFA rate the job is on sockets, not EFA

    @property
    def expected_gbytes_s(self) -> float:
        return self.network_gbps / 8 * (self.efa_efficiency if self.efa else DEFAULT_ASSUMPTIONS.tcp_efficiency)


@dataclass(frozen=True)
class Finding:
    level: Literal["fail", "warn", "info"]
    node: str | None
    figure: str
    message: str


@dataclass
class PreflightReport:
    backend: str
    world_size: int
    nodes: list[NodeFacts]
    measurements: list[Measurement]
    verdict: Literal["pass", "fail", "no-verdict"]
    findings: list[Finding] = field(default_factory=list)
    expected_gbytes_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.verdict != "fail"

    def best(self, scope: str, op: str) -> Measurement | None:
        ms = [m for m in self.measurements if m.scope == scope and m.op == op]
        return max(ms, key=lambda m: m.busbw_gbytes_s) if ms else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "ok": self.ok,
            "backend": self.backend,
            "world_size": self.world_size,
            "expected_gbytes_s": self.expected_gbytes_s,
            "findings": [asdict(f) for f in self.findings],
            "nodes": [n.to_dict() for n in self.nodes],
            "measurements": [m.to_dict() for m in self.measurements],
        }


def _node_problems(n: NodeFacts, exp: Expectation) -> list[Finding]:
    out: list[Finding] = []
    if n.gpus_visible < len(n.ranks):
        out.append(Finding("fail", n.node, "gpus_visible",
                           f"node {n.node} runs {len(n.ranks)} workers but they see {n.gpus_visible} GPUs"))
    elif exp.gpus_per_node is not None and n.gpus_visible != exp.gpus_per_node:
        out.append(Finding("fail", n.node, "gpus_visible",
                           f"node {n.node} sees {n.gpus_visible} GPUs, expected {exp.gpus_per_node}"))
    if exp.efa:
        if not n.infiniband:
            out.append(Finding("fail", n.node, "infiniband",
                               f"node {n.node}: /dev/infiniband is missing (no EFA device in the pod: "
                               f"request vpc.amazonaws.com/efa and check the EFA device plugin)"))
        if (n.fi_provider or "").lower() != "efa":
            out.append(Finding("warn", n.node, "FI_PROVIDER",
                               f"node {n.node}: FI_PROVIDER is {n.fi_provider or 'unset'}, expected efa"))
        if not n.net_plugin_loaded:
            found = ", ".join(n.net_plugin_files) or "none found"
            out.append(Finding("fail", n.node, "nccl_net_plugin",
                               f"node {n.node}: no NCCL net plugin (aws-ofi-nccl) loaded after the collectives "
                               f"(libnccl-net*.so on disk: {found})"))
    return out


def judge(
    measurements: list[Measurement], nodes: list[NodeFacts], expectation: Expectation | None, *, backend: str = "nccl",
) -> PreflightReport:
    """The verdict on given figures: cross-node bus bandwidth far below the EFA rate fails, naming nodes.

    Without an expectation (a local run over gloo) the figures are reported and nothing is judged.
    """
    world = sum(len(n.ranks) for n in nodes)
    report = PreflightReport(backend, world, list(nodes), list(measurements), "no-verdict")
    if expectation is None:
        report.findings.append(Finding("info", None, "network", "local run: figures only, no network verdict"))
        return report
    report.expected_gbytes_s = round(expectation.expected_gbytes_s, 4)
    per_node = {n.node: _node_problems(n, expectation) for n in nodes}
    for problems in per_node.values():
        report.findings.extend(problems)
    if len(nodes) < 2:
        report.findings.append(Finding("info", None, "network", "one node: nothing crosses the network"))
    floor = expectation.min_fraction * expectation.expected_gbytes_s
    for op in ("all_reduce", "all_gather"):
        best = report.best("cross", op)
        if best is None:
            continue
        share = best.busbw_gbytes_s / expectation.expected_gbytes_s
        figure = f"cross-node {op} bus bandwidth"
        text = (f"{figure} {best.busbw_gbytes_s:.2f} GB/s at {best.size_bytes / 2**20:.0f} MiB is "
                f"{share:.0%} of the expected {'EFA' if expectation.efa else 'TCP'} rate "
                f"{expectation.expected_gbytes_s:.2f} GB/s ({expectation.network_gbps:g} Gb/s)")
        if best.busbw_gbytes_s >= floor:
            report.findings.append(Finding("info", None, figure, text))
            continue
        suspects = [n for n in best.nodes if any(f.level == "fail" for f in per_node.get(n, []))]
        named = suspects or list(best.nodes)
        for node in named:
            report.findings.append(Finding(
                "fail", node, figure,
                f"node {node}: {text}; traffic is likely on TCP sockets, not EFA"
                + (" (see this node's other findings)" if suspects else ""),
            ))
    report.verdict = "fail" if any(f.level == "fail" for f in report.findings) else "pass"
    return report


def expectation_for(instance_type: str | None, gpus_per_node: int | None) -> Expectation | None:
    """From the catalog; None for unknown instance types (then only figures are reported).

    Pass `gpus_per_node` only when the run uses every GPU of every node.
    """
    from raydlc.facts import instances

    it = instances.instance_type(instance_type) if instance_type else None
    if it is None:
        return None
    return Expectation(network_gbps=it.network_gbps, efa=it.efa_interfaces > 0, gpus_per_node=gpus_per_node)


def from_dict(doc: dict[str, Any]) -> tuple[list[Measurement], list[NodeFacts]]:
    """Rebuild the figures the workers sent back (plain JSON over Ray Train's metrics)."""
    ms = [
        Measurement(m["op"], m["scope"], int(m["size_bytes"]), int(m["group_size"]), float(m["time_s"]), tuple(m["nodes"]))
        for m in doc["measurements"]
    ]
    ns = [
        NodeFacts(
            n["node"], n["hostname"], tuple(n["ranks"]), int(n["gpus_visible"]), bool(n["infiniband"]),
            n.get("fi_provider"), n.get("nccl_net"), tuple(n.get("net_plugin_files", ())), n.get("net_plugin_loaded"),
        )
        for n in doc["nodes"]
    ]
    return ms, ns


def run_preflight(
    *,
    num_workers: int,
    use_gpu: bool,
    expectation: Expectation | None,
    sizes: list[int] | None = None,
    iters: int = 5,
    warmup: int = 2,
    ranks_per_node: int | None = None,
    storage_path: str | None = None,
) -> PreflightReport:
    """Measure on `num_workers` Ray Train workers (one per GPU) in the current Ray session, then judge.

    Call it where `ray.init` reaches the cluster the job will use (on the head, or in the
    job's entrypoint before training); locally it starts a Ray instance when none is running.
    `ranks_per_node` groups ranks into pseudo-nodes, to exercise the cross-node path on one machine.
    """
    from raydlc.checks.collectives_job import measure

    doc = measure(
        num_workers=num_workers, use_gpu=use_gpu, sizes=sizes, iters=iters, warmup=warmup,
        ranks_per_node=ranks_per_node, storage_path=storage_path,
    )
    ms, ns = from_dict(doc)
    return judge(ms, ns, expectation, backend=doc["backend"])
