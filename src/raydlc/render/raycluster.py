"""RayCluster and RayJob (ray.io/v1) for KubeRay: a CPU-only head and one GPU pod per GPU node.

The head runs on the system node with `num-gpus: "0"` so that Ray never schedules a GPU worker
there, and `NVIDIA_VISIBLE_DEVICES=void` because the node's container runtime would otherwise run
the NVIDIA hook on a GPU-less node and fail the pod. Each worker claims its whole node: every
GPU, every EFA interface, and the CPU and memory left after system reservations
(raydlc.render.sizing), so there is exactly one worker per node and Ray's view of the GPUs
(`num-gpus`) equals the kubelet's.

NCCL's network is pinned by the NCCL_NET setting: aws-ofi-nccl registers itself as "Libfabric"
(after 1.11; 1.11 and older said "AWS Libfabric", a name newer releases still accept, as they do
"OFI"), and when the pinned network cannot initialise NCCL fails instead of quietly using sockets.
The container command is left to KubeRay, which generates `ray start` from rayStartParams.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from raydlc.config import FIELDS, Config, shared_storage_problem
from raydlc.errors import ConfigError, InputError
from raydlc.facts import instances
from raydlc.render import auth, autoscaler, bucket, eksctl, nodes, ownership
from raydlc.render.sizing import SUBMITTER, PodSize, head_size, worker_size

if TYPE_CHECKING:
    from raydlc.discovery.target import WorkerTarget

API_VERSION = "ray.io/v1"
CLUSTER_LABEL = "raydlc.io/cluster"  # on every pod of one Ray cluster; the NetworkPolicy keys on it
HEAD_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001}
LOG_VOLUME = "ray-logs"
LOG_PATH = "/tmp/ray"
WORKER_GROUP = "gpu-workers"
ENTRYPOINT = "python -m raydlc.train"



SECRET_NAME = "raydlc-secrets"  # `raydlc up` fills it from the caller's environment; files only name it
# HF_TOKEN for gated models; the experiment trackers' own variables (train.tracking): MLflow's client reads
# MLFLOW_TRACKING_TOKEN, W&B's WANDB_API_KEY, each from its process's environment.
SECRET_KEYS = ("HF_TOKEN", "MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY")


# A Spot GPU node's reclaim reaches Ray through its pod (GPU_CAPACITY_TYPE spot*). On an EC2 Spot interruption
# notice (two minutes before the instance goes) or a rebalance recommendation, an EKS managed node group cordons
# and drains the node: its pods are evicted, and each runs its preStop hook inside terminationGracePeriodSeconds
# before SIGTERM (EKS User Guide, managed node groups "Capacity types"; Kubernetes "Container hooks"). The GPU
# worker's hook first tells Ray's GCS that this node is going (`ray drain-node` with reason PREEMPTION and the
# reclaim deadline; Ray 2.58 python/ray/scripts/scripts.py: the node defaults to this one, the address to
# RAY_ADDRESS, which KubeRay v1.7.0 sets in every Ray container, common/pod.go), so Ray Train's preemption
# watcher (ray.train.get_preemption_info(), polling GCS's draining nodes) tells the training loop while the node
# still works; the hook then holds the pod for the window the loop has to checkpoint. The kubelet ends the container
# after the hook (SIGTERM, SIGKILL at the grace period's end): no hook stops Ray, as no Ray is ever stopped wholesale.
SPOT_NOTICE_S = 120  # EC2's Spot interruption notice: the instance goes two minutes after it
# Ray Train (2.58) ends the attempt at the deadline: it tears the workers down and restarts them under
# max_preemption_failures. A worker killed before that (the kubelet's SIGTERM after the hook: its node's death reads
# as a failure, not a preemption) would be charged to MAX_FAILURES, so the deadline falls inside the hold.
# `ray drain-node` counts its deadline from when it has started (Ray 2.58 scripts.py: `time.time_ns()` after its
# imports and, with no --node-id, after connecting to find this node), not from the hook's start: its start-up is
# taken off. Measured here (`ray drain-node --help`, this venv, Ray 2.58.0, a loaded 2-core machine): 4.3-4.7 s
# warm, 24 s with a cold page cache; in the pod the Ray node process has already read Ray's files, so the warm
# figure holds, with threefold margin. The hook cannot read the Spot notice's own time (the IMDS
# spot/instance-action needs a token and hop limit 2 from the pod; not assumed), so the margin to the instance's
# end is stated: the hook starts within EKS's reaction to the notice (120 s - SPOT_GRACE_S = 10 s at most, or the
# kubelet's SIGKILL falls after the instance is gone).
DRAIN_CLI_START_S = 15  # what `ray drain-node`'s start-up may take before it counts the deadline
DRAIN_HOLD_S = 100  # the preStop hook keeps the Ray node alive at most this long for the checkpoint, then returns
DRAIN_DEADLINE_S = DRAIN_HOLD_S - DRAIN_CLI_START_S - 5  # what Ray is told: inside the hold, 5 s for Train's poll
# The process title of a Ray Train v2 worker actor (ray.train.v2._internal.execution.worker_group.worker); pgrep -f
# excludes only itself, so a plain pattern would match the hook's own `/bin/sh -c "...pattern..."` forever: the
# bracket makes a regex that cannot match its own text.
TRAIN_WORKER = "ray::RayTrainWorker"
TRAIN_WORKER_PATTERN = "[r]ay::RayTrainWorker"
SPOT_GRACE_S = 110  # the GPU worker pod's terminationGracePeriodSeconds: the hold and the kubelet's SIGTERM, inside the notice
DRAIN_REASON = "DRAIN_NODE_REASON_PREEMPTION"
# The hold ends early once no Ray Train worker runs here (the attempt ended after its checkpoint, or the node was
# idle: Ray's autoscaler removing an idle worker pod need not wait); without pgrep it holds the whole window.
DRAIN_RAY = (f"ray drain-node --reason={DRAIN_REASON} --reason-message='EKS is draining this Spot node' "
             f"--deadline-remaining-seconds={DRAIN_DEADLINE_S} || echo 'raydlc: ray drain-node failed' >&2; "
             f"t=0; while [ $t -lt {DRAIN_HOLD_S} ] && {{ ! command -v pgrep >/dev/null || pgrep -f '{TRAIN_WORKER_PATTERN}' >/dev/null; }}; "
             f"do sleep 1; t=$((t+1)); done")


def _drain_hook() -> dict[str, Any]:
    """The Spot GPU worker's preStop hook: drain, then hold; only Spot nodes get a notice worth a hook."""
    return {"preStop": {"exec": {"command": ["/bin/sh", "-c", DRAIN_RAY]}}}


