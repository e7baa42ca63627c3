from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raydlc.config import FIELDS, RETIRED, Config, load_config, parse_assignments, render_yaml_template
from raydlc.errors import ConfigError

REFERENCE_ENV_SH = [
    "CLUSTER_NAME", "REGION", "K8S_VERSION", "NODE_AMI_FAMILY", "NAMESPACE", "SYSTEM_NODE_TYPE",
    "SYSTEM_NODE_COUNT", "GPU_NODE_TYPE", "GPU_NODE_COUNT", "GPUS_PER_NODE", "GPU_NODEGROUP_NAME",
    "GPU_AZ", "DLC_IMAGE", "KUBERAY_VERSION", "RAY_VERSION", "RAY_CLUSTER_NAME",
    "NVIDIA_DEVICE_PLUGIN_VERSION", "EFA_DEVICE_PLUGIN_VERSION", "MODEL_ID", "STEPS", "SEQ_LEN",
    "BATCH_SIZE", "LEARNING_RATE", "NUM_WORKERS",
]


def test_every_env_sh_variable_has_a_field_or_is_refused_with_its_reason() -> None:
    missing = [n for n in REFERENCE_ENV_SH if n not in FIELDS and n not in RETIRED]
    assert missing == []
    assert set(RETIRED).isdisjoint(FIELDS)


@pytest.mark.parametrize(
    "where",
    ["env", "file", "set"],
)
def test_efa_device_plugin_version_is_refused_because_eksctl_owns_the_plugin(clean_env: Path, where: str) -> None:
    env, overrides = {}, {}
    if where == "env":
        env = {"RAYDLC_EFA_DEVICE_PLUGIN_VERSION": "v0.5.32"}
    elif where == "file":
        (clean_env / "raydlc.yaml").write_text("images:\n  efa_device_plugin_version: v0.5.32\n")
    else:
        overrides = parse_assignments(["EFA_DEVICE_PLUGIN_VERSION=v0.5.32"])
    with pytest.raises(ConfigError) as ei:
        load_config(env=env, overrides=overrides)
    assert len(ei.value.problems) == 1
    msg = ei.value.problems[0]
    assert "efa_device_plugin_version" in msg.lower() and "eksctl owns the EFA device plugin" in msg and "efaEnabled" in msg
    assert "efa_device_plugin_version" not in render_yaml_template()


def test_defaults_are_the_reference_values(clean_env: Path) -> None:
    cfg = load_config(env={})
    assert cfg.cluster.region == "us-east-2"
    assert cfg.cluster.k8s_version == "1.36"
    assert cfg.cluster.ami_family == "AmazonLinux2023"
    assert cfg.cluster.namespace == "ray-train"
    assert (cfg.system_nodes.instance_type, cfg.system_nodes.count) == ("m7i.xlarge", 1)
    assert (cfg.gpu_nodes.instance_type, cfg.gpu_nodes.count, cfg.gpu_nodes.gpus_per_node) == ("g6.12xlarge", 2, 4)
    assert cfg.images.dlc_image == "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
    assert (cfg.images.ray_version, cfg.images.kuberay_version) == ("2.58.0", "1.7.0")
    assert cfg.train.model_id == "Qwen/Qwen2.5-1.5B"
    assert cfg.num_workers == 8
    assert all(cfg.source(n) == "default" for n in FIELDS)


def test_precedence_flag_over_env_over_file_over_default(clean_env: Path) -> None:
    (clean_env / "raydlc.yaml").write_text(
        yaml.safe_dump({"cluster": {"name": "from-file", "region": "us-west-2"}, "train": {"steps": 7, "seq_len": 64}})
    )
    env = {"RAYDLC_CLUSTER_NAME": "from-env", "RAYDLC_STEPS": "9"}
    cfg = load_config(env=env, overrides={"STEPS": 11})
    assert (cfg.cluster.name, cfg.source("CLUSTER_NAME")) == ("from-env", "env")
    assert (cfg.cluster.region, cfg.source("REGION")) == ("us-west-2", "file")
    assert (cfg.train.steps, cfg.source("STEPS")) == (11, "flag")
    assert (cfg.train.seq_len, cfg.source("SEQ_LEN")) == (64, "file")
    assert (cfg.train.batch_size, cfg.source("BATCH_SIZE")) == (1, "default")
    assert cfg.origin("CLUSTER_NAME") == "env RAYDLC_CLUSTER_NAME"


