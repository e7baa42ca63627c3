"""Launch decisions (sharding, mesh, resources, local defaults) and input checks before Ray starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from raydlc.config import FIELDS, LOCAL_DEFAULTS, TrainConfig, load_config
from raydlc.errors import CheckpointError, InputError
from raydlc.train import launch as L
from raydlc.train import layout
from raydlc.train import resolve as R
from raydlc.train.runspec import RunTarget

# What `raydlc train` runs with when nothing is set: the config's defaults under the local table.
LOCAL = TrainConfig().updated(**{FIELDS[k].key: v for k, v in LOCAL_DEFAULTS.items()})


G6 = "g6.12xlarge"


def test_auto_sharding_asks_the_planner_on_several_nodes_and_bad_names_fail() -> None:
    from raydlc.facts.models import SPECS
    from raydlc.planner import Workload, layout_for, recommend_sharding

    big, tiny = SPECS["qwen2.5-1.5b"], SPECS["tiny"]
    planned = recommend_sharding(Workload(big), layout_for(2, 4, instance_type=G6))
    assert planned == "hsdp"  # 40 Gb/s between nodes: replicate across them, shard within
    t = TrainConfig(model_id="qwen2.5-1.5b", num_workers=8)

    def sharding(train: TrainConfig, counts: list[int], model: object, instance_type: str | None) -> str:
        return layout.decide(train, counts, model=model, instance_type=instance_type).sharding  # type: ignore[arg-type]

    assert sharding(t, [4, 4], big, G6) == planned
    assert sharding(t, [4], big, G6) == "fsdp"  # one node: one replica
    assert sharding(t, [4, 4], None, G6) == "fsdp"  # no architecture to plan with
    assert sharding(t, [1, 1], tiny, None) == "fsdp"  # local: no GPU type
    assert sharding(t.updated(sharding="hsdp"), [4, 4], None, None) == "hsdp"
    assert sharding(t.updated(sharding="fsdp"), [4, 4], big, G6) == "fsdp"
    with pytest.raises(InputError, match="zero"):
        layout.decide(TrainConfig.model_construct(**(t.model_dump() | {"sharding": "zero"})), [1], model=None, instance_type=None)
    # The driver plans `auto` on the nodes Ray grants: 8 GPU workers on 2 x 4 GPUs are HSDP (2, 4).
    mesh, decision = R.plan_layout(t, [4, 4], model=big, instance_type=G6)
    assert (mesh.sharding, mesh.shape, decision.grad_accum, decision.micro_batch) == (planned, (2, 4), 1, 1)


def test_grad_accum_auto_runs_the_planners_layout_on_a_known_cluster_and_1_locally() -> None:
    from raydlc import planner
    from raydlc.facts.models import SPECS

    big, tiny = SPECS["qwen2.5-1.5b"], SPECS["tiny"]
    t = TrainConfig(model_id="qwen2.5-1.5b", num_workers=8, grad_accum="auto", use_gpu=True)
    d = layout.decide(t, [4, 4], model=big, instance_type=G6)
    # ACTIVATION_CHECKPOINTING left empty: searched with the layout.
    best = planner.recommend(planner.Workload(big, seq_len=128), planner.layout_for(2, 4, instance_type=G6), checkpointing=(False, True)).best
    assert best is not None and d.planned and d.note.startswith("planned: ")
    assert (d.sharding, d.micro_batch, d.grad_accum, d.grad_sync, d.activation_checkpointing) == (
        best.strategy, best.micro_batch, best.grad_accum, best.sync, best.activation_checkpointing)
    assert d.micro_batch * d.grad_accum > 1 and d.micro_batch * d.grad_accum * 8 * 128 <= t.max_global_batch
    applied = d.apply(t)
    assert (applied.batch_size, applied.grad_accum, applied.grad_sync, applied.activation_checkpointing) == (
        d.micro_batch, d.grad_accum, d.grad_sync, d.activation_checkpointing)
    assert R.global_sequences(applied) == d.micro_batch * d.grad_accum * 8
    # The training set caps the global batch too, and so does MAX_GLOBAL_BATCH.
    few = layout.decide(t, [4, 4], model=big, instance_type=G6, max_sequences=100)
    assert few.micro_batch * few.grad_accum * 8 <= 100
    low = layout.decide(t.updated(max_global_batch=8192), [4, 4], model=big, instance_type=G6)
    assert low.micro_batch * low.grad_accum * 8 * 128 <= 8192
    # A fixed accumulation keeps BATCH_SIZE; GRAD_SYNC=auto is the planner's fastest mode at it.
    fixed = layout.decide(t.updated(grad_accum=4, batch_size=2), [4, 4], model=big, instance_type=G6)
    assert (fixed.micro_batch, fixed.grad_accum) == (2, 4) and fixed.grad_sync in planner.SYNCS[fixed.sharding]
    # Locally there is no GPU type to plan with: accumulation 1, and the note says so.
    local = layout.decide(t.updated(model_id="tiny", num_workers=2, batch_size=8), [2], model=tiny, instance_type=None)
    assert (local.grad_accum, local.micro_batch, local.planned) == (1, 8, False)
    assert "chosen without the planner" in local.note and "no known GPU type" in local.note and "no gradient accumulation" in local.note
    # Without a plan, the sync mode is the FSDP2 switch for the sharding.
    plain = TrainConfig(model_id="tiny", num_workers=2, grad_accum=4)
    assert layout.decide(plain, [2], model=tiny, instance_type=None).grad_sync == "once"
    assert layout.decide(plain.updated(sharding="hsdp", hsdp_replicas=2), [2], model=tiny, instance_type=None).grad_sync == "all-reduce-once"
    assert layout.decide(plain.updated(grad_accum=1), [2], model=tiny, instance_type=None).grad_sync == "every"
    with pytest.raises(InputError, match="needs HSDP"):
        layout.decide(plain.updated(sharding="fsdp", grad_sync="all-reduce-once"), [2], model=tiny, instance_type=None)


def test_prepare_counts_accumulation_in_the_global_batch(tmp_path: Path) -> None:
    data = tmp_path / "d.txt"
    data.write_text(" ".join(f"word{i % 50}" for i in range(3000)))
    train = TrainConfig(model_id="tiny", num_workers=2, seq_len=32, batch_size=4, data=str(data), storage_path=str(tmp_path / "o"))
    p = L.prepare(train, RunTarget())
    assert R.resolve(train, RunTarget(), p, R.Granted.local(train)).grad_accum == 1 and p.n_train >= 8
    too_many = p.n_train // 8 + 1  # 2 workers x 4 sequences x this many micro-batches outgrows the data
    with pytest.raises(InputError, match=f"one global batch of {8 * too_many}"):
        L.prepare(train.updated(grad_accum=too_many), RunTarget())


def test_cluster_spec_carries_the_gpu_type_for_the_planner(clean_env: Path) -> None:
    from raydlc.config import load_config

    cfg = load_config(env={})
    assert L.target(cfg, local=False).instance_type == "g6.12xlarge"
    assert L.target(cfg, local=True).instance_type is None
    # `raydlc train --address` keeps the local defaults but joins the cluster: it plans with its GPU type.
    assert L.target(cfg, local=True, address="127.0.0.1:6379").instance_type == "g6.12xlarge"


def test_mesh_shape_replicates_across_nodes_and_shards_within() -> None:
    assert layout.plan_mesh("fsdp", [4, 4]).shape == (8,)
    assert layout.plan_mesh("hsdp", [4, 4]).shape == (2, 4)
    assert layout.plan_mesh("hsdp", [2], hsdp_replicas=2).shape == (2, 1)
    with pytest.raises(InputError):
        layout.plan_mesh("hsdp", [6], hsdp_replicas=4)


def test_resources_fill_gpus_and_workers() -> None:
    s = R.resolve_resources(TrainConfig(num_workers=0), {"CPU": 96, "GPU": 8})
    assert (s.use_gpu, s.num_workers) == (True, 8)
    s = R.resolve_resources(TrainConfig(num_workers=2), {"CPU": 2})
    assert (s.use_gpu, s.num_workers) == (False, 2)
    with pytest.raises(InputError, match="no GPUs"):
        R.resolve_resources(TrainConfig(num_workers=0), {"CPU": 2})


def test_local_defaults_apply_only_where_the_source_is_default(clean_env: Path) -> None:
    local = L.settings(load_config(), local=True)
    assert (local.model_id, local.num_workers, local.steps) == ("tiny", 2, LOCAL_DEFAULTS["STEPS"])
    assert local == LOCAL
    cluster_cfg = load_config()
    cluster = L.settings(cluster_cfg, local=False)
    assert (cluster.model_id, cluster.num_workers, cluster_cfg.gpu_nodes.gpus_per_node) == ("Qwen/Qwen2.5-1.5B", 0, 4)
    assert cluster == TrainConfig()  # one set of defaults: the cluster job's are the config's
    cfg = load_config(env={"RAYDLC_STEPS": "7", "RAYDLC_MODEL_ID": "qwen2.5-0.5b"}, overrides={"SEQ_LEN": 64, "RESUME": True})
    s = L.settings(cfg, local=True)
    assert (s.steps, s.model_id, s.seq_len, s.batch_size, s.resume) == (7, "qwen2.5-0.5b", 64, LOCAL_DEFAULTS["BATCH_SIZE"], True)


def test_prepare_checks_the_data_and_model_before_any_worker(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(InputError, match="empty"):
        L.prepare(LOCAL.updated(data=str(empty), storage_path=str(tmp_path)))
    with pytest.raises(InputError, match="not a built-in spec"):
        L.prepare(LOCAL.updated(model_id="gpt5", storage_path=str(tmp_path)))
    small = tmp_path / "small.txt"
    small.write_text("only a few words here")
    with pytest.raises(InputError, match="gives at most 0 sequences of 128 tokens"):
        L.prepare(LOCAL.updated(data=str(small), storage_path=str(tmp_path)))
    with pytest.raises(CheckpointError, match="no checkpoint"):
        L.prepare(LOCAL.updated(resume=True, storage_path=str(tmp_path / "fresh")))


def test_prepare_packs_prompt_response_data_with_masks(tmp_path: Path) -> None:
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"prompt": f"Question {i}: what is {i} plus {i}?", "response": f" It is {2 * i}."}) + "\n" for i in range(300)))
    p = L.prepare(LOCAL.updated(data=str(qa), seq_len=32, batch_size=2, num_workers=2, storage_path=str(tmp_path)))
    ids, labels = p.data.open().take(np.arange(p.data.rows))
    assert len(ids) == p.n_train + p.n_eval
    masked = (labels == -100).mean()
    assert 0.3 < masked < 0.9  # prompts are masked, responses are not
    assert p.n_eval % 2 == 0 and p.n_train >= 4
    assert p.tokenizer.tokenizer_json and p.tokenizer.vocab_size <= 4096


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYDLC_")}
    return subprocess.run([sys.executable, "-m", "raydlc.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [("missing.txt", None, "no such file"), ("empty.txt", "", "empty"), ("f.jsonl", '{"instruction": "x"}\n', "f.jsonl:1")],
)
def test_cli_bad_data_exits_2_before_ray_starts(tmp_path: Path, name: str, content: str | None, needle: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    r = cli(["train", "--data", str(path), "--out", str(tmp_path / "out")], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert "Ray" not in r.stderr  # no local Ray instance was started
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["train", "--help"], ["train", "--data", "missing.txt"]])
def test_train_help_and_bad_data_import_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    heavy = ("torch", "ray", "transformers", "kubernetes", "boto3")
    code = (
        "import sys; from raydlc.cli import main; rc = main(%r); "
        "print('RC=%%d HEAVY=' %% rc + ','.join(sorted(m for m in %r if m in sys.modules)))" % (args, heavy)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYDLC_")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    last = r.stdout.strip().splitlines()[-1]
    assert last == f"RC={0 if '--help' in args else 2} HEAVY=", r.stdout[-500:] + r.stderr[-500:]


def test_cluster_entrypoint_rejects_bad_data_with_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYDLC_")} | {"RAYDLC_DATA": str(tmp_path / "nope.jsonl")}
    r = subprocess.run([sys.executable, "-m", "raydlc.train", "--workers", "2"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2 and "nope.jsonl" in r.stderr and "Traceback" not in r.stderr


def test_cli_refuses_a_local_hsdp_run_that_would_be_fsdp_before_ray_starts(tmp_path: Path) -> None:
    r = cli(["train", "--sharding", "hsdp", "--workers", "2", "--out", str(tmp_path / "out")], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "HSDP needs at least 2 replicas" in r.stderr and "HSDP_REPLICAS=2" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_train_help_states_the_local_defaults_of_the_one_table() -> None:
    """The help text cannot drift from LOCAL_DEFAULTS: each `[NAME; local default: X]` is checked."""
    import re

    import typer

    from raydlc.cli import app

    command = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    stated = {}
    for param in command.params:
        m = re.search(r"\[(\w+); local default: ([^\]]+)\]", param.help or "")
        if m:
            stated[m.group(1)] = m.group(2)
    assert stated == {k: str(v) for k, v in LOCAL_DEFAULTS.items()}
