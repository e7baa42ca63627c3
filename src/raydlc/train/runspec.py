"""What every worker of one run receives: the validated settings and the driver's decisions.

The driver decides once (train.resolve: the model source, the mesh, the step, the precision,
where the run writes, which checkpoint it continues) and sends this as JSON; each worker validates it again on its
side of the Ray boundary, so a worker never reads an untyped dict. The packed data travel
beside it in Ray's object store.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from raydlc.config import TrainConfig
from raydlc.train.budget import Budget
from raydlc.train.layout import Mesh
from raydlc.train.tokenizer import TokenizerInfo


class Crash(BaseModel):
    """Fault injection for tests and drills: `rank` exits at `step` of the first attempt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    step: int


class Hang(BaseModel):
    """Fault injection for the stall guard's test, never set by a setting: `rank` stops making progress at `step` of the first attempt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    step: int


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    train: TrainConfig
    spec: str | None  # a built-in spec (random init), or None: from_pretrained(train.model_id)
    mesh: Mesh
    use_gpu: bool
    bf16: bool
    run_name: str
    run_dir: str
    tokenizer: TokenizerInfo
    data_digest: str
    resume_from: str | None = None
    crash: Crash | None = None
    hang: Hang | None = None
    budget: Budget | None = None  # JOB_MAX_COST_USD with the price it is spent at and when the clock started
    layout_note: str | None = None  # where the step came from (the planner, or the config), for people

    @model_validator(mode="after")
    def _step_decided(self) -> RunSpec:
        """GRAD_ACCUM is decided on the driver (train.layout.decide), never on a worker; a GRAD_SYNC
        left `auto` means the mesh's default, which every worker derives alike."""
        if not isinstance(self.train.grad_accum, int):
            raise ValueError(f"the driver sends a decided accumulation, got GRAD_ACCUM={self.train.grad_accum}")
        if self.train.grad_sync == "all-reduce-once" and self.mesh.sharding != "hsdp":
            raise ValueError("GRAD_SYNC=all-reduce-once needs an HSDP mesh")
        return self

    @property
    def grad_accum(self) -> int:
        assert isinstance(self.train.grad_accum, int)
        return self.train.grad_accum

    def to_wire(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_wire(cls, text: str) -> RunSpec:
        return cls.model_validate_json(text)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro-batch x accumulation x ranks."""
        return self.train.batch_size * self.grad_accum * self.mesh.world_size

    def checkpoint_meta(self) -> dict[str, object]:
        """What a checkpoint must match to be continued: the data order is a function of these."""
        return {
            "model": self.train.model_id,
            "spec": self.spec,
            "seq_len": self.train.seq_len,
            "global_batch": self.global_batch,
            "seed": self.train.seed,
            "data": self.data_digest,
        }
