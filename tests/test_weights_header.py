"""The safetensors of a model directory are checked against its config.json from their headers
alone (names, shapes, dtypes, byte sizes, truncation), before Ray starts: a directory that
does not match fails in the driver in well under a second, not after a minute of Ray."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from raydlc.errors import InputError
from raydlc.facts.models import ModelSpec, read_config
from raydlc.train.model import build_model
from raydlc.train.weights import check_against_config, read_header, safetensors_files

SPECS = [
    ModelSpec("qwen2-untied", 64, 2, 4, 2, 128, 300, False, max_position_embeddings=512),
    ModelSpec("llama-tied", 64, 2, 4, 2, 128, 300, True, max_position_embeddings=512, architecture="llama", qkv_bias=False),
]


def saved(spec: ModelSpec, directory: Path) -> ModelSpec:
    model = build_model(spec, seed=1)
    model.save_pretrained(directory, max_shard_size="40KB")
    return read_config(directory, str(directory))


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_the_names_and_shapes_a_config_implies_are_what_save_pretrained_writes(spec: ModelSpec, tmp_path: Path) -> None:
    read = saved(spec, tmp_path / "m")
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in safetensors_files(tmp_path / "m"):
        found |= read_header(f)
    model = build_model(spec, seed=1)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items() if k in found} == {k: s for k, (_, s) in found.items()}
    want = read.tensor_shapes()
    assert {k for k in want if k not in read.optional_tensors()} <= set(found) <= set(want)
    assert {k: want[k] for k in found} == {k: s for k, (_, s) in found.items()}
    assert check_against_config(tmp_path / "m", read) == len(found)


def _rewrite(path: Path, edit: object) -> None:
    """Rewrite a safetensors file's header through `edit(header) -> header`, keeping its data."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = edit(json.loads(raw[8:8 + n]))  # type: ignore[operator]
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def test_mismatched_truncated_and_foreign_files_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    d = tmp_path / "m"
    spec = saved(SPECS[0], d)
    wrong = spec.__class__(**{**spec.__dict__, "intermediate_size": 96})
    with pytest.raises(InputError, match=r"mlp\.\w+_proj\.weight is \(\d+, \d+\) in the safetensors, the config.json says"):
        check_against_config(d, wrong)
    deeper = spec.__class__(**{**spec.__dict__, "num_layers": 3})
    with pytest.raises(InputError, match=r"lack 12 of the config's tensors \(model\.layers\.2\."):
        check_against_config(d, deeper)

    files = safetensors_files(d)
    first = files[0]
    data = first.read_bytes()
    first.write_bytes(data[: len(data) - 10])  # a copy cut short
    with pytest.raises(InputError, match=r"is cut short: tensor '.+' ends at byte"):
        check_against_config(d, spec)
    first.write_bytes(data)

    name = next(iter(read_header(first)))
    _rewrite(first, lambda h: {**h, name: {**h[name], "dtype": "I8"}})
    with pytest.raises(InputError, match=r"holds [\d,]+ bytes, its shape .* as I8 needs"):
        check_against_config(d, spec)
    first.write_bytes(data)

    other = files[1]
    other.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(InputError, match="not a safetensors file"):
        check_against_config(d, spec)


def test_integer_weights_are_refused_as_not_float(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    spec = SPECS[1]
    d = tmp_path / "m"
    d.mkdir()
    save_file({k: torch.zeros(s, dtype=torch.int8) for k, s in spec.tensor_shapes().items()}, str(d / "model.safetensors"))
    with pytest.raises(InputError, match="is I8, not a float type"):
        check_against_config(d, spec)
