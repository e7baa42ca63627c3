"""What every worker of one run receives: the validated settings and the driver's decisions.

The driver decides once (the model source, the mesh, the precision, where the run writes,
which checkpoint it continues) and sends this as JSON; each worker validates it again on its
side of the Ray boundary, so a worker never reads an untyped dict. The packed data travel
beside it in Ray's object store.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from raydlc.config import TrainConfig
from raydlc.train.layout import Mesh
from raydlc.train.tokenizer import TokenizerInfo


class Crash(BaseModel):
    """Fault injection for tests and drills: `rank` exits at `step` of the first attempt."""

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

    def to_wire(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_wire(cls, text: str) -> RunSpec:
        return cls.model_validate_json(text)

    @property
    def global_batch(self) -> int:
        return self.train.batch_size * self.mesh.world_size

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
