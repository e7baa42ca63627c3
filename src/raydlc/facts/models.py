"""Model specs: the exact decoder architectures raydlc knows, as plain data, and the reader
that turns a model directory's `config.json` into one.

The built-in specs are kept in code because `AutoConfig.from_pretrained` needs the hub, and
the planner, the preflight, the benchmarks and the local runs all need the exact shapes
offline. A local directory (or a Hugging Face hub cache entry) with a `config.json` of a
supported architecture is read as JSON, without transformers and without touching the
weights. Nothing here imports torch: `raydlc plan` reads parameter counts without the
training stack.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raydlc.errors import InputError

# model_type in config.json -> the causal-LM class raydlc builds for it. Both are the same
# pre-norm decoder (RMSNorm, RoPE, GQA, SwiGLU); Qwen2 adds biases to q/k/v.
ARCHITECTURES: dict[str, str] = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
# LoRA's default targets per architecture: every attention and MLP projection of a block (peft's names).
LORA_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = dict.fromkeys(ARCHITECTURES, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KB; anything this large is not one


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
    architecture: str = "qwen2"  # a key of ARCHITECTURES
    head_dim: int = 0  # 0: hidden_size // num_heads
    qkv_bias: bool = True  # Qwen2: q/k/v projections carry biases
    o_bias: bool = False
    mlp_bias: bool = False
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # sorted (key, value) pairs, e.g. Llama 3.1's ("factor", 8.0), ..., ("rope_type", "llama3")
    source: str | None = None  # the config.json it was read from; None for a built-in

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)

    def layer_params(self) -> int:
        """One decoder block: attention (with the architecture's biases), SwiGLU MLP, two RMSNorms."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.intermediate_size
        attn = h * q + 2 * h * kv + q * h
        attn += (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0)
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        norms = 2 * h
        return attn + mlp + norms

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def param_count(self) -> int:
        head = 0 if self.tie_embeddings else self.embedding_params()
        return self.embedding_params() + self.num_layers * self.layer_params() + self.hidden_size + head

    def rope_parameters(self) -> dict[str, Any]:
        """RoPE as transformers 5 takes it (`rope_parameters`): the type, theta and any scaling."""
        extra = dict(self.rope_scaling)
        return {"rope_type": extra.pop("rope_type", "default"), "rope_theta": self.rope_theta, **extra}


    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a Hugging Face checkpoint of this architecture holds, by name, with its shape.

        The names `save_pretrained` writes for Qwen2ForCausalLM / LlamaForCausalLM; a tied head
        is the embedding and may be absent (`optional_tensors`).
        """
        h, q, kv, i, v = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.intermediate_size, self.vocab_size
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
        block = {"self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
                 "self_attn.o_proj.weight": (h, q), "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h),
                 "mlp.down_proj.weight": (h, i), "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
        if self.qkv_bias:
            block |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
        if self.o_bias:
            block["self_attn.o_proj.bias"] = (h,)
        if self.mlp_bias:
            block |= {"mlp.gate_proj.bias": (i,), "mlp.up_proj.bias": (i,), "mlp.down_proj.bias": (h,)}
        for n in range(self.num_layers):
            out |= {f"model.layers.{n}.{k}": shape for k, shape in block.items()}
        return out

    def projections(self) -> dict[str, tuple[int, int]]:
        """Each linear projection of a decoder block, by its module name, as (in features, out features): what LoRA can target."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def lora_params(self, rank: int, targets: tuple[str, ...] | None = None) -> int:
        """Adapter parameters of LoRA at `rank` on `targets` (default: the family's, LORA_DEFAULT_TARGETS):
        rank x (in + out) per targeted projection per block (A is rank x in, B is out x rank)."""
        shapes = self.projections()
        chosen = targets or LORA_DEFAULT_TARGETS[self.architecture]
        unknown = [t for t in chosen if t not in shapes]
        if unknown:
            raise InputError(f"unknown LoRA target {unknown[0]!r}", hint=f"use some of: {', '.join(shapes)}")
        return self.num_layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in chosen)

    def optional_tensors(self) -> set[str]:
        return {"lm_head.weight"} if self.tie_embeddings else set()

    def projection_names(self) -> dict[str, str]:
        """Each block's projections by full module name (model.layers.0.self_attn.q_proj -> q_proj): what LORA_TARGET_REGEX is matched against."""
        part = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
        return {f"model.layers.{i}.{part[p]}.{p}": p for i in range(self.num_layers) for p in self.projections()}


