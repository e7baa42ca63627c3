"""The one Config tree, layered from defaults, a YAML file, `RAYDLC_*` variables and flags.

The reference keeps every setting in `env.sh`; raydlc keeps that single source and the
per-variable overrides, but checks every value before anything is created. Each leaf field
carries its flat env.sh name (`GPU_NODE_COUNT`), which is also how errors and flags name it,
so one name works in the shell, in the YAML file, in `--set` and in messages.

pydantic-settings' nested env convention (`RAYDLC_GPU_NODES__COUNT`) would break the env.sh
names, so the layering is done here and pydantic only validates the merged result.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from raydlc import catalog
from raydlc.errors import ConfigError

ENV_PREFIX = "RAYDLC_"
DEFAULT_FILE = "raydlc.yaml"
Source = Literal["default", "file", "env", "flag"]

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")
_K8S = re.compile(r"^1\.\d{2}$")


def _env(name: str, help: str, **kw: Any) -> Any:
    return Field(description=help, json_schema_extra={"env": name}, **kw)


def _dns1123(value: str, max_len: int = 63) -> str:
    if not _DNS1123.match(value) or len(value) > max_len:
        raise ValueError(
            f"must be a DNS-1123 name (lowercase letters, digits and '-', starting and ending "
            f"with a letter or digit, at most {max_len} characters), got {value!r}"
        )
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False, frozen=True)


class ClusterConfig(_Section):
    name: str = _env("CLUSTER_NAME", "EKS cluster name", default="eks-cluster")
    region: str = _env("REGION", "AWS region", default="us-east-2")
    k8s_version: str = _env("K8S_VERSION", "Kubernetes version of the EKS control plane", default="1.36")
    ami_family: Literal["AmazonLinux2023", "Bottlerocket"] = _env(
        "NODE_AMI_FAMILY", "AMI family of every node group", default="AmazonLinux2023"
    )
    namespace: str = _env("NAMESPACE", "Kubernetes namespace of the Ray cluster and jobs", default="ray-train")
    kubeconfig: str | None = _env(
        "KUBECONFIG", "kubeconfig raydlc writes for the cluster and uses; empty = ~/.raydlc/<name>-<region>/kubeconfig "
        "(~/.kube/config only when given)", default=None,
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _dns1123(v, 100)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return _dns1123(v)

    @field_validator("kubeconfig", mode="before")
    @classmethod
    def _kubeconfig(cls, v: Any) -> Any:
        return None if v in ("", None) else v

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if not _REGION.match(v):
            raise ValueError(f"must look like an AWS region such as 'us-east-2', got {v!r}")
        return v

    @field_validator("k8s_version")
    @classmethod
    def _k8s(cls, v: Any) -> str:
        v = str(v)
        if not _K8S.match(v):
            raise ValueError(f"must be a Kubernetes minor version such as '1.36', got {v!r}")
        return v


class SystemNodesConfig(_Section):
    instance_type: str = _env("SYSTEM_NODE_TYPE", "instance type of the CPU system node group", default="m7i.xlarge")
    count: int = _env("SYSTEM_NODE_COUNT", "number of system nodes (KubeRay operator, Ray head)", default=1)
    nodegroup_name: str = _env("SYSTEM_NODEGROUP_NAME", "name of the system node group", default="system")
    volume_size_gb: int = _env("SYSTEM_VOLUME_SIZE", "root volume of each system node, GiB", default=80)

    @field_validator("count")
    @classmethod
    def _count(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1, got {v}")
        return v

    @field_validator("nodegroup_name")
    @classmethod
    def _ng(cls, v: str) -> str:
        return _dns1123(v)

    @field_validator("volume_size_gb")
    @classmethod
    def _vol(cls, v: int) -> int:
        if v < 20:
            raise ValueError(f"must be at least 20 GiB, got {v}")
        return v


class GpuNodesConfig(_Section):
    instance_type: str = _env("GPU_NODE_TYPE", "instance type of the EFA GPU node group", default="g6.12xlarge")
    count: int = _env("GPU_NODE_COUNT", "number of GPU nodes", default=2)
    gpus_per_node: int = _env("GPUS_PER_NODE", "GPUs on each GPU node; must match the instance type", default=4)
    nodegroup_name: str = _env("GPU_NODEGROUP_NAME", "name of the GPU node group", default="gpu-workers")
    az: str | None = _env(
        "GPU_AZ", "the one Availability Zone of the GPU nodes (EFA cannot cross AZs); empty = discover",
        default=None,
    )
    volume_size_gb: int = _env("GPU_VOLUME_SIZE", "root volume of each GPU node, GiB (the DLC image is large)", default=200)
    taint: bool = _env("GPU_TAINT", "taint GPU nodes so only pods that tolerate it land there", default=True)

    @field_validator("count", "gpus_per_node")
    @classmethod
    def _count(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1, got {v}")
        return v

    @field_validator("nodegroup_name")
    @classmethod
    def _ng(cls, v: str) -> str:
        return _dns1123(v)

    @field_validator("az", mode="before")
    @classmethod
    def _az(cls, v: Any) -> Any:
        return None if v in ("", None) else v

    @field_validator("volume_size_gb")
    @classmethod
    def _vol(cls, v: int) -> int:
        if v < 50:
            raise ValueError(f"must be at least 50 GiB (the DLC image alone is tens of GiB), got {v}")
        return v


class ImagesConfig(_Section):
    dlc_image: str = _env("DLC_IMAGE", "the AWS Ray Train DLC image every Ray pod runs", default=catalog.DEFAULT_IMAGE)
    ray_version: str = _env("RAY_VERSION", "Ray version inside the image (KubeRay's rayVersion)", default="2.58.0")
    force_ray_version: bool = _env(
        "FORCE_RAY_VERSION", "accept a RAY_VERSION that differs from the image's known Ray", default=False
    )
    kuberay_version: str = _env("KUBERAY_VERSION", "KubeRay operator chart version", default="1.7.0")
    nvidia_device_plugin_version: str = _env(
        "NVIDIA_DEVICE_PLUGIN_VERSION", "NVIDIA device plugin chart version", default="0.20.0"
    )
    efa_device_plugin_version: str = _env(
        "EFA_DEVICE_PLUGIN_VERSION", "EFA device plugin chart version", default="v0.5.32"
    )


class RayConfig(_Section):
    cluster_name: str = _env("RAY_CLUSTER_NAME", "name of the RayCluster resource", default="ray-train-cluster")
    nccl_net: str | None = _env(
        "NCCL_NET",
        "pin NCCL's network (e.g. 'Libfabric'), so a missing EFA fails loudly instead of falling back to sockets; empty = not pinned",
        default="Libfabric",
    )
    job_deadline_s: int = _env(
        "JOB_DEADLINE_S", "RayJob activeDeadlineSeconds: a cost guardrail for one job", default=4 * 3600
    )
    job_name: str = _env("RAY_JOB_NAME", "name of the RayJob resource (its cluster is named after it)", default="ray-train-job")
    job_ttl_s: int = _env(
        "JOB_TTL_S", "RayJob ttlSecondsAfterFinished: how long a finished job's cluster stays for logs", default=600
    )
    job_backoff_limit: int = _env(
        "JOB_BACKOFF_LIMIT", "RayJob backoffLimit: whole-job retries, each on a fresh cluster", default=0
    )
    submission_mode: Literal["K8sJobMode", "HTTPMode", "SidecarMode"] = _env(
        "JOB_SUBMISSION_MODE", "how KubeRay submits a RayJob: a submitter pod, the operator over HTTP, or a head sidecar",
        default="K8sJobMode",
    )
    operator_namespace: str = _env(
        "KUBERAY_NAMESPACE", "namespace of the KubeRay operator (admitted by the head's NetworkPolicy)", default="kuberay-operator"
    )

    @field_validator("cluster_name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _dns1123(v, 47)  # KubeRay appends suffixes to pod and service names

    @field_validator("job_name")
    @classmethod
    def _job_name(cls, v: str) -> str:
        return _dns1123(v, 40)  # the job's RayCluster is this name plus a 6-character suffix

    @field_validator("operator_namespace")
    @classmethod
    def _op_ns(cls, v: str) -> str:
        return _dns1123(v)

    @field_validator("job_ttl_s", "job_backoff_limit")
    @classmethod
    def _non_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"must be 0 or more, got {v}")
        return v

    @field_validator("nccl_net", mode="before")
    @classmethod
    def _net(cls, v: Any) -> Any:
        return None if v in ("", None) else v

    @field_validator("job_deadline_s")
    @classmethod
    def _deadline(cls, v: int) -> int:
        if v < 60:
            raise ValueError(f"must be at least 60 seconds, got {v}")
        return v


class TrainConfig(_Section):
    model_id: str = _env("MODEL_ID", "model spec (tiny, qwen2.5-0.5b, qwen2.5-1.5b), hub id or local dir", default="Qwen/Qwen2.5-1.5B")
    steps: int = _env("STEPS", "optimizer steps", default=5)
    seq_len: int = _env("SEQ_LEN", "tokens per sequence", default=128)
    batch_size: int = _env("BATCH_SIZE", "sequences per worker per step (micro-batch)", default=1)
    learning_rate: float = _env("LEARNING_RATE", "AdamW learning rate", default=2e-5)
    num_workers: int = _env("NUM_WORKERS", "Ray Train workers; 0 = one per GPU in the cluster", default=0)
    data: str | None = _env("DATA", "training data: .txt/.jsonl file or dir, or a dataset id; empty = bundled corpus", default=None)
    checkpoint_every: int = _env("CHECKPOINT_EVERY", "steps between sharded checkpoints; 0 = only at the end", default=0)
    storage_path: str | None = _env("STORAGE_PATH", "checkpoint storage (local dir, s3:// or shared FS); empty = per-run default", default=None)
    max_failures: int = _env("MAX_FAILURES", "worker-group restarts from the last checkpoint", default=1)
    sharding: Literal["fsdp", "hsdp", "auto"] = _env("SHARDING", "FSDP over all ranks, HSDP (shard in node), or the planner's choice", default="auto")

    @field_validator("steps", "seq_len", "batch_size")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"must be at least 1, got {v}")
        return v

    @field_validator("num_workers", "checkpoint_every", "max_failures")
    @classmethod
    def _non_negative(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"must be 0 or more, got {v}")
        return v

    @field_validator("learning_rate")
    @classmethod
    def _lr(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"must be greater than 0, got {v}")
        return v

    @field_validator("data", "storage_path", mode="before")
    @classmethod
    def _empty(cls, v: Any) -> Any:
        return None if v in ("", None) else v


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
    """One leaf of the tree: where it lives, its env.sh name, its default and meaning."""

    section: str
    key: str
    env: str
    default: Any
    help: str

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.env


def fields() -> Iterator[FieldInfo]:
    for section, model in SECTIONS.items():
        for key, f in model.model_fields.items():
            extra = f.json_schema_extra or {}
            assert isinstance(extra, dict)
            yield FieldInfo(section, key, str(extra["env"]), f.default, f.description or "")


FIELDS: dict[str, FieldInfo] = {f.env: f for f in fields()}
_BY_PATH: dict[tuple[str, str], FieldInfo] = {(f.section, f.key): f for f in FIELDS.values()}


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
    def gpu_instance(self) -> catalog.InstanceType | None:
        return catalog.instance_type(self.gpu_nodes.instance_type)

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


def _cross_field_problems(cfg: Config) -> list[tuple[str, str]]:
    """Rules that need more than one field; each names the field the user should change."""
    problems: list[tuple[str, str]] = []
    gpu = cfg.gpu_nodes
    az = gpu.az
    if az is not None:
        if not re.fullmatch(r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d[a-z]", az):
            problems.append(("GPU_AZ", f"must be an Availability Zone name such as '{cfg.cluster.region}a', got {az!r}"))
        elif not (az.startswith(cfg.cluster.region) and len(az) == len(cfg.cluster.region) + 1):
            problems.append(("GPU_AZ", f"{az!r} is not in region {cfg.cluster.region!r} (REGION)"))
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
    facts = catalog.image_facts(cfg.images.dlc_image)
    if facts is not None and facts.ray != cfg.images.ray_version and not cfg.images.force_ray_version:
        problems.append(
            (
                "RAY_VERSION",
                f"{cfg.images.dlc_image} ships Ray {facts.ray}, got {cfg.images.ray_version} "
                "(set FORCE_RAY_VERSION=true to override)",
            )
        )
    return problems


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError([f"config file {path}: cannot read it ({e.strerror or e})"]) from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([f"config file {path}: not valid YAML ({e})"]) from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"config file {path}: must be a mapping of sections, got {type(data).__name__}"])
    return data


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Config:
    """Layer default < file < env < flags, then validate everything at once.

    `overrides` are flags keyed by env.sh name (`{"GPU_NODE_COUNT": 3}`). The file is
    `path`, else `$RAYDLC_CONFIG`, else `./raydlc.yaml` when it exists. Nothing is written
    and nothing is called: a bad value stops here with every problem listed.
    """
    env = os.environ if env is None else env
    raw: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    sources: dict[str, str] = {}
    origins: dict[str, str] = {}
    problems: list[str] = []

    file_path: Path | None = None
    if path is not None:
        file_path = Path(path)
        if not file_path.exists():
            raise ConfigError([f"config file {file_path} does not exist"])
    elif env.get(ENV_PREFIX + "CONFIG"):
        file_path = Path(env[ENV_PREFIX + "CONFIG"])
        if not file_path.exists():
            raise ConfigError([f"config file {file_path} (from RAYDLC_CONFIG) does not exist"])
    else:
        candidate = Path(cwd or ".") / DEFAULT_FILE
        file_path = candidate if candidate.exists() else None

    if file_path is not None:
        data = _read_file(file_path)
        for section, values in data.items():
            if section not in SECTIONS:
                problems.append(
                    f"{section} (file {file_path}): unknown section; expected one of {', '.join(SECTIONS)}"
                )
                continue
            if values is None:
                continue
            if not isinstance(values, dict):
                problems.append(f"{section} (file {file_path}): must be a mapping of fields")
                continue
            for key, value in values.items():
                info = _BY_PATH.get((section, key))
                if info is None:
                    known = ", ".join(SECTIONS[section].model_fields)
                    problems.append(f"{section}.{key} (file {file_path}): unknown field; {section} has {known}")
                    continue
                raw[section][key] = value
                sources[info.env] = "file"
                origins[info.env] = f"file {file_path}"

    for info in FIELDS.values():
        if info.env_var in env:
            raw[info.section][info.key] = env[info.env_var].strip()
            sources[info.env] = "env"
            origins[info.env] = f"env {info.env_var}"

    for name, value in (overrides or {}).items():
        if value is None:
            continue
        info = FIELDS.get(name.upper())
        if info is None:
            problems.append(f"{name} (flag): unknown setting; see `raydlc config show` for the names")
            continue
        raw[info.section][info.key] = value
        sources[info.env] = "flag"
        origins[info.env] = "flag"

    if problems:
        raise ConfigError(problems)

    def where(env_name: str) -> str:
        return origins.get(env_name, "default")

    sections: dict[str, Any] = {}
    for section, model in SECTIONS.items():
        try:
            sections[section] = model(**raw[section])
        except ValidationError as e:
            for err in e.errors():
                key = str(err["loc"][0]) if err["loc"] else ""
                info = _BY_PATH.get((section, key))
                label = info.env if info else f"{section}.{key}"
                msg = err["msg"].removeprefix("Value error, ")
                if err["type"] not in ("value_error",) and "input" in err:
                    msg = f"{msg}, got {err['input']!r}"
                problems.append(f"{label} ({where(label)}): {msg}")
    if problems:
        raise ConfigError(problems)

    cfg = Config(**sections)
    cfg._sources.update(sources)
    cfg._origins.update(origins)
    cross = [f"{name} ({where(name)}): {msg}" for name, msg in _cross_field_problems(cfg)]
    if cross:
        raise ConfigError(cross)
    return cfg


def parse_assignments(items: list[str] | None) -> dict[str, str]:
    """`--set NAME=VALUE` flags into overrides; NAME is the env.sh name, with or without RAYDLC_."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError([f"--set {item!r}: expected NAME=VALUE, e.g. --set GPU_NODE_COUNT=4"])
        out[name.strip().upper().removeprefix(ENV_PREFIX)] = value
    return out


def render_yaml_template() -> str:
    """A commented raydlc.yaml with every field at its default, for `config init`."""
    lines = [
        "# raydlc configuration. Precedence: flag > RAYDLC_* environment > this file > default.",
        "# Every field can be overridden by the environment variable named in its comment.",
        "",
    ]
    for section in SECTIONS:
        lines.append(f"{section}:")
        for info in (f for f in FIELDS.values() if f.section == section):
            lines.append(f"  # {info.help} [{info.env_var}]")
            value = yaml.safe_dump({info.key: info.default}, default_flow_style=False).strip()
            lines.append(f"  {value}")
        lines.append("")
    return "\n".join(lines)
