"""The model FLOPs utilisation the planner assumes per GPU family: each figure *assumed* or *measured*, with its source.

A training step reaches a fraction of a GPU's datasheet peak; what that fraction is depends on the GPU, not just the
model. The one training figure published for the stack raydlc runs is torchtitan's on H100 (about 40 % MFU, compiled,
FSDP). That is about half of what an H100 reaches on a pure bf16 matmul (~800 of 989 TFLOPS), so the other families
are scaled from their own published matmul ceiling by the same half: an L4 reaches 54-71 of its 121 bf16 TFLOPS on a
matmul benchmark, so it plans at 0.5 x 54/121 = 0.22 (the low end: a sustained, power-limited card). These stand
until a GPU run (benchmarks/gpu_check.sh) measures a family and its row here says *measured*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TORCHTITAN_H100 = "torchtitan Llama-3.1-8B on 8 x H100, FSDP2 + per-block compile: ~40 % MFU (torchtitan docs/performance.md)"
H100_MATMUL_SHARE = 800 / 989  # a large bf16 GEMM on H100 SXM; torchtitan's MFU is about half of it
TRAIN_OVER_MATMUL = 0.40 / H100_MATMUL_SHARE  # ~0.49: what training keeps of a matmul's share of the peak


@dataclass(frozen=True)
class MfuFact:
    """A compiled MFU and where it comes from: `measured` on that GPU by a run, or `assumed` by reasoning from a source."""

    compiled: float
    kind: Literal["assumed", "measured"]
    source: str


def scaled(matmul_tflops: float, peak_tflops: float, where: str) -> MfuFact:
    """A family's MFU from its published matmul ceiling, scaled as torchtitan's H100 training figure is to H100's."""
    value = round(TRAIN_OVER_MATMUL * matmul_tflops / peak_tflops, 3)
    return MfuFact(value, "assumed", f"{where}: bf16 matmul {matmul_tflops:g} of {peak_tflops:g} TFLOPS x {TRAIN_OVER_MATMUL:.2f} "
                                     f"(torchtitan's ~40 % H100 MFU over H100's ~{H100_MATMUL_SHARE:.0%} matmul share)")


MFU: dict[str, MfuFact] = {
    "h100": MfuFact(0.40, "assumed", TORCHTITAN_H100),
    "h200": MfuFact(0.40, "assumed", TORCHTITAN_H100 + "; H200 taken as H100 (same compute, more memory)"),
    "l4": scaled(54.0, 121.0, "L4 (published bf16 matmul benchmark, 54-71 TFLOPS; the sustained low end)"),
    # Same Ada generation and power-limited design as the L4: its matmul share is assumed the L4's until measured.
    "l40s": scaled(54.0 / 121.0 * 362.0, 362.0, "L40S, at the L4's matmul share (same Ada generation; no L40S figure yet)"),
    # A10G (Ampere, AWS's lower-clocked A10): assumed at the L4's matmul share too, until a run measures it.
    "a10g": scaled(54.0 / 121.0 * 125.0, 125.0, "A10G, at the L4's matmul share (a clock-limited A10; no A10G figure yet)"),
}
DEFAULT = MfuFact(0.40, "assumed", TORCHTITAN_H100 + ", not yet scaled for this GPU")


def mfu_fact(gpu: str) -> MfuFact:
    """The MFU fact of a GPU family (a key of facts.instances.GPUS)."""
    return MFU.get(gpu, DEFAULT)
