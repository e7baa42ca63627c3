"""Pretrained weights, loaded shard by shard: no rank ever holds the whole model.

`from_pretrained` in every worker costs each rank the full model in host memory before FSDP
shards it (a 70B model: ~280 GB per rank, eight ranks a node). Instead the model is built on
the meta device from its config.json, sharded by FSDP2, given real storage for its local
shards only (`to_empty`), and then torch.distributed.checkpoint's Hugging Face reader copies
into each shard just its rows of each tensor: `safe_open(...).get_slice(name)[rows]` reads
those bytes of the memory-mapped file and nothing else. A tied head is the embedding under a
second name and is absent from the files, so it is filled through the embedding.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.errors import InputError, TrainError
from raydlc.facts.models import model_dir, read_config

if TYPE_CHECKING:
    import torch
    from torch import nn

    from raydlc.facts.models import ModelSpec

SUFFIX = ".safetensors"
# What a run needs from a hub repository: the config, the weights, the tokenizer.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]


def weights_dir(model_id: str) -> Path:
    """The local directory of the model's files: the directory itself, its hub cache entry, or a
    download into the hub cache (huggingface_hub's file locks let every rank on a node ask at once)."""
    local = model_dir(model_id)
    if local is not None:
        return local
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True", "yes"):
        raise InputError(
            f"model {model_id!r} is a hub id that is not in the local hub cache, and HF_HUB_OFFLINE is set",
            hint="download it first (hf download ID) or pass a local directory",
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model_id, allow_patterns=HUB_PATTERNS))
    except Exception as e:  # huggingface_hub's errors: not found, gated, no network
        raise InputError(f"cannot download model {model_id!r}: {type(e).__name__}: {e}", hint="check the id and HF_TOKEN, or pass a local directory") from e


def safetensors_files(directory: Path) -> list[Path]:
    files = sorted(p for p in directory.iterdir() if p.name.endswith(SUFFIX))
    if not files:
        raise InputError(
            f"{directory} has no {SUFFIX} files: raydlc loads weights shard by shard from safetensors",
            hint="convert once with model.save_pretrained(DIR) (safetensors is its default)",
        )
    return files


