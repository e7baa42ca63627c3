"""A default cluster run takes the planner's layout: `raydlc plan --json` and what `submit --builtin` ships agree (issue 33)."""

from __future__ import annotations

import pytest

import raydlc.api as api
from raydlc import planner
from raydlc.api._config import load
from raydlc.config import with_cluster_defaults, with_local_defaults
from raydlc.facts.models import get_spec
from raydlc.jobs.runtime_env import builtin_env
from raydlc.train.resolve import plan_layout

REFERENCE_TOKENS_PER_S = 0.5173 * 8 * 128  # the seed's Qwen2.5-1.5B on 2 x g6.12xlarge, batch 1 x 128 per GPU over EFA


def _shipped(env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """The config the cluster's driver loads from what `submit --builtin` ships (RAYDLC_* variables only)."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return load(None, None)


def test_a_default_submit_runs_the_layout_plan_json_recommends(clean_env: object, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = api.plan().to_dict()  # `raydlc plan --json`, the default config
    env = builtin_env(load(None, None), "cluster")
    assert env["RAYDLC_GRAD_ACCUM"] == "auto" and env["RAYDLC_SEQ_LEN"] == "2048"
    cfg = _shipped(env, monkeypatch)
    train = cfg.train.updated(use_gpu=True, num_workers=8)
    mesh, step = plan_layout(train, [4, 4], model=get_spec(train.model_id), instance_type=cfg.gpu_nodes.instance_type)
    final = step.apply(train)
    assert step.planned and "planned:" in step.note and "tokens/s" in step.note
    rec = doc["recommendation"]
    assert (mesh.sharding, final.batch_size, final.grad_accum, final.grad_sync, final.activation_checkpointing) == (
        rec["strategy"], rec["micro_batch"], rec["grad_accum"], rec["sync"], rec["activation_checkpointing"])
    assert (doc["strategy"], doc["micro_batch"], doc["grad_accum"], doc["seq_len"]) == (mesh.sharding, final.batch_size, final.grad_accum, final.seq_len)
    assert step.tokens_per_s == rec["tokens_per_s"] == doc["step_time_s"]["tokens_per_s"]


def test_the_default_plan_is_the_honest_ratio_at_the_l4s_assumed_mfu(clean_env: object) -> None:
    """At the L4's assumed MFU (facts.mfu, ~0.22, not the H100's 0.40) the default plans about 30x the reference, and below
    the physical ceiling (6N + attention FLOPs at 8 x 121 TFLOPS, ~94 k tokens/s)."""
    doc = api.plan().to_dict()
    assert doc["model"] == "qwen2.5-1.5b" and doc["layout"]["instance_type"] == "g6.12xlarge" and doc["layout"]["nodes"] == 2
    assert doc["seq_len"] == 2048 and doc["assumptions"]["mfu_used"] == 0.221 and doc["assumptions"]["mfu_source"]["kind"] == "assumed"
    assert 25 <= doc["recommendation"]["tokens_per_s"] / REFERENCE_TOKENS_PER_S <= 40
    assert doc["recommendation"]["tokens_per_s"] < 94_000
    assert doc["recommendation"]["per_gpu_bytes"] <= planner.MAX_MEMORY_FRACTION * doc["gpu_memory_bytes"]


def test_what_the_user_set_stays_set_and_the_local_run_is_unchanged(clean_env: object, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load(None, {"SEQ_LEN": 512, "GRAD_ACCUM": 2})
    kept = with_cluster_defaults(cfg).train
    assert (kept.seq_len, kept.grad_accum) == (512, 2)
    assert with_cluster_defaults(load(None, {"DATA": "corpus.jsonl"})).train.seq_len == 128  # other data: what it supports is unknown
    local = with_local_defaults(load(None, None)).train
    assert (local.seq_len, local.grad_accum, local.activation_checkpointing) == (128, 1, None)
    env = builtin_env(load(None, None), "local")
    assert "RAYDLC_SEQ_LEN" not in env and "RAYDLC_GRAD_ACCUM" not in env
    # Checkpointing set on the command line is kept: the planner searches only the rest.
    shipped = builtin_env(load(None, {"ACTIVATION_CHECKPOINTING": False}), "cluster")
    assert shipped["RAYDLC_ACTIVATION_CHECKPOINTING"] == "false"
    cfg = _shipped(shipped, monkeypatch)
    train = cfg.train.updated(use_gpu=True, num_workers=8)
    _, step = plan_layout(train, [4, 4], model=get_spec(train.model_id), instance_type=cfg.gpu_nodes.instance_type)
    assert step.planned and step.activation_checkpointing is False


def test_a_batch_size_the_user_set_is_not_replaced(clean_env: object) -> None:
    kept = with_cluster_defaults(load(None, {"BATCH_SIZE": 2})).train
    assert (kept.batch_size, kept.grad_accum, kept.seq_len) == (2, 1, 2048)


def test_a_forced_communication_bound_layout_is_warned_with_the_planners_choice_beside_it() -> None:
    from raydlc.config import TrainConfig
    from raydlc.train.layout import decide

    spec = get_spec("qwen2.5-1.5b")
    forced = TrainConfig(model_id="qwen2.5-1.5b", seq_len=128, batch_size=1, grad_accum=1, sharding="fsdp", activation_checkpointing=False, use_gpu=True)
    step = decide(forced, [4, 4], model=spec, instance_type="g6.12xlarge")
    assert (step.sharding, step.micro_batch, step.grad_accum, step.activation_checkpointing) == ("fsdp", 1, 1, False)
    assert "WARNING" in step.note and "network-bound" in step.note and "the planner's choice" in step.note
    free = decide(TrainConfig(model_id="qwen2.5-1.5b", seq_len=128, grad_accum="auto", use_gpu=True), [4, 4], model=spec, instance_type="g6.12xlarge")
    assert "WARNING" not in free.note and free.tokens_per_s is not None and free.tokens_per_s > 10 * (step.tokens_per_s or 0)


def test_reduce_dtype_auto_is_fp32_and_bf16_only_where_fp32_fits_nowhere_as_plan_says(clean_env: object) -> None:
    """REDUCE_DTYPE=auto (the default) keeps fp32's exact sums wherever a layout fits with them, and turns on bf16
    reduction only where nothing fits otherwise: the run's layout and `raydlc plan` make the same choice."""
    from raydlc.config import TrainConfig
    from raydlc.train.layout import decide

    def step(model: str, seq: int, reduce: str) -> object:
        t = TrainConfig(model_id=model, seq_len=seq, grad_accum="auto", use_gpu=True, reduce_dtype=reduce)
        return decide(t, [4, 4], model=get_spec(model), instance_type="g6.12xlarge")

    fits = step("qwen2.5-7b", 2048, "auto")
    assert fits.planned and fits.reduce_dtype == "fp32" and fits.apply(TrainConfig()).reduce_dtype == "fp32"
    long = step("qwen2.5-7b", 8192, "auto")
    assert long.planned and long.reduce_dtype == "bf16" and long.apply(TrainConfig()).reduce_dtype == "bf16"
    forced = step("qwen2.5-7b", 8192, "fp32")  # what the user set stays set: nothing plans
    assert not forced.planned and forced.reduce_dtype == "fp32"
    doc = api.plan(model="qwen2.5-7b", seq_len=8192).to_dict()
    assert doc["reduce_dtype"] == "bf16" and doc["recommendation"]["micro_batch"] == long.micro_batch
    assert api.plan(model="qwen2.5-7b").to_dict()["reduce_dtype"] == "fp32"
