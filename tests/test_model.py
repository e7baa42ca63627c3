from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from raydlc.errors import InputError
from raydlc.facts.models import SPECS, ModelSpec, get_spec, model_dir, read_config, resolve_spec, spec_for, spec_from_config
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


# ---- the built-in family -----------------------------------------------------------------------

# The parameter counts the model cards publish (Qwen2.5: "Number of Parameters", Llama: the
# safetensors total), so a transcription error in a spec fails here as well as against the meta model.
PUBLISHED = {
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-72b": 72_706_203_648,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_param_counts_are_the_published_ones(name: str) -> None:
    assert SPECS[name].param_count() == PUBLISHED[name]


def test_the_family_is_there_with_its_architecture() -> None:
    want = {f"qwen2.5-{s}" for s in ("0.5b", "1.5b", "3b", "7b", "14b", "32b", "72b")}
    want |= {"llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.3-70b"}
    assert want <= set(SPECS)
    assert {SPECS[n].architecture for n in want if n.startswith("llama")} == {"llama"}
    assert {SPECS[n].architecture for n in want if n.startswith("qwen")} == {"qwen2"}
    assert resolve_spec("meta-llama/Llama-3.1-8B") is SPECS["llama-3.1-8b"]
    assert resolve_spec("Qwen/Qwen2.5-72B") is SPECS["qwen2.5-72b"]


@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen2.5-7b"])
def test_meta_build_has_the_spec_class_biases_and_rope(name: str) -> None:
    spec = SPECS[name]
    model = build_model(spec, device="meta")
    assert type(model).__name__ == ("LlamaForCausalLM" if spec.architecture == "llama" else "Qwen2ForCausalLM")
    attn = model.model.layers[0].self_attn
    assert (attn.q_proj.bias is not None) == spec.qkv_bias and attn.o_proj.bias is None
    rope = model.config.rope_parameters
    assert rope["rope_theta"] == spec.rope_theta
    assert rope["rope_type"] == ("llama3" if spec.architecture == "llama" else "default")
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == spec.tie_embeddings


# ---- config.json ------------------------------------------------------------------------------

# Qwen/Qwen2.5-7B's config.json as published (transformers 4.x keys: rope_theta, rope_scaling).
QWEN25_7B_JSON = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
    "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.1",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 152064,
}
# meta-llama/Llama-3.2-1B's, likewise.
LLAMA32_1B_JSON = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 128256,
}


def _same_shape(a: ModelSpec, b: ModelSpec) -> None:
    skip = {"name", "hub_id", "source"}
    assert {k: v for k, v in asdict(a).items() if k not in skip} == {k: v for k, v in asdict(b).items() if k not in skip}


@pytest.mark.parametrize("doc, name", [(QWEN25_7B_JSON, "qwen2.5-7b"), (LLAMA32_1B_JSON, "llama-3.2-1b")])
def test_a_published_config_json_reads_as_the_built_in_spec(doc: dict[str, Any], name: str) -> None:
    _same_shape(spec_from_config(doc, name="x", source="config.json"), SPECS[name])


@pytest.mark.parametrize("name", ["tiny", "qwen2.5-72b", "llama-3.1-70b", "llama-3.2-3b"])
def test_what_save_pretrained_writes_reads_back_as_the_spec(name: str, tmp_path: Path) -> None:
    """transformers 5 writes `rope_parameters`; the reader takes both generations of keys."""
    from raydlc.train.model import hf_config

    cfg = hf_config(SPECS[name])
    cfg.architectures = ["LlamaForCausalLM" if SPECS[name].architecture == "llama" else "Qwen2ForCausalLM"]
    cfg.save_pretrained(tmp_path)
    spec = read_config(tmp_path, name="from-disk")
    _same_shape(spec, SPECS[name])
    assert spec.source == str(tmp_path / "config.json")
    assert spec.param_count() == SPECS[name].param_count()