def _volume_mounts() -> list[dict[str, Any]]:
    return [{"name": LOG_VOLUME, "mountPath": LOG_PATH}]


def _volumes() -> list[dict[str, Any]]:
    return [{"name": LOG_VOLUME, "emptyDir": {}}]


def _env(pairs: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def _secret_env() -> list[dict[str, Any]]:
    """Secrets by reference only: the value lives in a Kubernetes Secret, never in a rendered file."""
    return [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": key, "optional": True}}}
        for key in SECRET_KEYS
    ]


def worker_env(cfg: Config) -> dict[str, str]:
    """EFA/NCCL settings of every GPU pod; a value here is a decision, not a default."""
    env = {"FI_PROVIDER": "efa", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"}
    if cfg.ray.nccl_net:
        env["NCCL_NET"] = cfg.ray.nccl_net
    it = instances.instance_type(cfg.gpu_nodes.instance_type)
    if it is not None and it.gpudirect_rdma:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env


def _identity(cfg: Config, account: str) -> dict[str, Any]:
    """The service account whose pod identity may write the run prefix (raydlc.render.bucket); none without a bucket.
    The head's (`bucket.SERVICE_ACCOUNT`) is also the one KubeRay binds its autoscaler Role to; the workers'
    (`bucket.WORKER_SERVICE_ACCOUNT`) is bound to nothing. Attached, every Ray pod runs as `attached_account`."""
    if cfg.cluster.attach:
        return {"serviceAccountName": attached_account(cfg)}
    return {"serviceAccountName": account} if bucket.bucket_of(cfg) is not None else {}


def attached_account(cfg: Config) -> str:
    """Attached, the Ray pods' ServiceAccount: SERVICE_ACCOUNT (the platform's, with its storage access), else the one
    raydlc makes in NAMESPACE (`bucket.SERVICE_ACCOUNT`, no cloud access: storage then needs credentials of its own)."""
    return cfg.cluster.service_account or bucket.SERVICE_ACCOUNT


def _on_system_node(cfg: Config) -> dict[str, Any]:
    """The RayJob submitter lands on raydlc's system node group; attached, on whatever CPU node the platform's
    scheduler picks (its nodes carry none of raydlc's labels)."""
    return {} if cfg.cluster.attach else {"nodeSelector": nodes.system_labels()}


def _head_group(cfg: Config, instance: str, target: WorkerTarget | None = None) -> dict[str, Any]:
    size = head_size(cfg.system_nodes.instance_type, cfg.total_gpus, autoscaler.enabled(cfg))
    container = {
        "name": "ray-head",
        "image": cfg.images.dlc_image,
        "imagePullPolicy": "IfNotPresent",
        "env": _env({"NVIDIA_VISIBLE_DEVICES": "void", **storage_env(cfg)}) + _secret_env(),
        "ports": [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in HEAD_PORTS.items()],
        "resources": size.resources(),
        "volumeMounts": _volume_mounts(),
    }
    return {
        "serviceType": "ClusterIP",
        # No task or actor lands on the head: it keeps its CPUs for the GCS, the dashboard and the
        # job's driver (Ray Train's controller and the job supervisor ask for 0 CPUs, so they still fit).
        "rayStartParams": {"num-cpus": "0", "num-gpus": "0", "dashboard-host": "0.0.0.0"},
        "template": {
            "metadata": {"labels": {CLUSTER_LABEL: instance}},
            "spec": {
                **_identity(cfg, bucket.SERVICE_ACCOUNT),
                **({} if cfg.cluster.attach else _head_placement(target)),  # attached: no raydlc system node, target or not
                "containers": [container],
                "volumes": _volumes(),
            },
        },
    }


def _head_placement(target: WorkerTarget | None) -> dict[str, Any]:
    """The head on raydlc's system node; on an attached cluster (a target) on any node that takes it, which is
    one without the GPU nodes' taints: the head tolerates none of them."""
    return {"nodeSelector": nodes.system_labels()} if target is None else {}


def _attached_worker(cfg: Config, instance: str, target: WorkerTarget) -> dict[str, Any]:
    """The GPU worker group as the attached cluster can run it (raydlc.discovery.target): the found type's
    selector and taints' tolerations, GPUs per worker = GPUs per node, EFA only where the nodes offer it (and
    NCCL left to pick its transport otherwise: a pinned Libfabric network without EFA fails the job)."""
    from raydlc.discovery.read import base_type

    if target.cpu_m and target.memory_mi:
        size = PodSize(max(target.cpu_m // 1000, 1), max(target.memory_mi // 1024, 1))
    else:
        size = worker_size(base_type(target.instance_type))
    devices = {nodes.GPU_RESOURCE: str(target.gpus)}
    env = {"FI_PROVIDER": "efa"} if target.efa else {}
    env.update({"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"})
    if target.efa:
        devices[nodes.EFA_RESOURCE] = str(target.efa)
        if cfg.ray.nccl_net:
            env["NCCL_NET"] = cfg.ray.nccl_net
    if target.gpudirect_rdma:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    container = {
        "name": "ray-worker",
        "image": cfg.images.dlc_image,
        "imagePullPolicy": "IfNotPresent",
        "env": _env(env) + _secret_env(),
        "resources": size.resources(devices),
        "volumeMounts": _volume_mounts(),
        **({"lifecycle": _drain_hook()} if target.spot else {}),
    }
    spec: dict[str, Any] = {**_identity(cfg, bucket.WORKER_SERVICE_ACCOUNT), "nodeSelector": target.selector(),
                            "containers": [container], "volumes": _volumes()}
    if target.spot:
        spec["terminationGracePeriodSeconds"] = SPOT_GRACE_S
    if target.tolerations:
        spec["tolerations"] = target.toleration_list()
    low = 0 if autoscaler.enabled(cfg) else cfg.gpu_nodes.count
    return {
        "groupName": WORKER_GROUP,
        "replicas": low,
        "minReplicas": low,
        "maxReplicas": cfg.gpu_nodes.count,
        "rayStartParams": {"num-gpus": str(target.gpus)},
        "template": {"metadata": {"labels": {CLUSTER_LABEL: instance}}, "spec": spec},
    }


def _worker_group(cfg: Config, instance: str, target: WorkerTarget | None = None) -> dict[str, Any]:
    if target is not None:
        return _attached_worker(cfg, instance, target)
    gpun = cfg.gpu_nodes
    size = worker_size(gpun.instance_type)
    it = instances.instance_type(gpun.instance_type)
    assert it is not None  # worker_size raised otherwise
    devices = {nodes.GPU_RESOURCE: str(gpun.gpus_per_node), nodes.EFA_RESOURCE: str(it.efa_interfaces)}
    container = {
        "name": "ray-worker",
        "image": cfg.images.dlc_image,
        "imagePullPolicy": "IfNotPresent",
        "env": _env(worker_env(cfg)) + _secret_env(),
        "resources": size.resources(devices),
        "volumeMounts": _volume_mounts(),
        **({"lifecycle": _drain_hook()} if eksctl.spot(cfg) else {}),
    }
    spec: dict[str, Any] = {
        **_identity(cfg, bucket.WORKER_SERVICE_ACCOUNT),
        "nodeSelector": {nodes.ROLE: nodes.GPU_ROLE},
        "containers": [container],
        "volumes": _volumes(),
    }
    if eksctl.spot(cfg):
        spec["terminationGracePeriodSeconds"] = SPOT_GRACE_S
    tolerations = nodes.gpu_tolerations(cfg)
    if tolerations:
        spec["tolerations"] = tolerations
    low = 0 if autoscaler.enabled(cfg) else gpun.count  # Ray's autoscaler asks for workers when a job needs them
    return {
        "groupName": WORKER_GROUP,
        "replicas": low,
        "minReplicas": low,
        "maxReplicas": gpun.count,
        "rayStartParams": {"num-gpus": str(gpun.gpus_per_node)},
        "template": {"metadata": {"labels": {CLUSTER_LABEL: instance}}, "spec": spec},
    }


def cluster_spec(cfg: Config, instance: str, target: WorkerTarget | None = None) -> dict[str, Any]:
    """The RayCluster spec; `instance` names the cluster in the pods' CLUSTER_LABEL; `target` places the workers
    on an attached cluster's GPU capacity (raydlc.discovery.target) instead of raydlc's own node groups."""
    spec: dict[str, Any] = {
        "rayVersion": cfg.images.ray_version,
        "enableInTreeAutoscaling": autoscaler.enabled(cfg),
        "headGroupSpec": _head_group(cfg, instance, target),
        "workerGroupSpecs": [_worker_group(cfg, instance, target)],
    }
    if autoscaler.enabled(cfg):
        spec["autoscalerOptions"] = autoscaler_options(cfg)
    return spec


def autoscaler_options(cfg: Config) -> dict[str, Any]:
    """Ray's autoscaler v2 in the head pod (KubeRay v1.7.0 adds the sidecar and, for `version: v2`, sets
    RAY_enable_autoscaler_v2 on the head itself: common/pod.go `setAutoscalerV2EnvVars`). A worker pod
    that holds no Ray task or actor for IDLE_MINUTES is removed; `Default` upscaling asks for every pod a
    job's placement group needs at once, since a gang-scheduled job cannot start on part of its nodes."""
    return {"version": "v2", "idleTimeoutSeconds": cfg.gpu_nodes.idle_minutes * 60, "upscalingMode": "Default"}


def render_raycluster(cfg: Config, target: WorkerTarget | None = None) -> dict[str, Any]:
    """The RayCluster `up` applies. `upgradeStrategy: Recreate` makes KubeRay (v1.7.0 raycluster_controller.go,
    `shouldRecreatePodsForUpgrade`) delete every pod when the spec's hash (replicas and tolerations muted) no
    longer matches the head pod's, so a changed image or env reaches the pods; without it the old pods run on.
    A RayJob's cluster spec never carries it: KubeRay refuses the field on a RayCluster a RayJob creates."""
    name = cfg.ray.cluster_name
    return {
        "apiVersion": API_VERSION,
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": cfg.cluster.namespace, "labels": {CLUSTER_LABEL: name, **ownership.labels(cfg)}},
        "spec": {**cluster_spec(cfg, name, target), "upgradeStrategy": {"type": "Recreate"},
                 "authOptions": auth.auth_options(cfg)},  # Ray token auth from the Secret `up` creates (render/auth.py)
    }


def job_env(cfg: Config) -> dict[str, str]:
    """The training settings as RAYDLC_* variables: `python -m raydlc.train` loads its Config from them.

    Every train setting whose value differs from its default travels (the job fills the rest
    from the same defaults), plus the resolved worker count; nothing from the caller's
    environment is copied, so no credential can leak into the manifest.
    """
    env: dict[str, str] = {}
    for f in FIELDS.values():
        if f.section != "train":
            continue
        value = getattr(cfg.train, f.key)
        if value is not None and value != f.default:
            env[f.env_var] = str(value).lower() if isinstance(value, bool) else str(value)
    env[FIELDS["NUM_WORKERS"].env_var] = str(cfg.num_workers)
    return env


def cluster_job_env(cfg: Config) -> dict[str, str]:
    """The one place that decides a cluster run's settings, for every path that starts one (the Jobs API's
    `submit --builtin`, the RayJob `render`/`submit --rayjob` write): the config with the cluster defaults
    (`with_cluster_defaults`: SEQ_LEN, GRAD_ACCUM auto, LoRA's rate) resolved, as RAYDLC_* variables.
    USE_GPU left empty is true: a GPU group scaled to zero has no GPU when the job starts, so the job must ask for them."""
    from raydlc.config import with_cluster_defaults

    env = job_env(with_cluster_defaults(cfg))
    if cfg.train.use_gpu is None:
        env[FIELDS["USE_GPU"].env_var] = "true"
    return env


def storage_env(cfg: Config) -> dict[str, str]:
    """Where runs write, on the head (the driver of every job submitted to the cluster)."""
    env: dict[str, str] = {}
    if cfg.train.storage_path:
        env[FIELDS["STORAGE_PATH"].env_var] = cfg.train.storage_path
        if cfg.train.storage_shared:
            env[FIELDS["STORAGE_SHARED"].env_var] = "true"
    return env


def check_storage(cfg: Config) -> None:
    """A job on several GPU nodes needs storage all of them see; refuse to render one that lacks it."""
    problem = shared_storage_problem(cfg.train, cfg.gpu_nodes.count)
    if problem:
        raise ConfigError([f"STORAGE_PATH ({cfg.origin('STORAGE_PATH')}): {problem}"])


def runtime_env(cfg: Config, code_uri: str | None = None) -> dict[str, Any]:
    """Ray's runtime_env for the job; `code_uri` (a zip Ray can fetch) ships raydlc to the cluster.

    It is written as JSON (which is YAML) because KubeRay reads runtimeEnvYAML with a YAML 1.2
    parser: an unquoted `2e-05` would reach Ray as a float, and Ray rejects non-string env_vars.
    The settings are `cluster_job_env`'s, the same `submit --builtin` sends to the cluster.
    """
    from raydlc.facts.trackers import packages

    env: dict[str, Any] = {"env_vars": cluster_job_env(cfg)}
    if code_uri:
        env["py_modules"] = [code_uri]
    if packages(cfg.train.tracking):  # MLflow's and W&B's clients are not in the image: pinned, as `submit` pins
        env["pip"] = packages(cfg.train.tracking)
    return env


def _submitter(cfg: Config, instance: str) -> dict[str, Any]:
    """The K8sJobMode submitter pod, labelled as a pod of the cluster it submits to, so that head's NetworkPolicy admits it."""
    q = {"cpu": f"{SUBMITTER.cpu_m}m", "memory": f"{SUBMITTER.memory_mi // 1024}Gi"}  # counted on the system node
    return {
        "metadata": {"labels": {CLUSTER_LABEL: instance}},
        "spec": {
            "restartPolicy": "Never",
            **_on_system_node(cfg),
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": cfg.images.dlc_image,
                    "imagePullPolicy": "IfNotPresent",
                    "env": _env({"NVIDIA_VISIBLE_DEVICES": "void"}),
                    "resources": {"requests": dict(q), "limits": dict(q)},
                }
            ],
        },
    }


def check_model(cfg: Config) -> None:
    """The job's MODEL_ID must be something the training program can build: a built-in spec, a
    hub id, or a directory whose config.json names a supported architecture (read here, on the
    machine that renders; the job reads the same path on the cluster)."""
    from raydlc.facts.models import spec_for

    try:
        spec_for(cfg.train.model_id)
    except InputError as e:
        raise InputError(f"MODEL_ID ({cfg.origin('MODEL_ID')}): {e.message}", hint=e.hint) from e


CLUSTER_SELECTOR_KEY = "ray.io/cluster"  # KubeRay v1.7.0 utils.RayJobClusterSelectorKey


def check_on_standing_cluster(cfg: Config) -> None:
    """What KubeRay v1.7.0 refuses for a RayJob with a clusterSelector (utils/validation.go ValidateRayJobSpec)."""
    if cfg.ray.submission_mode == "SidecarMode":
        raise ConfigError([f"JOB_SUBMISSION_MODE ({cfg.origin('JOB_SUBMISSION_MODE')}): SidecarMode needs a cluster of the job's "
                           "own; the RayJob runs on the standing RayCluster (K8sJobMode or HTTPMode)"])
    if cfg.ray.job_backoff_limit > 0:
        raise ConfigError([f"JOB_BACKOFF_LIMIT ({cfg.origin('JOB_BACKOFF_LIMIT')}): KubeRay retries a whole job only on a "
                           "fresh cluster of its own; the RayJob runs on the standing RayCluster: use 0"])


def job_deadline(cfg: Config, prices: Mapping[str, float] | None = None) -> int:
    """activeDeadlineSeconds: JOB_DEADLINE_S, or sooner the time JOB_MAX_COST_USD buys at the price
    of the job's GPU nodes (`prices`: USD per instance-hour; by default GPU_USD_PER_HOUR when set, else the list price); a
    budget with no price, or too small for start-up and a step, is refused here, before submission."""
    from raydlc.planner import budget

    usd = cfg.train.max_cost_usd
    if usd is None:
        return cfg.ray.job_deadline_s
    g = cfg.gpu_nodes
    set_price = prices is None and g.usd_per_node_hour is not None  # GPU_USD_PER_HOUR: the price the nodes are bought at
    price = budget.hourly_price(g.instance_type, g.count, budget.prices_at(g.instance_type, g.usd_per_node_hour) if prices is None else prices)
    label = f"GPU_USD_PER_HOUR={g.usd_per_node_hour:g} a node-hour" if set_price else budget.PRICE_LABEL
    budget.check_budget(usd, price, step_s=None, where=f"{g.count} x {g.instance_type}", label=label)
    return budget.job_deadline_s(usd, price, cfg.ray.job_deadline_s)


def price_env(cfg: Config, prices: Mapping[str, float] | None) -> dict[str, str]:
    """RAYDLC_GPU_USD_PER_HOUR (one node's price an hour) when the job's GPU nodes are bought at other than the list
    price (`prices`: raydlc.jobs.submit.run_prices, the Spot price read at submit), so that the training program keeps
    JOB_MAX_COST_USD at that price; nothing at the list price (On-Demand). A price, not a secret."""
    from raydlc.planner import budget

    t = cfg.gpu_nodes.instance_type
    price = None if prices is None else prices.get(t)
    if price is None or price == budget.list_prices().get(t):
        return {}
    return {FIELDS["GPU_USD_PER_HOUR"].env_var: f"{price:g}"}


def render_rayjob(cfg: Config, code_uri: str | None = None, prices: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The RayJob on the RayCluster `up` made (`clusterSelector`): no second head, and KubeRay never deletes that
    cluster when the job ends (rayjob_controller.go skips deletion for a clusterSelector job, so neither
    shutdownAfterJobFinishes nor a TTL is rendered). `code_uri` is raydlc's zip in the bucket (raydlc.render.codezip)."""
    check_storage(cfg)
    check_model(cfg)
    check_on_standing_cluster(cfg)
    deadline = job_deadline(cfg, prices)
    name = cfg.ray.job_name
    env = runtime_env(cfg, code_uri)
    # The job's own driver stops at the deadline too: KubeRay v1.7.0 only marks a clusterSelector RayJob Failed there.
    env["env_vars"][FIELDS["JOB_DEADLINE_S"].env_var] = str(deadline)
    env["env_vars"].update(price_env(cfg, prices))  # a Spot run's budget at the Spot price
    spec: dict[str, Any] = {
        "entrypoint": ENTRYPOINT,
        "runtimeEnvYAML": json.dumps(env, indent=2, sort_keys=True),
        "clusterSelector": {CLUSTER_SELECTOR_KEY: cfg.ray.cluster_name},
        "activeDeadlineSeconds": deadline,
        "submissionMode": cfg.ray.submission_mode,
    }
    if cfg.ray.submission_mode == "K8sJobMode":
        spec["submitterPodTemplate"] = _submitter(cfg, cfg.ray.cluster_name)
    return {
        "apiVersion": API_VERSION,
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": cfg.cluster.namespace, "labels": {CLUSTER_LABEL: name, **ownership.labels(cfg)}},
        "spec": spec,
    }
