"""The model card the run's end writes into the export, read back by huggingface_hub's `ModelCard` (the Hub's parser).

The card step runs on a real RunSpec and summary over a run directory holding an export and its metrics, as
`train.ending.finish` calls it; the metadata block, the sections and the loss table come from them.
"""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import ModelCard

from raydlc.config import TrainConfig
from raydlc.data.tokenizer import TokenizerInfo
from raydlc.evaluate import card as cards
from raydlc.train import ending
from raydlc.train.layout import plan_mesh
from raydlc.train.runspec import RunSpec


def run_spec(run_dir: Path, **train: object) -> RunSpec:
    return RunSpec(train=TrainConfig(**{"model_id": "tiny", "num_workers": 2, "steps": 4, "seq_len": 32, **train}), spec="tiny",
                   mesh=plan_mesh("fsdp", [2]), use_gpu=False, bf16=False, run_name="run-x", run_dir=str(run_dir),
                   tokenizer=TokenizerInfo(eos_id=0, vocab_size=10, tokenizer_json="{}"), data_digest="d" * 64)


def summary(run_dir: Path) -> dict:
    (run_dir / "export").mkdir(parents=True)
    records = [{"step": s, "loss": 5.0 - s / 4} for s in range(1, 21)] + [{"step": 20, "eval_loss": 4.2}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return {"steps": 20, "eval_loss": 4.2, "train_sequences": 40, "tokens_per_s": 1234.5, "wall_s": 60.0, "run_name": "run-x",
            "export": str(run_dir / "export"), "metrics": str(run_dir / "metrics.jsonl"), "dataset": None,
            "evaluation": {"fine_tuned": {"held_out": {"loss": 4.2, "perplexity": 66.7}}, "base": {"held_out": {"loss": 8.3, "perplexity": 4023.9}},
                           "generations": [{"prompt": "def f", "fine_tuned": "(x):", "base": "zz"}]}}


def test_the_card_step_writes_a_card_the_hub_parses(tmp_path: Path) -> None:
    run = tmp_path / "run-x"
    out = ending.finish(run_spec(run), summary(run))
    assert "end_warnings" not in out, out.get("end_warnings")
    assert out["model_card"] == str(run / "export" / "README.md")
    card = ModelCard.load(run / "export" / "README.md")
    d = card.data.to_dict()
    assert d["library_name"] == "transformers" and d["pipeline_tag"] == "text-generation"
    assert "base_model" not in d  # a built-in spec is no Hub repository
    assert d["datasets"] == ["raydlc-data-" + "d" * 16] and "raydlc" in d["tags"] and "lora" not in d["tags"]
    text = card.text
    for part in ("## Training hyperparameters", "## Cluster and layout", "## Training loss", "## Evaluation", "## How to load it"):
        assert part in text
    assert "| learning rate | 2e-05 |" in text and "| sharding | fsdp |" in text and "| epochs seen | 1.0 |" in text  # 20 steps x 2 sequences / 40
    assert "| 20 | 0.0000 | 4.2000 |" in text  # the last step, with its eval loss
    assert "| held-out perplexity | 66.7000 | 4023.9000 |" in text
    prov = json.loads((run / "export" / "raydlc_run.json").read_text())
    assert prov["base"] == {"builtin": "tiny", "seed": 0} and prov["eval_loss"] == 4.2


def test_a_lora_card_names_peft_and_the_adapters_base(tmp_path: Path) -> None:
    facts = {"model": "Qwen/Qwen2.5-0.5B", "base_hub_id": "Qwen/Qwen2.5-0.5B", "adapter_base": "Qwen/Qwen2.5-0.5B", "export": "/r/export",
             "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}, "merged": False, "data_digest": "ab" * 32,
             "chat_template": True, "loss_points": [(1, 2.0, None)]}
    card = ModelCard(cards.render(facts))
    d = card.data.to_dict()
    assert d["base_model"] == "Qwen/Qwen2.5-0.5B" and d["library_name"] == "peft" and "lora" in d["tags"]
    assert "PeftModel.from_pretrained(base, '/r/export/adapter')" in card.text
    assert "| LoRA rank | 8 |" in card.text and "apply_chat_template" in card.text
    assert "Not evaluated after training" in card.text


def test_loss_points_keep_the_first_and_last_step() -> None:
    recs = [{"step": s, "loss": float(s)} for s in range(1, 101)]
    pts = cards.loss_points(recs, 5)
    assert [p[0] for p in pts] == [1, 26, 51, 75, 100] and cards.loss_points([]) == []


def test_eval_after_travels_to_a_cluster_job_and_the_ending_skips_evaluation_without_it(tmp_path: Path) -> None:
    from raydlc.config import load_config
    from raydlc.evaluate import ending as E
    from raydlc.render.raycluster import job_env

    assert job_env(load_config(env={"RAYDLC_EVAL_AFTER": "true"}))["RAYDLC_EVAL_AFTER"] == "true"  # python -m raydlc.train reads it
    assert "RAYDLC_EVAL_AFTER" not in job_env(load_config(env={}))
    end = ending.RunEnd(run_spec(tmp_path / "r"), {})
    assert E.evaluation(end) == {}  # EVAL_AFTER=false: no Ray task, nothing added
    assert E.base_of(run_spec(tmp_path / "r", lora_rank=4)) == {"path": f"{tmp_path / 'r'}/export/base"}


def test_a_lora_card_shows_a_target_pattern_whole(tmp_path: Path) -> None:
    """LORA_TARGET_REGEX (issue 46): the adapter's target_modules is one string; the card names it whole, not letter by letter."""
    run = tmp_path / "run-x"
    s = summary(run)
    (run / "export" / "adapter").mkdir()
    pattern = r"model\.layers\.1\..*_proj"
    (run / "export" / "adapter" / "adapter_config.json").write_text(json.dumps({"lora_alpha": 8, "target_modules": pattern}))
    from raydlc.evaluate.ending import card_facts

    facts = card_facts(ending.RunEnd(run_spec(run, lora_rank=4, lora_target_regex=pattern), s), [])
    assert facts["lora"]["targets"] == [pattern]
    assert f"| LoRA targets | {pattern} |" in ModelCard(cards.render({**facts, "loss_points": [(1, 2.0, None)]})).text.replace("\\|", "|")
