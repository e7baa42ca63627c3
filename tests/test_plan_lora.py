"""The planner models LoRA (issue 36, item 2): a frozen bf16 base, adapters with fp32 state, adapter-only reductions.

Pure arithmetic on the built-in specs; the training side (peft under FSDP2) is not here yet, so
a run asked for LoRA is refused (the last tests).
"""

from __future__ import annotations

import pytest

import raydlc.api as api
from raydlc import planner
from raydlc.api._config import load
from raydlc.errors import InputError
from raydlc.facts.models import SPECS

# By hand from Qwen2.5-7B's config.json (hidden 3584, intermediate 18944, 28 layers, 4 KV heads of 128): per layer
# q, o 3584+3584; k, v 3584+512; gate, up, down 3584+18944 -> 90,112 x rank 16 x 28 layers.
QWEN7_RANK16 = 40_370_176


def _independent_adapters(rank: int) -> int:
    """Qwen2.5-7B's projection shapes written out from its config.json, not read from the planner."""
    hidden, inter, layers, heads, kv_heads = 3584, 18944, 28, 28, 4
    head_dim = hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = [(hidden, q), (hidden, kv), (hidden, kv), (q, hidden), (hidden, inter), (hidden, inter), (inter, hidden)]
    return layers * sum(rank * (i + o) for i, o in shapes)


def test_adapter_count_equals_the_formula_for_qwen7b_rank16() -> None:
    w = planner.Workload(SPECS["qwen2.5-7b"], seq_len=2048, lora_rank=16)
    assert w.targets == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert w.adapter_params() == _independent_adapters(16) == QWEN7_RANK16
    assert w.trained_params() == QWEN7_RANK16
    assert planner.Workload(SPECS["qwen2.5-7b"], lora_rank=8, lora_targets=("q_proj", "v_proj")).adapter_params() == 28 * 8 * (3584 + 3584 + 3584 + 512)


@pytest.mark.parametrize("model, nodes", [("qwen2.5-32b", 2), ("qwen2.5-7b", 1)])
def test_lora_fits_on_g6_12xlarge_and_prints_tokens_per_s(model: str, nodes: int) -> None:
    p = api.plan(model=model, lora_rank=16, nodes=nodes, gpus_per_node=4, seq_len=2048)
    rec = p.recommendation
    assert p.layout["instance_type"] == "g6.12xlarge"
    assert rec["per_gpu_bytes"] is not None and rec["per_gpu_bytes"] <= planner.usable_capacity(planner.layout_for(nodes, 4, instance_type="g6.12xlarge"))
    assert rec["tokens_per_s"] > 0
    assert p.lora["rank"] == 16 and p.lora["adapter_params"] > 0
    assert "lora_flops" in p.assumptions and "4N instead of 6N" in p.assumptions["lora_flops"]
    text = str(p)
    assert "LoRA rank 16" in text and "tokens/s" in text


def test_full_fine_tuning_of_32b_does_not_fit_where_lora_does() -> None:
    full = api.plan(model="qwen2.5-32b", nodes=2, gpus_per_node=4, seq_len=2048)
    assert full.recommendation["per_gpu_bytes"] is None and full.lora == {"rank": 0}


@pytest.mark.parametrize("model", ["qwen2.5-7b", "llama-3.1-8b", "qwen2.5-0.5b"])
@pytest.mark.parametrize("accum, sync", [(1, "every"), (4, "once"), (4, "every")])
def test_lora_memory_is_below_full_fine_tuning_in_every_phase(model: str, accum: int, sync: str) -> None:
    full = planner.Workload(SPECS[model], seq_len=2048, micro_batch=2, grad_accum=accum, sync=sync)
    lora = full.at(lora_rank=16)
    for shard in (1, 8):
        f, lo = planner.memory_phases(full, shard), planner.memory_phases(lora, shard)
        assert set(f) == set(lo) == set(planner.PHASES)
        for phase in planner.PHASES:
            assert lo[phase]["total"] < f[phase]["total"], phase
        assert planner.memory_bytes(lora, shard)["total"] < planner.memory_bytes(full, shard)["total"]


