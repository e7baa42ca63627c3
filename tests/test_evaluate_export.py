"""The export as Hugging Face tools read it, built by raydlc's export code on a tiny model without Ray.

A chat fine-tune's export: `apply_chat_template` gives the very text the data pipeline rendered (raydlc's default
template, and a tokenizer's own), `model_max_length` is finite, `generation_config.json` names the tokenizer's EOS,
`pipeline("text-generation")` runs. LoRA on a built-in spec: the adapter's `base_model_name_or_path` is a folder
the export wrote, and peft loads the adapter on it into the merged model's logits. Then `raydlc generate` on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from raydlc.data import formats
from raydlc.data.tokenizer import EOS, TokenizerInfo, to_hf, train_bpe
from raydlc.facts.models import ModelSpec
from raydlc.train.checkpoint import save_hf
from raydlc.train.model import build_model

SPEC = ModelSpec("eval-tiny", 64, 2, 4, 2, 128, 0, True, max_position_embeddings=256)  # vocab from the tokenizer
CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                     {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6."}]}
OWN_TEMPLATE = ("{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}[ASSISTANT] {% endif %}")


def trained_text(rec: dict, render: formats.Renderer = formats.default_render) -> str:
    """The text the data pipeline encodes for a record (data.encode: its segments, then EOS)."""
    return "".join(s.text for s in formats.segments(rec, render=render))


def bpe_info() -> TokenizerInfo:
    texts = [trained_text(CHAT)] * 4 + ["def f(x):\n    return x + 1\n"] * 4
    tok = train_bpe(texts, 300)
    return TokenizerInfo(eos_id=tok.token_to_id(EOS), vocab_size=tok.get_vocab_size(), tokenizer_json=tok.to_str())


def export(tmp: Path, info: TokenizerInfo, name: str = "export") -> Path:
    """What loop.finalize writes for a full fine-tune: to_hf with the model's positions, then save_hf."""
    spec = ModelSpec(**{**SPEC.__dict__, "vocab_size": info.vocab_size})
    model = build_model(spec, seed=0)
    tok = to_hf(info, max_length=model.config.max_position_embeddings)
    save_hf(model.config, model.state_dict(), tmp / name, tokenizer=tok)
    return tmp / name


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(tmp_path_factory.mktemp("chat"), bpe_info())


def test_apply_chat_template_gives_the_text_the_data_pipeline_trained_on(chat_export: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(chat_export))
    assert tok.apply_chat_template(CHAT["messages"], tokenize=False) == trained_text(CHAT)
    given = tok.apply_chat_template(CHAT["messages"][:2], tokenize=False, add_generation_prompt=True)
    assert trained_text(CHAT).startswith(given) and given.endswith("<|im_start|>assistant\n")
    saved = json.loads((chat_export / "tokenizer_config.json").read_text()).get("chat_template") or (chat_export / "chat_template.jinja").read_text()
    assert saved == formats.DEFAULT_CHAT_TEMPLATE


