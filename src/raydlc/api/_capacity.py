"""`raydlc capacity` as a function: which Availability Zone can take the GPU nodes, read from AWS."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from raydlc.api._config import load

if TYPE_CHECKING:
    from raydlc.capacity import CapacityReport


def capacity(
    *,
    region: str | None = None,
    instance_type: str | None = None,
    count: int | None = None,
    probe: bool = False,
    config: str | os.PathLike[str] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> CapacityReport:
    """Rank the region's AZs for the GPU nodes: offerings, On-Demand quota, Spot score, subnets.

    `region`, `instance_type` and `count` stand for REGION, GPU_NODE_TYPE and GPU_NODE_COUNT;
    an instance type raydlc knows also sets GPUS_PER_NODE unless the configuration sets it.
    `probe` reserves the nodes in the best AZ for an instant, then cancels (a real, billed
    request on AWS). `best_zone` is None when no AZ can take the nodes. Credentials and the
    endpoint are boto3's own (AWS_PROFILE, AWS_ENDPOINT_URL, ...). The test suite runs the
    example below with AWS_ENDPOINT_URL pointing at a local moto server and fake credentials;
    moto has no Service Quotas, so the quota is then reported unknown, not guessed.

    Example:
        import raydlc.api as api

        report = api.capacity(region="us-west-2", instance_type="g6.12xlarge", count=2)
        print(report.region, report.best_zone, [(z.zone, z.verdict) for z in report.zones][:3])
    """
    from raydlc import capacity as cap

    flags: dict[str, Any] = {"REGION": region, "GPU_NODE_TYPE": instance_type, "GPU_NODE_COUNT": count}
    gpus = _catalog_gpus(config, settings, instance_type)
    if gpus is not None:
        flags["GPUS_PER_NODE"] = gpus
    from raydlc.edges import aws

    cfg = load(config, settings, **flags)
    with aws.command_budget("capacity"):
        return cap.discover(cfg, with_probe=probe)


def _catalog_gpus(config: str | os.PathLike[str] | None, settings: Mapping[str, Any] | None, instance_type: str | None) -> int | None:
    """GPUS_PER_NODE for an instance type raydlc knows, unless the configuration sets GPUS_PER_NODE."""
    from raydlc.errors import ConfigError
    from raydlc.facts import instances

    known = instances.instance_type(instance_type) if instance_type else None
    if known is None or known.gpus == 0:
        return None
    try:
        current = load(config, settings)
    except ConfigError:
        return known.gpus  # the final load reports whatever is still wrong
    return None if current.source("GPUS_PER_NODE") != "default" else known.gpus