def lora_targets_of(spec: ModelSpec, names: tuple[str, ...], regex: str | None) -> tuple[str, ...]:
    """The projections LoRA adapts in some block: LORA_TARGETS, or those LORA_TARGET_REGEX matches whole in any block, or the family's."""
    if regex:
        import re

        pattern = re.compile(regex)
        return tuple(dict.fromkeys(p for full, p in spec.projection_names().items() if pattern.fullmatch(full)))
    return names or LORA_DEFAULT_TARGETS[spec.architecture]


def saved_params(spec: ModelSpec, names: tuple[str, ...]) -> int:
    """LORA_MODULES_TO_SAVE's parameters as the planner counts them: the embedding and the head (one weight when tied);
    other modules (a norm) are too small to count."""
    parts = {n.rpartition(".")[2] for n in names} & {"embed_tokens", "lm_head"}
    return spec.embedding_params() * (1 if spec.tie_embeddings else len(parts)) if parts else 0


def lora_params_of(spec: ModelSpec, rank: int, names: tuple[str, ...], regex: str | None) -> int:
    """Adapter parameters as trained: with a pattern, only the blocks it matches count (it may pick a layer range)."""
    if not regex:
        return spec.lora_params(rank, names or None)
    import re

    pattern, shapes = re.compile(regex), spec.projections()
    return sum(rank * sum(shapes[p]) for full, p in spec.projection_names().items() if pattern.fullmatch(full))


def _qwen(name: str, hub: str, h: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tied: bool, positions: int, eps: float) -> ModelSpec:
    return ModelSpec(name, h, layers, heads, kv, inter, vocab, tied, max_position_embeddings=positions, rope_theta=1_000_000.0, rms_norm_eps=eps, hub_id=hub)


# Llama 3.1/3.2 extend the context with the "llama3" RoPE scaling; the factor differs by release.
def _llama3_rope(factor: float) -> tuple[tuple[str, Any], ...]:
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    return tuple(sorted(scaling.items()))  # sorted, as the config reader keeps them


def _llama(name: str, hub: str, h: int, layers: int, heads: int, kv: int, inter: int, tied: bool, rope_factor: float) -> ModelSpec:
    return ModelSpec(
        name, h, layers, heads, kv, inter, 128256, tied, max_position_embeddings=131072, rope_theta=500_000.0, rms_norm_eps=1e-5,
        hub_id=hub, architecture="llama", qkv_bias=False, rope_scaling=_llama3_rope(rope_factor),
    )


