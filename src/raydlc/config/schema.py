"""The one Config tree: its sections, their fields and the rules every value and every combination must keep.

The reference keeps every setting in `env.sh`; raydlc keeps that single source and the
per-variable overrides, but checks every value before anything is created. Each leaf field
carries its flat env.sh name (`GPU_NODE_COUNT`), which is also how errors and flags name it,
so one name works in the shell, in the YAML file, in `--set` and in messages. The layers
(defaults, a YAML file, `RAYDLC_*` variables, flags) are merged in `raydlc.config.load`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator

from raydlc.config.fieldtypes import (
    Above,
    AtLeast,
    Below,
    Between,
    Blank,
    CheckpointingMode,
    Dns1123,
    FolderName,
    NoUserInfo,
    OffOrAtLeast,
    Pattern,
    S3BucketName,
    Shaped,
    StorageLocation,
    WholeOrAuto,
    rules,
    shown,
)
from raydlc.facts import images, instances

ENV_PREFIX = "RAYDLC_"
Source = Literal["default", "file", "env", "flag"]

_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")
_K8S = re.compile(r"^1\.\d{2}$")
_AZ = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d[a-z]$")
# family.size: g6.12xlarge, p5en.48xlarge, u-6tb1.metal, m7i-flex.large, c7i.metal-24xl
_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*\.[a-z0-9]+(-[a-z0-9]+)*$")
# [registry[:port]/]path[:tag][@digest], as container runtimes parse an image reference
_IMAGE = re.compile(
    r"^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::\d+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
_SEMVER = re.compile(r"^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
_PY_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.+-]?[0-9A-Za-z]+)*$")
# S3's rules for a general purpose bucket: 3-63 characters, lowercase letters, digits, dots and hyphens,
# starting and ending with a letter or digit (dots are allowed by S3 but break virtual-hosted TLS; raydlc allows them).
_NCCL_NET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# A kubeconfig context name: kubectl accepts any text; raydlc refuses blanks inside, which no context it writes has
_CONTEXT = re.compile(r"^\S{1,253}$")
# A ServiceAccount's name is a DNS-1123 subdomain (Kubernetes apimachinery validation.IsDNS1123Subdomain): at most 253
_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LORA_TARGETS = re.compile(r"^(q|k|v|o|gate|up|down)_proj(,(q|k|v|o|gate|up|down)_proj)*$")
_LORA_SAVE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(,[A-Za-z_][A-Za-z0-9_.]*)*$")
_TRACKING = re.compile(r"^(none|(tensorboard|mlflow|wandb)(,(tensorboard|mlflow|wandb))*)$")

# A number with no bound of its own still gets one: a 26-digit node count is a typo, not a plan.
INT_MAX = 2**31 - 1
MAX_STRING = 1024  # every string setting: names, ids, paths and URIs are shorter; a longer value is a mistake
INT_MAX_WHY = "the largest 32-bit integer, the most Kubernetes and most tools accept"
EKS_NODEGROUP_MAX = 450  # EKS's default quota "Nodes per managed node group"
DAY_S = 24 * 3600


@dataclass(frozen=True)
class Flag:
    """A setting's command-line option: `raydlc train` and `python -m raydlc.train` are built from these.

    `help` is the sentence before the bracket the builder adds (`[STEPS; local default: 300]`);
    `default` is what that bracket says when the default is not the field's own value
    (`bundled stdlib-docstring corpus`); a switch with a negation is named `--bf16/--fp32`;
    `path`: the value is a storage location, a local path or a URI (`PATH|URI`), kept as the text given.
    """

    name: str
    help: str
    default: str | None = None
    path: bool = False


def _env(
    name: str, help: str, *, flag: Flag | None = None, le: float | None = None, why: str | None = None, **kw: Any
) -> Any:
    """A field with its env.sh name; `flag`: its option on the training commands; `le`/`why`: its
    upper bound and the reason the error states."""
    extra: dict[str, Any] = {"env": name}
    if flag is not None:
        extra["flag"] = asdict(flag)
    if le is not None:
        extra["le"], extra["le_why"] = le, why or ""
    return Field(description=help, json_schema_extra=extra, **kw)


def zone_problem(zone: str, region: str) -> str | None:
    """Why `zone` is not an Availability Zone of `region`; None when it is. The one AZ check."""
    if not _AZ.match(zone):
        return f"must be an Availability Zone name such as '{region}a', got {zone!r}"
    if not (zone.startswith(region) and len(zone) == len(region) + 1):
        return f"{zone!r} is not in region {region!r} (REGION)"
    return None


# The field types: a rule in the annotation is checked by _Section after the rules every field gets.
Count = Annotated[int, AtLeast(1)]
NonNegative = Annotated[int, AtLeast(0)]
Name = Annotated[str, Dns1123()]
Unset = Annotated[str | None, Blank()]
Storage = Annotated[str | None, Blank(), StorageLocation()]  # a local path or a URI, as given (never a pathlib.Path)
MaybeBool = Annotated[bool | None, Blank()]


class _Section(BaseModel):
    """Rules every field gets for free: floats finite, numbers bounded, strings free of control
    characters; then the rules its annotation carries (raydlc.config.fieldtypes)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _raw(cls, v: Any, info: ValidationInfo) -> Any:
        for rule in rules(cls.model_fields[str(info.field_name)].metadata):
            v = rule.before(v)
        return v

    @field_validator("*", mode="after")
    @classmethod
    def _every_field(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields[str(info.field_name)]
        if isinstance(v, str) and _CONTROL.search(v):
            raise ValueError(f"must not contain control characters (newlines, tabs, NUL), got {shown(v)}")
        if isinstance(v, str) and len(v) > MAX_STRING:
            raise ValueError(f"must be at most {MAX_STRING:,} characters, got {len(v):,}: {shown(v)}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            extra = field.json_schema_extra or {}
            assert isinstance(extra, dict)
            le = extra.get("le", INT_MAX if isinstance(v, int) else None)
            if le is not None and v > le:  # type: ignore[operator]
                why = extra.get("le_why", INT_MAX_WHY if "le" not in extra else "")
                raise ValueError(f"must be at most {le:,}" + (f" ({why})" if why else "") + f", got {v}")
        for rule in rules(field.metadata):
            rule.check(v)
        return v


_NODEGROUP_QUOTA = "EKS's default quota of nodes per managed node group"


class ClusterConfig(_Section):
    name: Annotated[str, Dns1123(100)] = _env("CLUSTER_NAME", "EKS cluster name", default="eks-cluster")
    region: Annotated[str, Shaped(_REGION, "an AWS region such as 'us-east-2'", verb="look like")] = _env(
        "REGION", "AWS region", default="us-east-2"
    )
    k8s_version: Annotated[str, Shaped(_K8S, "a Kubernetes minor version such as '1.36'")] = _env(
        "K8S_VERSION", "Kubernetes version of the EKS control plane", default="1.36"
    )
    ami_family: Literal["AmazonLinux2023", "Bottlerocket"] = _env(
        "NODE_AMI_FAMILY", "AMI family of every node group", default="AmazonLinux2023"
    )
    namespace: Name = _env("NAMESPACE", "Kubernetes namespace of the Ray cluster and jobs", default="ray-train")
    storage_bucket: Annotated[str | None, Blank(), S3BucketName()] = _env(
        "STORAGE_BUCKET", "the cluster's S3 bucket for checkpoints and code; empty = raydlc-<account>-<region>-<cluster> "
        "(an existing bucket tagged for the cluster is adopted)", default=None,
    )
    kubeconfig: Unset = _env(
        "KUBECONFIG", "kubeconfig raydlc writes for the cluster and uses; empty = ~/.raydlc/<name>-<region>/kubeconfig "
        "(~/.kube/config only when given)", default=None,
    )
    attach: bool = _env(
        "ATTACH", "attach to a Kubernetes cluster someone else runs: make only what lives in NAMESPACE (the RayCluster, its "
        "Secret and NetworkPolicy), nothing at the AWS or cluster scope (docs/attach.md)", default=False,
        flag=Flag("--attach", "Attach to a cluster a platform team runs: create only what lives in NAMESPACE (docs/attach.md)"),
    )
    kube_context: Annotated[str | None, Blank(), Shaped(_CONTEXT, "a kubeconfig context name (no blanks)")] = _env(
        "KUBE_CONTEXT", "with ATTACH: the kubeconfig context of the cluster (in KUBECONFIG, else ~/.kube/config); "
        "empty = the EKS cluster CLUSTER_NAME in REGION through raydlc's kubeconfig", default=None,
        flag=Flag("--kube-context", "With --attach: the kubeconfig context of the cluster", default="the EKS cluster CLUSTER_NAME"),
    )
    service_account: Annotated[str | None, Blank(), Shaped(_SUBDOMAIN, "a ServiceAccount name (a DNS-1123 subdomain)")] = _env(
        "SERVICE_ACCOUNT", "with ATTACH: the ServiceAccount in NAMESPACE the Ray pods run as (the one the platform gave "
        "storage access); empty = raydlc makes its own, with no cloud access", default=None,
    )
    skip_permission_check: bool = _env(
        "SKIP_PERMISSION_CHECK", "do not ask IAM's policy simulator first whether the caller may do what up and down will "
        "ask of AWS (for a caller whose permissions the simulator cannot see: SCPs, boundaries, conditions)", default=False,
        flag=Flag("--skip-permission-check", "Do not check the caller's AWS permissions with IAM's policy simulator first"),
    )


class SystemNodesConfig(_Section):
    instance_type: Annotated[str, Shaped(_INSTANCE_TYPE, "an EC2 instance type (family.size, e.g. 'm7i.xlarge')")] = _env(
        "SYSTEM_NODE_TYPE", "instance type of the CPU system node group", default="m7i.xlarge"
    )
    count: Count = _env(
        "SYSTEM_NODE_COUNT", "number of system nodes (KubeRay operator, Ray head)", default=1, le=EKS_NODEGROUP_MAX, why=_NODEGROUP_QUOTA
    )
    nodegroup_name: Name = _env("SYSTEM_NODEGROUP_NAME", "name of the system node group", default="system")
    volume_size_gb: Annotated[int, AtLeast(20, "GiB")] = _env(
        "SYSTEM_VOLUME_SIZE", "root volume of each system node, GiB", default=80, le=16384, why="16 TiB"
    )


class GpuNodesConfig(_Section):
    instance_type: Annotated[str, Shaped(_INSTANCE_TYPE, "an EC2 instance type (family.size, e.g. 'g6.12xlarge')")] = _env(
        "GPU_NODE_TYPE", "instance type of the EFA GPU node group", default="g6.12xlarge"
    )
    count: Count = _env("GPU_NODE_COUNT", "number of GPU nodes", default=2, le=EKS_NODEGROUP_MAX, why=_NODEGROUP_QUOTA)
    gpus_per_node: Count = _env(
        "GPUS_PER_NODE", "GPUs on each GPU node; must match the instance type", default=4, le=16, why="no EC2 instance type has more",
    )
    nodegroup_name: Name = _env("GPU_NODEGROUP_NAME", "name of the GPU node group", default="gpu-workers")
    capacity_type: Literal["on-demand", "spot", "spot-then-on-demand"] = _env(
        "GPU_CAPACITY_TYPE", "how the GPU nodes are bought: on-demand, spot (EKS managed Spot capacity; Ray drains a node "
        "on its reclaim notice), or spot-then-on-demand (an on-demand group when Spot has no capacity or quota: at `up`, "
        "and with IDLE_MINUTES > 0 an On-Demand twin from 0 that the Cluster Autoscaler scales when Spot cannot launch); "
        "head and system node stay on-demand", default="on-demand",
    )
    usd_per_node_hour: Annotated[float | None, Blank(), AtLeast(0, "dollars an hour")] = _env(
        "GPU_USD_PER_HOUR", "what one GPU node costs an hour as bought (JOB_MAX_COST_USD is kept at it): `submit` sets it "
        "in the job when the nodes are Spot (the Spot price read at submit); empty = the On-Demand list price",
        default=None, le=10_000, why="ten thousand dollars a node-hour",
    )
    az: Annotated[str | None, Blank(), Shaped(_AZ, "an Availability Zone name such as 'us-east-2a'")] = _env(
        "GPU_AZ", "the one Availability Zone of the GPU nodes (EFA cannot cross AZs); empty = discover", default=None,
    )
    volume_size_gb: Annotated[int, AtLeast(50, "GiB", why="the DLC image alone is tens of GiB")] = _env(
        "GPU_VOLUME_SIZE", "root volume of each GPU node, GiB (the DLC image is large)", default=200, le=16384, why="16 TiB"
    )
    taint: bool = _env("GPU_TAINT", "taint GPU nodes so only pods that tolerate it land there", default=True)
    idle_minutes: NonNegative = _env(
        "IDLE_MINUTES", "minutes a GPU node may hold no Ray work before it leaves (the group scales 0..GPU_NODE_COUNT); "
        "0 = fixed size, the nodes stay", default=15, le=7 * 24 * 60, why="a week",
    )


ChartVersion = Annotated[str, Shaped(_SEMVER, "a chart version such as '1.7.0'")]


class ImagesConfig(_Section):
    dlc_image: Annotated[str, Shaped(_IMAGE, "an image reference ([registry/]repository[:tag][@digest])")] = _env(
        "DLC_IMAGE", "the AWS Ray Train DLC image every Ray pod runs", default=images.DEFAULT_IMAGE
    )
    ray_version: Annotated[str, Shaped(_PY_VERSION, "a Ray version such as '2.58.0'")] = _env(
        "RAY_VERSION", "Ray version inside the image (KubeRay's rayVersion)", default="2.58.0"
    )
    force_ray_version: bool = _env(
        "FORCE_RAY_VERSION", "accept a RAY_VERSION that differs from the image's known Ray", default=False
    )
    kuberay_version: ChartVersion = _env("KUBERAY_VERSION", "KubeRay operator chart version", default="1.7.0")
    nvidia_device_plugin_version: ChartVersion = _env(
        "NVIDIA_DEVICE_PLUGIN_VERSION", "NVIDIA device plugin chart version", default="0.20.0"
    )
    cluster_autoscaler_version: ChartVersion = _env(
        "CLUSTER_AUTOSCALER_VERSION", "Kubernetes Cluster Autoscaler chart version (its image follows K8S_VERSION)",
        default="9.59.0",
    )


class RayConfig(_Section):
    # KubeRay appends suffixes to the cluster's pod and service names; a job's RayCluster is its name plus 6 characters.
    cluster_name: Annotated[str, Dns1123(47)] = _env("RAY_CLUSTER_NAME", "name of the RayCluster resource", default="ray-train-cluster")
    nccl_net: Annotated[str | None, Blank(), Shaped(_NCCL_NET, "an NCCL net name such as 'Libfabric'")] = _env(
        "NCCL_NET",
        "pin NCCL's network (e.g. 'Libfabric'), so a missing EFA fails loudly instead of falling back to sockets; empty = not pinned",
        default="Libfabric",
    )
    job_deadline_s: Annotated[int, AtLeast(60, "seconds")] = _env(
        "JOB_DEADLINE_S", "RayJob activeDeadlineSeconds: a cost guardrail for one job", default=4 * 3600,
        le=30 * DAY_S, why="30 days",
    )
    job_name: Annotated[str, Dns1123(40)] = _env(
        "RAY_JOB_NAME", "name of the RayJob resource (`submit --rayjob` applies it to the RayCluster RAY_CLUSTER_NAME)", default="ray-train-job"
    )
    job_ttl_s: NonNegative = _env(
        "JOB_TTL_S", "no effect (kept so configs that set it load): the RayJob runs on the standing RayCluster, "
        "which KubeRay never deletes, so no TTL is rendered", default=600,
        le=30 * DAY_S, why="30 days",
    )
    job_backoff_limit: NonNegative = _env(
        "JOB_BACKOFF_LIMIT", "RayJob backoffLimit: must stay 0; KubeRay retries a job only on a fresh cluster of its own, "
        "and the RayJob runs on the standing RayCluster", default=0,
        le=100, why="each retry starts a fresh cluster",
    )
    submission_mode: Literal["K8sJobMode", "HTTPMode", "SidecarMode"] = _env(
        "JOB_SUBMISSION_MODE", "how KubeRay submits a RayJob: a submitter pod, the operator over HTTP, or a head sidecar",
        default="K8sJobMode",
    )
    operator_namespace: Name = _env(
        "KUBERAY_NAMESPACE", "namespace of the KubeRay operator (admitted by the head's NetworkPolicy)", default="kuberay-operator"
    )


class TrainConfig(_Section):
    """Every knob of a training run: the workers receive exactly this, re-validated on their side."""

    model_id: str = _env(
        "MODEL_ID", "built-in model spec (README: Models), hub id, or local/hub-cache dir with config.json", default="Qwen/Qwen2.5-1.5B",
        flag=Flag("--model", "Built-in spec (random init), hub id or local dir (weights loaded shard by shard)"),
    )
    steps: Count = _env("STEPS", "optimizer steps", default=5, flag=Flag("--steps", "Optimizer steps"))
    seq_len: Count = _env("SEQ_LEN", "tokens per sequence", default=128, flag=Flag("--seq-len", "Tokens per sequence", default="128"))
    batch_size: Count = _env(
        "BATCH_SIZE", "sequences per worker per step (micro-batch)", default=1, flag=Flag("--batch-size", "Sequences per worker per step")
    )
    grad_accum: Annotated[int | Literal["auto"], WholeOrAuto("micro-batches")] = _env(
        "GRAD_ACCUM", "micro-batches per optimizer step; auto = the planner's micro-batch and accumulation on a known GPU cluster (1 elsewhere)", default=1,
        flag=Flag("--grad-accum", "Micro-batches per optimizer step, or auto: the planner's micro-batch and accumulation on a known GPU cluster"),
    )
    grad_sync: Literal["auto", "every", "once", "all-reduce-once"] = _env(
        "GRAD_SYNC", "when accumulated gradients are reduced: every micro-batch, once per step, or (HSDP) all-reduce once; auto = the planner's, else once (FSDP) / all-reduce-once (HSDP)", default="auto",
        flag=Flag("--sync", "Gradient sync with accumulation: every, once, all-reduce-once (HSDP), auto"),
    )
    max_global_batch: Count = _env(
        "MAX_GLOBAL_BATCH", "most tokens per optimizer step GRAD_ACCUM=auto may choose", default=131072,
        flag=Flag("--max-global-batch", "Most tokens per optimizer step the recommendation may use"),
    )
    learning_rate: Annotated[float, Above(0)] = _env("LEARNING_RATE", "AdamW learning rate", default=2e-5, flag=Flag("--lr", "AdamW learning rate"))
    num_workers: NonNegative = _env("NUM_WORKERS", "Ray Train workers; 0 = one per GPU in the cluster", default=0, flag=Flag("--workers", "Ray Train workers"))
    data: Annotated[str | None, Blank(), StorageLocation(also=("hf",))] = _env(  # hf:// refused later, by name (data.sources)
        "DATA", "training data: a prepared dataset (raydlc data prepare), or .jsonl/.parquet/.txt file, dir or s3:// prefix to prepare first; "
        "empty = bundled corpus", default=None,
        flag=Flag("--data", "Prepared dataset, or .jsonl/.parquet/.txt file, dir or s3:// prefix (prepared first)", default="bundled stdlib-docstring corpus",
                  path=True),
    )
    loss_on: Literal["assistant", "all"] = _env(
        "LOSS_ON", "which tokens carry the loss: assistant turns and responses only, or all", default="assistant",
        flag=Flag("--loss-on", "Loss on assistant turns and responses only, or on all tokens: assistant | all"),
    )
    on_bad_record: Literal["fail", "skip"] = _env(
        "ON_BAD_RECORD", "a record that cannot be used stops the preparation (fail) or is counted and left out (skip)", default="fail",
        flag=Flag("--on-bad-record", "A malformed record stops the preparation, or is skipped and counted: fail | skip"),
    )
    chat_template: Literal["model", "default"] = _env(
        "CHAT_TEMPLATE", "conversations rendered with the model tokenizer's chat template where it has one (model), or raydlc's default", default="model",
        flag=Flag("--chat-template", "Render conversations with the model's chat template (when it has one) or the default: model | default"),
    )
    checkpoint_every: NonNegative = _env(
        "CHECKPOINT_EVERY", "steps between sharded checkpoints; 0 = only at the end", default=0,
        flag=Flag("--checkpoint-every", "Steps between checkpoints; 0 = only at the end"),
    )
    checkpoint_keep: NonNegative = _env(
        "CHECKPOINT_KEEP", "checkpoints kept in storage, the newest; older ones are deleted once a newer one is complete; 0 = all", default=2,
    )
    storage_path: Storage = _env(
        "STORAGE_PATH", "checkpoint storage (local dir, s3:// or shared FS); empty = ./raydlc-out", default=None,
        flag=Flag("--out", "Storage for checkpoints, export, metrics", default="./raydlc-out", path=True),
    )
    max_failures: NonNegative = _env(
        "MAX_FAILURES", "worker-group restarts from the last checkpoint", default=1,
        flag=Flag("--max-failures", "Worker-group restarts from the last checkpoint"),
    )
    max_preemptions: Annotated[int, AtLeast(-1, why="-1 = unlimited")] = _env(
        "MAX_PREEMPTIONS", "worker-group restarts after a node drain notice (a Spot reclaim), from the checkpoint taken at the notice; "
        "counted apart from MAX_FAILURES (Ray Train's max_preemption_failures); -1 = unlimited", default=-1,
    )
    sharding: Literal["fsdp", "hsdp", "auto"] = _env(
        "SHARDING", "FSDP over all ranks, HSDP (shard in node), or the planner's choice", default="auto", flag=Flag("--sharding", "fsdp | hsdp | auto")
    )
    warmup_steps: NonNegative = _env(
        "WARMUP_STEPS", "linear learning-rate warm-up steps, then LR_SCHEDULE's decay", default=20,
        flag=Flag("--warmup-steps", "Linear learning-rate warm-up steps"),
    )
    warmup_ratio: Annotated[float | None, AtLeast(0), Below(1)] = _env(
        "WARMUP_RATIO", "warm-up as a share of STEPS (rounded up); set, it replaces WARMUP_STEPS", default=None,
        flag=Flag("--warmup-ratio", "Warm-up as a share of STEPS; replaces --warmup-steps"),
    )
    lr_schedule: Literal["cosine", "linear", "constant"] = _env(
        "LR_SCHEDULE", "learning rate after warm-up: cosine or linear decay to LEARNING_RATE x MIN_LR_RATIO at STEPS, or constant", default="cosine",
        flag=Flag("--lr-schedule", "Learning rate after warm-up: cosine | linear | constant"),
    )
    min_lr_ratio: Annotated[float, AtLeast(0), Below(1, why="1 is LR_SCHEDULE=constant")] = _env(
        "MIN_LR_RATIO", "the decayed learning rate at STEPS, as a share of LEARNING_RATE", default=0.0,
        flag=Flag("--min-lr-ratio", "Final learning rate as a share of --lr"),
    )
    weight_decay: Annotated[float, AtLeast(0)] = _env("WEIGHT_DECAY", "AdamW weight decay", default=0.0)
    max_grad_norm: Annotated[float, Above(0)] = _env("MAX_GRAD_NORM", "clip the global gradient norm to this", default=1.0)
    max_nonfinite_steps: Count = _env(
        "MAX_NONFINITE_STEPS", "steps in a row whose loss or gradient norm is NaN/inf (each skips its update) that stop the run", default=5,
    )
    seed: NonNegative = _env(
        "SEED", "seed of the model init, the data order and the eval split", default=0,
        flag=Flag("--seed", "Seed of the model init, data order and eval split"),
    )
    eval_fraction: Annotated[float, Between(0, 1)] = _env("EVAL_FRACTION", "share of the packed sequences held out for eval (at most 64)", default=0.05)
    eval_every: NonNegative = _env("EVAL_EVERY", "steps between eval losses; 0 = ten times over the run and at each checkpoint (always at the end)", default=0)
    eval_after: bool = _env(
        "EVAL_AFTER", "after training, evaluate the export beside its base (held-out perplexity, generations; raydlc eval) "
        "as a Ray task on one GPU worker; the results go into the summary and the model card", default=False,
        flag=Flag("--eval-after", "Evaluate the export beside its base after training (as raydlc eval does)"),
    )
    report_every: Count = _env("REPORT_EVERY", "steps between ray.train.report calls (each is a barrier)", default=10)
    hsdp_replicas: NonNegative = _env("HSDP_REPLICAS", "HSDP replica groups; 0 = one per node", default=0)
    bf16: MaybeBool = _env(
        "BF16", "bf16 compute with fp32 master weights (the reduction: REDUCE_DTYPE); empty = on GPUs only", default=None,
        flag=Flag("--bf16/--fp32", "Compute dtype", default="bf16 on GPUs, fp32 on CPUs"),
    )
    activation_checkpointing: Annotated[bool | Literal["selective"] | None, CheckpointingMode()] = _env(
        "ACTIVATION_CHECKPOINTING", "recompute decoder blocks in backward: full (true) all of each block, selective its cheap ops and "
        "every other matmul (train.sac), none (false); empty or auto = the planner's choice on a known GPU cluster, none elsewhere", default=None,
        flag=Flag("--activation-checkpointing", "Recompute decoder blocks in backward: none, selective, full or auto", default="the planner's choice on a GPU cluster"),
    )
    loss_chunk: NonNegative = _env(
        "LOSS_CHUNK", "tokens per chunk of the cross-entropy over the vocabulary (the full logits never exist); 0 = all at once", default=1024,
        le=1 << 20, why="a chunk beyond a million tokens is the unchunked loss", flag=Flag("--loss-chunk", "Tokens per chunk of the cross-entropy; 0 = unchunked"),
    )
    document_masking: bool = _env(
        "DOCUMENT_MASKING", "packed blocks attend within each document (causal and same-document mask, positions restarting "
        "per document, no loss on a document's first token): FlexAttention on CUDA with COMPILE, masked SDPA elsewhere; "
        "a dataset prepared before documents were recorded is one document per block", default=True,
        flag=Flag("--document-masking/--no-document-masking", "Attend within each packed document only"),
    )
    reduce_dtype: Literal["auto", "fp32", "bf16"] = _env(
        "REDUCE_DTYPE", "dtype of the gradient reduction (FSDP2's reduce_dtype): bf16 halves its bytes and rounds every sum; "
        "auto = fp32, or bf16 where only bf16 lets a layout fit (the planner's choice on a GPU cluster)", default="auto",
        flag=Flag("--reduce-dtype", "Gradient reduction dtype: auto, fp32 or bf16"),
    )
    lora_rank: NonNegative = _env(
        "LORA_RANK", "LoRA adapter rank; 0 = full fine-tuning. The base is frozen (bf16 with bf16 compute), the adapters "
        "(fp32) alone are trained, checkpointed and exported; an untouched LEARNING_RATE on a cluster becomes 2e-4", default=0,
        le=1024, why="adapters beyond rank 1024 are no longer low-rank",
        flag=Flag("--lora-rank", "LoRA adapter rank on a frozen base; 0 = full fine-tuning"),
    )
    lora_alpha: Annotated[float | None, Blank(), Above(0)] = _env(
        "LORA_ALPHA", "LoRA scaling numerator: the update is (alpha / rank) x B A; empty = 2 x LORA_RANK", default=None,
        le=1e6, why="a scaling beyond a million swamps the base",
        flag=Flag("--lora-alpha", "LoRA alpha (update scaled by alpha / rank)", default="2 x rank"),
    )
    lora_dropout: Annotated[float, AtLeast(0), Below(1, "a dropout of 1 drops every input")] = _env(
        "LORA_DROPOUT", "dropout on the adapters' input (0 <= p < 1)", default=0.0,
        flag=Flag("--lora-dropout", "Dropout on the LoRA adapters' input"),
    )
    lora_targets: Annotated[str | None, Blank(), Shaped(_LORA_TARGETS, "comma-separated projections of q_proj, k_proj, v_proj, o_proj, "
                                                       "gate_proj, up_proj, down_proj")] = _env(
        "LORA_TARGETS", "projections LoRA adapts, comma-separated (q_proj,v_proj); empty = the family's attention and MLP projections "
        "(all seven)", default=None,
    )
    lora_target_regex: Annotated[str | None, Blank(), Pattern()] = _env(
        "LORA_TARGET_REGEX", "instead of LORA_TARGETS: a Python regular expression matched whole (re.fullmatch, as peft matches a "
        "string target_modules) against each linear layer's full name, e.g. .*\\.layers\\.(2[4-9])\\.self_attn\\.(q|v)_proj; "
        "the adapter's target_modules is the pattern", default=None,
    )
    lora_modules_to_save: Annotated[str | None, Blank(), Shaped(_LORA_SAVE, "comma-separated module names such as embed_tokens,lm_head")] = _env(
        "LORA_MODULES_TO_SAVE", "modules trained in full beside the adapters (peft's modules_to_save), comma-separated, e.g. "
        "embed_tokens,lm_head for tokens the base never trained; checkpointed with the adapters and exported as peft saves them; "
        "on a tied model the embedding and the head are one weight, saved under both names", default=None,
    )
    lora_rslora: bool = _env(
        "LORA_RSLORA", "rank-stabilised LoRA: the update scaled by alpha / sqrt(rank) instead of alpha / rank (peft's use_rslora; for rank 64 and above)",
        default=False, flag=Flag("--lora-rslora", "Scale the LoRA update by alpha / sqrt(rank) (rsLoRA)"),
    )
    lora_merge: bool = _env(
        "LORA_MERGE", "with LORA_RANK > 0, export a merged Hugging Face model (W + scaling x B A) beside the adapter", default=True,
        flag=Flag("--merge/--no-merge", "Export the LoRA-merged model beside the adapter"),
    )
    compile: MaybeBool = _env("COMPILE", "torch.compile each decoder block (fullgraph) and the chunked loss; empty = on GPUs only", default=None)
    use_gpu: MaybeBool = _env("USE_GPU", "one GPU per worker; empty = when the Ray cluster has GPUs", default=None)
    run_name: Annotated[str | None, Blank(), FolderName()] = _env(
        "RUN_NAME", "run folder under STORAGE_PATH; empty = run-<UTC time>", default=None,
        flag=Flag("--run-name", "Run folder under --out", default="run-<UTC time>"),
    )
    resume: bool = _env(
        "RESUME", "continue from the newest whole checkpoint under STORAGE_PATH", default=False,
        flag=Flag("--resume", "Continue from the newest whole checkpoint under --out"),
    )
    resume_from: Storage = _env(
        "RESUME_FROM", "continue from this checkpoint directory (path or URI)", default=None,
        flag=Flag("--resume-from", "Continue from this checkpoint directory or URI", path=True),
    )
    overwrite: bool = _env(
        "OVERWRITE", "replace the run already in RUN_NAME's folder (its checkpoints and export go); without it, a run name that "
        "holds a run is refused", default=False,
        flag=Flag("--overwrite", "Replace the run already under --run-name (without it, a name that holds a run is refused)"),
    )
    storage_shared: bool = _env("STORAGE_SHARED", "STORAGE_PATH is a file system every node mounts (EFS, FSx, NFS)", default=False)
    preflight: bool = _env(
        "PREFLIGHT", "measure collective bandwidth on the workers first; stop if it fails", default=False,
        flag=Flag("--preflight", "Measure collective bandwidth on the same workers first; stop if it fails"),
    )
    stall_minutes: Annotated[float, OffOrAtLeast(1, "minute", "a shorter stall limit would end a healthy run between two steps")] = _env(
        "STALL_MINUTES", "stop the run (exit 1, evidence under <run>/stall) when no optimizer step completes for this long; "
        "0 = off, else at least 1; fractions allowed", default=20.0, le=7 * 24 * 60, why="a week",
        flag=Flag("--stall-minutes", "Stop the run, with evidence, when no optimizer step completes for this long; 0 = off"),
    )
    stall_first_minutes: Annotated[float, AtLeast(0, "minutes")] = _env(
        "STALL_FIRST_MINUTES", "the stall allowance of each attempt's first step (weights loading, compilation); "
        "never less than STALL_MINUTES", default=60.0, le=7 * 24 * 60, why="a week",
    )
    max_cost_usd: Annotated[float | None, Blank(), AtLeast(0.01, "dollars")] = _env(
        "JOB_MAX_COST_USD", "dollar budget of one run at the list price of the GPU nodes it occupies: the loop stops cleanly "
        "before it is spent, and a RayJob's activeDeadlineSeconds follows it; empty = no budget", default=None,
        le=1_000_000, why="a million dollars",
        flag=Flag("--max-cost", "Dollar budget at the GPU nodes' list price: stop cleanly (checkpoint, export) before it is spent"),
    )
    tracking: Annotated[str, Shaped(_TRACKING, "a comma list of tensorboard, mlflow, wandb, or none")] = _env(
        "TRACKING", "experiment trackers rank 0 logs to, a comma list of tensorboard (event files under <run>/tb), mlflow, wandb; "
        "none = off. A failing tracker is a warning, never a failed run", default="tensorboard",
        flag=Flag("--tracking", "Experiment trackers: tensorboard, mlflow, wandb (comma list) or none"),
    )
    mlflow_tracking_uri: Annotated[str | None, Blank(), NoUserInfo("MLFLOW_TRACKING_TOKEN")] = _env(
        "MLFLOW_TRACKING_URI", "MLflow's tracking server (http(s)://…), a database (sqlite:///…, with the full mlflow package), "
        "a file store (with MLFLOW_ALLOW_FILE_STORE=true) or a SageMaker managed MLflow ARN (with sagemaker-mlflow); empty = MLflow's default", default=None,
    )
    mlflow_experiment_name: Annotated[str | None, Blank()] = _env(
        "MLFLOW_EXPERIMENT_NAME", "MLflow experiment of the run (created if missing); empty = raydlc", default=None,
    )
    wandb_project: Annotated[str | None, Blank()] = _env("WANDB_PROJECT", "W&B project of the run; empty = raydlc", default=None)
    wandb_entity: Annotated[str | None, Blank()] = _env("WANDB_ENTITY", "W&B entity (team or user); empty = the API key's default", default=None)
    wandb_mode: Literal["online", "offline", "disabled"] = _env(
        "WANDB_MODE", "W&B mode: online (WANDB_API_KEY from the environment or the cluster's Secret), offline (a run directory "
        "under <run>/wandb, `wandb sync` later) or disabled", default="online",
    )

    @property
    def lora_targets_list(self) -> tuple[str, ...]:
        """LORA_TARGETS as names, in order, once each; () = the family's default."""
        return tuple(dict.fromkeys(self.lora_targets.split(","))) if self.lora_targets else ()

    @property
    def lora_modules_to_save_list(self) -> tuple[str, ...]:
        """LORA_MODULES_TO_SAVE as names, in order, once each."""
        return tuple(dict.fromkeys(self.lora_modules_to_save.split(","))) if self.lora_modules_to_save else ()

    def lora_meta(self) -> dict[str, Any]:
        """What a checkpoint of this run must match to be continued under LoRA: the rank (0 = full
        fine-tuning, also what a checkpoint from before LoRA counts as), alpha and targets as resolved."""
        if self.lora_rank == 0:
            return {"lora_rank": 0}
        from raydlc.facts.models import LORA_DEFAULT_TARGETS

        targets = self.lora_targets_list or next(iter(LORA_DEFAULT_TARGETS.values()))  # every family's default is the same seven
        alpha = self.lora_alpha if self.lora_alpha is not None else 2.0 * self.lora_rank
        chosen = {"lora_target_regex": self.lora_target_regex} if self.lora_target_regex else {"lora_targets": ",".join(targets)}
        meta = {"lora_rank": self.lora_rank, "lora_alpha": float(alpha), **chosen}
        meta |= {"lora_modules_to_save": ",".join(self.lora_modules_to_save_list)} if self.lora_modules_to_save else {}  # absent: none
        return meta | ({"lora_rslora": True} if self.lora_rslora else {})  # absent when off: earlier checkpoints still match

    def updated(self, **changes: Any) -> TrainConfig:
        """A copy with `changes` applied and everything validated again (model_copy checks nothing)."""
        return type(self).model_validate({**self.model_dump(), **changes})


SECTIONS: dict[str, type[_Section]] = {
    "cluster": ClusterConfig,
    "system_nodes": SystemNodesConfig,
    "gpu_nodes": GpuNodesConfig,
    "images": ImagesConfig,
    "ray": RayConfig,
    "train": TrainConfig,
}


@dataclass(frozen=True)
class FieldInfo:
    """One leaf of the tree: where it lives, its env.sh name, its default and meaning, its flag."""

    section: str
    key: str
    env: str
    default: Any
    help: str
    annotation: Any = None  # the field's type, as the flag builders read it
    flag: Flag | None = None

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.env


def fields() -> Iterator[FieldInfo]:
    for section, model in SECTIONS.items():
        for key, f in model.model_fields.items():
            extra = f.json_schema_extra or {}
            assert isinstance(extra, dict)
            flag = Flag(**extra["flag"]) if "flag" in extra else None  # type: ignore[arg-type]
            yield FieldInfo(section, key, str(extra["env"]), f.default, f.description or "", f.annotation, flag)


FIELDS: dict[str, FieldInfo] = {f.env: f for f in fields()}
FIELDS_BY_PATH: dict[tuple[str, str], FieldInfo] = {(f.section, f.key): f for f in FIELDS.values()}


class Config(BaseModel):
    """The effective configuration; `sources` says where each value came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: ClusterConfig = ClusterConfig()
    system_nodes: SystemNodesConfig = SystemNodesConfig()
    gpu_nodes: GpuNodesConfig = GpuNodesConfig()
    images: ImagesConfig = ImagesConfig()
    ray: RayConfig = RayConfig()
    train: TrainConfig = TrainConfig()

    _sources: dict[str, str] = PrivateAttr(default_factory=dict)
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    def source(self, env_name: str) -> Source:
        """default / file / env / flag for a field named by its env.sh name."""
        return self._sources.get(env_name, "default")  # type: ignore[return-value]

    def origin(self, env_name: str) -> str:
        """The exact origin, e.g. `env RAYDLC_REGION` or `file ./raydlc.yaml`."""
        return self._origins.get(env_name, "default")

    def value(self, env_name: str) -> Any:
        f = FIELDS[env_name]
        return getattr(getattr(self, f.section), f.key)

    @property
    def gpu_instance(self) -> instances.InstanceType | None:
        return instances.instance_type(self.gpu_nodes.instance_type)

    @property
    def total_gpus(self) -> int:
        return self.gpu_nodes.count * self.gpu_nodes.gpus_per_node

    @property
    def num_workers(self) -> int:
        """Ray Train workers: the configured number, or one per GPU when 0."""
        return self.train.num_workers or self.total_gpus

    def rows(self) -> list[dict[str, Any]]:
        """Every field with its value and provenance, for `config show`."""
        return [
            {
                "name": f.env,
                "env": f.env_var,
                "path": f"{f.section}.{f.key}",
                "value": self.value(f.env),
                "source": self.source(f.env),
                "origin": self.origin(f.env),
            }
            for f in FIELDS.values()
        ]

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def cross_field_problems(cfg: Config) -> list[tuple[str, str]]:
    """Rules that need more than one field; each names the field the user should change."""
    problems: list[tuple[str, str]] = []
    gpu = cfg.gpu_nodes
    if gpu.az is not None and (why := zone_problem(gpu.az, cfg.cluster.region)):
        problems.append(("GPU_AZ", why))
    it = cfg.gpu_instance
    if it is not None:
        if it.gpus == 0:
            problems.append(("GPU_NODE_TYPE", f"{it.name} has no GPUs"))
        elif gpu.gpus_per_node != it.gpus:
            problems.append(
                ("GPUS_PER_NODE", f"{it.name} has {it.gpus} GPUs per node, got {gpu.gpus_per_node}")
            )
        if it.gpus and it.efa_interfaces == 0:
            problems.append(("GPU_NODE_TYPE", f"{it.name} does not support EFA; choose an EFA-capable type"))
    problems += _idle_problems(cfg)
    problems += _attach_problems(cfg)
    facts = images.image_facts(cfg.images.dlc_image)
    if facts is not None and facts.ray != cfg.images.ray_version and not cfg.images.force_ray_version:
        problems.append(
            (
                "RAY_VERSION",
                f"{cfg.images.dlc_image} ships Ray {facts.ray}, got {cfg.images.ray_version} "
                "(set FORCE_RAY_VERSION=true to override)",
            )
        )
    return problems


def _attach_problems(cfg: Config) -> list[tuple[str, str]]:
    """KUBE_CONTEXT and SERVICE_ACCOUNT name things of a cluster raydlc attaches to; without ATTACH they would be
    silently unused (raydlc writes its own kubeconfig and makes its own service accounts)."""
    if cfg.cluster.attach:
        return []
    return [(env, f"is only used with ATTACH=true (raydlc up --attach), got {shown(cfg.value(env))}")
            for env in ("KUBE_CONTEXT", "SERVICE_ACCOUNT") if cfg.value(env) is not None]


def _idle_problems(cfg: Config) -> list[tuple[str, str]]:
    """An idle time shorter than a GPU node takes to come back would trade a short wait for a long one;
    and the Cluster Autoscaler's image must match the control plane's minor version."""
    idle = cfg.gpu_nodes.idle_minutes
    if idle == 0:
        return []
    problems: list[tuple[str, str]] = []
    floor = instances.gpu_node_startup_minutes(cfg.gpu_nodes.instance_type)
    if idle < floor:
        problems.append(("IDLE_MINUTES", f"must be 0 (fixed size) or at least {floor}, got {idle}: a {cfg.gpu_nodes.instance_type} node "
                                         f"takes about {floor} minutes to come back (launch, join, device plugins, the DLC image pull), "
                                         "so a shorter idle time makes every job wait longer than it saves"))
    if images.cluster_autoscaler_image(cfg.cluster.k8s_version) is None:
        known = ", ".join(sorted(images.CLUSTER_AUTOSCALER_IMAGES))
        problems.append(("K8S_VERSION", f"no Cluster Autoscaler release is pinned for Kubernetes {cfg.cluster.k8s_version} "
                                        f"(known: {known}); set IDLE_MINUTES=0 for a fixed-size cluster"))
    return problems


def shared_storage_problem(train: TrainConfig, nodes: int) -> str | None:
    """Why STORAGE_PATH cannot serve `nodes` nodes, or None.

    Every rank uploads its own checkpoint shards and the export lands beside them, so with more
    than one node the storage must be the same on all of them: a remote URI (s3://…), or a path
    on a file system every node mounts, declared with STORAGE_SHARED=true.
    """
    from raydlc.storage import reaches_every_node

    if nodes <= 1 or reaches_every_node(train.storage_path, train.storage_shared):
        return None
    got = repr(train.storage_path) if train.storage_path else "unset (./raydlc-out on each node)"
    return (
        f"{nodes} nodes need storage every node sees: s3://bucket/prefix, or a shared file system path "
        f"with STORAGE_SHARED=true; got {got}"
    )
