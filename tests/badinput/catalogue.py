"""The catalogue of bad inputs: what a user might type, and the one line raydlc must answer with.

One `Row` per case, grouped by command. To cover a new command, add its rows here: the suite
fails while a registered command has none. Paths in `args` are relative to a fresh working
directory holding `files`; `{black_hole}` and `{refused}` stand for the two local endpoints.
Rows marked `sub=True` run the real CLI in a subprocess (the issue's examples, and at least one
per command); the rest run `main([...])` in-process, which checks the same things faster.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

DIR = None  # in `files`: make a directory instead of a file


class Sparse(int):
    """In `files`: a sparse file of this many bytes (big, yet no disk and no memory)."""


class Link(str):
    """In `files`: a symbolic link to this target (relative to the link's folder)."""


FIFO = Sparse(-1)  # in `files`: a named pipe (reading it would wait forever for a writer)


@dataclass(frozen=True)
class Row:
    id: str
    args: tuple[str, ...]
    code: int  # the exit code: 2 for the user's input, 1 for the world's or the machine's fault
    says: str  # must appear in the one `error:` line
    files: Mapping[str, bytes | str | int | None] = field(default_factory=dict)
    env: Mapping[str, str | None] = field(default_factory=dict)  # None: unset
    stdin_closed: bool = False
    sub: bool = False
    reaches_aws: bool = False  # otherwise the row must fail before any connection to AWS (the black hole; a row may use it as a Ray head)
    locks: tuple[str, ...] = ()  # files the suite holds an flock on (filelock) while the row runs: another raydlc at work
    hint_lacks: str = ""  # must not appear in the output (a hint that would point at the wrong thing)


def r(id: str, args: str | list[str], code: int, says: str, **kw: object) -> Row:
    return Row(id, tuple(args.split() if isinstance(args, str) else args), code, says, **kw)  # type: ignore[arg-type]


ZONES = "--zones us-east-2a,us-east-2b"
DIGITS_26 = "1" * 26
SHA = "0" * 64


def _manifest(**over: object) -> str:
    doc: dict[str, object] = {"format": 1, "step": 5, "world_size": 2, "files": {".metadata": {"size": 1, "sha256": SHA}}, "meta": {}}
    doc.update(over)
    return json.dumps({k: v for k, v in doc.items() if v is not ...})


CONFIG = [
    r("config-not-utf8", "--config latin.yaml config show", 2, "not UTF-8", files={"latin.yaml": b"cluster:\n  name: caf\xe9\n"}, sub=True),
    r("config-nul-bytes", "--config nul.yaml config show", 2, "not valid YAML", files={"nul.yaml": b"\x00\x01"}),
    r("config-is-a-directory", "--config conf.d config show", 2, "conf.d", files={"conf.d": DIR}),
    r("config-missing", "--config nope.yaml config show", 2, "does not exist"),
    r("config-env-missing", "config show", 2, "RAYDLC_CONFIG", env={"RAYDLC_CONFIG": "gone.yaml"}),
    r("config-a-list", "--config l.yaml config show", 2, "must be a mapping", files={"l.yaml": "- a\n- b\n"}),
    r("config-yaml-syntax", "--config s.yaml config show", 2, "not valid YAML", files={"s.yaml": "train: [unclosed\n"}),
    r("config-unknown-section", "--config u.yaml config show", 2, "unknown section", files={"u.yaml": "clustr: {}\n"}),
    r("config-unknown-field", "--config u.yaml config show", 2, "gpu_nodes.cuont", files={"u.yaml": "gpu_nodes:\n  cuont: 3\n"}),
    r("config-section-not-mapping", "--config m.yaml config show", 2, "must be a mapping of fields", files={"m.yaml": "cluster: 5\n"}),
    r("config-file-inf", "--config i.yaml config show", 2, "LEARNING_RATE", files={"i.yaml": "train:\n  learning_rate: .inf\n"}),
    r("config-file-huge-count", "--config b.yaml config show", 2, "GPU_NODE_COUNT", files={"b.yaml": "gpu_nodes:\n  count: 1.0e+30\n"}),
    r("config-file-retired", "--config e.yaml config show", 2, "eksctl owns", files={"e.yaml": "images:\n  efa_device_plugin_version: v0.5.32\n"}),
    r("set-without-equals", "--set STEPS config show", 2, "NAME=VALUE"),
    r("set-unknown-name", "--set NOT_A_SETTING=1 config show", 2, "NOT_A_SETTING"),
    r("set-retired", "--set EFA_DEVICE_PLUGIN_VERSION=v1 config show", 2, "eksctl owns"),
    r("env-lr-inf", "config show", 2, "LEARNING_RATE", env={"RAYDLC_LEARNING_RATE": "inf"}, sub=True),
    r("env-lr-nan", "config show --json", 2, "LEARNING_RATE", env={"RAYDLC_LEARNING_RATE": "nan"}),
    r("env-lr-minus-inf", "config show", 2, "LEARNING_RATE", env={"RAYDLC_LEARNING_RATE": "-inf"}),
    r("env-count-26-digits", "config show", 2, "at most 450", env={"RAYDLC_GPU_NODE_COUNT": DIGITS_26}, sub=True),
    r("env-steps-huge", "config show", 2, "at most 2,147,483,647", env={"RAYDLC_STEPS": "9" * 12}),
    r("env-gpus-per-node-huge", "config show", 2, "GPUS_PER_NODE", env={"RAYDLC_GPUS_PER_NODE": "64"}),
    r("env-deadline-huge", "config show", 2, "30 days", env={"RAYDLC_JOB_DEADLINE_S": "9" * 10}),
    r("env-volume-huge", "config show", 2, "GPU_VOLUME_SIZE", env={"RAYDLC_GPU_VOLUME_SIZE": "99999999"}),
    r("env-gpu-price-negative", "config show", 2, "GPU_USD_PER_HOUR", env={"RAYDLC_GPU_USD_PER_HOUR": "-1.25"}),
    r("env-gpu-price-nan", "config show", 2, "GPU_USD_PER_HOUR", env={"RAYDLC_GPU_USD_PER_HOUR": "nan"}),
    r("env-gpu-price-huge", "config show", 2, "ten thousand dollars a node-hour", env={"RAYDLC_GPU_USD_PER_HOUR": "1e9"}, sub=True),
    r("env-type-injection", "config show", 2, "GPU_NODE_TYPE", env={"RAYDLC_GPU_NODE_TYPE": "g6.12xlarge; rm -rf /"}),
    r("env-type-10kb", "config show", 2, "GPU_NODE_TYPE (env RAYDLC_GPU_NODE_TYPE): must be at most 1,024 characters, got 10,000",
      env={"RAYDLC_GPU_NODE_TYPE": "g" * 10_000}, sub=True),
    r("set-image-10kb", ["--set", "DLC_IMAGE=" + "x" * 10_000, "config", "show"], 2, "DLC_IMAGE"),
    r("env-system-type-bad", "config show", 2, "SYSTEM_NODE_TYPE", env={"RAYDLC_SYSTEM_NODE_TYPE": "M7I.XLARGE"}),
    r("env-image-bad", "config show", 2, "DLC_IMAGE", env={"RAYDLC_DLC_IMAGE": "my image:latest"}),
    r("env-az-bad-shape", "config show", 2, "GPU_AZ", env={"RAYDLC_GPU_AZ": "east"}),
    r("env-az-other-region", "config show", 2, "not in region", env={"RAYDLC_GPU_AZ": "us-west-2a"}),
    r("env-chart-version-bad", "config show", 2, "KUBERAY_VERSION", env={"RAYDLC_KUBERAY_VERSION": "latest"}),
    r("env-nccl-net-bad", "config show", 2, "NCCL_NET", env={"RAYDLC_NCCL_NET": "$(reboot)"}),
    r("env-control-characters", "config show", 2, "control characters", env={"RAYDLC_MODEL_ID": "tiny\nrm"}),
    r("env-retired", "config show", 2, "eksctl owns", env={"RAYDLC_EFA_DEVICE_PLUGIN_VERSION": "v0.5.32"}, sub=True),
    r("init-into-a-directory", "config init adir --force", 2, "is a directory", files={"adir": DIR}, sub=True),
    r("init-under-a-file", "config init afile/raydlc.yaml", 2, "afile is a file", files={"afile": "keep"}, sub=True),
    r("init-in-proc", "config init /proc/raydlc.yaml", 2, "cannot create files in /proc", sub=True),
    r("init-read-only", "config init /sys/raydlc/raydlc.yaml", 2, "cannot create files in /sys"),
    r("init-exists", "config init raydlc.yaml", 2, "already exists", files={"raydlc.yaml": "keep: me\n"}),
    r("init-bad-flag", "config init --forse", 2, "--forse"),
]

VERSION = [
    r("version-bad-flag", "version --jsn", 2, "--jsn", sub=True),
    r("version-extra-argument", "version extra", 2, "extra"),
    r("tb-bad-flag", "tb --jsn x", 2, "--jsn", sub=True),  # tb: a bad flag (the missing run: tb-nowhere below)
]

S3 = {"RAYDLC_STORAGE_PATH": "s3://bucket/runs"}  # two GPU nodes need storage every node sees

# Model directories: a config.json raydlc cannot build from, next to what save_pretrained writes.
GPT2 = json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "vocab_size": 50257})
QWEN2_SMALL = json.dumps({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
})


