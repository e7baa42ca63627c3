"""Where adding nodes stops paying: the planner's recommended layout at each node count.

For every node count the planner's own search (`raydlc.planner.recommend`: sharding x micro-batch
x accumulation x sync mode) runs twice, without and with activation checkpointing, and the
faster layout that fits wins (without checkpointing on a tie: it recomputes nothing). Scaling
efficiency compares tokens/s per node with the smallest node count that fits: 100% is linear.
Pure arithmetic on a `ModelSpec` and the catalogue, like the planner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from raydlc import planner
from raydlc.errors import InputError
from raydlc.facts import instances

MAX_NODE_COUNTS = 32  # points on one scan
MAX_NODES = 450  # EKS's default nodes per managed node group, as GPU_NODE_COUNT


def parse_node_counts(text: str, flag: str = "--scan-nodes") -> list[int]:
    """`1,2,4,8` -> [1, 2, 4, 8]: whole numbers 1..450, at most 32 of them, sorted, no repeats."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise InputError(f"{flag} {text!r}: a comma-separated list of node counts", hint=f"e.g. {flag} 1,2,4,8,16")
    counts: list[int] = []
    for p in parts:
        if not p.isdigit() or not p.isascii():
            raise InputError(f"{flag}: {p!r} is not a node count", hint=f"whole numbers from 1 to {MAX_NODES}, e.g. {flag} 1,2,4,8")
        n = int(p)
        if not 1 <= n <= MAX_NODES:
            raise InputError(f"{flag}: {n} nodes is outside 1..{MAX_NODES} (EKS's default nodes per managed node group)",
                             hint=f"e.g. {flag} 1,2,4,8,16,32,64")
        counts.append(n)
    counts = sorted(set(counts))
    if len(counts) > MAX_NODE_COUNTS:
        raise InputError(f"{flag}: {len(counts)} node counts; at most {MAX_NODE_COUNTS} per scan", hint="e.g. powers of two: 1,2,4,...,64")
    return counts


@dataclass(frozen=True)
class ScanRow:
    nodes: int
    gpus: int
    fits: bool
    strategy: str | None
    sync: str | None
    micro_batch: int
    grad_accum: int
    activation_checkpointing: bool | str
    global_batch: int
    tokens_per_step: int
    per_gpu_bytes: int | None
    step_time_s: float | None
    tokens_per_s: float
    bound: str | None
    linear_tokens_per_s: float | None  # the reference's tokens/s per node times these nodes
    efficiency: float | None  # tokens_per_s / linear_tokens_per_s
    reason: str


@dataclass(frozen=True)
class Scan:
    model: str
    params: int
    instance_type: str | None
    gpu: str
    gpu_name: str
    gpus_per_node: int
    gpu_memory_bytes: int
    network_gbps: float
    efa: bool
    nvlink: bool
    seq_len: int
    policy: str
    reference_nodes: int | None  # the smallest node count that fits: efficiency 100%
    rows: list[ScanRow]
    assumptions: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def best_efficient(self, threshold: float = 0.8) -> ScanRow | None:
        """The largest node count that still scales at `threshold` of linear or better."""
        ok = [r for r in self.rows if r.efficiency is not None and r.efficiency >= threshold]
        return ok[-1] if ok else None


def _choose(recs: dict[bool | str, planner.Recommendation], tie: float) -> tuple[planner.Recommendation, bool | str]:
    """The cheapest checkpointing (none, selective, full) unless a costlier one is faster by more than the tie margin."""
    order = sorted(recs, key=planner.ac_rank)
    rec, ac = recs[order[0]], order[0]
    for other in order[1:]:
        cand = recs[other]
        if cand.best is not None and (rec.best is None or cand.best.tokens_per_s > rec.best.tokens_per_s * (1 + tie)):
            rec, ac = cand, other
    return rec, ac


def scan(
    w: planner.Workload,
    node_counts: Sequence[int],
    layout_at: Callable[[int], planner.Layout],
    *,
    activation_checkpointing: bool | str | None = None,
    instance_type: str | None = None,
    assumptions: planner.Assumptions = planner.DEFAULT_ASSUMPTIONS,
) -> Scan:
    """The recommended layout and its predicted speed at each node count.

    Like `recommend`, the scan searches the step: the workload gives the model, sequence length,
    precision and the global-batch ceiling. Activation checkpointing is searched too:
    `activation_checkpointing=None` lets each node count choose; True or False pins it.
    """
    if not node_counts:
        raise InputError("--scan-nodes: no node counts", hint="e.g. --scan-nodes 1,2,4,8")
    rows: list[ScanRow] = []
    ref: tuple[int, float] | None = None
    first = layout_at(node_counts[0])
    for n in node_counts:
        layout = layout_at(n)
        choices = planner.AC_SEARCH if activation_checkpointing is None else (activation_checkpointing,)
        recs = {ac: planner.recommend(w.at(activation_checkpointing=ac), layout, assumptions=assumptions) for ac in choices}
        rec, ac = _choose(recs, assumptions.tie_fraction)
        b = rec.best
        linear = eff = None
        if b is not None:
            if ref is None:
                ref = (n, b.tokens_per_s)
            linear = ref[1] / ref[0] * n
            eff = b.tokens_per_s / linear if linear else None
        rows.append(ScanRow(
            nodes=n, gpus=n * layout.gpus_per_node, fits=b is not None,
            strategy=b.strategy if b else None, sync=b.sync if b else None,
            micro_batch=b.micro_batch if b else 0, grad_accum=b.grad_accum if b else 0,
            activation_checkpointing=ac if b else (activation_checkpointing or False),
            global_batch=b.global_batch if b else 0, tokens_per_step=b.tokens_per_step if b else 0,
            per_gpu_bytes=b.per_gpu_bytes if b else None, step_time_s=b.step_time_s if b else None,
            tokens_per_s=b.tokens_per_s if b else 0.0, bound=b.bound if b else None,
            linear_tokens_per_s=linear, efficiency=eff, reason=rec.reason,
        ))
    gpu = instances.GPUS[first.gpu]
    return Scan(
        model=w.spec.name, params=w.spec.param_count(), instance_type=instance_type or first.instance_type, gpu=first.gpu, gpu_name=gpu.name,
        gpus_per_node=first.gpus_per_node, gpu_memory_bytes=planner.gpu_capacity(first), network_gbps=first.network_gbps,
        efa=first.efa, nvlink=first.nvlink, seq_len=w.seq_len, policy=w.policy, reference_nodes=ref[0] if ref else None, rows=rows,
        assumptions=asdict(assumptions) | {"max_global_batch": w.max_global_batch},
    )
