"""A run's values, from the request to the workers: where it goes, what the driver prepared, what every worker receives.

`RunTarget` says where a run goes, beside what it trains; `Prepared` is the driver's facts about
its inputs (train.prepare makes it); `RunSpec` is what every worker receives: the validated
settings and the driver's decisions. The driver decides once (train.resolve: the model source,
the mesh, the step, the precision, where the run writes, which checkpoint it continues) and sends
the RunSpec as JSON; each worker validates it again on its side of the Ray boundary, so a worker
never reads an untyped dict. The packed data travel beside it in Ray's object store. They live
here, below launch, prepare and resolve, so that none of those imports another for a type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, model_validator

from raydlc.config import TrainConfig
from raydlc.data.tokenizer import TokenizerInfo
from raydlc.edges import ray_runtime
from raydlc.planner.budget import Budget
from raydlc.train.faults import Fault
from raydlc.train.layout import Mesh

if TYPE_CHECKING:
    from raydlc.data.dataset import TrainData
    from raydlc.facts.models import ModelSpec


@dataclass(frozen=True)
class RunTarget:
    """Where a run goes, beside what it trains."""

    address: str | None = None  # a Ray head to join; None: RAY_ADDRESS, else a local Ray started here
    instance_type: str | None = None  # the GPU nodes' type: what `SHARDING=auto` plans with
    log_to_driver: bool = True
    env: dict[str, str] = field(default_factory=dict)  # extra worker environment
    faults: Fault | None = None  # fault injection for tests and drills (train.faults): a crash or a hang
    usd_per_hour: float | None = None  # the run's GPU nodes' price, given (tests, a negotiated rate); None: the list price of instance_type
    gpu_usd_per_node_hour: float | None = None  # GPU_USD_PER_HOUR: one node's price as bought (Spot, read at submit); None: list price
    deadline_at: float | None = None  # wall-clock time (time.time()) past which the driver aborts the run: a RayJob's deadline

    @property
    def local(self) -> bool:
        return self.address is None and ray_runtime.address_from_env() is None


@dataclass(frozen=True)
class Prepared:
    """The driver's facts about a run's inputs, made once and passed on unchanged."""

    builtin: str | None  # a built-in spec (random init), or None: from_pretrained(MODEL_ID)
    model: ModelSpec | None  # the architecture, when known
    data: TrainData  # where the workers read their rows: the prepared dataset, never its rows
    tokenizer: TokenizerInfo
    storage: str  # STORAGE_PATH, resolved
    run_name: str
    resume_from: str | None
    n_train: int
    n_eval: int
    data_digest: str
    resume_meta: dict[str, Any] | None = None
    dataset_reused: bool = False
    resume_step: int | None = None  # the step of the checkpoint continued from: this invocation trains the steps after it


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
    faults: Fault | None = None  # tests and drills only (train.faults): the loop's step hooks
    budget: Budget | None = None  # JOB_MAX_COST_USD with the price it is spent at and when the clock started
    layout_note: str | None = None  # where the step came from (the planner, or the config), for people
    tracking_id: str | None = None  # the job's tracker run (train.tracking): the same across restarts and --resume
    tracking_dir: str | None = None  # the run directory where tracking began: TensorBoard's events are under its tb/

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
            **self.train.lora_meta(),
            **({"tracking_id": self.tracking_id, "tracking_dir": self.tracking_dir} if self.tracking_id else {}),  # continued, not matched
        }