def test_a_directory_spec_counts_what_transformers_builds(tmp_path: Path) -> None:
    """Odd shapes a config.json may carry: head_dim apart from hidden/heads, Llama with biases."""
    doc = dict(LLAMA32_1B_JSON, hidden_size=96, head_dim=40, num_attention_heads=6, num_key_value_heads=2, intermediate_size=200,
               num_hidden_layers=2, vocab_size=500, attention_bias=True, mlp_bias=True, tie_word_embeddings=False)
    (tmp_path / "config.json").write_text(json.dumps(doc))
    spec = get_spec(str(tmp_path))
    model = build_model(spec, device="meta")
    assert sum(p.numel() for p in model.parameters()) == spec.param_count()
    assert model.model.layers[0].self_attn.q_proj.out_features == 240


def test_hub_cache_entries_and_cached_hub_ids_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct"
    snap = entry / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text(json.dumps(dict(QWEN25_7B_JSON, max_position_embeddings=32768)))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert model_dir("Qwen/Qwen2.5-7B-Instruct") == snap
    by_id = spec_for("Qwen/Qwen2.5-7B-Instruct")
    by_path = spec_for(str(entry))
    assert by_id is not None and by_path is not None
    assert by_id.param_count() == SPECS["qwen2.5-7b"].param_count() and by_id.max_position_embeddings == 32768
    assert by_path.source == str(snap / "config.json")
    assert spec_for("Qwen/Qwen2.5-3B-Instruct") is None  # not cached, no built-in: known only once downloaded


@pytest.mark.parametrize(
    "doc, needle",
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "unsupported architecture: model_type 'gpt2' (GPT2LMHeadModel)"),
        ({"model_type": "mixtral"}, "model_type 'mixtral'"),
        ({"architectures": ["LlamaForCausalLM"]}, "model_type None"),
        (dict(LLAMA32_1B_JSON, architectures=["LlamaForSequenceClassification"]), "LlamaForSequenceClassification"),
        (dict(LLAMA32_1B_JSON, quantization_config={"quant_method": "awq"}), "quantized (awq)"),
        (dict(LLAMA32_1B_JSON, hidden_size="2048"), "`hidden_size` must be an integer"),
        (dict(LLAMA32_1B_JSON, tie_word_embeddings="yes"), "`tie_word_embeddings` must be bool"),
        (dict(LLAMA32_1B_JSON, num_hidden_layers=0), "at least 1"),
        ({k: v for k, v in QWEN25_7B_JSON.items() if k != "vocab_size"}, "`vocab_size` is missing"),
        (dict(QWEN25_7B_JSON, num_key_value_heads=5), "not a multiple of num_key_value_heads 5"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_configs_raydlc_cannot_build_are_refused_by_name(doc: Any, needle: str) -> None:
    with pytest.raises(InputError) as e:
        spec_from_config(doc, name="m", source="m/config.json")
    assert needle in e.value.message and e.value.message.startswith("m/config.json")


def test_paths_that_are_not_model_directories(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"has no config\.json"):
        spec_for(str(tmp_path / "empty"))
    with pytest.raises(InputError, match="does not exist"):
        spec_for(str(tmp_path / "nope"))
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "config.json").write_bytes(b" " * (2 << 20))
    with pytest.raises(InputError, match="not a model config"):
        spec_for(str(tmp_path / "big"))
    assert spec_for("someone/else") is None


def test_plan_reads_a_model_directory_and_the_72b_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.cli import main

    (tmp_path / "config.json").write_text(json.dumps(LLAMA32_1B_JSON))
    assert main(["plan", "--model", str(tmp_path), "--nodes", "2", "--gpus-per-node", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["params"] == PUBLISHED["llama-3.2-1b"] and doc["model"] == str(tmp_path)
    assert main(["plan", "--model", "qwen2.5-72b", "--nodes", "16", "--gpus-per-node", "8", "--gpu", "h100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["params"] == PUBLISHED["qwen2.5-72b"] and doc["fits"] and doc["recommendation"]["micro_batch"] >= 1
