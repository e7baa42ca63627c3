"""LoRA end to end under a real local Ray (issue 36): 2 workers take the steps of 1 on the same global
batch, a resume continues identically (the base rebuilt from its seeded init), the checkpoint holds
the adapters only, and the export has the merged model and `adapter/`.

The tiny built-in model is random-init and its embedding and head are frozen under LoRA, so its loss
falls only a few percent in a few steps: the tests assert that it falls, not by how much.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.test_train_e2e import BASE, QUIET, assert_close, fingerprints, losses

from raydlc.config import TrainConfig
from raydlc.data.corpus import bundled_corpus
from raydlc.train.launch import run

pytestmark = pytest.mark.slow

STEPS = 6


@pytest.fixture(scope="module")
def local_ray(ray_local: Any) -> None:
    """The session's one in-process Ray (tests/conftest.py)."""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> TrainConfig:
    """test_train_e2e's run: a slice of the bundled corpus as a user .txt file."""
    path = tmp_path_factory.mktemp("data") / "docstrings.txt"
    path.write_text("\n\n".join(d.text for d in bundled_corpus(max_chars=150_000)))
    return BASE.updated(data=str(path))


def size(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def lora(base: TrainConfig) -> TrainConfig:
    return base.updated(lora_rank=8, warmup_steps=0, learning_rate=1e-2)


@pytest.fixture(scope="module")
def lora_two(local_ray: None, lora: TrainConfig, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run(lora.updated(storage_path=str(tmp_path_factory.mktemp("lora-two"))), QUIET)


def test_lora_on_two_workers_takes_the_steps_of_one(lora_two: dict[str, Any], lora: TrainConfig, tmp_path: Path) -> None:
    one = run(lora.updated(num_workers=1, batch_size=4, storage_path=str(tmp_path)), QUIET)
    assert one["global_batch"] == lora_two["global_batch"] == 4
    assert_close(losses(one), losses(lora_two))
    assert fingerprints(one) == fingerprints(lora_two)
    assert lora_two["final_loss"] < lora_two["first_loss"]


def test_resume_continues_identically(lora_two: dict[str, Any], lora: TrainConfig, tmp_path: Path) -> None:
    earlier = Path(lora_two["run_dir"]) / "checkpoint_000004"
    resumed = run(lora.updated(resume_from=str(earlier), storage_path=str(tmp_path)), QUIET)
    assert resumed["resumed_from"] == str(earlier)
    assert_close(losses(resumed), losses(lora_two))
    assert fingerprints(resumed) == fingerprints(lora_two)


def test_the_checkpoint_holds_adapters_only(lora_two: dict[str, Any], base: TrainConfig, local_ray: None, tmp_path: Path) -> None:
    from raydlc.train.checkpoint import load_extra, read_metadata

    ck = Path(lora_two["run_dir"]) / "checkpoint_000006"
    keys = [k for k in read_metadata(ck).state_dict_metadata if k.startswith("model.")]
    assert keys and all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in keys), keys[:5]
    assert json.loads((ck / "raydlc_checkpoint.json").read_text())["meta"]["lora_rank"] == 8
    extras = [load_extra(ck, ck / f"extra_rank{r}.pt") for r in (0, 1)]
    assert len(extras[0]["history"]) >= 6 and "history" not in extras[1]  # the run's records, stored once
    full = run(base.updated(steps=2, checkpoint_every=2, storage_path=str(tmp_path)), QUIET)
    share = size(ck) / size(Path(full["run_dir"]) / "checkpoint_000002")
    print(f"LoRA checkpoint: {size(ck):,} bytes, {share:.2%} of a full one")
    assert share < 0.05


def test_the_export_has_the_merged_model_and_the_adapter(lora_two: dict[str, Any]) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = Path(lora_two["export"])
    config = json.loads((export / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16 and len(config["target_modules"]) == 7
    adapter = load_file(str(export / "adapter" / "adapter_model.safetensors"))
    b = {k: v for k, v in adapter.items() if k.endswith(".lora_B.weight")}
    assert len(b) == 4 * 7 and all(bool(v.abs().sum() > 0) for v in b.values())  # every B left zero: each adapter trained
    model = AutoModelForCausalLM.from_pretrained(str(export))
    tok = AutoTokenizer.from_pretrained(str(export))
    assert not any("lora" in n for n, _ in model.named_parameters())  # merged: plain HF keys
    prompt = tok("Return the", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]
