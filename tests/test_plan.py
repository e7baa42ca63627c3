from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from raydlc import planner
from raydlc.cli import main
from raydlc.facts.instances import GPUS
from raydlc.facts.models import SPECS, ModelSpec, get_spec
from raydlc.train.model import build_model

P15 = 1_543_714_304
G6 = planner.layout_for(2, 4, instance_type="g6.12xlarge")
W = planner.Workload


def cli_json(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-m", "raydlc.cli", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("policy", "bytes_per_param"), [("pure-bf16", 2 + 2 + 4), ("bf16-mixed", 4 + 4 + 8)])
def test_acceptance_cli_params_and_sharded_state_match_the_formula(policy: str, bytes_per_param: int) -> None:
    doc = cli_json(["plan", "--model", "qwen2.5-1.5b", "--nodes", "2", "--gpus-per-node", "4", "--policy", policy, "--seq-len", "128", "--grad-accum", "1", "--json"])
    assert doc["params"] == P15
    b = doc["per_gpu_bytes_by_phase"]["optimizer_step"]  # every shard's gradient exists at the step
    state = b["params"] + b["grads"] + b["optimizer"] + b["fp32_master"]
    assert state == bytes_per_param * P15 // 8
    assert doc["per_gpu_bytes"] == doc["per_gpu_bytes_by_phase"][doc["peak_phase"]]
    assert set(doc) >= {"params", "per_gpu_bytes", "traffic_bytes_per_step", "step_time_s", "recommendation"}
    assert doc["step_time_s"]["bound"] in ("compute", "network", "intra-node")
    if policy == "pure-bf16":  # the seed's figures: 12.35 GB in all, 1.54 GB per GPU over 8
        assert round(state * 8 / 1e9, 2) == 12.35 and round(state / 1e9, 2) == 1.54


def test_bf16_mixed_stores_fp32_shards_which_are_the_master_and_all_gathers_bf16() -> None:
    spec = get_spec("qwen2.5-1.5b")
    mixed_plan, pure_plan = (planner.plan(W(spec, policy=p), G6) for p in ("bf16-mixed", "pure-bf16"))
    mixed, pure = mixed_plan.per_gpu_bytes_by_phase["optimizer_step"], pure_plan.per_gpu_bytes_by_phase["optimizer_step"]
    local = P15 // 8
    assert (mixed["params"], mixed["grads"], mixed["optimizer"]) == (4 * local, 4 * local, 8 * local)
    assert mixed["fp32_master"] == 0 == pure["fp32_master"]  # FSDP2 keeps no second copy
    assert (pure["params"], pure["grads"], pure["optimizer"]) == (2 * local, 2 * local, 4 * local)
    mixed, pure = mixed_plan.per_gpu_bytes_by_phase["embeddings_reduce"], pure_plan.per_gpu_bytes_by_phase["embeddings_reduce"]
    assert mixed["unsharded_params"] == pure["unsharded_params"]  # both gather in bf16
    assert mixed["unsharded_grads"] == pure["unsharded_grads"]  # the bf16 gradient of the unit
    assert mixed["reduce_buffer"] == 2 * pure["reduce_buffer"] > 0  # FSDP2's buffer, in fp32 and in bf16
    assert mixed_plan.per_gpu_bytes["total"] > pure_plan.per_gpu_bytes["total"]


def test_the_units_cover_the_model_once_and_a_block_is_a_layer() -> None:
    for spec in (SPECS["tiny"], ModelSpec("untied", 128, 2, 4, 2, 344, 1000, False)):
        model = build_model(spec, device="meta")
        u = planner.fsdp_units(spec)
        assert u["root"] + u["embeddings"] + u["head"] + spec.num_layers * u["block"] == spec.param_count()
        assert sum(p.numel() for p in model.model.layers[0].parameters()) == spec.layer_params() == u["block"]
        assert planner.kept_params(spec) == u["root"] + u["head"] + u["block"]


def test_unsharded_root_and_overhead_are_counted() -> None:
    spec = get_spec("qwen2.5-1.5b")
    p = planner.plan(W(spec, policy="pure-bf16"), G6)
    b = p.per_gpu_bytes
    assert spec.tie_embeddings  # the shared weight is the root unit's, held all step with the final norm
    for phase in ("forward", "head_backward"):
        assert p.per_gpu_bytes_by_phase[phase]["unsharded_params"] == 2 * (spec.embedding_params() + spec.hidden_size + 2 * spec.layer_params())
    assert b == max(p.per_gpu_bytes_by_phase.values(), key=lambda ph: ph["total"])  # the peak is the largest phase
    assert b["overhead"] >= 1 << 30
    assert b["total"] == sum(v for k, v in b.items() if k != "total")


def test_fsdp_traffic_formula_and_hsdp_crosses_nodes_less() -> None:
    spec = get_spec("qwen2.5-1.5b")
    p = planner.plan(W(spec, policy="bf16-mixed"), G6)
    f, h = p.strategies["fsdp"].traffic_bytes_per_step, p.strategies["hsdp"].traffic_bytes_per_step
    # Every unit gathered in forward and again in backward, but the root and the last block once.
    assert f["all_gather"] == int(7 / 8 * (2 * P15 - planner.kept_params(spec)) * 2)
    assert f["reduce_scatter"] == int(7 / 8 * P15 * 4)
    assert f["cross_node_per_node"] == f["per_gpu"] and f["all_reduce"] == 0
    assert h["all_reduce"] == int(2 * 1 / 2 * -(-P15 // 4) * 4)
    assert h["cross_node_per_node"] == pytest.approx(4 * h["all_reduce"], abs=4)
    assert h["cross_node_per_node"] < f["cross_node_per_node"]
    one = planner.plan(W(spec), planner.layout_for(1, 4, instance_type="g6.12xlarge")).strategies
    assert one["fsdp"].traffic_bytes_per_step["cross_node_per_node"] == 0
    assert one["hsdp"].traffic_bytes_per_step["intra_node_per_gpu"] == h["intra_node_per_gpu"]
    assert p.strategies["hsdp"].per_gpu_bytes["total"] > p.strategies["fsdp"].per_gpu_bytes["total"]


def test_step_time_is_network_bound_across_nodes_and_efa_beats_tcp() -> None:
    spec = get_spec("qwen2.5-1.5b")
    st = planner.plan(W(spec, policy="pure-bf16"), G6).step_time_s
    assert st["bound"] == "network" and st["transport"] == "efa"
    assert st["efa"]["estimate"] < st["tcp"]["estimate"]
    # The published 2 x g6.12xlarge figures: 0.5173 steps/s on EFA, 0.2513 on TCP.
    assert 1 / st["efa"]["estimate"] == pytest.approx(0.5173, rel=0.25)
    assert 1 / st["tcp"]["estimate"] == pytest.approx(0.2513, rel=0.25)
    single = planner.plan(W(spec, micro_batch=8, seq_len=2048), planner.layout_for(1, 8, instance_type="p5.48xlarge"))
    assert single.step_time_s["bound"] == "compute" and single.step_time_s["network"] == 0


def test_largest_micro_batch_is_the_edge_of_fitting_and_monotone() -> None:
    spec = get_spec("qwen2.5-1.5b")
    p = planner.plan(W(spec, policy="bf16-mixed"), G6)
    s = p.strategies["fsdp"]
    cap = p.gpu_memory_bytes
    total = lambda b: planner.memory_bytes(W(spec, seq_len=128, micro_batch=b), 8)["total"]
    assert s.max_micro_batch >= 1 and total(s.max_micro_batch) <= cap < total(s.max_micro_batch + 1)

    def mb(**kw: object) -> int:
        args = dict(nodes=2, gpus=4, gpu="l4", seq=128, ac=False) | kw
        lay = planner.layout_for(args["nodes"], args["gpus"], gpu=args["gpu"], network_gbps=40)
        return planner.plan(W(spec, seq_len=args["seq"], activation_checkpointing=args["ac"]), lay).max_micro_batch

    seqs = [mb(seq=s) for s in (128, 512, 2048, 8192)]
    assert seqs == sorted(seqs, reverse=True) and seqs[0] > seqs[-1]
    gpus = [mb(nodes=n) for n in (1, 2, 4, 8)]
    assert gpus == sorted(gpus) and gpus[-1] > gpus[0]
    assert mb(ac=True) > mb(ac=False)
    assert mb(gpu="h100") > mb(gpu="l4")


@pytest.mark.parametrize("checkpointing", [False, True])
def test_saved_activations_match_what_autograd_keeps(checkpointing: bool) -> None:
    """Bytes of the distinct non-parameter storages autograd saves in a bf16 forward on CPU (SDPA)."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for spec in (SPECS["tiny"], ModelSpec("small", 512, 8, 8, 2, 1376, 32003, False)):
        model = build_model(spec, dtype=torch.bfloat16)
        if checkpointing:
            for i, layer in enumerate(model.model.layers):
                model.model.layers[i] = checkpoint_wrapper(layer)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor, params: set[int] = params, saved: dict[int, int] = saved) -> torch.Tensor:
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                saved[st.data_ptr()] = st.nbytes()
            return t

        ids = torch.randint(0, spec.vocab_size, (2, 128))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=ids)
        w = W(spec, seq_len=128, micro_batch=2, activation_checkpointing=checkpointing, loss_chunk=0)
        want = planner.activation_parts(w)["saved"] + planner.logits_parts(w)["saved"]  # transformers' own loss keeps the log-softmax
        assert sum(saved.values()) == pytest.approx(want, rel=0.02), spec.name


def test_activation_checkpointing_keeps_only_block_inputs() -> None:
    spec = get_spec("qwen2.5-1.5b")
    a = planner.plan(W(spec, seq_len=1024, micro_batch=2), G6).activations_bytes
    assert a["with_checkpointing"] < a["without_checkpointing"] / 2
    per_token_in = spec.num_layers * 2 * spec.hidden_size * 1024 * 2
    assert a["with_checkpointing"] > per_token_in


def test_recommendation_and_recommend_sharding() -> None:
    spec = get_spec("qwen2.5-1.5b")
    assert planner.recommend_sharding(W(spec), planner.layout_for(2, 4, gpu="l4", network_gbps=40)) == "hsdp"
    assert planner.recommend_sharding(W(spec), planner.layout_for(1, 4, gpu="l4", network_gbps=40)) == "fsdp"  # one node
    assert planner.recommend_sharding(W(spec, policy="pure-bf16"), G6) == "hsdp"
    # 8 nodes x 1 L4: HSDP would keep 16 B/param of 1.5B on each 22.4 GiB GPU.
    assert planner.recommend_sharding(W(spec), planner.layout_for(8, 1, gpu="l4", network_gbps=40)) == "fsdp"
    rec = planner.plan(W(spec), planner.layout_for(8, 1, gpu="l4", network_gbps=40)).recommendation
    assert "HSDP needs" in rec["reason"] and rec["micro_batch"] >= 1
    big = planner.plan(W(get_spec("qwen2.5-1.5b")), planner.layout_for(1, 1, gpu="l4", network_gbps=40))
    assert big.fits is False and big.recommendation["micro_batch"] == 0
    assert "not even one sequence" in big.recommendation["micro_batch_reason"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policy", "fp8"], "precision policy"),
        (["--strategy", "ddp"], "sharding strategy"),
        (["--gpu", "tpu"], "unknown GPU"),
        (["--model", "gpt-9"], "unknown model spec"),
        (["--gpus-per-node", "0"], "at least 1"),
        (["--network-gbps", "0"], "must be positive"),
        (["--micro-batch", "0"], "BATCH_SIZE"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], needle: str, clean_env: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert "hint:" in err or "invalid configuration" in err  # config errors name the field and its source instead


def test_plan_and_preflight_import_nothing_heavy() -> None:
    code = (
        "import sys; import raydlc.checks.preflight; from raydlc.cli import main; main(['plan', '--json']); "
        "print('HEAVY=' + ','.join(m for m in ('torch', 'ray', 'transformers', 'kubernetes', 'boto3') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.rstrip().endswith("HEAVY="), r.stdout[-300:] + r.stderr[-500:]
    assert json.loads(r.stdout.splitlines()[0])["params"] == P15


def test_human_output_names_the_recommendation(clean_env: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "tiny", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "per-GPU memory" in out and "recommended:" in out and "fsdp" in out


def test_when_nothing_fits_nothing_is_recommended(clean_env: object, capsys: pytest.CaptureFixture[str]) -> None:
    """A 72B on one L4: the plan says why nothing fits, not "recommended: fsdp, micro-batch 0, ~0 tokens/s"."""
    assert main(["plan", "--model", "qwen2.5-72b", "--nodes", "1", "--gpus-per-node", "1", "--instance-type", "g6.12xlarge"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "nothing recommended: nothing fits (the smallest layout needs" in out and "not even one sequence fits" in out
    assert "recommended: fsdp" not in out and "micro-batch 0" not in out and "~0 tokens/s" not in out


def test_tcp_only_layout_uses_tcp_rate() -> None:
    lay = replace(G6, efa=False)
    st = planner.plan(W(get_spec("qwen2.5-1.5b")), lay).step_time_s
    assert st["transport"] == "tcp" and st["estimate"] == st["tcp"]["estimate"]


def test_compute_bound_layouts_keep_fsdp_for_its_memory() -> None:
    p = planner.plan(W(get_spec("qwen2.5-1.5b"), seq_len=4096, micro_batch=4), planner.layout_for(2, 8, instance_type="p5.48xlarge"))
    assert p.step_time_s["bound"] == "compute"
    assert p.recommendation["strategy"] == "fsdp" and "compute-bound either way" in p.recommendation["reason"]
    assert p.strategies["fsdp"].per_gpu_bytes["total"] < p.strategies["hsdp"].per_gpu_bytes["total"]


def test_accumulation_gathers_every_micro_batch_and_reduces_as_the_sync_mode_says() -> None:
    spec = get_spec("qwen2.5-1.5b")
    one = {s: planner.traffic_bytes(W(spec), s, G6) for s in ("fsdp", "hsdp")}
    for strategy, sync, rs_times, ar_times in [
        ("fsdp", "every", 8, 8), ("fsdp", "once", 1, 1),
        ("hsdp", "every", 8, 8), ("hsdp", "once", 1, 1), ("hsdp", "all-reduce-once", 8, 1),
    ]:
        t = planner.traffic_bytes(W(spec, grad_accum=8, sync=sync), strategy, G6)
        base = one[strategy]
        assert t["all_gather"] == pytest.approx(8 * base["all_gather"], abs=8), (strategy, sync)
        assert t["reduce_scatter"] == pytest.approx(rs_times * base["reduce_scatter"], abs=8), (strategy, sync)
        assert t["all_reduce"] == pytest.approx(ar_times * base["all_reduce"], abs=8), (strategy, sync)
    # HSDP's network carries only the all-reduce: paying it once is what makes accumulation pay off.
    hsdp_once = planner.traffic_bytes(W(spec, grad_accum=8, sync="all-reduce-once"), "hsdp", G6)
    assert hsdp_once["cross_node_per_node"] == one["hsdp"]["cross_node_per_node"]
    assert planner.traffic_bytes(W(spec, grad_accum=1, sync="once"), "fsdp", G6) == planner.traffic_bytes(W(spec), "fsdp", G6) | {"sync": "once"}


def test_accumulation_memory_is_the_unsharded_gradient_for_once_and_a_shard_for_all_reduce_once() -> None:
    spec, p = get_spec("qwen2.5-1.5b"), P15
    m = lambda **kw: planner.memory_bytes(W(spec, seq_len=128, micro_batch=4, **kw), 4)
    assert m()["accumulated_grads"] == 0 == m(grad_accum=1, sync="once")["accumulated_grads"]
    assert m(grad_accum=4, sync="once")["accumulated_grads"] == 4 * p  # fp32 reduce dtype, whole model
    assert m(grad_accum=4, sync="all-reduce-once")["accumulated_grads"] == 4 * -(-p // 4)
    assert m(grad_accum=4, sync="every")["accumulated_grads"] == 0
    pure = planner.memory_bytes(W(spec, policy="pure-bf16", seq_len=128, micro_batch=4, grad_accum=4, sync="once"), 4)
    assert pure["accumulated_grads"] == 2 * p  # no reduce dtype: kept in bf16


def test_step_time_overlaps_within_each_micro_batch_and_one_micro_batch_is_the_old_formula() -> None:
    spec = get_spec("qwen2.5-1.5b")
    st1 = planner.step_time(W(spec, seq_len=128, micro_batch=16), "hsdp", G6)
    assert st1["estimate"] == max(st1["compute"], st1["communication"])
    st = planner.step_time(W(spec, seq_len=128, micro_batch=16, grad_accum=8, sync="all-reduce-once"), "hsdp", G6)
    assert st["compute"] == pytest.approx(8 * st1["compute"], abs=1e-3)
    assert st["tokens_per_step"] == 16 * 128 * 8 * 8 and st["tokens_per_s"] == pytest.approx(st["tokens_per_step"] / st["estimate"], rel=1e-3)
    # The cross-node all-reduce is paid once for 8 micro-batches; the all-gathers inside the node 8 times.
    assert st["network"] == pytest.approx(st1["network"], abs=1e-3) and st["intra_node"] > 7 * st1["intra_node"]
    assert st["tokens_per_s"] > 2 * st1["tokens_per_s"]
    serial = planner.step_time(W(spec, seq_len=128, micro_batch=16, grad_accum=8, sync="all-reduce-once"), "hsdp", G6, planner.Assumptions(overlap=False))
    assert serial["estimate"] == pytest.approx(serial["compute"] + serial["communication"], abs=1e-3)
    assert serial["estimate"] > st["estimate"]


def test_acceptance_plan_recommends_accumulation_and_tokens_per_s_on_the_reference_cluster() -> None:
    doc = cli_json(["plan", "--model", "qwen2.5-1.5b", "--nodes", "2", "--gpus-per-node", "4", "--seq-len", "128", "--json"])
    rec = doc["recommendation"]
    assert rec["micro_batch"] * rec["grad_accum"] > 1 and rec["tokens_per_s"] > 0
    assert rec["tokens_per_step"] == rec["micro_batch"] * rec["grad_accum"] * 8 * 128 <= rec["max_global_batch"] == 131072
    # The reference's own layout, 1 x 128 per GPU without accumulation, is what it beats.
    ref = planner.recommend(W(get_spec("qwen2.5-1.5b"), policy="bf16-mixed"), G6, micro_batches=(1,), grad_accums=(1,), strategies=("fsdp",))
    assert ref.best is not None and rec["tokens_per_s"] > 20 * ref.best.tokens_per_s
    assert rec["runner_up"] is not None and (rec["runner_up"]["strategy"], rec["runner_up"]["sync"]) != (rec["strategy"], rec["sync"])
    assert rec["candidates_considered"] > 50 and rec["top"][0]["tokens_per_s"] >= rec["tokens_per_s"]
    assert "runner-up" in rec["reason"] and "131,072 tokens" in rec["reason"]


def test_recommend_is_the_fastest_that_fits_within_the_ceiling_and_honours_pinned_dimensions() -> None:
    spec = get_spec("qwen2.5-1.5b")
    rec = planner.recommend(W(spec, seq_len=128), G6)
    assert rec.best is not None
    fitting = [c for c in rec.candidates if c.fits]
    assert all(c.tokens_per_step <= 131072 for c in rec.candidates)
    assert rec.best.tokens_per_s >= max(c.tokens_per_s for c in fitting) * (1 - planner.DEFAULT_ASSUMPTIONS.tie_fraction)
    assert {c.strategy for c in rec.candidates} == {"fsdp", "hsdp"} and {c.sync for c in rec.candidates} == {"every", "once", "all-reduce-once"}
    assert not any(c.sync == "all-reduce-once" for c in rec.candidates if c.strategy == "fsdp")
    # Each candidate is the planner's own arithmetic for that layout.
    b = rec.best
    again = planner.candidate(W(spec, seq_len=128, micro_batch=b.micro_batch, grad_accum=b.grad_accum, sync=b.sync), b.strategy, G6)
    assert again == b
    small = planner.recommend(W(spec, seq_len=128, max_global_batch=16384), G6)
    assert small.best is not None and small.best.tokens_per_step <= 16384 < rec.best.tokens_per_step
    pinned = planner.recommend(W(spec), G6, micro_batches=(2,), grad_accums=(4,), strategies=("fsdp",), syncs=("every",))
    assert [(c.strategy, c.micro_batch, c.grad_accum, c.sync) for c in pinned.candidates] == [("fsdp", 2, 4, "every")]
    # One node: no HSDP; a compute-bound single GPU takes the largest micro-batch, not accumulation.
    h200 = planner.recommend(W(spec), planner.layout_for(1, 1, gpu="h200", network_gbps=100))
    assert h200.best is not None and h200.best.strategy == "fsdp" and h200.best.grad_accum == 1 and h200.best.micro_batch >= 64
    nothing = planner.recommend(W(spec), planner.layout_for(1, 1, gpu="l4", network_gbps=40))
    assert nothing.best is None and "nothing fits" in nothing.reason and nothing.to_dict()["micro_batch"] == 0


def test_plan_grad_accum_auto_shows_the_recommended_layouts_figures(clean_env: object) -> None:
    doc = cli_json(["plan", "--model", "qwen2.5-1.5b", "--grad-accum", "auto", "--json"])
    rec = doc["recommendation"]
    assert (doc["strategy"], doc["micro_batch"], doc["grad_accum"], doc["sync"]) == (rec["strategy"], rec["micro_batch"], rec["grad_accum"], rec["sync"])
    assert doc["step_time_s"]["tokens_per_s"] == rec["tokens_per_s"]
    fixed = cli_json(["plan", "--model", "qwen2.5-1.5b", "--grad-accum", "4", "--micro-batch", "2", "--sync", "every", "--json"])
    assert (fixed["grad_accum"], fixed["micro_batch"], fixed["strategies"]["hsdp"]["sync"]) == (4, 2, "every")
    assert fixed["traffic_bytes_per_step"]["micro_batches"] == 4


@pytest.mark.parametrize("model", ["qwen2.5-7b", "llama-3.1-8b"])
def test_acceptance_7b_and_8b_fit_the_seeds_cluster_with_what_they_need(model: str, clean_env: object) -> None:
    doc = cli_json(["plan", "--model", model, "--nodes", "2", "--gpus-per-node", "4", "--seq-len", "2048", "--grad-accum", "1", "--json"])
    rec, cap = doc["recommendation"], doc["gpu_memory_bytes"]
    assert not doc["fits"]  # as given (no checkpointing) it does not
    assert rec["per_gpu_bytes"] is not None and rec["per_gpu_bytes"] <= planner.MAX_MEMORY_FRACTION * cap
    # The time-resolved count: checkpointing is all it needs; the reduction stays fp32, with micro-batch 2 or more.
    assert rec["activation_checkpointing"] is True and rec["reduce_dtype"] == "fp32" and rec["loss_chunk"] == 1024
    assert rec["micro_batch"] >= 2
    items = rec["per_gpu_bytes_itemised"]
    assert items["total"] == rec["per_gpu_bytes"] and {"unsharded_params", "unsharded_grads", "reduce_buffer", "logits"} <= set(items)
    spec = get_spec(model)
    head = spec.embedding_params() + spec.hidden_size
    assert items["unsharded_grads"] in (2 * head, 2 * spec.embedding_params(), 0)  # a unit's bf16 gradient where one is alive
    assert items["reduce_buffer"] in (4 * head, 4 * spec.embedding_params(), 0)  # and its fp32 reduce-scatter buffer
    assert doc["logits_bytes"]["unchunked"] == 12 * spec.vocab_size * 2048 > 10 * doc["logits_bytes"]["chunked"] / 8


def test_the_root_units_term_of_qwen_7b_drops_to_what_the_new_units_hold() -> None:
    spec = get_spec("qwen2.5-7b")
    w = W(spec, seq_len=2048)
    u = planner.fsdp_units(spec)
    assert u["root"] == 0 and u["embeddings"] == spec.embedding_params() and u["head"] == spec.embedding_params() + spec.hidden_size
    old_root = 2 * spec.embedding_params() + spec.hidden_size  # embeddings, norm and head, one unit held all step
    old_term = (old_root + 2 * u["block"]) * 2 + old_root * (2 + 4)  # gathered bf16 with two blocks, plus its bf16 and fp32 gradients
    assert round(old_term / 1e9, 2) == 9.65
    new = planner.unsharded_parts(w)
    assert new["unsharded_params"] == (u["head"] + 2 * u["block"]) * 2 and new["unsharded_grads"] == u["head"] * 2
    assert new["reduce_buffer"] == u["head"] * 4 and planner.unsharded_parts(w.at(reduce_dtype="bf16"))["reduce_buffer"] == u["head"] * 2
    assert sum(new.values()) < old_term * 0.6


def test_seq_len_reaches_every_term_and_the_reduce_dtype_the_traffic() -> None:
    spec = get_spec("qwen2.5-7b")
    short, long = (planner.memory_phases(W(spec, seq_len=n, loss_chunk=0), 8)["head_backward"] for n in (128, 2048))
    assert long["activations"] == 16 * short["activations"] and long["logits"] == 16 * short["logits"]
    chunked = planner.memory_phases(W(spec, seq_len=2048), 8)["head_backward"]
    assert chunked["logits"] == long["logits"] * 8 // 12 // 2  # one chunk of 1024 tokens of the 2048, 8 B not 12
    f32, b16 = (planner.traffic_bytes(W(spec, reduce_dtype=d), "fsdp", G6) for d in ("fp32", "bf16"))
    assert b16["reduce_scatter"] * 2 == pytest.approx(f32["reduce_scatter"], rel=1e-6) and b16["all_gather"] == f32["all_gather"]
    scans = {n: cli_json(["plan", "--model", "qwen2.5-1.5b", "--scan-nodes", "1,2", "--seq-len", str(n), "--json"]) for n in (128, 2048)}
    assert scans[2048]["seq_len"] == 2048 and [r["micro_batch"] for r in scans[2048]["rows"]] != [r["micro_batch"] for r in scans[128]["rows"]]
    assert [r["tokens_per_s"] for r in scans[2048]["rows"]] != [r["tokens_per_s"] for r in scans[128]["rows"]]


def test_checkpointing_is_searched_and_no_recommendation_plans_above_the_headroom() -> None:
    """1.5B at seq 2048 on the reference cluster: checkpointing wins when it is faster (at an H100-like MFU, where the
    larger micro-batch it allows pays for its recompute; at the L4's assumed MFU it does not), every pick under 92 %."""
    spec = get_spec("qwen2.5-1.5b")
    w = W(spec, seq_len=2048)
    fast = planner.Assumptions(mfu_by_gpu={"l4": 0.40})
    both = planner.recommend(w, G6, checkpointing=(False, True), assumptions=fast)
    without = planner.recommend(w, G6, assumptions=fast)
    assert both.best is not None and without.best is not None
    assert both.best.activation_checkpointing and both.best.tokens_per_s > without.best.tokens_per_s
    assert {c.activation_checkpointing for c in both.candidates} == {False, True}
    cap = planner.gpu_capacity(G6)
    for rec in (both, without):
        assert all(c.fits == (c.per_gpu_bytes <= planner.MAX_MEMORY_FRACTION * cap) for c in rec.candidates)
        assert rec.best.per_gpu_bytes <= 0.92 * cap
    # What `plan` recommends with checkpointing free is that search with selective checkpointing too (faster here).
    p = planner.plan(w.at(grad_accum="auto"), G6, free=("activation_checkpointing",), assumptions=fast)
    three = planner.recommend(w, G6, checkpointing=planner.AC_SEARCH, assumptions=fast)
    assert p.recommendation["activation_checkpointing"] == "selective" == p.activation_checkpointing == three.best.activation_checkpointing
    assert p.recommendation["tokens_per_s"] == three.best.tokens_per_s > both.best.tokens_per_s and p.recommendation["needs"] == {}
    # At the L4's own (lower) MFU compute is dearer: the search keeps the faster of the two, whichever it is.
    l4 = planner.recommend(w, G6, checkpointing=(False, True))
    assert l4.best is not None and l4.best.tokens_per_s == max(c.tokens_per_s for c in l4.candidates if c.fits)


def test_the_plan_states_its_mfu_by_gpu_and_compile_and_its_link_efficiencies(clean_env: object) -> None:
    doc = cli_json(["plan", "--model", "qwen2.5-1.5b", "--seq-len", "2048", "--json"])
    a = doc["assumptions"]
    compiled = planner.planned_compile(planner_compile_default())
    assert a["compile"] is compiled and a["mfu_used"] == a["mfu_by_gpu"]["l4"]["compiled" if compiled else "eager"]
    assert a["mfu_by_gpu"]["l4"]["compiled"] == 0.221 and a["mfu_by_gpu"]["h100"]["compiled"] == 0.4  # facts.mfu: scaled, not the H100's
    assert a["mfu_by_gpu"]["l4"]["source"] == "assumed" and "54 of 121 TFLOPS" in a["mfu_by_gpu"]["l4"]["from"]
    assert a["mfu_source"]["kind"] == "assumed" and "L4" in a["mfu_source"]["source"]
    assert set(a["mfu_by_gpu"]) == set(GPUS)
    assert a["mfu_by_gpu"]["h100"]["eager"] < a["mfu_by_gpu"]["h100"]["compiled"] and f"compile={'on' if compiled else 'off'}" in a["mfu_depends_on"]
    assert a["link_efficiency"] == {"efa": 0.85, "tcp": 0.4, "pcie_gbytes_s": 16.0, "nvlink_gbytes_s": 200.0}
    import raydlc.api as api

    eager = api.plan(model="qwen2.5-1.5b", seq_len=2048, settings={"COMPILE": False}).to_dict()
    assert eager["assumptions"]["compile"] is False and "compile=off" in eager["assumptions"]["mfu_depends_on"]
    assert eager["assumptions"]["mfu_used"] == pytest.approx(0.221 / 1.157, rel=1e-3)
    on = api.plan(model="qwen2.5-1.5b", seq_len=2048, settings={"COMPILE": True}).to_dict()
    assert on["assumptions"]["compile"] is True and on["assumptions"]["mfu_used"] == 0.221
    assert eager["recommendation"]["tokens_per_s"] < on["recommendation"]["tokens_per_s"]  # eager computes slower
    # A measured MFU for one GPU replaces the assumption there only.
    measured = planner.Assumptions(mfu_by_gpu={"l4": 0.3})
    assert measured.mfu_for("l4") == 0.3 and measured.mfu_for("h100") == 0.4 and measured.stated("l4", True)["mfu_by_gpu"]["l4"]["source"] == "measured"


def planner_compile_default() -> bool | None:
    """COMPILE's default in the config (the loop's side of issue 33 decides it)."""
    from raydlc.config import FIELDS

    return FIELDS["COMPILE"].default