def test_lora_memory_terms() -> None:
    spec = SPECS["qwen2.5-7b"]
    w = planner.Workload(spec, seq_len=2048, lora_rank=16)
    shard = 4
    n, p = w.adapter_params(), spec.param_count()
    opt = planner.memory_phases(w, shard)["optimizer_step"]
    assert opt["params"] == -(-p // shard) * 2 + -(-n // shard) * 4  # the base in bf16, the adapters in fp32
    assert opt["optimizer"] == -(-n // shard) * 8  # AdamW state of the adapters only
    assert opt["grads"] == -(-n // shard) * 4 and opt["fp32_master"] == 0
    # The adapters' rank-wide intermediates are the only activations LoRA adds.
    extra = planner.activation_parts(w)["saved"] - planner.activation_parts(w.at(lora_rank=0))["saved"]
    assert extra == spec.num_layers * 2 * 16 * 7 * w.tokens


def test_traffic_gathers_the_base_and_reduces_adapter_gradients_only() -> None:
    spec = SPECS["qwen2.5-32b"]
    layout = planner.layout_for(2, 4, instance_type="g6.12xlarge")
    full = planner.Workload(spec, seq_len=2048)
    lora = full.at(lora_rank=16)
    n, ring = lora.adapter_params(), 7 / 8
    t_full, t_lora = planner.traffic_bytes(full, "fsdp", layout), planner.traffic_bytes(lora, "fsdp", layout)
    assert t_full["reduce_scatter"] == int(ring * spec.param_count() * 4)  # every fp32 gradient
    assert t_lora["reduce_scatter"] == int(ring * n * 4)  # the adapters' only: no base gradient moves
    assert t_lora["reduce_scatter"] < t_full["reduce_scatter"] / 100
    assert t_full["all_gather"] <= t_lora["all_gather"] <= t_full["all_gather"] * 1.01  # the base gathered as before (bf16), adapters beside it
    h_full, h_lora = planner.traffic_bytes(full, "hsdp", layout), planner.traffic_bytes(lora, "hsdp", layout)
    assert h_lora["all_reduce"] == int(2 * 0.5 * -(-n // 4) * 4) and h_lora["all_reduce"] < h_full["all_reduce"] / 100


def test_lora_flops_skip_the_base_weight_gradients() -> None:
    spec = SPECS["qwen2.5-7b"]
    full = planner.Workload(spec, seq_len=2048, loss_chunk=0)
    lora = full.at(lora_rank=16)
    attention = 12 * spec.num_layers * spec.hidden_size * 2048
    assert planner.flops_per_step(full) == 2048 * (6 * spec.param_count() + attention)
    assert planner.flops_per_step(lora) == 2048 * (4 * spec.param_count() + 6 * lora.adapter_params() + attention)


def test_bad_lora_settings_are_refused() -> None:
    with pytest.raises(InputError, match="LoRA rank"):
        planner.Workload(SPECS["tiny"], lora_rank=-1)
    with pytest.raises(InputError, match="unknown LoRA target 'qkv'"):
        planner.Workload(SPECS["tiny"], lora_rank=4, lora_targets=("qkv",))
    with pytest.raises(Exception, match="LORA_TARGETS"):
        load(None, {"LORA_TARGETS": "q_proj,lm_head"})
    assert load(None, {"LORA_TARGETS": "q_proj,v_proj,q_proj"}).train.lora_targets_list == ("q_proj", "v_proj")


def test_lora_settings_reach_training_and_a_cluster_run_learns_at_2e_4() -> None:
    """LoRA trains now (issue 36): its settings load and validate, and on a cluster an untouched LEARNING_RATE
    becomes LoRA's usual 2e-4; one the user set stays, and full fine-tuning keeps 2e-5."""
    from raydlc.config import with_cluster_defaults

    cfg = load(None, {"LORA_RANK": 8, "LORA_DROPOUT": 0.05})
    assert cfg.train.lora_alpha is None and cfg.train.lora_merge is True and cfg.train.lora_dropout == 0.05
    assert cfg.train.lora_meta() == {"lora_rank": 8, "lora_alpha": 16.0, "lora_targets": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"}
    lr = with_cluster_defaults(cfg)
    assert lr.train.learning_rate == 2e-4 and lr.origin("LEARNING_RATE") == "cluster default"
    assert with_cluster_defaults(load(None, {"LORA_RANK": 8, "LEARNING_RATE": 1e-3})).train.learning_rate == 1e-3
    assert with_cluster_defaults(load(None, {})).train.learning_rate == 2e-5


def test_cli_plans_32b_lora_on_two_g6_nodes(clean_env: object, capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.cli import main

    assert main(["plan", "--model", "qwen2.5-32b", "--lora-rank", "16", "--nodes", "2", "--gpus-per-node", "4", "--seq-len", "2048"]) == 0
    out = capsys.readouterr().out
    assert "2 x 4 L4" in out and "LoRA rank 16" in out and "134,217,728 adapter parameters" in out
    assert "recommended: fsdp" in out and "tokens/s" in out and "nothing fits" not in out


@pytest.mark.parametrize("intermediate", [512, 1024])
def test_lora_dropout_s_saved_bytes_are_what_the_planner_counts(intermediate: int) -> None:
    """Issue 46: LoRA's dropout (p > 0) saves its masks; the planner's `lora_dropout_bytes` is the difference autograd
    keeps per token and block (saved_tensors_hooks over one decoder block, bf16 base, fp32 adapters)."""
    import torch

    from raydlc.facts.models import ModelSpec
    from raydlc.planner.model import lora_dropout_bytes
    from raydlc.train.lora import with_lora
    from raydlc.train.model import build_model

    spec = ModelSpec("t", 256, 1, 4, 2, intermediate, 300, True, max_position_embeddings=512)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def saved_per_token(p: float) -> float:
        m = build_model(spec, seed=0)
        with_lora(m, rank=8, alpha=16, dropout=p, targets=targets, seed=0, base_dtype=torch.bfloat16)
        m.train()
        ids = torch.randint(0, 300, (2, 64), generator=torch.Generator().manual_seed(0))
        x = m.model.embed_tokens(ids)
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m.model.layers[0](x, position_embeddings=m.model.rotary_emb(x, torch.arange(64)[None]))
        return sum(seen.values()) / ids.numel()

    measured = saved_per_token(0.1) - saved_per_token(0.0)
    w = planner.Workload(spec, seq_len=64, lora_rank=8, lora_targets=targets, lora_dropout=0.1)
    assert lora_dropout_bytes(w) == measured == 6 * 256 + 2 * intermediate
    assert lora_dropout_bytes(planner.Workload(spec, seq_len=64, lora_rank=8, lora_targets=targets)) == 0  # p = 0 saves no mask
    more = planner.activation_parts(w)["saved"] - planner.activation_parts(planner.Workload(spec, seq_len=64, lora_rank=8, lora_targets=targets))["saved"]
    assert more == measured * w.tokens * spec.num_layers


def test_a_target_pattern_counts_the_adapters_it_builds_and_the_planner_its_projections() -> None:
    """LORA_TARGET_REGEX (issue 46): the run summary counts exactly the adapters the pattern builds (block 1 only here);
    the planner, which models every block alike, counts the projections it matches in every block (an upper bound)."""
    from types import SimpleNamespace

    from raydlc.api._plan import _lora_targets
    from raydlc.config import TrainConfig
    from raydlc.facts.models import get_spec
    from raydlc.train.launch import trained_params
    from raydlc.train.lora import apply_lora
    from raydlc.train.model import build_model

    spec, pattern = get_spec("tiny"), r"model\.layers\.1\.(self_attn\.q|mlp\.down)_proj"
    train = TrainConfig(lora_rank=4, lora_target_regex=pattern)
    out = trained_params(SimpleNamespace(train=train, run_dir="/r"), SimpleNamespace(model=spec))  # type: ignore[arg-type]
    model = build_model(spec, device="meta")
    assert len(apply_lora(model, rank=4, alpha=8.0, dropout=0.0, targets=(), seed=0, target_regex=pattern)) == 2
    params = list(model.parameters())
    assert out["params"] == {"trainable": sum(p.numel() for p in params if p.requires_grad), "total": sum(p.numel() for p in params)}
    assert out["lora"]["targets"] == [pattern]  # a list as by name: the summary and the card join it
    assert _lora_targets(spec, train) == ("q_proj", "down_proj")
    assert _lora_targets(spec, TrainConfig(lora_rank=4, lora_targets="v_proj")) == ("v_proj",)
    assert spec.lora_params(4, ("q_proj", "down_proj")) == spec.num_layers * out["params"]["trainable"]  # every block vs block 1


def test_modules_to_save_are_planned_as_trained_parameters() -> None:
    """LORA_MODULES_TO_SAVE (issue 46): the embedding and the head carry gradients and AdamW state, so the planner counts
    them with the adapters (once on a tied model, where they are one weight); the run summary counts them trainable."""
    from types import SimpleNamespace

    from raydlc.config import TrainConfig
    from raydlc.facts.models import get_spec, saved_params
    from raydlc.train.launch import trained_params

    tied, untied = get_spec("tiny"), SPECS["llama-3.1-8b"]
    assert tied.tie_embeddings and not untied.tie_embeddings
    assert saved_params(tied, ("embed_tokens", "lm_head")) == saved_params(tied, ("lm_head",)) == tied.embedding_params()
    assert saved_params(untied, ("embed_tokens", "lm_head")) == 2 * untied.embedding_params() and saved_params(untied, ("norm",)) == 0
    plain = planner.Workload(untied, lora_rank=16)
    saving = planner.Workload(untied, lora_rank=16, lora_saved_params=untied.embedding_params())
    assert saving.trained_params() == plain.trained_params() + untied.embedding_params()
    p, e = plain.trained_params(), untied.embedding_params()
    more = planner.memory_bytes(saving, 8)["optimizer"] - planner.memory_bytes(plain, 8)["optimizer"]
    assert more == (-(-(p + e) // 8) - -(-p // 8)) * saving.precision.optimizer and more > 0  # AdamW's moments of the shard
    out = trained_params(SimpleNamespace(train=TrainConfig(lora_rank=4, lora_modules_to_save="embed_tokens"), run_dir="/r"),  # type: ignore[arg-type]
                         SimpleNamespace(model=tied))
    assert out["params"]["trainable"] == tied.lora_params(4) + tied.embedding_params() and out["lora"]["modules_to_save"] == ["embed_tokens"]
