"""Launch decisions (sharding, mesh, resources, local defaults) and input checks before Ray starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raydlc.config import FIELDS, LOCAL_DEFAULTS, TrainConfig, load_config
from raydlc.errors import CheckpointError, InputError
from raydlc.train import launch as L
from raydlc.train import layout

# What `raydlc train` runs with when nothing is set: the config's defaults under the local table.
LOCAL = TrainConfig().updated(**{FIELDS[k].key: v for k, v in LOCAL_DEFAULTS.items()})


def test_auto_sharding_asks_the_planner_on_several_nodes_and_bad_names_fail() -> None:
    from raydlc.models import SPECS
    from raydlc.plan import recommend_sharding

    big = SPECS["qwen2.5-1.5b"]
    planned = recommend_sharding(big, 2, 4, None, 128, 1, instance_type="g6.12xlarge")
    assert planned == "hsdp"  # 40 Gb/s between nodes: replicate across them, shard within
    assert layout.resolve_sharding("auto", 2, 4, model=big, seq_len=128, micro_batch=1, instance_type="g6.12xlarge") == planned
    assert layout.resolve_sharding("auto", 1, 4, model=big, instance_type="g6.12xlarge") == "fsdp"  # one node: one replica
    assert layout.resolve_sharding("auto", 2, 4) == "fsdp"  # no architecture to plan with
    assert layout.resolve_sharding("auto", 2, 1, model=SPECS["tiny"]) == "fsdp"  # local: no GPU type
    assert layout.resolve_sharding("hsdp", 2, 4) == "hsdp"
    assert layout.resolve_sharding("fsdp", 2, 4, model=big, instance_type="g6.12xlarge") == "fsdp"
    with pytest.raises(InputError, match="zero"):
        layout.resolve_sharding("zero", 1, 1)
    # The driver plans `auto` on the nodes Ray grants: 8 GPU workers on 2 x 4 GPUs are HSDP (2, 4).
    mesh = L.plan_layout(TrainConfig(model_id="qwen2.5-1.5b", num_workers=8), [4, 4], model=big, instance_type="g6.12xlarge")
    assert (mesh.sharding, mesh.shape) == (planned, (2, 4))


def test_cluster_spec_carries_the_gpu_type_for_the_planner(clean_env: Path) -> None:
    from raydlc.config import load_config

    cfg = load_config(env={})
    assert L.target(cfg, local=False).instance_type == "g6.12xlarge"
    assert L.target(cfg, local=True).instance_type is None


def test_mesh_shape_replicates_across_nodes_and_shards_within() -> None:
    assert layout.plan_mesh("fsdp", [4, 4]).shape == (8,)
    assert layout.plan_mesh("hsdp", [4, 4]).shape == (2, 4)
    assert layout.plan_mesh("hsdp", [2], hsdp_replicas=2).shape == (2, 1)
    with pytest.raises(InputError):
        layout.plan_mesh("hsdp", [6], hsdp_replicas=4)


def test_resources_fill_gpus_and_workers() -> None:
    s = L.resolve_resources(TrainConfig(num_workers=0), {"CPU": 96, "GPU": 8})
    assert (s.use_gpu, s.num_workers) == (True, 8)
    s = L.resolve_resources(TrainConfig(num_workers=2), {"CPU": 2})
    assert (s.use_gpu, s.num_workers) == (False, 2)
    with pytest.raises(InputError, match="no GPUs"):
        L.resolve_resources(TrainConfig(num_workers=0), {"CPU": 2})


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
    with pytest.raises(InputError, match="fewer than 128 tokens"):
        L.prepare(LOCAL.updated(data=str(small), storage_path=str(tmp_path)))
    with pytest.raises(CheckpointError, match="no checkpoint"):
        L.prepare(LOCAL.updated(resume=True, storage_path=str(tmp_path / "fresh")))


def test_prepare_packs_prompt_response_data_with_masks(tmp_path: Path) -> None:
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"prompt": f"Question {i}: what is {i} plus {i}?", "response": f" It is {2 * i}."}) + "\n" for i in range(300)))
    p = L.prepare(LOCAL.updated(data=str(qa), seq_len=32, batch_size=2, num_workers=2, storage_path=str(tmp_path)))
    labels = p.arrays["train_labels"]
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