# Sources: the `config.json` of each base model on huggingface.co (Qwen/Qwen2.5-{0.5B,...,72B},
# meta-llama/Llama-3.2-{1B,3B}, meta-llama/Llama-3.1-{8B,70B}, meta-llama/Llama-3.3-70B-Instruct),
# as mirrored by derived repositories that keep the base config (read 2026 through search; the
# gated meta-llama repos through unmodified copies). The base Qwen2.5 configs differ from the
# -Instruct ones in max_position_embeddings (131072 vs 32768 for 1.5B/7B/14B/32B/72B) and in
# rms_norm_eps (1e-5 vs 1e-6 for 14B/32B/72B); these are the base values.
SPECS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        # The local default: ~4M parameters, a vocabulary sized for a tokenizer trained on the spot.
        ModelSpec("tiny", 256, 4, 4, 2, 688, 4096, True, max_position_embeddings=2048),
        _qwen("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True, 32768, 1e-6),
        _qwen("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True, 131072, 1e-6),
        _qwen("qwen2.5-3b", "Qwen/Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151936, True, 32768, 1e-6),
        _qwen("qwen2.5-7b", "Qwen/Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False, 131072, 1e-6),
        _qwen("qwen2.5-14b", "Qwen/Qwen2.5-14B", 5120, 48, 40, 8, 13824, 152064, False, 131072, 1e-5),
        _qwen("qwen2.5-32b", "Qwen/Qwen2.5-32B", 5120, 64, 40, 8, 27648, 152064, False, 131072, 1e-5),
        _qwen("qwen2.5-72b", "Qwen/Qwen2.5-72B", 8192, 80, 64, 8, 29568, 152064, False, 131072, 1e-5),
        _llama("llama-3.2-1b", "meta-llama/Llama-3.2-1B", 2048, 16, 32, 8, 8192, True, 32.0),
        _llama("llama-3.2-3b", "meta-llama/Llama-3.2-3B", 3072, 28, 24, 8, 8192, True, 32.0),
        _llama("llama-3.1-8b", "meta-llama/Llama-3.1-8B", 4096, 32, 32, 8, 14336, False, 8.0),
        _llama("llama-3.1-70b", "meta-llama/Llama-3.1-70B", 8192, 80, 64, 8, 28672, False, 8.0),
        _llama("llama-3.3-70b", "meta-llama/Llama-3.3-70B-Instruct", 8192, 80, 64, 8, 28672, False, 8.0),
    ]
}
_BY_HUB_ID = {s.hub_id.lower(): s for s in SPECS.values() if s.hub_id}
_BY_HUB_ID["meta-llama/meta-llama-3.1-8b"] = SPECS["llama-3.1-8b"]  # the repository's name before the rename
_BY_HUB_ID["meta-llama/meta-llama-3.1-70b"] = SPECS["llama-3.1-70b"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_spec(model_id: str) -> ModelSpec | None:
    """A built-in spec by name or by its hub id; None for other hub ids and local dirs."""
    key = model_id.strip()
    return SPECS.get(key.lower()) or _BY_HUB_ID.get(key.lower())


def builtin_names() -> str:
    return ", ".join(SPECS)


# ---- model directories ---------------------------------------------------------------------------


def hub_cache_root() -> Path:
    """Where huggingface_hub keeps downloads, by its own environment variables."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    return home / "hub"


def _snapshot(repo_dir: Path) -> Path | None:
    """The snapshot a hub cache entry (`models--org--name`) points at: refs/main, else the only one."""
    snaps = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text(errors="replace").strip()
        if commit and (snaps / commit).is_dir():
            return snaps / commit
    found = sorted(p for p in snaps.iterdir() if p.is_dir()) if snaps.is_dir() else []
    return found[0] if len(found) == 1 else None


def looks_like_path(model_id: str) -> bool:
    """A path, not a hub id (`org/name`): absolute, relative with a dot, home, or deeper than one slash."""
    return model_id.startswith(("/", ".", "~")) or model_id.count("/") > 1 or model_id.endswith("/")


def model_dir(model_id: str) -> Path | None:
    """The directory holding the model's config.json (and weights): a local directory, a hub cache
    entry given by path, or a hub id already in the local hub cache; None when there is none."""
    if model_id.strip().lower() in SPECS:
        return None
    p = Path(model_id).expanduser()
    if p.is_dir():
        if (p / CONFIG_FILE).exists():
            return p
        if p.name.startswith("models--") and (p / "snapshots").is_dir():
            snap = _snapshot(p)
            if snap is None:
                raise InputError(f"{p}: a hub cache entry without refs/main and with several snapshots", hint=f"pass one of {p / 'snapshots'}/<commit>")
            return snap
        raise InputError(f"model directory {p} has no {CONFIG_FILE}", hint="pass a directory written by save_pretrained (config.json + *.safetensors)")
    if looks_like_path(model_id) and Path(model_id).expanduser().exists():  # a file, not the folder save_pretrained writes
        raise InputError(f"model directory {model_id} is a file, not a directory",
                         hint="pass the folder holding config.json and *.safetensors (written by save_pretrained), a hub id or a built-in spec")
    if looks_like_path(model_id):
        raise InputError(f"model directory {model_id} does not exist", hint=f"pass an existing directory, a hub id (org/name) or a built-in spec: {builtin_names()}")
    if _HUB_ID.match(model_id.strip()):
        entry = hub_cache_root() / ("models--" + model_id.strip().replace("/", "--"))
        if entry.is_dir():
            snap = _snapshot(entry)
            if snap is not None and (snap / CONFIG_FILE).exists():
                return snap
    return None


# Ceilings on a config.json's sizes, each well above any released decoder (Llama 3.1 405B: hidden 16384,
# 126 layers, MLP 53248; vocabularies up to ~262k): beyond them a file is wrong, not a bigger model.
CONFIG_BOUNDS: dict[str, int] = {
    "hidden_size": 1 << 16, "num_attention_heads": 1 << 10, "num_key_value_heads": 1 << 10, "head_dim": 1 << 10,
    "num_hidden_layers": 1 << 10, "intermediate_size": 1 << 20, "vocab_size": 1 << 22, "max_position_embeddings": 1 << 24,
}


def _field(doc: dict[str, Any], key: str, kind: type, where: str, default: Any = ..., minimum: float | None = 1) -> Any:
    if key not in doc or doc[key] is None:
        if default is ...:
            raise InputError(f"{where}: `{key}` is missing", hint="a model's config.json as save_pretrained writes it")
        return default
    v = doc[key]
    ok = isinstance(v, kind) and not (kind is not bool and isinstance(v, bool))
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v, ok = float(v), True
    if not ok:
        raise InputError(f"{where}: `{key}` must be {'a number' if kind is float else 'an integer' if kind is int else kind.__name__}, got {v!r}")
    if minimum is not None and kind in (int, float) and not v >= minimum:
        raise InputError(f"{where}: `{key}` must be at least {minimum:g}, got {v!r}")
    top = CONFIG_BOUNDS.get(key)
    if top is not None and v > top:
        raise InputError(f"{where}: `{key}` must be at most {top:,} (above any released model), got {v:,}")
    return v


def spec_from_config(doc: Any, *, name: str, source: str) -> ModelSpec:
    """A ModelSpec from a parsed config.json; anything raydlc cannot build is refused by name."""
    where = source
    if not isinstance(doc, dict):
        raise InputError(f"{where}: not a JSON object", hint="a model's config.json as save_pretrained writes it")
    model_type = doc.get("model_type")
    archs = doc.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise InputError(f"{where}: `architectures` must be a list of class names, got {archs!r}")
    supported = ", ".join(f"{c} ({t})" for t, c in ARCHITECTURES.items())
    if model_type not in ARCHITECTURES:
        what = f"model_type {model_type!r}" + (f" ({', '.join(archs)})" if archs else "")
        raise InputError(f"{where}: unsupported architecture: {what}", hint=f"raydlc trains {supported}")
    wrong = [a for a in archs if a != ARCHITECTURES[model_type]]
    if wrong:
        raise InputError(f"{where}: unsupported architecture: {', '.join(wrong)}", hint=f"raydlc trains causal LMs: {supported}")
    if doc.get("quantization_config"):
        method = doc["quantization_config"].get("quant_method", "?") if isinstance(doc["quantization_config"], dict) else "?"
        raise InputError(f"{where}: the weights are quantized ({method})", hint="full fine-tuning needs the bf16/fp32 checkpoint")
    llama = model_type == "llama"
    hidden = _field(doc, "hidden_size", int, where)
    heads = _field(doc, "num_attention_heads", int, where)
    kv = _field(doc, "num_key_value_heads", int, where, default=heads)
    head_dim = _field(doc, "head_dim", int, where, default=0, minimum=0)
    if not head_dim and hidden % heads:
        raise InputError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    if heads % kv:
        raise InputError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    rope = doc.get("rope_parameters") if isinstance(doc.get("rope_parameters"), dict) else None
    legacy = doc.get("rope_scaling") if isinstance(doc.get("rope_scaling"), dict) else {}
    rope = dict(rope if rope is not None else legacy)
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    rope.setdefault("rope_theta", doc.get("rope_theta"))
    theta = _field(rope, "rope_theta", float, where, default=10_000.0 if llama else 1_000_000.0)
    rope.pop("rope_theta")
    scaling = tuple(sorted(rope.items())) if rope.get("rope_type", "default") != "default" else ()
    attention_bias = _field(doc, "attention_bias", bool, where, default=False) if llama else True
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=_field(doc, "num_hidden_layers", int, where),
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=_field(doc, "intermediate_size", int, where),
        vocab_size=_field(doc, "vocab_size", int, where),
        tie_embeddings=_field(doc, "tie_word_embeddings", bool, where, default=False),
        max_position_embeddings=_field(doc, "max_position_embeddings", int, where, default=2048 if llama else 32768),
        rope_theta=theta,
        rms_norm_eps=_field(doc, "rms_norm_eps", float, where, default=1e-6, minimum=0),
        architecture=model_type,
        head_dim=head_dim,
        qkv_bias=attention_bias,
        o_bias=llama and attention_bias,
        mlp_bias=_field(doc, "mlp_bias", bool, where, default=False) if llama else False,
        rope_scaling=scaling,
        source=source,
    )


def read_config(directory: Path, name: str) -> ModelSpec:
    """The spec in `directory/config.json`: read as JSON, never the weights."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise InputError(f"{path} is not a file", hint="pass a directory written by save_pretrained")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise InputError(f"{path} is {path.stat().st_size:,} bytes: not a model config")
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from e
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not valid JSON: {e.msg} at line {e.lineno}", hint="a model's config.json as save_pretrained writes it") from e
    return spec_from_config(doc, name=name, source=str(path))


def spec_for(model_id: str) -> ModelSpec | None:
    """Built-in name or hub id, then a model directory or hub cache entry; None for a hub id
    raydlc has neither a spec nor a local copy of (its shapes are known only once downloaded)."""
    spec = resolve_spec(model_id)
    if spec is not None:
        return spec
    d = model_dir(model_id)
    return read_config(d, model_id) if d is not None else None


def get_spec(name: str) -> ModelSpec:
    spec = spec_for(name)
    if spec is None:
        raise InputError(
            f"unknown model spec {name!r}",
            hint=f"built-in specs: {builtin_names()}; or a directory with a config.json (a hub id must be in the local hub cache)",
        )
    return spec


def spec_dict(spec: ModelSpec) -> dict[str, Any]:
    return asdict(spec) | {"params": spec.param_count()}

