"""What a run produced, end to end under a real local Ray: `raydlc generate` and `raydlc eval` on a run (the api
examples, each trains its own), and a LoRA run on the built-in spec with EVAL_AFTER=true: the evaluation runs as a
Ray task at the run's end, its results in the summary and the model card, and the adapter loads from the paths its
own export names. Slow: Ray runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from tests.test_api_train_plan import run_example

import raydlc.api as api

pytestmark = pytest.mark.slow


def test_the_generate_example_runs(clean_env: Path, ray_local: Any) -> None:
    run_example(api.generate)


def test_the_evaluate_example_runs(clean_env: Path, ray_local: Any) -> None:
    run_example(api.evaluate)


@pytest.fixture(scope="module")
def lora_run(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return api.train(steps=4, seq_len=32, batch_size=2, workers=1, lr=1e-2, lora_rank=4, eval_after=True, settings={"WARMUP_STEPS": "0"},
                     out=tmp_path_factory.mktemp("lora"), log_to_driver=False)


def test_eval_after_runs_at_the_end_and_lands_in_the_summary_and_the_card(lora_run: Any) -> None:
    from huggingface_hub import ModelCard

    assert not lora_run.end_warnings
    ev = lora_run.evaluation
    assert ev is not None and ev["base_name"].endswith("/export/base")
    assert math.isclose(ev["fine_tuned"]["held_out"]["perplexity"], math.exp(lora_run.eval_loss), rel_tol=1e-3)
    assert ev["base"]["held_out"]["perplexity"] > ev["fine_tuned"]["held_out"]["perplexity"]
    card = ModelCard.load(lora_run.model_card)
    assert card.data.library_name == "transformers" and "lora" in card.data.tags
    assert f"| held-out perplexity | {ev['fine_tuned']['held_out']['perplexity']:.4f} |" in card.text


def test_the_lora_adapter_loads_from_its_own_export_and_matches_the_merged_model(lora_run: Any) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    export = Path(lora_run.export)
    named = json.loads((export / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert named == str(export / "base")
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(named), str(export / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(export)).eval()
    ids = torch.randint(0, merged.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(tuned(ids).logits, merged(ids).logits, atol=1e-4)


def test_raydlc_eval_json_on_the_run(lora_run: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.cli import main

    assert main(["eval", lora_run.run_dir, "--prompt", "Return the", "--max-new-tokens", "4", "--device", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert math.isclose(doc["fine_tuned"]["held_out"]["loss"], lora_run.eval_loss, rel_tol=1e-3)
    assert [g["prompt"] for g in doc["generations"]] == ["Return the"] and doc["generations"][0]["base"] is not None
    assert main(["eval", lora_run.run_dir, "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu"]) == 0
    shown = capsys.readouterr().out
    assert "held-out perplexity" in shown and "fine-tuned:" in shown and "base:" in shown