# safetensors' header: 8 bytes (little-endian length N), then N bytes of JSON naming each tensor's
# dtype, shape and byte range in the data that follows (github.com/huggingface/safetensors, format).
HEADER_MAX = 100 << 20  # the library's own limit on N
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
FLOATS = {"F64", "F32", "F16", "BF16"}  # what the loader copies into the model's parameters


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's (dtype, shape) from a .safetensors file's header, checked against the file's size;
    no tensor is read. A file cut short or not safetensors at all raises InputError naming it."""
    import json
    import struct

    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= min(HEADER_MAX, size - 8):
                raise InputError(f"{path}: not a safetensors file (no header)", hint=_SAVE_HINT)
            doc = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"{path}: not a safetensors file (its header is not JSON)", hint=_SAVE_HINT) from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a safetensors file (its header is not a JSON object)", hint=_SAVE_HINT)
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, t in doc.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(path, name, t, size - 8 - n)
    return out


def _entry(path: Path, name: str, t: object, data_bytes: int) -> tuple[str, tuple[int, ...]]:
    """One header entry: a known dtype, a shape of whole numbers, a byte range that fits the file."""
    ok = isinstance(t, dict) and t.get("dtype") in ITEMSIZE and isinstance(t.get("shape"), list) and isinstance(t.get("data_offsets"), list)
    shape = t.get("shape") if isinstance(t, dict) else None
    offsets = t.get("data_offsets") if isinstance(t, dict) else None
    if not ok or not all(isinstance(d, int) and d >= 0 for d in shape or []) or len(offsets or []) != 2 \
            or not all(isinstance(o, int) and o >= 0 for o in offsets or []):
        raise InputError(f"{path}: tensor {name[:100]!r} has a malformed header entry", hint=_SAVE_HINT)
    assert isinstance(t, dict) and isinstance(shape, list) and isinstance(offsets, list)
    begin, end = offsets
    want = ITEMSIZE[t["dtype"]]
    for d in shape:
        want *= d
    if end - begin != want:
        raise InputError(f"{path}: tensor {name[:100]!r} holds {end - begin:,} bytes, its shape {tuple(shape)} as {t['dtype']} needs {want:,}",
                         hint=_SAVE_HINT)
    if end > data_bytes:
        raise InputError(f"{path} is cut short: tensor {name[:100]!r} ends at byte {end:,} of {data_bytes:,}",
                         hint="copy the file again; compare its size with the source's")
    return t["dtype"], tuple(shape)


_SAVE_HINT = "write the directory with model.save_pretrained(DIR) (safetensors is its default)"


def check_against_config(directory: Path, spec: ModelSpec) -> int:
    """The safetensors in `directory` hold every tensor `spec` (its config.json) needs, in its shape
    and as floats, and no file is cut short: checked from the headers before Ray starts. Returns the
    number of tensors."""
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in safetensors_files(directory):
        found |= read_header(f)
    want = spec.tensor_shapes()
    missing = sorted(k for k in want if k not in found and k not in spec.optional_tensors())
    if missing:
        raise InputError(
            f"{directory}: the safetensors lack {len(missing)} of the config's tensors ({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''})",
            hint="the config.json and the weights must come from the same save_pretrained",
        )
    for name, (dtype, shape) in sorted(found.items()):
        if name in want and shape != want[name]:
            raise InputError(f"{directory}: tensor {name} is {shape} in the safetensors, the config.json says {want[name]}",
                             hint="the config.json and the weights must come from the same save_pretrained")
        if name in want and dtype not in FLOATS:
            raise InputError(f"{directory}: tensor {name} is {dtype}, not a float type (F32, F16, BF16)",
                             hint="quantized or integer weights are not trained here: pass the full-precision model")
    return len(found)


def checkpoint_keys(files: list[Path]) -> set[str]:
    """The tensor names in the files, from their headers only."""
    from safetensors import safe_open

    keys: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            keys.update(h.keys())
    return keys


def reset_computed_buffers(model: nn.Module, device: torch.device) -> None:
    """`to_empty` leaves non-persistent buffers (RoPE's inverse frequencies) uninitialised: they are
    not in any checkpoint, so recompute them the way the module's own constructor does."""
    import torch

    for mod_name, module in model.named_modules():
        computed = [n for n in getattr(module, "_non_persistent_buffers_set", ()) if getattr(module, n, None) is not None]
        if not computed:
            continue
        if "RotaryEmbedding" not in type(module).__name__:
            raise TrainError(f"cannot initialise buffer(s) {computed} of {mod_name or 'the model'} ({type(module).__name__}) after meta-device build")
        with torch.device(device):
            fresh = type(module)(config=module.config)  # type: ignore[call-arg]
        with torch.no_grad():
            for n in computed:
                getattr(module, n).copy_(getattr(fresh, n))


def load_shards(model: nn.Module, directory: Path) -> dict[str, Any]:
    """Fill an FSDP2-sharded model (local shards allocated, values garbage) from the safetensors in
    `directory`: each rank reads only its own slices. Collective: every rank calls it."""
    import torch
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    files = safetensors_files(directory)
    t0 = time.perf_counter()
    from raydlc.train.lora import is_adapter_key

    sd = {k: v for k, v in get_model_state_dict(model).items() if not is_adapter_key(k)}  # LoRA's adapters: initialised, not read
    in_files = checkpoint_keys(files)
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    if tied:
        if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:  # type: ignore[operator]
            raise TrainError("the tied head is not the embedding any more (to_empty unties a plain model: call tie_weights() first)")
        for k in [k for k in sd if k not in in_files and k.endswith("lm_head.weight")]:
            del sd[k]  # the embedding under another name: loaded through it
    missing = sorted(k for k in sd if k not in in_files)
    if missing:
        raise InputError(
            f"{directory}: the safetensors lack {len(missing)} of the model's tensors ({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''})",
            hint="the config.json and the weights must come from the same save_pretrained",
        )
    dcp_load(sd, storage_reader=HuggingFaceStorageReader(str(directory)))
    read = sum(_local(v).numel() for v in sd.values() if isinstance(v, torch.Tensor))
    return {"tensors": len(sd), "files": len(files), "local_elements": read, "seconds": time.perf_counter() - t0}


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def build_sharded(model_id: str, *, device: torch.device, shard: Callable[[nn.Module], nn.Module], log: bool = False) -> nn.Module:
    """The pretrained model, sharded: config -> meta-device model -> FSDP2 (`shard`) -> local
    storage -> this rank's slices of the weights. Host memory per rank is about its shard."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = weights_dir(model_id)
    read_config(directory, model_id)  # refuses an architecture raydlc cannot build, by name
    safetensors_files(directory)
    config = AutoConfig.from_pretrained(str(directory))
    config.use_cache = False
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model = shard(model)
    model.to_empty(device=device)
    reset_computed_buffers(model, device)
    stats = load_shards(model, directory)  # FSDP2 keeps a tied head tied through to_empty; load_shards checks
    if log:
        print(
            f"[raydlc] loaded {stats['tensors']} tensors from {len(list(directory.glob('*' + SUFFIX)))} safetensors file(s) in "
            f"{stats['seconds']:.1f}s, shard by shard ({stats['local_elements']:,} elements on this rank)",
            flush=True,
        )
    return model
