"""The `plan` use cases: the memory, traffic and speed of a fine-tune before paying for GPUs, and
the scale-out scan over node counts, as `raydlc plan` (and `--scan-nodes`) compute them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydlc.api._config import load
from raydlc.config import Flag, flags, with_cluster_defaults
from raydlc.planner import TrainingPlan
from raydlc.planner.scan import Scan

if TYPE_CHECKING:
    from raydlc import planner

# The settings `plan` takes, named as its flags: the planner's words where they are not training's.
OPTIONS = [
    flags.option("MODEL_ID", Flag("--model", "Built-in spec (qwen2.5-0.5b…72b, llama-3.2-1b…llama-3.3-70b, tiny), its hub id, or a dir with config.json")),
    flags.option("GPU_NODE_COUNT", Flag("--nodes", "GPU nodes")),
    flags.option("SEQ_LEN"),
    flags.option("BATCH_SIZE", Flag("--micro-batch", "Sequences per GPU per micro-batch")),
    flags.option("GRAD_ACCUM", Flag("--grad-accum", "Micro-batches per optimizer step, or auto: the figures of the recommended layout")),
    flags.option("GRAD_SYNC"),
    flags.option("MAX_GLOBAL_BATCH"),
    flags.option("LOSS_CHUNK"),
    flags.option("REDUCE_DTYPE"),
    flags.option("LORA_RANK", Flag("--lora-rank", "LoRA adapter rank on a frozen bf16 base; 0 = full fine-tuning")),
    flags.option("LORA_TARGETS", Flag("--lora-targets", "Projections LoRA adapts, comma-separated; default: the family's attention and MLP projections")),
    flags.option("GPU_NODE_TYPE", Flag("--instance-type", "GPU instance type whose catalogue facts to plan with")),
]
SEARCHED = ("micro_batch", "grad_accum", "sync")  # the step a scan searches: settings only, no arguments of `scan`
# What `plan` may turn on when nothing fits (raydlc.planner.REMEDIES), unless the caller set it.
FREE = {"loss_chunk": "LOSS_CHUNK", "activation_checkpointing": "ACTIVATION_CHECKPOINTING", "reduce_dtype": "REDUCE_DTYPE"}
PLAN_SPOT_UNKNOWN = "plan calls no AWS API; `raydlc capacity` and `raydlc status` read it live"
GPUS_PER_NODE_MAX = 16  # no EC2 instance type has more (GPUS_PER_NODE's bound)


@dataclass(frozen=True)
class PlanResult(TrainingPlan):
    """The planner's `TrainingPlan`, printed as `raydlc plan` shows it; `to_dict()` is `raydlc plan --json`.
    `prices`: the GPU nodes' On-Demand list price beside Spot (raydlc.capacity.prices; plan reads no AWS API, so
    the Spot price is unknown here and `raydlc capacity`/`status` read it live)."""

    prices: dict[str, Any] | None = None
    asked: dict[str, Any] | None = None  # what the caller set (None: left to the planner), beside the figures' layout

    def __str__(self) -> str:
        from raydlc.views.plan import print_plan
        from raydlc.views.text import rendered

        return rendered(lambda console: print_plan(self, console))


@dataclass(frozen=True)
class ScanResult(Scan):
    """The scale-out `Scan` and the plot written, if any; `to_dict()` is `raydlc plan --scan-nodes … --json`."""

    plot: str | None = None

    def __str__(self) -> str:
        from raydlc.views.scan import print_scan
        from raydlc.views.text import rendered

        return rendered(lambda console: print_scan(self, console))


def _inputs(
    config: str | os.PathLike[str] | None, settings: Mapping[str, Any] | None, arguments: Mapping[str, Any], gpus_per_node: int | None
) -> tuple[Any, Any, int, set[str]]:
    """The config with the plan's settings layered in, the model's spec, the GPUs per node to plan with,
    and the settings the caller gave (what the plan may not change to make a layout fit).

    `arguments` are the use case's own (its `locals()`): the ones named like OPTIONS are settings.

    A known `instance_type` brings its GPU count (so GPUS_PER_NODE matches it); `gpus_per_node`
    is a what-if that bypasses the config's cross-field rule.
    """
    from raydlc.errors import InputError
    from raydlc.facts import instances
    from raydlc.facts.models import get_spec

    if gpus_per_node is not None and gpus_per_node > GPUS_PER_NODE_MAX:
        raise InputError(f"--gpus-per-node must be at most {GPUS_PER_NODE_MAX} (no EC2 instance type has more), got {gpus_per_node}")
    given = flags.named_settings(OPTIONS, {o.keyword: arguments.get(o.keyword) for o in OPTIONS}, caller="plan")
    known = instances.instance_type(given["GPU_NODE_TYPE"]) if given.get("GPU_NODE_TYPE") else None
    # A plan is of a cluster run: the cluster's defaults (GRAD_ACCUM=auto, SEQ_LEN 2048), as `submit --builtin` ships them.
    cfg = with_cluster_defaults(load(config, settings, **given, GPUS_PER_NODE=known.gpus if known else None))
    gpn = cfg.gpu_nodes.gpus_per_node if gpus_per_node is None else gpus_per_node
    return cfg, get_spec(cfg.train.model_id), gpn, set(given) | set(settings or {})


def _reduce(setting: str) -> str:
    """REDUCE_DTYPE as the planner takes it: `auto` starts at fp32 (bf16 is a remedy `plan` turns on only when nothing fits)."""
    return "fp32" if setting == "auto" else setting


def _lora_targets(spec: Any, t: Any) -> tuple[str, ...]:
    """The planner counts LoRA per projection in every block: a LORA_TARGET_REGEX that picks some blocks is counted as
    all of them (an upper bound on the adapters' bytes)."""
    from raydlc.facts.models import lora_targets_of

    return lora_targets_of(spec, t.lora_targets_list, t.lora_target_regex) if t.lora_target_regex and t.lora_rank else t.lora_targets_list


def _saved(spec: Any, t: Any) -> int:
    from raydlc.facts.models import saved_params

    return saved_params(spec, t.lora_modules_to_save_list) if t.lora_rank else 0


def _workload(cfg: Any, spec: Any, policy: str, activation_checkpointing: bool | str, given: set[str]) -> planner.Workload:
    """The planner's workload of the settings; REDUCE_DTYPE left at its default means the policy's own
    reduction (pure-bf16 reduces in its bf16 parameters' dtype, as FSDP2 does without a policy)."""
    from raydlc import planner

    t = cfg.train
    return planner.Workload(
        spec, seq_len=t.seq_len, micro_batch=t.batch_size, grad_accum=t.grad_accum, sync=t.grad_sync, policy=policy,
        activation_checkpointing=activation_checkpointing, max_global_batch=t.max_global_batch,
        loss_chunk=t.loss_chunk, reduce_dtype=_reduce(t.reduce_dtype) if policy != "pure-bf16" or "REDUCE_DTYPE" in given else None,
        compile=planner.planned_compile(t.compile), lora_rank=t.lora_rank, lora_targets=_lora_targets(spec, t), lora_saved_params=_saved(spec, t), lora_dropout=t.lora_dropout,
    )


def plan(
    *,
    model: str | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | None = None,
    network_gbps: float | None = None,
    seq_len: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | str | None = None,
    sync: str | None = None,
    max_global_batch: int | None = None,
    loss_chunk: int | None = None,
    reduce_dtype: str | None = None,
    lora_rank: int | None = None,
    lora_targets: str | None = None,
    policy: str = "bf16-mixed",
    strategy: str | None = None,
    activation_checkpointing: bool | None = None,
    instance_type: str | None = None,
    config: str | os.PathLike[str] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> PlanResult:
    """Per-GPU memory, per-step traffic, step time and tokens/s for FSDP and HSDP, and the fastest layout that fits.

    Unset arguments come from the configuration (`MODEL_ID`, `GPU_NODE_COUNT`, `GPU_NODE_TYPE`,
    `SEQ_LEN`, `BATCH_SIZE`, `LOSS_CHUNK`, `REDUCE_DTYPE`, `LORA_RANK`, …); `gpu`, `network_gbps` and `gpus_per_node` are what-ifs on the
    instance type's facts. `grad_accum="auto"` shows the recommended layout's figures. When
    nothing fits as given, the recommendation turns on the chunked loss, activation
    checkpointing and then bf16 reduction, those the caller did not set, and names them (`needs`).
    Pure arithmetic: nothing is called, nothing is written.

    Example:
        >>> import raydlc.api as api
        >>> p = api.plan(model="qwen2.5-1.5b", nodes=2, gpus_per_node=4)
        >>> p.params, p.layout["gpu_name"], p.recommendation["strategy"] in ("fsdp", "hsdp")
        (1543714304, 'L4', True)
        >>> print(p)  # doctest: +ELLIPSIS
        qwen2.5-1.5b (1,543,714,304 parameters), bf16-mixed, 2 x 4 L4 (24.05 GB), 40 Gb/s EFA, ...
        ...
        recommended: ...
    """
    from raydlc import planner

    cfg, spec, gpn, given = _inputs(config, settings, locals(), gpus_per_node)
    layout = planner.layout_for(cfg.gpu_nodes.count, gpn, gpu=gpu, instance_type=cfg.gpu_nodes.instance_type, network_gbps=network_gbps)
    ac = activation_checkpointing if activation_checkpointing is not None else cfg.train.activation_checkpointing
    free = tuple(n for n, env in FREE.items() if (env not in given or (n == "reduce_dtype" and cfg.train.reduce_dtype == "auto"))
                 and (n != "activation_checkpointing" or ac is None))
    work = _workload(cfg, spec, policy, ac or False, given)
    result = planner.plan(work, layout, strategy=strategy, free=free)
    from raydlc.capacity.prices import gpu_prices

    prices = gpu_prices(cfg, cfg.gpu_nodes.az, None, unknown=PLAN_SPOT_UNKNOWN).to_dict()
    t = cfg.train
    asked = {"micro_batch": t.batch_size if "BATCH_SIZE" in given or t.grad_accum != "auto" else None,
             "grad_accum": None if t.grad_accum == "auto" else t.grad_accum, "activation_checkpointing": ac}
    return PlanResult(**{f.name: getattr(result, f.name) for f in fields(TrainingPlan)}, prices=prices, asked=asked)


def scan(
    scan_nodes: str | Sequence[int],
    *,
    model: str | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | None = None,
    network_gbps: float | None = None,
    seq_len: int | None = None,
    max_global_batch: int | None = None,
    loss_chunk: int | None = None,
    reduce_dtype: str | None = None,
    lora_rank: int | None = None,
    lora_targets: str | None = None,
    policy: str = "bf16-mixed",
    activation_checkpointing: bool | None = None,
    instance_type: str | None = None,
    plot: str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> ScanResult:
    """Where adding nodes stops paying: the recommended layout, tokens/s and scaling efficiency at each node count.

    `scan_nodes` is `"1,2,4,8"` (as `--scan-nodes`) or a list of counts. Each count chooses
    activation checkpointing unless `activation_checkpointing` pins it. `plot` writes a PNG of
    tokens/s and efficiency against nodes (whole or not at all). The other arguments are `plan`'s;
    the step (micro-batch, accumulation, sync) is what the scan searches, so it takes none (as
    settings they are still checked).

    Example:
        >>> import raydlc.api as api
        >>> s = api.scan("1,2,4", model="qwen2.5-1.5b", instance_type="p5.48xlarge")
        >>> [r.nodes for r in s.rows], s.reference_nodes, s.rows[0].efficiency
        ([1, 2, 4], 1, 1.0)
    """
    from raydlc import planner
    from raydlc.planner import scan

    text = scan_nodes if isinstance(scan_nodes, str) else ",".join(str(n) for n in scan_nodes)
    cfg, spec, gpn, given = _inputs(config, settings, locals(), gpus_per_node)
    counts = scan.parse_node_counts(text)
    path = Path(plot) if plot is not None else None
    if path is not None:
        from raydlc.edges.files import check_output_file

        check_output_file(path, "--plot", force=True)
    work = _workload(cfg, spec, policy, False, given)

    def layout_at(n: int) -> planner.Layout:
        return planner.layout_for(n, gpn, gpu=gpu, instance_type=cfg.gpu_nodes.instance_type, network_gbps=network_gbps)

    found = scan.scan(work, counts, layout_at, activation_checkpointing=activation_checkpointing)
    result = ScanResult(**{f.name: getattr(found, f.name) for f in fields(Scan)}, plot=str(path) if path else None)
    if path is not None:
        from raydlc.views.scan import plot_scan

        plot_scan(result, path)
    return result
