"""The LoRA export (raydlc.train.lora_export) read back by the real peft and transformers.

Tiny Qwen2 (tied, q/k/v biases) and Llama (untied) models built from specs; the adapters are built by hand from the
contract's key names and shapes (raydlc.train.lora's LoRALinear keys), with random non-zero B so that an adapter
lost or misplaced on the way changes the logits. The reference forward is the base model with hooks adding
scaling · B(A(x)) to each adapted Linear's output: neither peft nor the merge is involved in it.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import peft  # a dev extra (pyproject); the image has none, and lora_export needs none
import pytest
import torch
from tests.doubles import dlc_env as D

from raydlc.errors import LoRAExportError, TrainError
from raydlc.facts.models import ModelSpec
from raydlc.train import lora_export as X
from raydlc.train.model import build_model

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RANK, ALPHA = 4, 8.0
SPECS = {
    "qwen2": ModelSpec("lora-qwen2", 64, 2, 4, 2, 128, 300, True, max_position_embeddings=512),
    "llama": ModelSpec("lora-llama", 64, 2, 4, 2, 128, 300, False, max_position_embeddings=512, architecture="llama", qkv_bias=False),
}


def base(arch: str) -> torch.nn.Module:
    return build_model(SPECS[arch], seed=0).eval()


def adapters_for(model: torch.nn.Module, *, rank: int = RANK, seed: int = 1) -> dict[str, torch.Tensor]:
    """The contract's keys and shapes: <module>.lora_A.weight (r x in), <module>.lora_B.weight (out x r), B non-zero."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.rpartition(".")[2] in TARGETS:
            out[f"{name}.lora_A.weight"] = torch.randn(rank, m.in_features, generator=g) * 0.2
            out[f"{name}.lora_B.weight"] = torch.randn(m.out_features, rank, generator=g) * 0.2
    return out


def trained_state(arch: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model = base(arch)
    return model, {**model.state_dict(), **adapters_for(model)}


def hand_logits(model: torch.nn.Module, adapters: dict[str, torch.Tensor], ids: torch.Tensor, scaling: float) -> torch.Tensor:
    """The base forward with scaling · x Aᵀ Bᵀ added to each adapted Linear's output."""
    hooks = []
    for name, m in model.named_modules():
        if f"{name}.lora_A.weight" in adapters:
            a, b = adapters[f"{name}.lora_A.weight"], adapters[f"{name}.lora_B.weight"]
            hooks.append(m.register_forward_hook(lambda _m, args, out, a=a, b=b: out + scaling * (args[0] @ a.T @ b.T)))
    try:
        with torch.no_grad():
            return model(ids).logits
    finally:
        for h in hooks:
            h.remove()


def save_hf(config: Any) -> Any:
    """A save_merged as the loop's would be: the merged weights into a fresh HF model of the config, save_pretrained."""
    from transformers import AutoModelForCausalLM

    def save(weights: dict[str, torch.Tensor], folder: Path) -> None:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not unexpected and not missing, (missing, unexpected)
        model.save_pretrained(str(folder), safe_serialization=True)
    return save


def ids() -> torch.Tensor:
    return torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(3))


def write(out: Path, state: dict[str, torch.Tensor], *, config: Any = None, merge: bool = True, rank: int = RANK, **kw: Any) -> None:
    save = kw.pop("save_merged", None) or (save_hf(config) if config is not None else (lambda _w, _f: None))
    X.write(out, state, rank=rank, alpha=kw.pop("alpha", ALPHA), dropout=kw.pop("dropout", 0.0), targets=kw.pop("targets", TARGETS),
            base_model=kw.pop("base_model", None), merge=merge, save_merged=save, **kw)