def _model(config: str | bytes, name: str = "m") -> dict[str, str | bytes | None]:
    return {name: DIR, f"{name}/config.json": config}


def _safetensors(shapes: Mapping[str, tuple[int, ...]], *, cut: int = 0) -> bytes:
    """A bf16 .safetensors file of zeros with these tensors (its header as the format says), `cut` bytes short."""
    import struct

    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2
        for d in shape:
            size *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * (offset - cut)


def _qwen2_small_tensors(**wrong: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """The tensors QWEN2_SMALL's config implies (hidden 64, 2 layers, 4/2 heads, MLP 128, vocab 1000, untied)."""
    block = {"self_attn.q_proj.weight": (64, 64), "self_attn.k_proj.weight": (32, 64), "self_attn.v_proj.weight": (32, 64),
             "self_attn.o_proj.weight": (64, 64), "self_attn.q_proj.bias": (64,), "self_attn.k_proj.bias": (32,),
             "self_attn.v_proj.bias": (32,), "mlp.gate_proj.weight": (128, 64), "mlp.up_proj.weight": (128, 64),
             "mlp.down_proj.weight": (64, 128), "input_layernorm.weight": (64,), "post_attention_layernorm.weight": (64,)}
    out = {"model.embed_tokens.weight": (1000, 64), "model.norm.weight": (64,), "lm_head.weight": (1000, 64)}
    out |= {f"model.layers.{n}.{k}": v for n in range(2) for k, v in block.items()}
    return out | wrong


def _weights(**kw: object) -> dict[str, str | bytes | None]:
    return {**_model(QWEN2_SMALL), "m/model.safetensors": _safetensors(_qwen2_small_tensors(), **kw)}  # type: ignore[arg-type]


# A head record as `submit --local` writes it, naming a directory in the row's working dir.
def _head_record(pid: int, start_ticks: int | None) -> dict[str, str | bytes | None]:
    rec = {"pid": pid, "start_ticks": start_ticks, "dashboard_url": "http://127.0.0.1:9", "address": "127.0.0.1:9",
           "temp_dir": "{work}/precious", "log": "{work}/precious/ray-head.log", "python": "python", "started_at": 0.0}
    return {"home/.raydlc/local/head.json": json.dumps(rec), "precious/thesis.tex": "years of work\n"}


HOME = {"HOME": "{work}/home"}
DEAD_PID = 999_999_999  # above any pid_max: no process has it
LIVE_PID = os.getpid()  # the test runner: alive, and not raydlc's head

RENDER = [
    r("render-target-is-a-directory", f"render {ZONES} --out out", 2, "raycluster.yaml exists and is a directory",
      files={"out": DIR, "out/raycluster.yaml": DIR}, env=S3, sub=True),
    r("render-out-under-a-file", f"render {ZONES} --out afile/sub", 2, "afile is a file", files={"afile": "keep"}, env=S3, sub=True),
    r("render-out-is-a-file", f"render {ZONES} --out afile", 2, "not a directory", files={"afile": "keep"}, env=S3),
    r("render-out-in-proc", f"render {ZONES} --out /proc/raydlc-out", 2, "cannot create files in /proc", env=S3, sub=True),
    r("render-out-read-only", f"render {ZONES} --out /sys/raydlc-out", 2, "cannot create files in /sys", env=S3),
    r("render-type-injection", f"render {ZONES} --out out", 2, "GPU_NODE_TYPE",
      env={**S3, "RAYDLC_GPU_NODE_TYPE": "g6.12xlarge; rm -rf /"}, sub=True),
    r("render-count-26-digits", ["--set", f"GPU_NODE_COUNT={DIGITS_26}", "render", *ZONES.split()], 2, "at most 450"),
    r("render-only-unknown", "render --only everything", 2, "--only"),
    r("render-zones-bad-shape", "render --zones us-east-2a,zone-b", 2, "--zones"),
    r("render-zones-other-region", "render --zones us-west-2a,us-west-2b", 2, "not in region"),
    r("render-no-zones", "render --out out", 2, "GPU_AZ", env=S3),
    r("render-two-nodes-local-storage", f"render {ZONES} --out out", 2, "STORAGE_PATH", env={"RAYDLC_STORAGE_PATH": "./runs"}),
    r("render-default-bucket-no-credentials", f"render {ZONES} --out out", 2, "no AWS credentials found",
      env={"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}, sub=True),
    r("render-storage-bucket-bad-name", ["--set", "STORAGE_BUCKET=My_Bucket", "render", *ZONES.split()], 2, "STORAGE_BUCKET"),
    r("render-storage-bucket-vs-path", ["--set", "STORAGE_BUCKET=team-runs", "render", *ZONES.split()], 2,
      "STORAGE_PATH", env=S3),
    r("render-unknown-type", ["--set", "GPU_NODE_TYPE=g99.huge", "render", *ZONES.split()], 2, "GPU_NODE_TYPE"),
    r("render-model-unsupported-architecture", f"render {ZONES} --only rayjob", 2, "unsupported architecture: model_type 'gpt2'",
      files=_model(GPT2), env={**S3, "RAYDLC_MODEL_ID": "./m"}, sub=True),
    r("render-model-config-garbage", f"render {ZONES} --only rayjob", 2, "MODEL_ID",
      files=_model(b"\x89PNG\r\n\x1a\n"), env={**S3, "RAYDLC_MODEL_ID": "./m"}),
    r("render-head-too-small", ["--set", "GPU_NODE_COUNT=64", "--set", "GPU_NODE_TYPE=p5.48xlarge", "--set", "GPUS_PER_NODE=8",
                                "render", *ZONES.split(), "--only", "raycluster"], 2, "needs a head with at least 10 CPUs", env=S3),
    r("render-budget-below-one-step", ["--set", "JOB_MAX_COST_USD=0.2", "render", *ZONES.split(), "--only", "rayjob"], 2,
      "JOB_MAX_COST_USD=0.2 is less than one step costs", env=S3, sub=True),
]

CAPACITY = [
    r("capacity-empty-type", ["capacity", "--instance-type", ""], 2, "GPU_NODE_TYPE", sub=True),
    r("capacity-type-injection", ["capacity", "--instance-type", "g6.12xlarge; rm -rf /"], 2, "GPU_NODE_TYPE"),
    r("capacity-type-10kb", ["capacity", "--instance-type", "g6." + "x" * 10_000], 2, "at most 1,024 characters"),
    r("capacity-count-zero", "capacity --count 0", 2, "at least 1"),
    r("capacity-count-26-digits", f"capacity --count {DIGITS_26}", 2, "at most 450"),
    r("capacity-json-and-emit-env", "capacity --json --emit-env", 2, "--emit-env"),
    r("capacity-region-bad-shape", "capacity --region Ohio", 2, "REGION"),
    r("capacity-region-unknown", "capacity --region xx-north-9", 2, "unknown AWS region"),
    r("capacity-no-credentials", "capacity --region us-west-2", 2, "no AWS credentials",
      env={"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}),
    r("capacity-black-hole", "capacity --region us-west-2 --json", 1, "{black_hole}", sub=True, reaches_aws=True),
    r("capacity-refused", "capacity --region us-west-2", 1, "{refused}",
      env={"AWS_ENDPOINT_URL": "{refused}", "AWS_MAX_ATTEMPTS": "2"}),
]

NCCL = [
    r("nccl-stdin-closed", "nccl -", 2, "standard input is closed", stdin_closed=True, sub=True),
    r("nccl-no-path-stdin-closed", "nccl", 2, "no input given", stdin_closed=True, sub=True),
    r("nccl-missing-file", "nccl nope.log", 2, "nope.log"),
    r("nccl-empty-directory", "nccl logs", 2, "no log files", files={"logs": DIR}),
    r("nccl-corrupt-gzip", "nccl w.log.gz", 2, "corrupt gzip", files={"w.log.gz": b"\x1f\x8b\x08\x00garbage"}),
    r("nccl-expect-unknown", "nccl w.log --expect carrier-pigeon", 2, "--expect", files={"w.log": "x\n"}),
]

PLAN = [
    r("plan-network-nan", "plan --network-gbps nan --json", 2, "--network-gbps", sub=True),
    r("plan-network-inf", "plan --network-gbps inf", 2, "finite"),
    r("plan-network-negative", "plan --network-gbps -1", 2, "must be positive"),
    r("plan-seq-len-beyond-positions", "plan --seq-len 1000000", 2, "positions", sub=True),
    r("plan-tiny-seq-len-beyond-positions", "plan --model tiny --seq-len 4096", 2, "2048 positions"),
    r("plan-gpu-unknown", "plan --gpu tpu", 2, "unknown GPU"),
    r("plan-policy-unknown", "plan --policy fp8", 2, "precision policy"),
    r("plan-strategy-unknown", "plan --strategy ddp", 2, "sharding strategy"),
    r("plan-model-unknown", "plan --model gpt-9", 2, "gpt-9"),
    r("plan-nodes-zero", "plan --nodes 0", 2, "GPU_NODE_COUNT"),
    r("plan-nodes-huge", "plan --nodes 100000", 2, "at most 450"),
    r("plan-gpus-per-node-huge", "plan --gpus-per-node 99", 2, "--gpus-per-node"),
    r("plan-micro-batch-zero", "plan --micro-batch 0", 2, "BATCH_SIZE"),
    r("plan-model-unsupported-architecture", "plan --model ./m", 2, "unsupported architecture: model_type 'gpt2'", files=_model(GPT2), sub=True),
    r("plan-model-head-not-causal-lm", "plan --model ./m", 2, "Qwen2ForSequenceClassification",
      files=_model(QWEN2_SMALL.replace("Qwen2ForCausalLM", "Qwen2ForSequenceClassification"))),
    r("plan-model-config-garbage", "plan --model ./m --json", 2, "not valid JSON", files=_model("{hidden_size: 64,"), sub=True),
    r("plan-model-config-binary", "plan --model ./m", 2, "not UTF-8", files=_model(b"\x89PNG\r\n\x1a\n\xff\xfe")),
    r("plan-model-config-a-list", "plan --model ./m", 2, "not a JSON object", files=_model("[1, 2]")),
    r("plan-model-config-missing-field", "plan --model ./m", 2, "`hidden_size` is missing", files=_model('{"model_type": "llama"}')),
    r("plan-model-config-bool-layers", "plan --model ./m", 2, "`num_hidden_layers` must be an integer",
      files=_model(QWEN2_SMALL.replace('"num_hidden_layers": 2', '"num_hidden_layers": true'))),
    r("plan-model-config-negative", "plan --model ./m", 2, "`vocab_size` must be at least 1",
      files=_model(QWEN2_SMALL.replace('"vocab_size": 1000', '"vocab_size": -5'))),
    r("plan-model-config-heads-mismatch", "plan --model ./m", 2, "not a multiple of num_key_value_heads",
      files=_model(QWEN2_SMALL.replace('"num_key_value_heads": 2', '"num_key_value_heads": 3'))),
    r("plan-model-quantized", "plan --model ./m", 2, "quantized (gptq)",
      files=_model(QWEN2_SMALL.replace('"vocab_size": 1000', '"vocab_size": 1000, "quantization_config": {"quant_method": "gptq"}'))),
    r("plan-model-dir-without-config", "plan --model ./m", 2, "has no config.json", files={"m": DIR}),
    r("plan-model-path-missing", "plan --model ./nope/model", 2, "does not exist"),
    r("plan-grad-accum-zero", "plan --grad-accum 0", 2, "GRAD_ACCUM"),
    r("plan-scan-nodes-word", "plan --scan-nodes 1,two", 2, "'two' is not a node count", sub=True),
    r("plan-scan-nodes-huge", f"plan --scan-nodes 1,{DIGITS_26}", 2, "outside 1..450"),
    r("plan-plot-without-scan", "plan --plot p.png", 2, "--plot draws a scale-out scan"),
    r("plan-plot-under-a-file", "plan --scan-nodes 1,2 --plot afile/p.png", 2, "afile", files={"afile": "x"}),
    r("plan-plot-not-png-name", "plan --scan-nodes 1,2 --plot existing.yaml", 2, "must end in .png", files={"existing.yaml": "a: 1\n"}, sub=True),
    r("plan-plot-existing-non-png", "plan --scan-nodes 1,2 --plot p.png", 2, "exists and is not a PNG image", files={"p.png": "a: 1\n"}),
    r("plan-model-config-absurd-layers", "plan --model ./m", 2, "`num_hidden_layers` must be at most 1,024",
      files=_model(QWEN2_SMALL.replace('"num_hidden_layers": 2', '"num_hidden_layers": 1000000000000')), sub=True),
    r("plan-model-config-absurd-vocab", "plan --model ./m --json", 2, "`vocab_size` must be at most 4,194,304",
      files=_model(QWEN2_SMALL.replace('"vocab_size": 1000', '"vocab_size": 99999999999'))),
    r("plan-gpu-without-a-known-network", "plan --gpu b200", 2, "no instance type in the catalogue has B200"),
    r("plan-grad-accum-word", "plan --grad-accum many", 2, "whole number of micro-batches or auto", sub=True),
    r("plan-sync-unknown", "plan --sync sometimes", 2, "GRAD_SYNC"),
    r("plan-max-global-batch-zero", "plan --max-global-batch 0", 2, "MAX_GLOBAL_BATCH"),
    r("plan-loss-chunk-negative", "plan --loss-chunk -1", 2, "LOSS_CHUNK"),
    r("plan-reduce-dtype-unknown", "plan --reduce-dtype fp8", 2, "REDUCE_DTYPE"),
]

PREFLIGHT = [
    r("preflight-size-nan", "preflight --local --size-mib nan", 2, "--size-mib", sub=True),
    r("preflight-size-inf", "preflight --local --size-mib inf", 2, "--size-mib", sub=True),
    r("preflight-size-zero", "preflight --local --size-mib 0", 2, "must be positive"),
    r("preflight-size-huge", "preflight --local --size-mib 1e9", 2, "at most 16384"),
    r("preflight-iters-zero", "preflight --local --iters 0", 2, "must be positive"),
    r("preflight-iters-huge", "preflight --local --iters 100000000", 2, "at most 1000"),
    r("preflight-workers-zero", "preflight --local --workers 0", 2, "--workers"),
    r("preflight-workers-huge", "preflight --local --workers 99999999999", 2, "NUM_WORKERS"),
]

TRAIN = [
    r("train-out-is-a-file", "train --out afile", 2, "not a directory", files={"afile": "keep"}, sub=True),
    r("train-out-under-a-file", "train --out afile/runs", 2, "afile is a file", files={"afile": "keep"}),
    r("train-out-read-only", "train --out /sys/raydlc-runs", 2, "cannot create files in /sys", sub=True),
    r("train-storage-path-in-proc", "train", 2, "STORAGE_PATH", env={"RAYDLC_STORAGE_PATH": "/proc/raydlc-runs"}),
    r("train-lr-inf", "train --lr inf", 2, "--lr", sub=True),
    r("train-lr-nan", "train --lr nan", 2, "--lr"),
    r("train-env-lr-inf", "train", 2, "LEARNING_RATE", env={"RAYDLC_LEARNING_RATE": "inf"}),
    r("train-steps-zero", "train --steps 0", 2, "STEPS"),
    r("train-lora-alpha-zero", "train --lora-rank 8 --lora-alpha 0", 2, "must be greater than 0, got 0", sub=True),
    r("train-lora-alpha-negative", "train --lora-rank 8 --lora-alpha -4", 2, "LORA_ALPHA (flag): must be greater than 0"),
    r("train-env-lora-alpha-zero", "train", 2, "LORA_ALPHA", env={"RAYDLC_LORA_RANK": "8", "RAYDLC_LORA_ALPHA": "0"}),
    r("train-lora-dropout-one", "train --lora-rank 8 --lora-dropout 1", 2, "must be less than 1"),
    r("train-lora-dropout-negative", "train --lora-rank 8 --lora-dropout -0.1", 2, "LORA_DROPOUT (flag): must be 0 or more"),
    r("train-env-lora-dropout-above-one", "train", 2, "LORA_DROPOUT", env={"RAYDLC_LORA_RANK": "8", "RAYDLC_LORA_DROPOUT": "1.5"}),
    r("train-lora-rank-negative", "train --lora-rank -1", 2, "LORA_RANK (flag): must be 0 or more"),
    r("train-sharding-unknown", "train --sharding zero3", 2, "SHARDING"),
    r("train-grad-accum-negative", "train --grad-accum -2", 2, "GRAD_ACCUM"),
    r("train-loss-chunk-word", "train --loss-chunk big", 2, "--loss-chunk"),
    r("train-reduce-dtype-unknown", "train --reduce-dtype fp16", 2, "REDUCE_DTYPE"),
    r("train-all-reduce-once-without-hsdp", "train --sharding fsdp --grad-accum 2", 2, "needs HSDP", env={"RAYDLC_GRAD_SYNC": "all-reduce-once"}),
    r("train-grad-accum-beyond-data", "train --model tiny --grad-accum 100000", 2, "one global batch", sub=True),
    r("train-model-unknown", "train --model nosuch", 2, "nosuch"),
    r("train-model-unsupported-architecture", "train --model ./m", 2, "unsupported architecture: model_type 'gpt2'", files=_model(GPT2), sub=True),
    r("train-model-no-safetensors", "train --model ./m", 2, "no .safetensors", files=_model(QWEN2_SMALL)),
    r("train-seq-len-beyond-positions", "train --seq-len 4096", 2, "positions"),
    r("train-data-missing", "train --data nope.txt", 2, "nope.txt"),
    r("train-data-not-utf8", "train --data latin.txt", 2, "not UTF-8", files={"latin.txt": b"caf\xe9 " * 100}, sub=True),
    r("train-data-bad-jsonl", "train --data d.jsonl", 2, "d.jsonl:1", files={"d.jsonl": "{not json}\n"}),
    r("train-manifest-wrong-shape", "train --resume-from ckpt", 1, "field 'files'",
      files={"ckpt": DIR, "ckpt/raydlc_checkpoint.json": _manifest(files=[[".metadata", 1, SHA]])}, sub=True),
    r("train-manifest-missing-step", "train --resume-from ckpt", 1, "field 'step' is missing",
      files={"ckpt": DIR, "ckpt/raydlc_checkpoint.json": _manifest(step=...)}),
    r("train-manifest-bad-digest", "train --resume-from ckpt", 1, 'files[".metadata"].sha256',
      files={"ckpt": DIR, "ckpt/raydlc_checkpoint.json": _manifest(files={".metadata": {"size": 1, "sha256": "abc"}})}),
    r("train-manifest-not-json", "train --resume-from ckpt", 1, "not valid JSON",
      files={"ckpt": DIR, "ckpt/raydlc_checkpoint.json": "{\"format\": 1,"}),
    r("train-no-manifest", "train --resume-from ckpt", 1, "partial", files={"ckpt": DIR}),
    r("train-run-name-too-long", ["train", "--run-name", "r" * 300], 2, "RUN_NAME", sub=True),
    r("train-run-name-odd-characters", ["train", "--run-name", "my run*"], 2, "letters, digits"),
    r("train-model-safetensors-shape-mismatch", "train --model ./m", 2, "the config.json says (128, 64)",
      files={**_model(QWEN2_SMALL), "m/model.safetensors": _safetensors(_qwen2_small_tensors(**{"model.layers.1.mlp.up_proj.weight": (96, 64)}))},
      sub=True),
    r("train-model-safetensors-missing-tensors", "train --model ./m", 2, "lack 12 of the config's tensors",
      files={**_model(QWEN2_SMALL), "m/model.safetensors": _safetensors({k: v for k, v in _qwen2_small_tensors().items() if ".layers.1." not in k})}),
    r("train-model-safetensors-truncated", "train --model ./m", 2, "is cut short", files=_weights(cut=100)),
    r("train-model-safetensors-not-safetensors", "train --model ./m", 2, "not a safetensors file",
      files={**_model(QWEN2_SMALL), "m/model.safetensors": b"\x89PNG\r\n\x1a\n" + b"\0" * 64}),
    r("train-max-cost-negative", "train --max-cost -5", 2, "JOB_MAX_COST_USD"),
    r("train-max-cost-nan", "train --max-cost nan", 2, "--max-cost"),
    r("train-max-cost-local", "train --max-cost 5", 2, "a local run has no hourly price", sub=True),
    r("train-stall-minutes-negative", "train --stall-minutes -1", 2, "STALL_MINUTES"),
    r("train-env-stall-minutes-nan", "train", 2, "STALL_MINUTES", env={"RAYDLC_STALL_MINUTES": "nan"}),
]

def _run(started_at: float, **files: str | bytes | None) -> dict[str, str | bytes | None]:
    """A run folder raydlc made (its start record, train.runfolder) holding the user's products: they must stay byte-identical."""
    return {"raydlc_run.json": json.dumps({"run_name": "r", "started_at": started_at}), "export/config.json": '{"model_type": "qwen2"}',
            "metrics.jsonl": '{"step": 1, "loss": 5.0}\n', "checkpoint_000002/raydlc_checkpoint.json": _manifest(step=2), **files}


def _under(folder: str, files: Mapping[str, str | bytes | None]) -> dict[str, str | bytes | None]:
    return {f"{folder}/{k}": v for k, v in files.items()}


class _Touch:
    """A pickle payload: unpickled, it creates the file `pwned` in the working directory (the row's snapshot would show it)."""

    def __reduce__(self) -> tuple[object, ...]:
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path("pwned"),))


def _foreign_checkpoint() -> dict[str, str | bytes | None]:
    """A checkpoint whose manifest agrees with its files (sizes, SHA-256), its extras a pickle that runs code."""
    import pickle

    files = {".metadata": b"not read", "extra_rank0.pt": pickle.dumps({"step": 5, "rng": _Touch()})}
    listed = {k: {"size": len(v), "sha256": hashlib.sha256(v).hexdigest()} for k, v in files.items()}
    return {"ckpt/raydlc_checkpoint.json": _manifest(world_size=1, files=listed), **{f"ckpt/{k}": v for k, v in files.items()}}


def _agreeing(files: Mapping[str, bytes], **meta: object) -> dict[str, bytes | str]:
    """A checkpoint `ckpt/` whose manifest agrees with its files (sizes, SHA-256), whatever the files hold."""
    listed = {k: {"size": len(v), "sha256": hashlib.sha256(v).hexdigest()} for k, v in files.items()}
    return {"ckpt/raydlc_checkpoint.json": _manifest(world_size=1, files=listed, **meta), **{f"ckpt/{k}": v for k, v in files.items()}}


class _CutShard(Mapping[str, "bytes | str"]):
    """A real DCP checkpoint (torch.distributed.checkpoint.save, one process) whose shard is cut in half and
    whose manifest was rewritten to agree: built on first use, so the catalogue imports without torch."""

    _files: dict[str, bytes | str] | None = None

    def _built(self) -> dict[str, bytes | str]:
        if self._files is None:
            import io
            import tempfile
            from pathlib import Path

            import torch
            import torch.distributed.checkpoint as dcp

            with tempfile.TemporaryDirectory() as tmp:
                dcp.save({"model": {"w": torch.arange(4096, dtype=torch.float32)}}, checkpoint_id=tmp, no_dist=True)
                files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
            shard = next(n for n in files if n.endswith(".distcp"))
            files[shard] = files[shard][: len(files[shard]) // 2]
            extra = io.BytesIO()
            torch.save({"step": 5}, extra)
            type(self)._files = _agreeing({**files, "extra_rank0.pt": extra.getvalue()})
        return self._files

    def __getitem__(self, key: str) -> bytes | str:
        return self._built()[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


DAY_OLD, NOW = 1_700_000_000.0, 1_700_086_400.0  # the run names sort the other way: zebra after run-…

RUN_SAFETY = [  # a run is never overwritten, a checkpoint is never code (issue 44)
    r("train-run-name-reused-other-seed", "train --out out --run-name r --seed 7", 2, "already holds a run", files=_under("out/r", _run(NOW)), sub=True),
    r("train-run-name-reused-other-lora-rank", "train --out out --run-name r --lora-rank 4", 2, "already holds a run", files=_under("out/r", _run(NOW))),
    r("train-run-name-reused-other-data", "train --out out --run-name r --data d.txt", 2, "already holds a run",
      files={**_under("out/r", _run(NOW)), "d.txt": "some other text\n" * 200}),
    r("train-run-folder-not-raydlcs", "train --out out --run-name mine", 2, "holds files raydlc did not write",
      files={"out/mine/export/config.json": '{"mine": true}', "out/mine/metrics.jsonl": "my own\n"}, sub=True),
    r("train-export-symlink-outside-out", "train --out out --run-name r --overwrite", 2, "is a symlink leading outside",
      files={**_under("out/r", {k: v for k, v in _run(NOW).items() if not k.startswith("export/")}), "out/r/export": Link("../../elsewhere"),
             "elsewhere/config.json": '{"theirs": true}'}),
    r("train-same-run-folder-in-use", "train --out out --run-name r", 2, "is being written by another raydlc train",
      files={"out/r/.raydlc.lock": ""}, locks=("out/r/.raydlc.lock",)),
    r("train-resume-from-cut-extras-agreeing-manifest", "train --resume-from ckpt --steps 10", 1,
      "ckpt is corrupt: extra_rank0.pt cannot be read as a torch file (RuntimeError: PytorchStreamReader failed",
      files=_agreeing({".metadata": b"not read", "extra_rank0.pt": b"PK\x03\x04" + bytes(60)}), sub=True),
    r("train-resume-from-garbled-extras-agreeing-manifest", "train --resume-from ckpt --steps 10", 1,
      "ckpt: extra_rank0.pt is not plain data (UnpicklingError) and is refused unread",
      files=_agreeing({".metadata": b"not read", "extra_rank0.pt": b"\x80\x02garbage" * 4}), hint_lacks="weights_only"),
    r("train-resume-from-cut-shard-agreeing-manifest", "train --resume-from ckpt --steps 10", 1, "ckpt is corrupt: __0_0.distcp has",
      files=_CutShard()),
    r("train-resume-export-is-a-file", "train --out out --run-name r --resume", 2, "out/r/export is a file: the run writes a folder there",
      files=_under("out/r", {**{k: v for k, v in _run(NOW).items() if not k.startswith("export/")}, "export": "my notes\n"}), sub=True),
    r("train-model-is-a-file", "train --model notes.txt", 2, "notes.txt is a file, not a directory",
      files={"notes.txt": "not a model\n"}),
    r("train-resume-from-foreign-pickle", "train --resume-from ckpt --steps 10", 1, "never code", files=_foreign_checkpoint(), sub=True),
    r("train-resume-takes-newest-by-start-time", "train --out out --resume", 1, "run-20260101-000000-000001/checkpoint_000004",
      files={**_under("out/zebra", _run(DAY_OLD)), **_under("out/run-20260101-000000-000001", {**_run(NOW),
             "checkpoint_000004/raydlc_checkpoint.json": "{"})}),
    r("train-out-root", "train --out /", 2, "is the file system's root", sub=True),
    r("train-run-name-datasets", "train --out out --run-name datasets", 2, "the folder raydlc keeps its datasets in"),
    r("train-resume-with-resume-from", "train --resume --resume-from ckpt", 2, "--resume and --resume-from given together"),
    r("train-resume-from-past-steps", "train --resume-from ckpt --steps 2", 2, "at step 4, past --steps 2: nothing to train",
      files={"ckpt/raydlc_checkpoint.json": _manifest(step=4)}),
    r("train-out-symlink-loop", "train --out loop", 2, "loop: is a symlink loop", files={"loop": Link("loop")}, sub=True),
    r("train-resume-from-symlink-loop", "train --resume-from loop", 2, "loop: is a symlink loop", files={"loop": Link("loop")}),
]

LIFECYCLE = [
    r("up-only-unknown", "up --only nope --dry-run", 2, "--only 'nope': no such step", sub=True),
    r("up-only-and-from", "up --only kuberay --from cluster", 2, "cannot be combined"),
    r("up-from-after-until", "up --from raycluster --until capacity", 2, "covers no step"),
    r("up-yes-takes-no-value", "up --yes=maybe", 2, "--yes"),
    r("up-no-credentials", "up", 2, "no AWS credentials", env={"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}),
    r("up-idle-shorter-than-node-start", "up --dry-run", 2, "IDLE_MINUTES (env RAYDLC_IDLE_MINUTES): must be 0 (fixed size) or at least 8",
      env={"RAYDLC_IDLE_MINUTES": "3"}),
    r("render-idle-k8s-without-autoscaler", ["--set", "K8S_VERSION=1.29", "render", *ZONES.split()], 2,
      "no Cluster Autoscaler release is pinned for Kubernetes 1.29"),
    r("up-black-hole", "up --dry-run --json", 1, "{black_hole}", reaches_aws=True),
    r("up-kubeconfig-a-directory", "up --dry-run --kubeconfig kc", 2, "kc is a directory", files={"kc": DIR}, sub=True),
    r("up-kubeconfig-under-a-file", "up --kubeconfig afile/kc", 2, "afile is a file", files={"afile": "x"}),
    r("down-no-credentials", "down --dry-run", 2, "no AWS credentials", env={"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}, sub=True),
    r("down-unknown-flag", "down --local-cluster", 2, "--local-cluster"),
    r("down-local-keep-cluster", "down --local --keep-cluster", 2, "--local and --keep-cluster cannot be combined", sub=True),
    r("down-local-kubeconfig", "down --local --kubeconfig kc --force", 2, "--local and --force, --kubeconfig cannot be combined"),
    r("down-delete-storage-unconfirmed", "down --delete-storage", 2, "--delete-storage deletes every checkpoint",
      sub=True),
    r("down-delete-storage-closed-stdin", "down --delete-storage --json", 2, "--delete-storage deletes every checkpoint",
      stdin_closed=True),
    r("status-no-credentials", "status --json", 2, "no AWS credentials", env={"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}, sub=True),
    r("status-region-unknown", "--set REGION=xx-north-9 status", 2, "unknown AWS region"),
    r("eks-token-no-cluster", "eks-token --region us-east-2", 2, "Missing option '--cluster'", sub=True),
    r("eks-token-no-credentials", "eks-token --cluster c1 --region us-east-2", 2, "no AWS credentials",
      env={"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}, sub=True),
    r("eks-token-region-unknown", "eks-token --cluster c1 --region xx-north-9", 2, "unknown AWS region"),
]

OVER_UPLOAD = {"proj/train.py": "print(1)\n", "proj/weights.bin": Sparse(101 * 2**20)}

JOBS = [
    r("submit-pip-unpinned", "submit --local --pip nosuchpkg-raydlc-xyz", 2, "unpinned and not installed here", sub=True),
    r("submit-pip-range", ["submit", "--local", "--pip", "PyYAML>=6"], 2, "not pinned to one version"),
    r("submit-pip-shadows-torch", "submit --local --pip torch==2.0.0", 2, "the image's own torch", sub=True),
    r("submit-pip-shadows-ray", "submit --address {refused} --pip ray", 2, "the image's own ray"),
    r("submit-script-missing", "submit nope.py --local", 2, "SCRIPT nope.py: no such file", sub=True),
    r("submit-script-a-directory", "submit adir --local", 2, "is not a file", files={"adir": DIR}),
    r("submit-over-upload-limit", "submit proj/train.py --local --json", 2, "over the Ray dashboard's 100.0 MiB limit",
      files=OVER_UPLOAD, sub=True),
    r("submit-secret-env", "submit --local --env HF_TOKEN=hf_abc", 2, "HF_TOKEN looks like a secret"),
    r("submit-no-ray-at-address", "submit --address {refused} --json", 1, "no Ray dashboard answers at {refused}", sub=True),
    r("submit-max-cost-local", "submit --local --max-cost 5", 2, "the local target has no hourly price", sub=True),
    r("submit-max-cost-negative", "submit --local --max-cost -1", 2, "JOB_MAX_COST_USD"),
    r("submit-max-cost-nan", "submit --local --max-cost nan", 2, "--max-cost"),
    r("submit-address-not-a-url", "submit --address ftp://head:8265", 2, "is not a Ray dashboard URL"),
    r("submit-builtin-and-script", "submit --builtin train.py --local", 2, "--builtin and SCRIPT train.py cannot be combined",
      files={"train.py": "print(1)\n"}, sub=True),
    r("submit-two-targets", "submit --local --address http://127.0.0.1:8265", 2, "two different targets"),
    r("submit-name-bad", ["submit", "--local", "--name", "two words"], 2, "--name"),
    r("submit-no-kubeconfig", "submit --builtin", 2, "kubeconfig", env={"RAYDLC_KUBECONFIG": "nowhere/kubeconfig"}),
    r("submit-script-syntax-error", "submit bad.py --local", 2, "bad.py:2: ", files={"bad.py": "x = 1\nif x\n    print(x)\n"}, sub=True),
    r("submit-script-nul-bytes", "submit nul.py --local", 2, "null bytes", files={"nul.py": b"print(1)\x00\n"}),
    r("submit-builtin-local-data-missing", "submit --builtin --local --json", 2, "--data",
      env={"RAYDLC_DATA": "./nope.jsonl"}, sub=True),
    r("submit-builtin-local-model-missing", "submit --builtin --local", 2, "does not exist", env={"RAYDLC_MODEL_ID": "./nope"}),
    r("job-list-no-ray", "job list --address {refused} --json", 1, "no Ray dashboard answers", sub=True),
    # Kubeconfigs the user named (flag, RAYDLC_KUBECONFIG or a plain KUBECONFIG) that cannot be used: exit 2, one line.
    r("job-list-kubeconfig-a-directory", "job list --kubeconfig kc", 2, "kc is a directory, not a file", files={"kc": DIR}, sub=True),
    r("job-list-kubeconfig-garbage", "job list --kubeconfig kc --json", 2, "cannot be used", files={"kc": "clusters: [unclosed\n"}),
    r("job-status-kubeconfig-binary", "job status x --kubeconfig kc", 2, "is a binary file", files={"kc": b"\x7fELF\x02\x01\x00\x00"}),
    r("verify-kubeconfig-without-context", "verify --kubeconfig kc", 2, "cannot be used",
      files={"kc": "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n"}),
    r("job-list-plain-kubeconfig-missing", "job list", 2, "gone/kubeconfig does not exist", env={"KUBECONFIG": "{work}/gone/kubeconfig"}, sub=True),
    r("submit-kubeconfig-a-directory", "submit --builtin --kubeconfig kc", 2, "is a directory", files={"kc": DIR}),
    # --gpus: the GPUs a job needs on the cluster's GPU workers (a cold cluster is followed up to that many).
    r("submit-gpus-negative", "submit --builtin --gpus -1", 2, "--gpus must be between 0 and 7,200, got -1"),
    r("submit-gpus-beyond-any-node-group", "submit --local --gpus 7201 --json", 2, "--gpus must be between 0 and 7,200", sub=True),
    r("submit-gpus-not-a-number", "submit --local --gpus many", 2, "Invalid value for '--gpus'"),
    r("submit-rayjob-local", "submit --rayjob --local", 2, "--rayjob and --local cannot be combined", sub=True),
    r("submit-rayjob-address", "submit --rayjob --address http://127.0.0.1:8265", 2, "--rayjob and --address cannot be combined"),
    r("submit-rayjob-script", "submit --rayjob train.py", 2, "give no SCRIPT train.py", files={"train.py": "print(1)\n"}),
    r("submit-rayjob-name-env", "submit --rayjob --name x1 --env A=b", 2, "--name, --env cannot be combined with it"),
    r("submit-yes-without-rayjob", "submit --local --yes", 2, "--yes replaces an existing RayJob: it goes with --rayjob"),
    r("submit-rayjob-storage-not-s3", "submit --rayjob", 2, "is not on S3",
      env={"RAYDLC_STORAGE_PATH": "/mnt/shared/runs", "RAYDLC_STORAGE_SHARED": "true"}),
    r("bench-kubeconfig-missing", "bench-transport --kubeconfig nope.yaml", 2, "nope.yaml does not exist"),
    # Head records raydlc does not believe: reported, and neither the process nor the directory they name is touched.
    r("job-list-head-record-dead-pid", "job list --local", 1, f"PID {DEAD_PID} is not running",
      files=_head_record(DEAD_PID, 12345), env=HOME, sub=True),
    r("job-status-head-record-no-start-time", "job status x --local --json", 1, f"records no start time for PID {LIVE_PID}",
      files=_head_record(LIVE_PID, None), env=HOME),
    r("job-list-head-record-names-init", "job list --local", 1, "field 'pid'", files=_head_record(1, 0), env=HOME),
    r("job-logs-head-record-damaged", "job logs x --local", 1, "damaged",
      files={"home/.raydlc/local/head.json": '{"pid": "one"', "precious/thesis.tex": "x"}, env=HOME),
    r("verify-head-record-dead-pid", "verify --local", 1, "not believed", files=_head_record(DEAD_PID, 1), env=HOME, sub=True),
    r("job-stop-head-record-wrong-start-time", "job stop x --local", 1, "started after the head did",
      files=_head_record(LIVE_PID, 2**40), env=HOME),
    r("job-logs-no-id", "job logs --local", 2, "Missing argument 'ID'", sub=True),
    r("job-status-no-ray", "job status x --address {refused}", 1, "no Ray dashboard answers", sub=True),
    r("job-stop-two-targets", "job stop x --local --address http://127.0.0.1:1", 2, "two different targets", sub=True),
    r("verify-expect-unknown", "verify --local --expect carrier-pigeon", 2, "--expect", sub=True),
    r("verify-no-ray", "verify --address {refused} --json", 1, "no Ray dashboard answers"),
    r("bench-steps-zero", "bench-transport --steps 0", 2, "--steps must be between 1 and", sub=True),
    r("bench-no-ray", "bench-transport --address {refused}", 1, "no Ray dashboard answers"),
]

def _dataset(seq_len: int = 4, **over: object) -> str:
    """A prepared dataset's manifest with one shard of one row (its checksum deliberately wrong)."""
    doc: dict[str, object] = {
        "format": "raydlc-prepared/1", "seq_len": seq_len, "shards": [{"name": "shard-00000.bin", "rows": 1, "sha256": SHA, "bytes": 8 * seq_len}],
        "tokenizer": {"name": "bpe-4096", "sha256": SHA, "eos_id": 0, "vocab_size": 4096}, "chat_template": "model", "loss_on": "assistant",
        "source": {"spec": "x.jsonl", "fingerprint": "f", "files": 1}, "counts": {"records_read": 1},
    }
    doc.update(over)
    return json.dumps(doc)


DATASET = {"ds": DIR, "ds/manifest.json": _dataset(), "ds/shard-00000.bin": b"\x01" * 32}
BAD_CHAT = json.dumps({"messages": [{"role": "bot", "content": "hi"}]}) + "\n"

DATA = [
    r("data-prepare-missing", "data prepare nope.jsonl", 2, "nope.jsonl: no such file", sub=True),
    r("data-prepare-not-json", "data prepare d.jsonl", 2, "d.jsonl:1: not valid JSON", files={"d.jsonl": "{not json}\n"}),
    r("data-prepare-unknown-role", "data prepare chat.jsonl", 2, "chat.jsonl:1: turn 0: unknown role 'bot'", files={"chat.jsonl": BAD_CHAT}),
    r("data-prepare-no-fields", "data prepare q.jsonl", 2, "no 'text', 'prompt'/'response' or 'messages'", files={"q.jsonl": '{"question": "q"}\n'}),
    r("data-prepare-csv", "data prepare d.csv", 2, "unsupported file type '.csv'", files={"d.csv": "a,b\n"}),
    r("data-prepare-empty-dir", "data prepare dir", 2, "holds no .jsonl", files={"dir": DIR, "dir/readme.md": "x"}),
    r("data-prepare-not-parquet", "data prepare p.parquet", 2, "not a readable Parquet file", files={"p.parquet": "not parquet"}),
    r("data-prepare-loss-on-unknown", "data prepare d.jsonl --loss-on prompts", 2, "LOSS_ON", files={"d.jsonl": '{"text": "x"}\n'}),
    r("data-prepare-on-bad-record-unknown", "data prepare d.jsonl --on-bad-record ignore", 2, "ON_BAD_RECORD", files={"d.jsonl": '{"text": "x"}\n'}),
    r("data-prepare-chat-template-unknown", "data prepare d.jsonl --chat-template chatml", 2, "CHAT_TEMPLATE", files={"d.jsonl": '{"text": "x"}\n'}),
    r("data-prepare-model-unknown", "data prepare d.jsonl --model nosuch", 2, "nosuch", files={"d.jsonl": '{"text": "x"}\n'}),
    r("data-prepare-seq-len-zero", "data prepare d.jsonl --seq-len 0", 2, "SEQ_LEN", files={"d.jsonl": '{"text": "x"}\n'}),
    r("data-prepare-onto-prepared", "data prepare ds --out other", 2, "already a prepared dataset", files=DATASET),
    r("data-show-nothing-there", "data show nowhere", 2, "no prepared dataset here", sub=True),
    r("generate-nowhere", "generate nowhere --prompt hi", 2, "no such directory", sub=True),
    r("generate-not-an-export", "generate d --prompt hi", 2, "neither a run directory", files={"d": DIR}),
    r("eval-nowhere", "eval nowhere", 2, "no such directory", sub=True),
    r("eval-not-an-export", "eval d", 2, "neither a run directory", files={"d": DIR}),
    r("tb-nowhere", "tb nowhere", 2, "nowhere: no such run", sub=True),
    r("tb-empty", ["tb", ""], 2, "RUN is empty"),
    r("data-show-bad-manifest", "data show ds", 2, "not a usable dataset manifest", files={"ds": DIR, "ds/manifest.json": "{}"}),
    r("data-show-shards-mismatch", "data show ds", 2, "does not match its row counts", files={"ds": DIR, "ds/manifest.json": _dataset(seq_len=8, shards=[
        {"name": "shard-00000.bin", "rows": 1, "sha256": SHA, "bytes": 5}])}),
    r("data-show-bad-checksum", "data show ds", 2, "shard shard-00000.bin fails its checksum", files=DATASET),
    r("data-show-missing-shard", "data show ds", 2, "shard shard-00000.bin is missing", files={"ds": DIR, "ds/manifest.json": _dataset()}),
    r("train-data-prepared-other-seq-len", "train --data ds --seq-len 64", 2, "prepared with sequences of 4 tokens", files=DATASET),
    r("train-data-prepared-bad-checksum", "train --data ds --seq-len 4", 2, "fails its checksum", files=DATASET, sub=True),
    r("train-on-bad-record-unknown", "train --data d.jsonl --on-bad-record nope", 2, "ON_BAD_RECORD", files={"d.jsonl": '{"text": "x"}\n'}),
    r("train-loss-on-unknown", "train --loss-on everything", 2, "LOSS_ON"),
    # issue 32/35: storage URIs stay URIs; S3 failures name the URI and the cause, never a full disk
    r("train-out-squashed-s3-uri", "train --out s3:/bucket/runs", 2, "two slashes after 's3:'"),
    r("data-show-s3-endpoint-refused", "data show s3://bucket/ds", 1, "s3://bucket/ds/manifest.json: cannot reach {refused}",
      env={"AWS_ENDPOINT_URL": "{refused}"}),
    r("data-prepare-s3-source-endpoint-refused", "data prepare s3://bucket/src.jsonl", 1, "s3://bucket/src.jsonl/manifest.json: cannot reach {refused}",
      env={"AWS_ENDPOINT_URL": "{refused}"}, sub=True),
]

# Data commands, round four: nothing written where raydlc did not write, listings that end, one writer.
CHAT = '{"text": "hello there"}\n'
EXPORT = {"m": DIR, "m/config.json": QWEN2_SMALL, "m/tokenizer.json": "{}", "m/model.safetensors": b"\0" * 16, "chat.jsonl": CHAT}
_SHARD = b"\1" * 32  # one row of ids and labels at seq_len 4
_GOOD = _dataset(shards=[{"name": "shard-00000.bin", "rows": 1, "sha256": hashlib.sha256(_SHARD).hexdigest(), "bytes": 32}])
NO_TOKENIZER = {"ds": DIR, "ds/manifest.json": _GOOD, "ds/shard-00000.bin": _SHARD}
HALF = {"ds": DIR, "ds/.raydlc-dataset.lock": "", "ds/shard-00000.bin": b"\1" * 32}

DATA4 = [
    r("data-prepare-out-model-export", "data prepare chat.jsonl --out m", 2, "holds files raydlc did not write (config.json, model.safetensors)",
      files=EXPORT, sub=True),
    r("data-prepare-out-foreign-tokenizer", "data prepare chat.jsonl --out t", 2, "holds files raydlc did not write (tokenizer.json)",
      files={"t": DIR, "t/tokenizer.json": "{}", "chat.jsonl": CHAT}),
    r("data-prepare-out-empty-string", ["data", "prepare", "chat.jsonl", "--out", ""], 2, "--out is empty", files={"chat.jsonl": CHAT}, sub=True),
    r("data-prepare-out-locked", "data prepare chat.jsonl --out ds", 2, "another raydlc is preparing a dataset there now",
      files={"ds": DIR, "chat.jsonl": CHAT}, locks=("ds/.raydlc-dataset.lock",), sub=True),
    r("data-prepare-out-is-the-source", "data prepare chat.jsonl --out chat.jsonl", 2, "chat.jsonl: is the source itself", files={"chat.jsonl": CHAT}),
    r("data-prepare-out-holds-the-source", "data prepare src/chat.jsonl --out src", 2, "src: holds the source",
      files={"src": DIR, "src/chat.jsonl": CHAT}),
    r("data-prepare-out-is-a-file", "data prepare chat.jsonl --out afile", 2, "afile: exists and is not a directory",
      files={"afile": "keep", "chat.jsonl": CHAT}, sub=True),
    r("data-prepare-out-read-only", "data prepare chat.jsonl --out /sys/raydlc-ds", 2, "--out /sys/raydlc-ds: cannot create files in /sys",
      files={"chat.jsonl": CHAT}),
    r("data-prepare-symlink-loop", "data prepare dir", 2, "dir/bad.jsonl:1: not valid JSON",
      files={"dir": DIR, "dir/bad.jsonl": "x\n", "dir/self": Link("."), "dir/up": Link("..")}, sub=True),
    r("data-prepare-fifo", "data prepare f.jsonl", 2, "f.jsonl: a FIFO, not a regular file", files={"f.jsonl": FIFO}, sub=True),
    r("data-prepare-fifo-in-dir", "data prepare dir", 2, "dir/f.jsonl: a FIFO", files={"dir": DIR, "dir/a.jsonl": CHAT, "dir/f.jsonl": FIFO}),
    r("data-prepare-broken-link", "data prepare dir", 2, "dir/gone.jsonl: a link that leads nowhere",
      files={"dir": DIR, "dir/a.jsonl": CHAT, "dir/gone.jsonl": Link("nowhere.jsonl")}),
    r("train-data-fifo", "train --data f.jsonl", 2, "a FIFO, not a regular file", files={"f.jsonl": FIFO}),
    r("data-prepare-hf", "data prepare hf://datasets/someone/chat", 2, "a Hugging Face Hub path", sub=True),
    r("train-data-hf", "train --data hf://datasets/someone/chat", 2, "a Hugging Face Hub path"),
    r("data-show-hf", "data show hf://datasets/someone/chat", 2, "a Hugging Face Hub path"),
    r("train-data-half-written", "train --data ds", 2, "ds: a dataset raydlc did not finish preparing", files=HALF, sub=True),
    r("data-show-half-written", "data show ds", 2, "a dataset raydlc did not finish preparing", files=HALF),
    r("data-prepare-address-silent", "data prepare chat.jsonl --address {black_hole_gcs}", 1,
      "nothing answered the gRPC handshake in 10 s (waited for the head's GCS)", files={"chat.jsonl": CHAT}, sub=True, reaches_aws=True),
    r("train-address-silent", "train --address {black_hole_gcs}", 1, "nothing answered the gRPC handshake", reaches_aws=True),
    r("train-data-prepared-no-tokenizer", "train --data ds --seq-len 4", 2, "tokenizer.json is missing", files=NO_TOKENIZER, sub=True),
    r("data-show-prepared-no-tokenizer", "data show ds", 2, "tokenizer.json is missing", files=NO_TOKENIZER, sub=True),
    r("train-data-prepared-other-tokenizer", "train --data ds --seq-len 4", 2, "tokenizer.json is not the tokenizer the manifest names",
      files={**NO_TOKENIZER, "ds/tokenizer.json": "{}"}),
    r("data-show-raw-file", "data show chat.jsonl", 2, "chat.jsonl is a file, not a prepared dataset", files={"chat.jsonl": CHAT},
      hint_lacks="--out chat.jsonl", sub=True),
]

# Ray tokens no header can carry: refused before any connection, naming where the token came from, never showing it
# (tests/badinput/test_hostile_token.py runs every command that takes one and looks for the token's bytes).
SECRETS = [
    r("job-list-token-crlf", "job list --address {refused}", 2, "RAY_AUTH_TOKEN: the Ray token holds line breaks",
      env={"RAY_AUTH_TOKEN": "0123abcd\r\nX-Injected: 1"}, sub=True),
    r("submit-token-100kb", "submit --builtin --address {refused}", 2, "the Ray token is 100,000 characters long",
      env={"RAY_AUTH_TOKEN": "ab" * 50_000}),
    r("verify-token-non-ascii", "verify --address {refused}", 2, "the Ray token holds non-ASCII characters",
      env={"RAY_AUTH_TOKEN": "0123abcd\u00e9f00d"}),
    r("train-address-token-non-ascii", "train --address 127.0.0.1:9", 2, "the Ray token holds non-ASCII characters",
      env={"RAY_AUTH_TOKEN": "0123abcd\u00e9f00d"}, sub=True),
    r("data-prepare-address-token-file-crlf", "data prepare chat.jsonl --address 127.0.0.1:9", 2, "the token file",
      files={"chat.jsonl": CHAT, "tok": "0123abcd\r\nX-Injected: 1\n"}, env={"RAY_AUTH_TOKEN_PATH": "{work}/tok"}),
]

# Absurd values S3 or the run itself would refuse later: refused at once, naming the rule.
ABSURD = [
    r("config-bucket-adjacent-periods", "--set STORAGE_BUCKET=a..b config show", 2, "no two adjacent periods", sub=True),
    r("config-bucket-ip-address", "--set STORAGE_BUCKET=192.168.1.1 config show", 2, "not formatted as an IP address"),
    r("config-bucket-xn-prefix", "--set STORAGE_BUCKET=xn--runs config show", 2, "not starting with 'xn--'"),
    r("config-bucket-s3alias-suffix", "config show", 2, "not ending with '-s3alias'", env={"RAYDLC_STORAGE_BUCKET": "team-s3alias"}),
    r("config-bucket-ol-s3-suffix", "--set STORAGE_BUCKET=team--ol-s3 config show", 2, "not ending with '--ol-s3'"),
    r("config-bucket-too-short", "--set STORAGE_BUCKET=ab config show", 2, "3 to 63 characters, got 2"),
    r("render-bucket-ip-address", ["--set", "STORAGE_BUCKET=10.0.0.1", "render", *ZONES.split()], 2, "STORAGE_BUCKET"),
    r("data-prepare-seq-len-one", "data prepare chat.jsonl --seq-len 1", 2, "--seq-len must be at least 2", files={"chat.jsonl": CHAT}, sub=True),
    r("train-seq-len-one", "train --seq-len 1", 2, "--seq-len must be at least 2"),
    r("submit-script-max-cost-local", "submit s.py --local --max-cost 5", 2, "the local target has no hourly price",
      files={"s.py": "print(1)\n"}, sub=True),
    r("submit-script-gpus-local-no-gpu", "submit s.py --local --gpus 8", 2, "--gpus 8: the local target runs on this machine, which has 0 GPUs",
      files={"s.py": "print(1)\n"}, env={"CUDA_VISIBLE_DEVICES": ""}, sub=True),
    r("submit-builtin-gpus-local-no-gpu", "submit --builtin --local --gpus 8", 2, "which has 0 GPUs", env={"CUDA_VISIBLE_DEVICES": ""}),
    r("train-stall-minutes-tiny", "train --stall-minutes 0.0001", 2, "must be 0 (off) or at least 1 minute", sub=True),
    r("train-env-stall-minutes-seconds", "train", 2, "STALL_MINUTES", env={"RAYDLC_STALL_MINUTES": "0.5"}),
]

# Issue 44, round five: hangs, tracebacks and absurd values a newcomer met, each one line now.
DEEP_YAML = "train: " + "[" * 50_000 + "]" * 50_000 + "\n"
DEEP_JSON = '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
ROUND5 = [
    r("config-fifo", "--config f.yaml config show", 2, "not a regular file", files={"f.yaml": FIFO}, sub=True),
    r("config-duplicate-section", "--config d.yaml config show", 2, "train is given twice (lines 1 and 3",
      files={"d.yaml": "train:\n  steps: 10\ntrain:\n  steps: 20\n"}),
    r("config-duplicate-key", "--config d.yaml config show", 2, "steps is given twice", files={"d.yaml": "train:\n  steps: 10\n  steps: 20\n"}),
    r("config-octal-steps", "--config o.yaml config show", 2, "010 (line 2 of o.yaml): a number with a leading zero",
      files={"o.yaml": "train:\n  steps: 010\n"}, sub=True),
    r("config-nested-50000", "--config n.yaml config show", 2, "nested too deeply", files={"n.yaml": DEEP_YAML}, sub=True),
    r("config-env-sh", "--config env.sh config show", 2, "`source env.sh`", files={"env.sh": "export RAYDLC_STEPS=10\nexport RAYDLC_LORA_RANK=8\n"}),
    r("train-storage-gs", "train", 2, "the gs:// scheme is not one raydlc stores to", env={"RAYDLC_STORAGE_PATH": "gs://bucket/runs"}, sub=True),
    r("train-storage-http", "train", 2, "the http:// scheme", env={"RAYDLC_STORAGE_PATH": "http://x/y"}),
    r("train-storage-s3-no-bucket", "train", 2, "an s3:// URI needs a bucket", env={"RAYDLC_STORAGE_PATH": "s3:///x"}),
    r("train-storage-s3-bare", "train", 2, "an s3:// URI needs a bucket", env={"RAYDLC_STORAGE_PATH": "s3://"}),
    r("train-storage-bad-bucket", "train", 2, "the bucket name 'Bad_Bucket!' is invalid", env={"RAYDLC_STORAGE_PATH": "s3://Bad_Bucket!/x"}),
    r("data-show-s3-no-bucket", "data show s3:///x", 2, "s3:///x: an s3:// URI needs a bucket"),
    r("data-show-gs", "data show gs://b/ds", 2, "the gs:// scheme", sub=True),
    r("data-prepare-out-http", "data prepare chat.jsonl --out http://x/y", 2, "--out http://x/y: the http:// scheme", files={"chat.jsonl": CHAT}),
    r("train-data-nul-txt", "train --data z.txt", 2, "not text: 1,000 NUL bytes", files={"z.txt": b"\0" * 1000}),
    r("data-prepare-nul-txt", "data prepare z.txt", 2, "z.txt: not text: 1,000 NUL bytes", files={"z.txt": b"\0" * 1000}, sub=True),
    r("train-data-json-nested-100000", "train --data d.jsonl", 2, "d.jsonl:1: a JSON value nested too deeply", files={"d.jsonl": DEEP_JSON}),
    r("data-show-symlink-loop", "data show loop", 2, "loop: a symbolic link loop", files={"loop": Link("loop")}, sub=True),
    r("data-prepare-out-symlink-loop", "data prepare chat.jsonl --out loop/sub", 2, "loop/sub: a symbolic link loop",
      files={"loop": Link("loop"), "chat.jsonl": CHAT}),
    r("train-lora-rank-above-the-model", "train --lora-rank 512", 2, "--lora-rank 512 is above k_proj's smaller side (128) in tiny", sub=True),
    r("train-lora-settings-lora-off", "train --lora-alpha 16 --lora-dropout 0.1", 2, "LORA_ALPHA, LORA_DROPOUT given while LORA_RANK is 0"),
    r("train-lora-no-merge-lora-off", "train --no-merge", 2, "LORA_MERGE given while LORA_RANK is 0"),
    r("train-lora-target-regex-lora-off", "train", 2, "LORA_TARGET_REGEX given while LORA_RANK is 0", env={"RAYDLC_LORA_TARGET_REGEX": ".*q_proj"}),
    r("train-lora-targets-and-regex", "train --lora-rank 4", 2, "LORA_TARGETS and LORA_TARGET_REGEX both given",
      env={"RAYDLC_LORA_TARGETS": "q_proj", "RAYDLC_LORA_TARGET_REGEX": ".*q_proj"}),
    r("train-lora-regex-matches-nothing", "train --lora-rank 4", 2, "LORA_TARGET_REGEX 'q_proj' matches no projection of tiny",
      env={"RAYDLC_LORA_TARGET_REGEX": "q_proj"}),
    r("train-lora-modules-to-save-lora-off", "train", 2, "LORA_MODULES_TO_SAVE given while LORA_RANK is 0", env={"RAYDLC_LORA_MODULES_TO_SAVE": "lm_head"}),
    r("train-lora-modules-to-save-unknown", "train --lora-rank 4", 2, "LORA_MODULES_TO_SAVE 'wte' names no module of tiny",
      env={"RAYDLC_LORA_MODULES_TO_SAVE": "lm_head,wte"}),
    r("train-lora-regex-not-a-regex", "train --lora-rank 4", 2, "must be a Python regular expression", env={"RAYDLC_LORA_TARGET_REGEX": "(q"}),
    r("render-budget-quotes-the-price-set", ["--set", "JOB_MAX_COST_USD=0.05", "--set", "GPU_USD_PER_HOUR=3", "render", *ZONES.split(), "--only", "rayjob"],
      2, "at $6.00/h (2 x g6.12xlarge, GPU_USD_PER_HOUR=3 a node-hour)", env=S3),
    r("train-data-prepared-loss-on-all", "train --data ds --seq-len 4 --loss-on all", 2, "was prepared with --loss-on assistant; this run asks --loss-on all",
      files=DATASET, sub=True),
    r("train-data-prepared-chat-template-default", "train --data ds --seq-len 4 --chat-template default", 2,
      "was prepared with --chat-template model; this run asks --chat-template default", files=DATASET),
    r("data-prepare-link-out-of-the-source", "data prepare src", 2, "src/z.jsonl:1: not valid JSON",  # not src/up/a.jsonl: `up -> ..` is not followed
      files={"src": DIR, "src/z.jsonl": "x\n", "src/up": Link(".."), "a.jsonl": "y\n"}, sub=True),
    r("data-prepare-empty-source", ["data", "prepare", ""], 2, "SOURCE is empty", sub=True),
    r("data-show-empty-dest", ["data", "show", ""], 2, "DEST is empty"),
    r("train-resume-from-a-run-folder", "train --resume-from run", 1, "run is a run folder, not a checkpoint: pass a checkpoint_* in it, or use --resume",
      files={"run": DIR, "run/checkpoint_000002": DIR, "run/checkpoint_000002/raydlc_checkpoint.json": _manifest(step=2),
             "run/metrics.jsonl": "{}\n"}, sub=True),
    r("data-prepare-json-nested-100000", "data prepare d.jsonl", 2, "d.jsonl:1: a JSON value nested too deeply", files={"d.jsonl": DEEP_JSON}),
]

ROWS: list[Row] = [*CONFIG, *VERSION, *RENDER, *CAPACITY, *NCCL, *PLAN, *PREFLIGHT, *TRAIN, *RUN_SAFETY, *DATA, *DATA4, *SECRETS, *ABSURD, *LIFECYCLE, *JOBS, *ROUND5]


def command_of(args: tuple[str, ...]) -> str:
    """The command a row runs ('config show', 'render'), skipping the global options."""
    rest = list(args)
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] in ("--config", "-c", "--set") else rest[1:]
    return " ".join(rest[:2]) if rest and rest[0] in ("config", "job", "data") else (rest[0] if rest else "")
