"""Model specs: the exact Qwen2 architecture configs raydlc knows, as plain data.

The specs are kept in code because `AutoConfig.from_pretrained` needs the hub, and the
planner, the preflight, the benchmarks and the local runs all need the exact shapes offline.
Nothing here imports torch: `raydlc plan` reads parameter counts without the training stack.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from raydlc.errors import InputError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    max_position_embeddings: int = 32768
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    hub_id: str | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def layer_params(self) -> int:
        """One decoder block: q/k/v projections carry biases in Qwen2, o_proj does not."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = (h * h + h) + 2 * (h * kv + kv) + h * h
        mlp = 3 * h * self.intermediate_size
        norms = 2 * h
        return attn + mlp + norms

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def param_count(self) -> int:
        head = 0 if self.tie_embeddings else self.embedding_params()
        return self.embedding_params() + self.num_layers * self.layer_params() + self.hidden_size + head


SPECS: dict[str, ModelSpec] = {
    # The local default: ~4M parameters, a vocabulary sized for a tokenizer trained on the spot.
    "tiny": ModelSpec("tiny", 256, 4, 4, 2, 688, 4096, True, max_position_embeddings=2048),
    "qwen2.5-0.5b": ModelSpec("qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936, True, hub_id="Qwen/Qwen2.5-0.5B"),
    "qwen2.5-1.5b": ModelSpec("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, 151936, True, hub_id="Qwen/Qwen2.5-1.5B"),
}
_BY_HUB_ID = {s.hub_id.lower(): s for s in SPECS.values() if s.hub_id}


def resolve_spec(model_id: str) -> ModelSpec | None:
    """A built-in spec by name or by its hub id; None for other hub ids and local dirs."""
    key = model_id.strip()
    return SPECS.get(key.lower()) or _BY_HUB_ID.get(key.lower())


def get_spec(name: str) -> ModelSpec:
    spec = resolve_spec(name)
    if spec is None:
        raise InputError(f"unknown model spec {name!r}", hint=f"built-in specs: {', '.join(SPECS)}")
    return spec


def spec_dict(spec: ModelSpec) -> dict[str, Any]:
    return asdict(spec) | {"params": spec.param_count()}