# ---- peft and transformers read the export -------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_peft_loads_the_adapter_and_the_merged_model_matches_it(arch: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model, state = trained_state(arch)
    adapters = X.split(state)[1]
    out = tmp_path / "export"
    write(out, state, config=model.config, base_model="Qwen/none" if arch == "qwen2" else None)
    assert sorted(p.name for p in (out / "adapter").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]

    reference = hand_logits(model, adapters, ids(), ALPHA / RANK)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuned = peft.PeftModel.from_pretrained(base(arch), str(out / "adapter"))
    assert not [w for w in caught if "adapter keys" in str(w.message) or "unexpected" in str(w.message).lower()]
    result = tuned.load_adapter(str(out / "adapter"), adapter_name="again")  # the load's own account of the keys
    assert result.unexpected_keys == [] and [k for k in result.missing_keys if ".again." in k] == []
    loaded = {k.replace(".default.", "."): v for k, v in tuned.state_dict().items() if ".lora_" in k and ".default." in k}
    assert {k.removeprefix("base_model.model."): v.shape for k, v in loaded.items()} == {k: v.shape for k, v in adapters.items()}
    for k, v in loaded.items():
        assert torch.equal(v, adapters[k.removeprefix("base_model.model.")]), k
    tuned.set_adapter("default")
    with torch.no_grad():
        peft_logits = tuned(ids()).logits
    peft_vs_hand = (peft_logits - reference).abs().max().item()
    assert peft_vs_hand < 1e-5, peft_vs_hand
    assert (reference - model(ids()).logits).abs().max().item() > 1e-2  # the adapters do change the output

    merged_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        merged_vs_peft = (merged_model(ids()).logits - peft_logits).abs().max().item()
    print(f"{arch}: max |Δlogits| peft vs hand {peft_vs_hand:.3g}, merged vs peft {merged_vs_peft:.3g}")
    assert merged_vs_peft < 1e-4, merged_vs_peft


