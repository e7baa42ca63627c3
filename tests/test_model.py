from __future__ import annotations

import pytest

from raydlc.errors import InputError
from raydlc.models import SPECS, get_spec, resolve_spec
from raydlc.train.model import build_model


@pytest.mark.parametrize("name", list(SPECS))
def test_param_count_formula_matches_the_real_architecture(name: str) -> None:
    spec = SPECS[name]
    model = build_model(spec, device="meta")
    assert sum(p.numel() for p in model.parameters()) == spec.param_count()


def test_qwen25_15b_is_exact() -> None:
    spec = get_spec("qwen2.5-1.5b")
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (1536, 28, 12, 2)
    assert (spec.intermediate_size, spec.vocab_size, spec.tie_embeddings) == (8960, 151936, True)
    assert spec.param_count() == 1_543_714_304


def test_hub_ids_resolve_to_specs_and_unknown_names_fail() -> None:
    assert resolve_spec("Qwen/Qwen2.5-1.5B") is SPECS["qwen2.5-1.5b"]
    assert resolve_spec("someone/else") is None
    with pytest.raises(InputError, match="unknown model spec"):
        get_spec("gpt-9")


def test_tiny_trains_one_step_on_cpu() -> None:
    import torch

    spec = SPECS["tiny"]
    assert 1_000_000 < spec.param_count() < 10_000_000
    model = build_model(spec)
    ids = torch.randint(0, spec.vocab_size, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and abs(loss.item() - torch.log(torch.tensor(spec.vocab_size)).item()) < 1.0
