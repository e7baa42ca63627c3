"""The answer for a whole log, in the shape `raydlc nccl --json` prints: verdict, proof, per rank, per machine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from raydlc.nccl.facts import Evidence

# libfabric: the OFI plugin carried the traffic with GPUDirect RDMA, but no line proves which provider.
VERDICTS: tuple[str, ...] = ("efa", "socket", "ib", "libfabric", "libfabric-other", "single-node", "mixed", "unknown")
EXPECTABLE: tuple[str, ...] = ("efa", "socket", "ib", "single-node")
PROOFS: tuple[str, ...] = ("carried", "selected")


@dataclass
class RankInfo:
    """One process's row: who it is (from its facts) and what the verdict makes of its traffic.

    `inter_node` is the verdict word of what carried its inter-node traffic, with a `*`
    when that is only what it selected; `proof` says which.
    """

    key: str
    rank: int | None = None
    nranks: int | None = None
    node: str | None = None
    ip: str | None = None
    pid: int | None = None
    device: int | None = None
    nccl_version: str | None = None
    plugin: str | None = None
    provider: str | None = None
    fabric: str | None = None
    network: str | None = None
    transports: list[str] = field(default_factory=list)
    inter_node: str | None = None
    gdr: bool | None = None
    errors: int = 0
    proof: str | None = None
    host: str | None = None


@dataclass
class HostInfo:
    """One machine (or, where NCCL shows more than the log can separate, several with one name)."""

    host: str
    name: str
    addresses: list[str]
    machines: int
    processes: list[str]
    ranks: list[int]
    inter_node: str | None
    proof: str | None
    why: list[str] = field(default_factory=list)
    told_by: str = "hostname"  # what sets it apart: hostname, addresses (a shared hostname), or caller (a node name given)
    # verdict word -> the ranks (or, unnumbered, the processes) whose inter-node traffic it was; several words: `mixed`
    inter_node_ranks: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class NcclReport:
    """The answer for a whole log: verdict, how it is known, fallback, and the lines it rests on."""

    verdict: str
    proof: str | None
    fallback: bool
    fallback_from: str | None
    gdr: bool | None
    nccl_version: str | None
    plugin: str | None
    plugin_version: str | None
    provider: str | None
    fabric: str | None
    network: str | None
    nodes: int | None
    ranks: list[RankInfo]
    errors: list[Evidence]
    evidence: list[Evidence]
    failures: list[Evidence]
    reasons: list[str]
    causes: list[str]
    env: dict[str, str]
    sources: list[str]
    lines: int
    candidates: int
    folded_repeats: int = 0
    hosts: list[HostInfo] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def expect_ok(r: NcclReport, expect: str, accept_selected: bool = False) -> bool:
    """The gate: this verdict, carried by traffic (or only selected, if accepted), no fallback, no error."""
    proven = r.proof == "carried" or (accept_selected and r.proof == "selected")
    return r.verdict == expect and proven and not r.fallback and not r.errors