def test_model_max_length_is_the_models_positions_and_generation_config_names_eos(chat_export: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(chat_export))
    assert tok.model_max_length == 256
    gen = json.loads((chat_export / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id == tok.convert_tokens_to_ids(EOS)
    assert gen["pad_token_id"] == tok.pad_token_id


def test_pipeline_text_generation_runs_on_the_export_as_is(chat_export: Path) -> None:
    from transformers import pipeline

    gen = pipeline("text-generation", model=str(chat_export), device="cpu")
    out = gen([{"role": "user", "content": "What is 2+2?"}], max_new_tokens=5, do_sample=False)
    assert out[0]["generated_text"][-1]["role"] == "assistant"
    out = gen("def f(x):", max_new_tokens=5, do_sample=False)
    assert out[0]["generated_text"].startswith("def f(x):") and len(out[0]["generated_text"]) > len("def f(x):")


def test_a_tokenizers_own_template_is_kept_and_matches_the_pipeline(tmp_path: Path) -> None:
    """CHAT_TEMPLATE=model with a tokenizer that has one: the export keeps that template, which rendered the data."""
    import functools

    own = to_hf(bpe_info())
    own.chat_template = OWN_TEMPLATE
    own.save_pretrained(str(tmp_path / "own"))
    build_model(ModelSpec(**{**SPEC.__dict__, "vocab_size": len(own)}), device="meta").config.save_pretrained(str(tmp_path / "own"))  # a model folder
    info = TokenizerInfo(eos_id=own.eos_token_id, vocab_size=len(own), pretrained=str(tmp_path / "own"), template="model")
    out = export(tmp_path, info)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    rendered = trained_text(CHAT, formats.template_render(functools.partial(own.apply_chat_template, tokenize=False)))
    assert rendered.startswith("[SYSTEM] Be brief.")
    assert tok.apply_chat_template(CHAT["messages"], tokenize=False) == rendered
    # CHAT_TEMPLATE=default over the same tokenizer: the data was rendered with the default, and so is the export's
    tok = AutoTokenizer.from_pretrained(str(export(tmp_path, TokenizerInfo(**{**info.__dict__, "template": "default"}), "default")))
    assert tok.apply_chat_template(CHAT["messages"], tokenize=False) == trained_text(CHAT)


def test_lora_on_a_built_in_spec_loads_from_the_paths_its_export_names(tmp_path: Path) -> None:
    """write(base_dir=…): the base beside the adapter; peft on that base gives the merged model's logits."""
    from peft import PeftModel
    from tests.test_lora_export import ALPHA, RANK, TARGETS, adapters_for
    from transformers import AutoModelForCausalLM

    from raydlc.train import lora_export as X

    info = bpe_info()
    spec = ModelSpec(**{**SPEC.__dict__, "vocab_size": info.vocab_size})
    model = build_model(spec, seed=0).eval()
    state = {**model.state_dict(), **adapters_for(model)}
    tok = to_hf(info, max_length=256)
    out = tmp_path / "run" / "export"
    X.write(out, state, rank=RANK, alpha=ALPHA, dropout=0.0, targets=TARGETS, base_model="eval-tiny", merge=True,
            save_merged=lambda w, f: save_hf(model.config, w, f, tokenizer=tok), base_dir=str(out / X.BASE_DIR))
    named = json.loads((out / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert named == str(out / "base")
    base = AutoModelForCausalLM.from_pretrained(named)
    for k, v in model.state_dict().items():
        assert torch.equal(base.state_dict()[k], v), k
    peft_model = PeftModel.from_pretrained(base, str(out / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = torch.randint(0, info.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = peft_model(ids).logits, merged(ids).logits
    assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    assert not torch.allclose(a, model(ids).logits, atol=1e-3)  # the adapter changed something
    from peft import AutoPeftModelForCausalLM  # reads base_model_name_or_path itself: the export alone suffices

    with torch.no_grad():
        assert torch.allclose(AutoPeftModelForCausalLM.from_pretrained(str(out / "adapter")).eval()(ids).logits, b, atol=1e-4)


def test_generate_greedy_is_repeatable_and_compare_with_itself_agrees(chat_export: Path) -> None:
    import raydlc.api as api

    r = api.generate(chat_export, prompt="What is 2+2?", chat=True, max_new_tokens=6, compare=str(chat_export), device="cpu")
    assert r.chat and r.sampling["temperature"] == 0
    [o] = r.outputs
    assert isinstance(o["fine_tuned"], str) and o["fine_tuned"] == o["base"]  # the same weights, greedy
    s1 = api.generate(chat_export, prompt="def f", max_new_tokens=6, temperature=1.0, seed=5, device="cpu").outputs[0]["fine_tuned"]
    s2 = api.generate(chat_export, prompt="def f", max_new_tokens=6, temperature=1.0, seed=5, device="cpu").outputs[0]["fine_tuned"]
    assert s1 == s2


def test_generate_cli_json_and_its_errors(chat_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert main(["generate", str(chat_export), "--prompts", str(prompts), "--max-new-tokens", "3", "--device", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [o["prompt"] for o in doc["outputs"]] == ["a", "b"] and doc["base"] is None
    assert main(["generate", str(tmp_path), "--prompt", "x"]) == 2
    assert "neither a run directory" in capsys.readouterr().err
    assert main(["generate", str(chat_export)]) == 2
    assert "nothing to generate from" in capsys.readouterr().err


def test_vllm_reads_the_exports_config_where_installed(chat_export: Path) -> None:
    vllm_config = pytest.importorskip("vllm.config", reason="vllm is not installed (an optional check)")
    cfg = vllm_config.ModelConfig(model=str(chat_export), tokenizer=str(chat_export), dtype="float32")
    assert cfg.max_model_len <= 256


def test_generation_stops_at_the_end_of_a_turn_where_the_tokenizer_has_it_as_one_token(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, GenerationConfig

    info = bpe_info()
    tok = to_hf(info, max_length=256)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    model = build_model(ModelSpec(**{**SPEC.__dict__, "vocab_size": len(tok)}), seed=0)
    save_hf(model.config, model.state_dict(), tmp_path / "e", tokenizer=tok)
    turn = tok.convert_tokens_to_ids("<|im_end|>")
    assert GenerationConfig.from_pretrained(str(tmp_path / "e")).eos_token_id == [tok.eos_token_id, turn]
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "e")).config.eos_token_id == tok.eos_token_id