def test_explicit_config_path_and_raydlc_config_env(clean_env: Path) -> None:
    p = clean_env / "elsewhere.yaml"
    p.write_text("gpu_nodes:\n  count: 5\n")
    assert load_config(p, env={}).gpu_nodes.count == 5
    assert load_config(env={"RAYDLC_CONFIG": str(p)}).gpu_nodes.count == 5
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(clean_env / "nope.yaml", env={})


@pytest.mark.parametrize(
    ("env", "field", "fragment"),
    [
        ({"RAYDLC_CLUSTER_NAME": "Bad_Name"}, "CLUSTER_NAME", "DNS-1123"),
        ({"RAYDLC_NAMESPACE": "-ns"}, "NAMESPACE", "DNS-1123"),
        ({"RAYDLC_GPU_NODEGROUP_NAME": "GPU"}, "GPU_NODEGROUP_NAME", "DNS-1123"),
        ({"RAYDLC_RAY_CLUSTER_NAME": "x" * 60}, "RAY_CLUSTER_NAME", "DNS-1123"),
        ({"RAYDLC_SYSTEM_NODE_COUNT": "0"}, "SYSTEM_NODE_COUNT", "at least 1"),
        ({"RAYDLC_GPU_NODE_COUNT": "-1"}, "GPU_NODE_COUNT", "at least 1"),
        ({"RAYDLC_GPU_NODE_COUNT": "two"}, "GPU_NODE_COUNT", "integer"),
        ({"RAYDLC_REGION": "Ohio"}, "REGION", "AWS region"),
        ({"RAYDLC_GPU_AZ": "us-west-2a"}, "GPU_AZ", "not in region"),
        ({"RAYDLC_GPU_AZ": "zone-a"}, "GPU_AZ", "Availability Zone"),
        ({"RAYDLC_RAY_VERSION": "2.50.0"}, "RAY_VERSION", "ships Ray 2.58.0"),
        ({"RAYDLC_GPUS_PER_NODE": "8"}, "GPUS_PER_NODE", "has 4 GPUs"),
        ({"RAYDLC_GPU_NODE_TYPE": "p5.48xlarge"}, "GPUS_PER_NODE", "has 8 GPUs"),
        ({"RAYDLC_GPU_NODE_TYPE": "m7i.xlarge"}, "GPU_NODE_TYPE", "no GPUs"),
        ({"RAYDLC_LEARNING_RATE": "0"}, "LEARNING_RATE", "greater than 0"),
        ({"RAYDLC_LEARNING_RATE": "-1e-4"}, "LEARNING_RATE", "greater than 0"),
        ({"RAYDLC_SEQ_LEN": "0"}, "SEQ_LEN", "at least 1"),
        ({"RAYDLC_BATCH_SIZE": "0"}, "BATCH_SIZE", "at least 1"),
        ({"RAYDLC_K8S_VERSION": "latest"}, "K8S_VERSION", "minor version"),
        ({"RAYDLC_NODE_AMI_FAMILY": "Ubuntu"}, "NODE_AMI_FAMILY", "AmazonLinux2023"),
    ],
)
def test_each_rule_names_field_and_source(clean_env: Path, env: dict[str, str], field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(env=env)
    msg = str(ei.value)
    assert f"{field} (env RAYDLC_" in msg or f"{field} (default)" in msg
    assert fragment in msg


def test_cross_field_rules_accept_valid_combinations(clean_env: Path) -> None:
    cfg = load_config(env={"RAYDLC_GPU_NODE_TYPE": "p5.48xlarge", "RAYDLC_GPUS_PER_NODE": "8", "RAYDLC_GPU_AZ": "us-east-2b"})
    assert cfg.total_gpus == 16
    forced = load_config(env={"RAYDLC_RAY_VERSION": "2.59.0", "RAYDLC_FORCE_RAY_VERSION": "true"})
    assert forced.images.ray_version == "2.59.0"
    custom = load_config(env={"RAYDLC_DLC_IMAGE": "example.com/mine:1", "RAYDLC_RAY_VERSION": "2.40.0"})
    assert custom.images.ray_version == "2.40.0"  # unknown image: nothing to compare against


def test_file_errors_name_the_file(clean_env: Path) -> None:
    (clean_env / "raydlc.yaml").write_text("gpu_nodes:\n  cuont: 3\nclustr: {}\n")
    with pytest.raises(ConfigError) as ei:
        load_config(env={})
    assert "gpu_nodes.cuont" in str(ei.value) and "clustr" in str(ei.value)
    (clean_env / "raydlc.yaml").write_text("train:\n  steps: 0\n")
    with pytest.raises(ConfigError, match=r"STEPS \(file .*raydlc.yaml\): must be at least 1"):
        load_config(env={})
    (clean_env / "raydlc.yaml").write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(env={})


def test_flags_and_set_assignments(clean_env: Path) -> None:
    assert parse_assignments(["RAYDLC_STEPS=3", "gpu_node_count=4"]) == {"STEPS": "3", "GPU_NODE_COUNT": "4"}
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        parse_assignments(["STEPS"])
    with pytest.raises(ConfigError, match="NOT_A_FIELD"):
        load_config(env={}, overrides={"NOT_A_FIELD": 1})


def test_template_round_trip_gives_defaults(clean_env: Path) -> None:
    (clean_env / "raydlc.yaml").write_text(render_yaml_template())
    from_file = load_config(env={})
    assert from_file.as_dict() == Config().as_dict()
    assert all(from_file.source(n) == "file" for n in FIELDS)


TRAINING_KNOBS = [
    "MODEL_ID", "STEPS", "SEQ_LEN", "BATCH_SIZE", "LEARNING_RATE", "NUM_WORKERS", "DATA", "CHECKPOINT_EVERY",
    "CHECKPOINT_KEEP", "STORAGE_PATH", "MAX_FAILURES", "MAX_PREEMPTIONS", "SHARDING", "WARMUP_STEPS", "WARMUP_RATIO", "LR_SCHEDULE", "MIN_LR_RATIO", "WEIGHT_DECAY", "MAX_GRAD_NORM", "MAX_NONFINITE_STEPS", "SEED",
    "EVAL_FRACTION", "EVAL_EVERY", "EVAL_AFTER", "REPORT_EVERY", "HSDP_REPLICAS", "BF16", "ACTIVATION_CHECKPOINTING", "COMPILE",
    "USE_GPU", "RUN_NAME", "RESUME", "RESUME_FROM", "OVERWRITE", "STORAGE_SHARED", "PREFLIGHT", "GRAD_ACCUM", "GRAD_SYNC", "MAX_GLOBAL_BATCH",
    "LOSS_ON", "ON_BAD_RECORD", "CHAT_TEMPLATE", "LOSS_CHUNK", "DOCUMENT_MASKING", "REDUCE_DTYPE", "LORA_RANK", "LORA_ALPHA", "LORA_DROPOUT", "LORA_TARGETS", "LORA_TARGET_REGEX", "LORA_MODULES_TO_SAVE", "LORA_RSLORA", "LORA_MERGE",
    "STALL_MINUTES", "STALL_FIRST_MINUTES", "JOB_MAX_COST_USD",
    "TRACKING", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_MODE",
]


def test_every_training_knob_is_a_train_field_settable_from_the_environment(clean_env: Path) -> None:
    from raydlc.config import TrainConfig

    assert sorted(f.env for f in FIELDS.values() if f.section == "train") == sorted(TRAINING_KNOBS)
    assert list(TrainConfig.model_fields) == [FIELDS[n].key for n in FIELDS if FIELDS[n].section == "train"]
    env = {
        "RAYDLC_WARMUP_STEPS": "3", "RAYDLC_WEIGHT_DECAY": "0.1", "RAYDLC_MAX_GRAD_NORM": "0.5", "RAYDLC_SEED": "7",
        "RAYDLC_EVAL_FRACTION": "0.1", "RAYDLC_EVAL_EVERY": "5", "RAYDLC_REPORT_EVERY": "2", "RAYDLC_HSDP_REPLICAS": "2",
        "RAYDLC_BF16": "true", "RAYDLC_ACTIVATION_CHECKPOINTING": "true", "RAYDLC_COMPILE": "1", "RAYDLC_USE_GPU": "false",
        "RAYDLC_RUN_NAME": "first", "RAYDLC_RESUME": "yes", "RAYDLC_RESUME_FROM": "s3://b/r/checkpoint_000004",
        "RAYDLC_STORAGE_SHARED": "true", "RAYDLC_PREFLIGHT": "true", "RAYDLC_EVAL_AFTER": "true",
    }
    t = load_config(env=env).train
    assert (t.warmup_steps, t.weight_decay, t.max_grad_norm, t.seed, t.eval_fraction, t.eval_every, t.report_every) == (3, 0.1, 0.5, 7, 0.1, 5, 2)
    assert (t.hsdp_replicas, t.bf16, t.activation_checkpointing, t.compile, t.use_gpu) == (2, True, True, True, False)
    assert (t.run_name, t.resume, t.resume_from, t.storage_shared, t.preflight) == ("first", True, "s3://b/r/checkpoint_000004", True, True)
    assert t.eval_after is True and load_config(env={}).train.eval_after is False
    acc = load_config(env={"RAYDLC_GRAD_ACCUM": " Auto ", "RAYDLC_GRAD_SYNC": "all-reduce-once", "RAYDLC_MAX_GLOBAL_BATCH": "65536"}).train
    assert (acc.grad_accum, acc.grad_sync, acc.max_global_batch) == ("auto", "all-reduce-once", 65536)
    assert load_config(env={"RAYDLC_GRAD_ACCUM": "8"}).train.grad_accum == 8
    guard = load_config(env={"RAYDLC_STALL_MINUTES": "1.5", "RAYDLC_STALL_FIRST_MINUTES": "90", "RAYDLC_JOB_MAX_COST_USD": "12.5"}).train
    assert (guard.stall_minutes, guard.stall_first_minutes, guard.max_cost_usd) == (1.5, 90.0, 12.5)
    empty = load_config(env={"RAYDLC_BF16": "", "RAYDLC_USE_GPU": "", "RAYDLC_RUN_NAME": ""}).train
    assert (empty.bf16, empty.use_gpu, empty.run_name) == (None, None, None)  # empty = decided from the hardware / the clock


@pytest.mark.parametrize(
    ("env", "field", "fragment"),
    [
        ({"RAYDLC_REPORT_EVERY": "0"}, "REPORT_EVERY", "at least 1"),
        ({"RAYDLC_WARMUP_STEPS": "-1"}, "WARMUP_STEPS", "0 or more"),
        ({"RAYDLC_WEIGHT_DECAY": "-0.1"}, "WEIGHT_DECAY", "0 or more"),
        ({"RAYDLC_MAX_GRAD_NORM": "0"}, "MAX_GRAD_NORM", "greater than 0"),
        ({"RAYDLC_EVAL_FRACTION": "1"}, "EVAL_FRACTION", "between 0 and 1"),
        ({"RAYDLC_HSDP_REPLICAS": "-2"}, "HSDP_REPLICAS", "0 or more"),
        ({"RAYDLC_RUN_NAME": "a/b"}, "RUN_NAME", "one folder name"),
        ({"RAYDLC_BF16": "maybe"}, "BF16", "boolean"),
        ({"RAYDLC_GRAD_ACCUM": "0"}, "GRAD_ACCUM", "at least 1, or auto"),
        ({"RAYDLC_GRAD_ACCUM": "four"}, "GRAD_ACCUM", "whole number of micro-batches or auto"),
        ({"RAYDLC_GRAD_SYNC": "sometimes"}, "GRAD_SYNC", "'every', 'once' or 'all-reduce-once'"),
        ({"RAYDLC_MAX_GLOBAL_BATCH": "0"}, "MAX_GLOBAL_BATCH", "at least 1"),
    ],
)
def test_training_knobs_are_validated_naming_field_and_source(clean_env: Path, env: dict[str, str], field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(env=env)
    assert f"{field} (env RAYDLC_{field})" in str(ei.value) and fragment in str(ei.value)


def test_local_defaults_are_one_table_applied_only_to_untouched_defaults(clean_env: Path) -> None:
    from raydlc.config import LOCAL_DEFAULTS, with_local_defaults

    assert set(LOCAL_DEFAULTS) <= {f.env for f in FIELDS.values() if f.section == "train"}
    assert all(FIELDS[k].default != v for k, v in LOCAL_DEFAULTS.items())  # each entry changes something
    cfg = with_local_defaults(load_config(env={"RAYDLC_STEPS": "7"}, overrides={"BATCH_SIZE": 3}))
    assert (cfg.train.steps, cfg.train.batch_size, cfg.train.model_id, cfg.train.num_workers) == (7, 3, "tiny", 2)
    assert (cfg.origin("STEPS"), cfg.origin("BATCH_SIZE"), cfg.origin("MODEL_ID")) == ("env RAYDLC_STEPS", "flag", "local default")
    assert cfg.cluster == load_config(env={}).cluster


def test_shared_storage_rule(clean_env: Path) -> None:
    from raydlc.config import TrainConfig, shared_storage_problem

    assert shared_storage_problem(TrainConfig(), 1) is None
    assert "unset (./raydlc-out on each node)" in (shared_storage_problem(TrainConfig(), 2) or "")
    assert "STORAGE_SHARED=true" in (shared_storage_problem(TrainConfig(storage_path="/mnt/runs"), 2) or "")
    assert "file:///x" in (shared_storage_problem(TrainConfig(storage_path="file:///x"), 2) or "")  # a local path by another name
    assert shared_storage_problem(TrainConfig(storage_path="s3://bucket/runs"), 4) is None
    assert shared_storage_problem(TrainConfig(storage_path="/mnt/efs/runs", storage_shared=True), 4) is None