def test_the_adapter_config_is_a_lora_config_peft_reads_as_written(tmp_path: Path) -> None:
    _, state = trained_state("qwen2")
    write(tmp_path / "e", state, merge=False, alpha=12, dropout=0.05, targets=("v_proj", "q_proj", "k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
          base_model="/models/qwen")
    cfg = peft.PeftConfig.from_pretrained(str(tmp_path / "e" / "adapter"))
    assert isinstance(cfg, peft.LoraConfig)
    assert (cfg.peft_type, cfg.task_type, cfg.r, cfg.lora_alpha, cfg.lora_dropout) == ("LORA", "CAUSAL_LM", RANK, 12, 0.05)
    assert set(cfg.target_modules) == set(TARGETS) and cfg.base_model_name_or_path == "/models/qwen"
    assert (cfg.bias, cfg.fan_in_fan_out, cfg.use_rslora, cfg.use_dora, cfg.inference_mode) == ("none", False, False, False, True)
    written = json.loads((tmp_path / "e" / "adapter" / "adapter_config.json").read_text())
    assert written["target_modules"] == sorted(TARGETS) and written["lora_alpha"] == 12
    assert not (tmp_path / "e" / "config.json").exists()  # merge off: the adapter only


def test_the_adapter_file_holds_peft_keys_contiguous_with_pts_metadata(tmp_path: Path) -> None:
    from safetensors import safe_open

    _, state = trained_state("llama")
    state = {k: (v.T.contiguous().T if k.endswith(".lora_B.weight") else v) for k, v in state.items()}  # views, as a transpose leaves
    assert not next(v for k, v in state.items() if k.endswith(".lora_B.weight")).is_contiguous()
    write(tmp_path / "e", state, merge=False)
    with safe_open(str(tmp_path / "e" / "adapter" / "adapter_model.safetensors"), "pt") as f:
        keys, meta = set(f.keys()), f.metadata()
    assert meta == {"format": "pt"}
    assert keys == {"base_model.model." + k for k in X.split(state)[1]}
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys


# ---- the pure functions ---------------------------------------------------------------------------------------


def test_merged_folds_each_adapter_into_its_weight_in_fp32_and_keeps_the_dtype() -> None:
    w = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    a, b = torch.randn(2, 5), torch.randn(6, 2)
    state = {"m.q_proj.weight": w, "m.q_proj.bias": torch.ones(6), "m.q_proj.lora_A.weight": a, "m.q_proj.lora_B.weight": b,
             "m.norm.weight": torch.ones(5)}
    out = X.merged(state, scaling=0.5)
    assert set(out) == {"m.q_proj.weight", "m.q_proj.bias", "m.norm.weight"}
    assert out["m.q_proj.weight"].dtype == torch.bfloat16
    assert torch.equal(out["m.q_proj.weight"], (w.float() + 0.5 * (b @ a)).to(torch.bfloat16))
    assert out["m.norm.weight"] is state["m.norm.weight"] and torch.equal(state["m.q_proj.weight"], w)  # untouched, not copied


def test_split_and_peft_keys() -> None:
    t = torch.zeros(1, 1)
    basepart, adapters = X.split({"a.q_proj.weight": t, "a.q_proj.lora_A.weight": t, "a.q_proj.lora_B.weight": t, "lora_head.weight": t})
    assert set(basepart) == {"a.q_proj.weight", "lora_head.weight"} and set(adapters) == {"a.q_proj.lora_A.weight", "a.q_proj.lora_B.weight"}
    assert set(X.peft_adapter_state(adapters)) == {"base_model.model.a.q_proj.lora_A.weight", "base_model.model.a.q_proj.lora_B.weight"}
    with pytest.raises(LoRAExportError, match=r"a\.q_proj\.weight is not an adapter"):
        X.peft_adapter_state({"a.q_proj.weight": t})


# ---- bad input: an error naming the key, nothing on disk ---------------------------------------------------------


def _small_state() -> dict[str, torch.Tensor]:
    return {"model.layers.0.self_attn.q_proj.weight": torch.zeros(8, 6), "model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(RANK, 6),
            "model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(8, RANK), "model.norm.weight": torch.ones(6)}


Q = "model.layers.0.self_attn.q_proj"
BAD = {
    "A without B": (lambda s: s.pop(f"{Q}.lora_B.weight"), {}, f"{Q}.lora_A.weight has no pair \\({Q}.lora_B.weight is missing\\)"),
    "B without A": (lambda s: s.pop(f"{Q}.lora_A.weight"), {}, f"{Q}.lora_B.weight has no pair"),
    "no base weight": (lambda s: s.pop(f"{Q}.weight"), {}, f"adapts {Q}.weight, which is not in the state"),
    "B too tall": (lambda s: s.update({f"{Q}.lora_B.weight": torch.ones(9, RANK)}), {}, f"{Q}: lora_A \\(4, 6\\) x lora_B \\(9, 4\\) does not fit {Q}.weight \\(8, 6\\)"),
    "ranks disagree": (lambda s: s.update({f"{Q}.lora_B.weight": torch.ones(8, 3)}), {}, f"{Q}: lora_A \\(4, 6\\) x lora_B \\(8, 3\\)"),
    "rank 0": (lambda s: None, {"rank": 0}, "rank 0 is not a LoRA rank"),
    "not the run's rank": (lambda s: None, {"rank": 8}, f"{Q}.lora_A.weight has rank 4, the run's rank is 8"),
    "not a target": (lambda s: None, {"targets": ("v_proj",)}, f"{Q}.lora_A.weight adapts q_proj, which is not among the targets"),
    "a target without adapter": (lambda s: s.update({"model.layers.1.mlp.q_proj.weight": torch.zeros(2, 2)}), {},
                                 "model.layers.1.mlp.q_proj.weight is a target's weight with no adapter beside it"),
    "no adapters": (lambda s: [s.pop(k) for k in list(s) if ".lora_" in k], {}, "holds no adapter weights"),
    "targets as one string": (lambda s: None, {"targets": "q_proj,v_proj"}, "targets 'q_proj,v_proj' must be module names"),
    "dropout 1": (lambda s: None, {"dropout": 1.0}, "dropout 1.0 must be in \\[0, 1\\)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_state_is_refused_naming_the_key_and_leaves_nothing(case: str, tmp_path: Path) -> None:
    change, kw, message = BAD[case]
    state = _small_state()
    change(state)
    called = []
    with pytest.raises(LoRAExportError, match=message) as e:
        write(tmp_path / "runs" / "r1" / "export", state, save_merged=lambda w, f: called.append(f), **kw)
    assert isinstance(e.value, TrainError) and e.value.exit_code == 1
    assert list(tmp_path.iterdir()) == [] and called == []


def test_a_folder_that_is_not_an_earlier_export_is_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "export"
    out.mkdir()
    (out / "weights.bin").write_text("someone's")
    with pytest.raises(LoRAExportError, match=f"{out} exists and is not an earlier export") as e:
        write(out, _small_state())
    assert e.value.hint and "replaces only its own exports" in e.value.hint
    again = pickle.loads(pickle.dumps(e.value))  # as a Ray worker's error reaches the driver
    assert type(again) is LoRAExportError and (again.message, again.hint) == (e.value.message, e.value.hint)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"] and [p.name for p in out.iterdir()] == ["weights.bin"]


def test_a_failing_save_merged_leaves_nothing_and_keeps_an_earlier_export(tmp_path: Path) -> None:
    out = tmp_path / "export"
    write(out, _small_state(), save_merged=lambda w, f: (f / "model.safetensors").write_text("v1"))
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def boom(weights: dict[str, torch.Tensor], folder: Path) -> None:
        (folder / "model.safetensors").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write(out, _small_state(), save_merged=boom)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    with pytest.raises(OSError):
        write(tmp_path / "new" / "deeper" / "export", _small_state(), save_merged=boom)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # the parents it made are gone too


def test_an_earlier_export_is_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "export"
    write(out, _small_state(), save_merged=lambda w, f: (f / "stale.txt").write_text("v1"))
    state = _small_state()
    state[f"{Q}.lora_B.weight"] = torch.full((8, RANK), 2.0)
    got: dict[str, torch.Tensor] = {}
    write(out, state, save_merged=lambda w, f: got.update(w))
    assert not (out / "stale.txt").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    assert torch.equal(got[f"{Q}.weight"], torch.full((8, 6), (ALPHA / RANK) * 2.0 * RANK))  # 0 + s · B @ A with A, B constant


# ---- in the Ray Train image: no peft ----------------------------------------------------------------------------


def test_the_export_runs_in_the_image_which_has_no_peft(tmp_path: Path) -> None:
    guard = tmp_path / "guard"
    D.prepare(guard)
    code = f"""
import json, sys, torch
from pathlib import Path
try:
    import peft
    has_peft = True
except ImportError:
    has_peft = False
from raydlc.train import lora_export as X
state = {{"m.q_proj.weight": torch.zeros(3, 2), "m.q_proj.lora_A.weight": torch.ones(1, 2), "m.q_proj.lora_B.weight": torch.ones(3, 1)}}
X.write(Path({str(tmp_path / "out")!r}), state, rank=1, alpha=2, dropout=0.0, targets=["q_proj"], base_model=None, merge=False, save_merged=None)
print(json.dumps({{"has_peft": has_peft, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("peft", "accelerate"))}}))
"""
    done = D.run(["-c", code], guard, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got == {"has_peft": False, "loaded": []}
    assert "peft" in D.refused(guard)  # the guard did hide an installed peft
    assert sorted(p.name for p in (tmp_path / "out" / "adapter").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]


def test_rslora_scales_by_alpha_over_sqrt_rank_in_the_layer_the_export_and_peft(tmp_path: Path) -> None:
    """LORA_RSLORA (issue 46): the layer's scaling is alpha / sqrt(r); the export says `use_rslora`, so peft scales the
    same, and the merged model folds the adapters in at that scale."""
    import math

    from transformers import AutoModelForCausalLM

    from raydlc.train.lora import LoRALinear, lora_scaling

    assert lora_scaling(16, 32.0, rslora=True) == 8.0 and lora_scaling(16, 32.0) == 2.0
    assert LoRALinear(torch.nn.Linear(8, 8), rank=4, alpha=8.0, dropout=0.0, rslora=True).scaling == 4.0
    model, state = trained_state("qwen2")
    adapters = X.split(state)[1]
    out = tmp_path / "export"
    write(out, state, config=model.config, rslora=True)
    reference = hand_logits(model, adapters, ids(), ALPHA / math.sqrt(RANK))
    tuned = peft.PeftModel.from_pretrained(base("qwen2"), str(out / "adapter"))
    assert tuned.peft_config["default"].use_rslora is True
    with torch.no_grad():
        assert (tuned(ids()).logits - reference).abs().max().item() < 1e-5
    merged_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        assert (merged_model(ids()).logits - reference).abs().max().item() < 1e-4


def test_a_target_pattern_is_written_as_peft_s_string_and_peft_adapts_the_same_modules(tmp_path: Path) -> None:
    """LORA_TARGET_REGEX (issue 46): `target_modules` is the pattern itself, which peft matches whole against each module's
    full name; the adapters on the layers it picks (block 1's q and v only) load with no missing key and give the
    hand-computed logits, as the merged model does."""
    from transformers import AutoModelForCausalLM

    pattern = r"model\.layers\.1\.self_attn\.(q|v)_proj"
    model = base("llama")
    adapters = {k: v for k, v in adapters_for(model).items() if k.startswith(("model.layers.1.self_attn.q_proj.", "model.layers.1.self_attn.v_proj."))}
    assert len(adapters) == 4
    state = {**model.state_dict(), **adapters}
    out = tmp_path / "export"
    write(out, state, config=model.config, targets=("q_proj", "v_proj"), target_regex=pattern)
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["target_modules"] == pattern
    tuned = peft.PeftModel.from_pretrained(base("llama"), str(out / "adapter"))
    adapted = {n.removeprefix("base_model.model.") for n, m in tuned.named_modules() if type(m).__name__ == "Linear" and hasattr(m, "lora_A")}
    assert adapted == {"model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"}
    reference = hand_logits(model, adapters, ids(), ALPHA / RANK)
    with torch.no_grad():
        assert (tuned(ids()).logits - reference).abs().max().item() < 1e-5
        merged_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
        assert (merged_model(ids()).logits - reference).abs().max().item() < 1e-4
    with pytest.raises(LoRAExportError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight is a target's weight with no adapter"):
        write(tmp_path / "wide", state, targets=("q_proj",), target_regex=r".*\.(q|v)_proj")  # peft would adapt block 0 too
    with pytest.raises(LoRAExportError, match=r"the pattern .* does not match it whole"):
        write(tmp_path / "narrow", state, targets=("q_proj",), target_regex=r"model\.layers\.1\.self_attn\.q_proj")
    assert not (tmp_path / "wide").exists() and not (tmp_path / "narrow").exists()


def test_modules_to_save_are_written_as_peft_saves_them_and_peft_loads_them(tmp_path: Path) -> None:
    """LORA_MODULES_TO_SAVE (issue 46) on an untied model: the trained head under `base_model.model.lm_head.weight` and
    `modules_to_save: ["lm_head"]`, as peft's save_pretrained writes them; peft's model (adapters + the saved head) and
    the merged model both give the hand-computed logits, and a saved module missing from the state is refused."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model, state = trained_state("llama")
    adapters = X.split(state)[1]
    head = state["lm_head.weight"] + 0.05 * torch.randn(state["lm_head.weight"].shape, generator=torch.Generator().manual_seed(5))
    state = {**state, "lm_head.weight": head}
    out = tmp_path / "export"
    write(out, state, config=model.config, modules_to_save=["lm_head.weight"])
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["modules_to_save"] == ["lm_head"]
    assert torch.equal(load_file(str(out / "adapter" / "adapter_model.safetensors"))["base_model.model.lm_head.weight"], head)
    trained = base("llama")
    trained.lm_head.weight.data.copy_(head)
    reference = hand_logits(trained, adapters, ids(), ALPHA / RANK)
    tuned = peft.PeftModel.from_pretrained(base("llama"), str(out / "adapter"))
    with torch.no_grad():
        assert (tuned(ids()).logits - reference).abs().max().item() < 1e-5
        assert (reference - hand_logits(model, adapters, ids(), ALPHA / RANK)).abs().max().item() > 1e-3  # the head matters
        merged_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
        assert (merged_model(ids()).logits - reference).abs().max().item() < 1e-4
    with pytest.raises(LoRAExportError, match=r"model\.norm2\.weight \(LORA_MODULES_TO_SAVE\) is not in the state"):
        write(tmp_path / "bad", state, modules_to_save=["model.norm2.weight"])
    assert not (tmp_path / "bad").exists()
