"""LoRA on FSDP2 (issue 36), the training side, in a one-rank gloo group: the layer and its keys, the
product's `build` with adapters added before `fully_shard`, a frozen base that does not move, the
loss falling, accumulation, the bf16 collectives (base gathered bf16, adapters alone reduced),
adapters-only checkpoints and the refusal to resume with other LoRA settings, and the export."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.test_train_step import world_of_one

from raydlc.config import TrainConfig
from raydlc.errors import CheckpointError
from raydlc.facts.models import LORA_DEFAULT_TARGETS, get_spec
from raydlc.train import checkpoint as ckpt
from raydlc.train import loop as L
from raydlc.train.layout import plan_mesh
from raydlc.train.lora import ADAPTER_SUFFIXES, LoRALinear, adapter_state, apply_lora, is_adapter_key
from raydlc.train.model import build_model

SEQ, MB = 32, 4
SEVEN = LORA_DEFAULT_TARGETS["qwen2"]


@pytest.fixture
def world() -> Iterator[None]:
    with world_of_one():
        yield


def settings(**kw: Any) -> TrainConfig:
    base = dict(model_id="tiny", seq_len=SEQ, batch_size=MB, num_workers=1, learning_rate=2e-3, warmup_steps=0, lora_rank=8)
    return TrainConfig(**{**base, **kw})


def built(bf16: bool = False, **kw: Any) -> L.Trainer:
    return L.build(settings(**kw), spec="tiny", mesh=plan_mesh("fsdp", [1]), device=torch.device("cpu"), bf16=bf16)


def data(rows: int = 32) -> np.ndarray:
    """Tokens from 64 of the 4096 ids: something a few steps can learn."""
    return np.random.default_rng(0).integers(0, 64, size=(rows, SEQ), dtype=np.int32)


def full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in model.state_dict().items()}


def steps(t: L.Trainer, ids: np.ndarray, n: int, micro: int = MB) -> list[float]:
    out = []
    for step in range(n):
        rows = np.arange(8) + 8 * (step % (len(ids) // 8))
        out.append(float(L.train_step(t, L.micro_batches(ids, ids, rows, micro, t.device), 2e-3).loss))
    return out


def test_the_layer_keeps_the_base_keys_adds_adapters_and_starts_as_the_base() -> None:
    spec = get_spec("tiny")
    model, plain = build_model(spec, seed=1), build_model(spec, seed=1)
    keys = set(model.state_dict())
    replaced = apply_lora(model, rank=4, alpha=8, dropout=0.0, targets=SEVEN, seed=3)
    assert len(replaced) == spec.num_layers * 7 and replaced[0] == "model.layers.0.self_attn.q_proj"
    sd = model.state_dict()
    assert {k for k in sd if not is_adapter_key(k)} == keys  # the HF keys are unchanged
    q = "model.layers.0.self_attn.q_proj"
    assert sd[q + ".lora_A.weight"].shape == (4, spec.hidden_size) and sd[q + ".lora_B.weight"].shape == (spec.num_heads * spec.head_dim, 4)
    assert set(adapter_state(sd)) == {f"{m}{s}" for m in replaced for s in ADAPTER_SUFFIXES}
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [n for n in dict(model.named_parameters()) if is_adapter_key(n)]
    assert all(bool((v == 0).all()) for k, v in sd.items() if k.endswith(".lora_B.weight"))
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, plain(input_ids=ids).logits)  # B = 0: the base's outputs
        again = build_model(spec, seed=1)
        apply_lora(again, rank=4, alpha=8, dropout=0.0, targets=SEVEN, seed=3)
        assert torch.equal(again.state_dict()[q + ".lora_A.weight"], sd[q + ".lora_A.weight"])  # A seeded by (seed, name)
        assert not torch.equal(sd[q + ".lora_A.weight"], sd["model.layers.1.self_attn.q_proj.lora_A.weight"])
        layer: LoRALinear = model.model.layers[0].self_attn.q_proj
        layer.lora_B.weight.normal_()
        x = torch.randn(3, spec.hidden_size)
        want = x @ layer.weight.T + layer.bias + 2.0 * (x @ layer.lora_A.weight.T @ layer.lora_B.weight.T)
        torch.testing.assert_close(layer(x), want)


def test_targets_choose_the_projections() -> None:
    model = build_model(get_spec("tiny"))
    replaced = apply_lora(model, rank=2, alpha=4, dropout=0.1, targets=("q_proj", "v_proj"), seed=0)
    assert {r.rsplit(".", 1)[1] for r in replaced} == {"q_proj", "v_proj"}
    assert isinstance(model.model.layers[0].self_attn.v_proj, LoRALinear)
    assert not isinstance(model.model.layers[0].mlp.up_proj, LoRALinear)
    assert not isinstance(model.lm_head, LoRALinear)


def test_the_frozen_base_does_not_move_and_the_loss_falls(world: None) -> None:
    t = built()
    before = full(t.model)
    base = {k for k in before if not is_adapter_key(k)}
    assert {id(p) for g in t.optimizer.param_groups for p in g["params"]} == {id(p) for n, p in t.model.named_parameters() if is_adapter_key(n)}
    losses = steps(t, data(), 12)
    after = full(t.model)
    assert all(torch.equal(before[k], after[k]) for k in base)  # bit-identical
    assert any(not torch.equal(before[k], after[k]) for k in after if k.endswith(".lora_B.weight"))
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("sync", ["once", "every"])
def test_accumulation_takes_the_steps_of_one_micro_batch(world: None, sync: str) -> None:
    ids = data()
    one = steps(built(batch_size=8), ids, 3, micro=8)
    four = steps(built(batch_size=2, grad_accum=4, grad_sync=sync), ids, 3, micro=2)
    assert np.allclose(one, four, rtol=0, atol=1e-5), (one, four)


def test_bf16_stores_the_base_in_bf16_gathers_it_bf16_and_reduces_adapters_only(world: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    gathered: list[torch.dtype] = []
    reduced: list[tuple[int, Any]] = []
    real_gather, real_reduce = FSDPParam.init_unsharded_param, pg.foreach_reduce

    def gather(self: FSDPParam) -> None:  # each parameter as gathered for compute (one rank: copied, not all-gathered)
        real_gather(self)
        gathered.append(self._unsharded_param.dtype)

    def reduce(fsdp_params: Any, grads: list[torch.Tensor], *args: Any, **kw: Any) -> Any:
        reduced.append((sum(g.numel() for g in grads), {g.dtype for g in grads}))
        return real_reduce(fsdp_params, grads, *args, **kw)

    monkeypatch.setattr(FSDPParam, "init_unsharded_param", gather)
    monkeypatch.setattr(pg, "foreach_reduce", reduce)
    t = built(bf16=True)
    params = dict(t.model.named_parameters())
    assert {p.dtype for n, p in params.items() if not is_adapter_key(n)} == {torch.bfloat16}  # never upcast
    assert {p.dtype for n, p in params.items() if is_adapter_key(n)} == {torch.float32}
    steps(t, data(), 1, micro=8)  # one micro-batch: one reduction per unit
    adapters = sum(p.numel() for n, p in params.items() if is_adapter_key(n))
    assert gathered and set(gathered) == {torch.bfloat16}
    assert sum(n for n, _ in reduced) == adapters  # the reduce-scatters carry the adapters' gradients, nothing else
    assert all(dtypes == {torch.bfloat16} for _, dtypes in reduced)  # computed in bf16; reduced in REDUCE_DTYPE (fp32)


def test_checkpoints_hold_adapters_only_and_resume_exactly(world: None, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    ids = data()
    t = built()
    steps(t, ids, 3)
    meta = settings().lora_meta()
    d = tmp_path / ckpt.dir_name(3)
    ckpt.save(d, t.model, t.optimizer, step=3, rank=0, world_size=1, extra={}, meta=meta)
    saved = dcp.FileSystemReader(str(d)).read_metadata().state_dict_metadata
    models = [k.removeprefix("model.") for k in saved if k.startswith("model.")]
    assert models and all(is_adapter_key(k) for k in models), models
    assert ckpt.verify(d).meta["lora_rank"] == 8 and ckpt.verify(d).meta["lora_targets"] == ",".join(SEVEN)
    cont = steps(t, ids, 2)
    fresh = built()
    ckpt.load(d, fresh.model, fresh.optimizer, rank=0, lora=meta)
    assert steps(fresh, ids, 2) == cont  # the rebuilt base plus the saved adapters and moments


def test_resuming_with_other_lora_settings_is_refused_naming_the_field(world: None, tmp_path: Path) -> None:
    t = built()
    d = tmp_path / ckpt.dir_name(1)
    ckpt.save(d, t.model, t.optimizer, step=1, rank=0, world_size=1, extra={}, meta=settings().lora_meta())
    with pytest.raises(CheckpointError, match="lora_rank: checkpoint 8, now 4"):
        ckpt.load(d, t.model, t.optimizer, rank=0, lora=settings(lora_rank=4).lora_meta())
    with pytest.raises(CheckpointError, match=r"lora_alpha: checkpoint 16\.0, now 4\.0"):
        ckpt.load(d, t.model, t.optimizer, rank=0, lora=settings(lora_alpha=4).lora_meta())
    with pytest.raises(CheckpointError, match=r"lora_targets: checkpoint q_proj,.*, now q_proj"):
        ckpt.load(d, t.model, t.optimizer, rank=0, lora=settings(lora_targets="q_proj").lora_meta())
    assert ckpt.lora_differences({"model": "tiny"}, settings().lora_meta()) == ["lora_rank: checkpoint 0, now 8"]  # before LoRA: rank 0
    assert ckpt.lora_differences({"model": "tiny"}, settings(lora_rank=0).lora_meta()) == []


def test_the_export_writes_the_adapter_and_the_merged_model(world: None, tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    t = built()
    steps(t, data(), 3)
    state = full(t.model)
    lora = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "targets": list(SEVEN), "base_model": "tiny", "merge": True}
    ckpt.export_hf(t.model, tmp_path / "export", rank=0, tokenizer=None, dtype=torch.float32, lora=lora)
    config = json.loads((tmp_path / "export" / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["peft_type"] == "LORA"
    adapter = load_file(str(tmp_path / "export" / "adapter" / "adapter_model.safetensors"))
    assert set(adapter) == {"base_model.model." + k for k in state if is_adapter_key(k)}
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"))
    q = "model.layers.1.mlp.down_proj"
    want = state[q + ".weight"] + 2.0 * state[q + ".lora_B.weight"] @ state[q + ".lora_A.weight"]
    torch.testing.assert_close(merged.state_dict()[q + ".weight"], want)
    ids = torch.as_tensor(data(2)[:, :16], dtype=torch.long)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, t.model(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_pretrained_weights_load_into_the_frozen_base_shard_by_shard(world: None, tmp_path: Path, bf16: bool) -> None:
    """The pretrained path (`weights.build_sharded`): the adapters are not read from the files (they have none),
    the base holds the saved weights (bf16 as saved, or fp32 without bf16 compute), B starts at zero."""
    from tests.test_weights import TINY, export

    directory = export(TINY["llama-tied"], tmp_path / "m", "60KB")
    from safetensors.torch import load_file

    saved: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        saved |= load_file(str(f))
    t = L.build(settings(model_id=str(directory), seq_len=16), spec=None, mesh=plan_mesh("fsdp", [1]), device=torch.device("cpu"), bf16=bf16)
    state = full(t.model)
    assert {k: v.dtype for k, v in state.items() if not is_adapter_key(k)} == dict.fromkeys(saved, torch.bfloat16 if bf16 else torch.float32) | (
        {"lm_head.weight": torch.bfloat16 if bf16 else torch.float32} if "lm_head.weight" in state else {})
    assert all(torch.equal(state[k].to(torch.bfloat16), v) for k, v in saved.items())
    assert all(bool((v == 0).all()) for k, v in state.items() if k.endswith(".lora_B.weight"))
    assert any(k.endswith(".lora_A.weight") for k in state) and all(bool(v.abs().sum() > 0) for k, v in state.items() if k.endswith(".lora_A.weight"))
    steps(t, np.random.default_rng(0).integers(0, 64, size=(16, 16), dtype=np.int32), 1)


def test_targets_that_match_no_layer_stop_the_build() -> None:
    from raydlc.errors import TrainError
    from raydlc.train.lora import with_lora

    with pytest.raises(TrainError, match="no linear layer of the model has one of these names"):
        with_lora(build_model(get_spec("tiny"), device="meta"), rank=4, alpha=8, dropout=0.0, targets=("wq",), seed=0)


def test_activation_checkpointing_builds_the_same_adapters(world: None) -> None:
    """A is seeded by the module's state-dict name, which the checkpoint wrapper does not change."""
    plain, wrapped = full(built().model), full(built(activation_checkpointing=True).model)
    assert set(plain) == set(wrapped) and all(torch.equal(plain[k], wrapped[k]) for k in plain)


def test_a_target_pattern_picks_the_layers_it_matches_whole_and_peft_loads_the_export(world: None, tmp_path: Path) -> None:
    """LORA_TARGET_REGEX (issue 46): matched whole (peft's re.fullmatch) against the full module name, so a layer range
    works; trained, the export's adapter_config carries the pattern and peft on the export gives the merged model's logits."""
    import peft
    from transformers import AutoModelForCausalLM

    pattern = r"model\.layers\.1\..*_proj"
    t = built(lora_target_regex=pattern)
    adapted = {n for n, m in t.model.named_modules() if isinstance(m, LoRALinear)}
    assert adapted == {f"model.layers.1.{p}" for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert [n for n, p in t.model.named_parameters() if p.requires_grad] == [n for n, _ in t.model.named_parameters() if is_adapter_key(n)]
    steps(t, data(), 3)
    state = full(t.model)
    lora = L.lora_export_settings(t.model, type("Run", (), {"train": settings(lora_target_regex=pattern), "spec": None, "run_dir": str(tmp_path)})())
    assert lora is not None and lora["target_regex"] == pattern
    ckpt.export_hf(t.model, tmp_path / "export", rank=0, tokenizer=None, dtype=torch.float32, lora=lora)
    assert json.loads((tmp_path / "export" / "adapter" / "adapter_config.json").read_text())["target_modules"] == pattern
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export")).eval()
    frozen = AutoModelForCausalLM.from_config(merged.config)
    frozen.load_state_dict({k: v for k, v in state.items() if not is_adapter_key(k)}, strict=False)
    tuned = peft.PeftModel.from_pretrained(frozen.eval(), str(tmp_path / "export" / "adapter"))
    ids = torch.as_tensor(data(2)[:, :16], dtype=torch.long)
    with torch.no_grad():
        torch.testing.assert_close(tuned(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
        with tuned.disable_adapter():  # peft adapted `frozen` in place: its base alone, with the adapters off
            plain = tuned(input_ids=ids).logits
        assert (tuned(input_ids=ids).logits - plain).abs().max().item() > 1e-4  # the trained adapters change the output


def test_a_target_pattern_that_matches_nothing_or_more_than_projections_stops_the_build() -> None:
    from raydlc.errors import TrainError
    from raydlc.train.lora import with_lora

    def build(pattern: str) -> None:
        with_lora(build_model(get_spec("tiny"), device="meta"), rank=4, alpha=8, dropout=0.0, targets=(), seed=0, target_regex=pattern)

    with pytest.raises(TrainError, match=r"^LORA_TARGET_REGEX 'q_proj' matches no linear layer"):  # whole-name match: q_proj alone is no name
        build("q_proj")
    with pytest.raises(TrainError, match=r"^LORA_TARGET_REGEX .* matches lm_head \(Linear\), which is not a block's projection"):
        build(r"lm_head|.*\.q_proj")
    with pytest.raises(TrainError, match=r"matches model\.layers\.0\.self_attn \(.*\), which is not a block's projection"):
        build(r"model\.layers\.0\.self_attn.*")


def test_a_checkpoint_of_other_targets_or_pattern_is_refused() -> None:
    by_name, by_pattern = settings(lora_targets="q_proj").lora_meta(), settings(lora_target_regex=r".*\.q_proj").lora_meta()
    assert by_pattern == {"lora_rank": 8, "lora_alpha": 16.0, "lora_target_regex": r".*\.q_proj"}
    assert ckpt.lora_differences(by_pattern, by_pattern) == []
    assert ckpt.lora_differences(by_name, by_pattern) == [r"lora_target_regex: checkpoint None, now .*\.q_proj"]
    assert ckpt.lora_differences(by_pattern, by_name) == ["lora_targets: checkpoint None, now q_proj", r"lora_target_regex: checkpoint .*\.q_proj, now None"]
    assert ckpt.lora_differences(by_pattern, settings(lora_target_regex=r".*\.v_proj").lora_meta()) == [
        r"lora_target_regex: checkpoint .*\.q_proj, now .*\.v_proj"]


def test_modules_to_save_train_in_full_checkpoint_resume_and_export_as_peft_saves_them(world: None, tmp_path: Path) -> None:
    """LORA_MODULES_TO_SAVE (issue 46): the embedding (tied: the head too, one weight) trains in fp32 beside the adapters,
    the optimizer holds it, the checkpoint holds it and a resume continues exactly; the export's merged model has its
    trained values and peft loads the adapter (modules_to_save, both tied names) to the merged model's logits."""
    import peft
    from transformers import AutoModelForCausalLM

    kw = {"lora_modules_to_save": "embed_tokens", "lora_targets": "q_proj,v_proj"}
    emb = "model.embed_tokens.weight"
    bf16 = dict(built(bf16=True, **kw).model.named_parameters())
    assert bf16[emb].dtype == torch.float32 and bf16["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16  # trained in fp32 like the adapters
    t = built(**kw)
    trained = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert emb in trained and all(is_adapter_key(n) for n in trained if n != emb)
    assert any(p is dict(t.model.named_parameters())[emb] for g in t.optimizer.param_groups for p in g["params"])
    before = full(t.model)[emb].clone()
    ids = data()
    steps(t, ids, 2)
    after = full(t.model)
    assert (after[emb] - before).abs().max().item() > 1e-3  # the embedding moved
    import torch.distributed.checkpoint as dcp

    d = tmp_path / ckpt.dir_name(2)
    ckpt.save(d, t.model, t.optimizer, step=2, rank=0, world_size=1, extra={}, meta=settings(**kw).lora_meta())
    held = [k.removeprefix("model.") for k in dcp.FileSystemReader(str(d)).read_metadata().state_dict_metadata if k.startswith("model.")]
    assert emb in held and all(k == emb or is_adapter_key(k) for k in held), held
    going = steps(t, ids, 2)
    again = built(**kw)
    ckpt.load(d, again.model, again.optimizer, rank=0, lora=settings(**kw).lora_meta())
    assert torch.equal(full(again.model)[emb], after[emb])
    assert steps(again, ids, 2) == going  # the embedding's moments restored too: the same steps
    with pytest.raises(CheckpointError, match="lora_modules_to_save: checkpoint embed_tokens, now None"):
        ckpt.load(d, built(lora_targets="q_proj,v_proj").model, again.optimizer, rank=0, lora=settings(lora_targets="q_proj,v_proj").lora_meta())

    state = full(t.model)
    run = type("Run", (), {"train": settings(**kw), "spec": None, "run_dir": str(tmp_path)})()
    lora = L.lora_export_settings(t.model, run)
    assert lora is not None and lora["modules_to_save"] == ["lm_head.weight", emb]  # tied: one weight, both names
    ckpt.export_hf(t.model, tmp_path / "export", rank=0, tokenizer=None, dtype=torch.float32, lora=lora)
    config = json.loads((tmp_path / "export" / "adapter" / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["embed_tokens", "lm_head"]
    from safetensors.torch import load_file

    adapter = load_file(str(tmp_path / "export" / "adapter" / "adapter_model.safetensors"))
    assert torch.equal(adapter["base_model.model." + emb], state[emb].float()) and torch.equal(adapter["base_model.model.lm_head.weight"], state[emb].float())
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"), dtype=torch.float32).eval()
    assert torch.equal(merged.state_dict()[emb], state[emb].float())
    frozen = AutoModelForCausalLM.from_config(merged.config, dtype=torch.float32)
    frozen.load_state_dict({k: before if k == emb else v.float() for k, v in state.items() if not is_adapter_key(k)}, strict=False)
    tuned = peft.PeftModel.from_pretrained(frozen.eval(), str(tmp_path / "export" / "adapter"))
    x = torch.as_tensor(data(2)[:, :16], dtype=torch.long)
    with torch.no_grad():
        torch.testing.assert_close(tuned(input_ids=x).logits, merged(input_ids=x).logits, atol=1e-4, rtol=1e-4)


def test_modules_to_save_that_name_no_module_or_a_target_stop_the_build() -> None:
    from raydlc.errors import TrainError
    from raydlc.train.lora import with_lora

    def build(names: tuple[str, ...], targets: tuple[str, ...] = ("q_proj",)) -> None:
        with_lora(build_model(get_spec("tiny"), device="meta"), rank=4, alpha=8, dropout=0.0, targets=targets, seed=0, modules_to_save=names)

    with pytest.raises(TrainError, match=r"^LORA_MODULES_TO_SAVE 'wte' names no module of the model"):
        build(("wte",))
    with pytest.raises(TrainError, match=r"^LORA_MODULES_TO_SAVE 'q_proj' is a LoRA target too"):
        build(("q_proj",))


def test_a_saved_module_loads_pretrained_in_fp32_under_bf16_and_trains(world: None, tmp_path: Path) -> None:
    """LORA_MODULES_TO_SAVE on the pretrained path (`weights.build_sharded`) with bf16 compute: the saved embedding holds
    the file's values in fp32 (the base stays bf16), and a step moves it."""
    from safetensors.torch import load_file
    from tests.test_weights import TINY, export

    directory = export(TINY["llama-tied"], tmp_path / "m", "60KB")
    saved: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        saved |= load_file(str(f))
    t = L.build(settings(model_id=str(directory), seq_len=16, lora_modules_to_save="embed_tokens"), spec=None, mesh=plan_mesh("fsdp", [1]),
                device=torch.device("cpu"), bf16=True)
    emb = "model.embed_tokens.weight"
    state = full(t.model)
    assert state[emb].dtype == torch.float32 and torch.equal(state[emb].to(saved[emb].dtype), saved[emb])
    assert state["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    steps(t, np.random.default_rng(0).integers(0, 64, size=(16, 16), dtype=np.int32), 1)
    assert not torch.equal(full(t.model)[emb], state[emb])
