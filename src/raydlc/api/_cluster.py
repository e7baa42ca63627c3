"""The cluster's use cases: `up`, `down`, `status` — the same work as `raydlc up|down|status`.

Each loads the configuration the CLI's way (`config`, `settings`, then the named arguments) and
runs the lifecycle's order over its resources; progress goes to an optional `reporter` (a
`raydlc.api.Reporter`: started / acting / line / finished, called from the steps' threads).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from raydlc.api._config import load
from raydlc.edges import aws

if TYPE_CHECKING:
    from raydlc.lifecycle.cluster_status import ClusterStatus
    from raydlc.lifecycle.types import Reporter, Run

PathLike = str | os.PathLike[str]


def _kubeconfig(path: PathLike | None) -> str | None:
    return os.fspath(path) if path is not None else None


def _check_kubeconfig_target(cfg: Any) -> None:
    """Where `up` will write the kubeconfig the user named: a file or nothing yet, under a directory."""
    from pathlib import Path

    from raydlc.errors import InputError

    if not cfg.cluster.kubeconfig:
        return
    p = Path(cfg.cluster.kubeconfig).expanduser()
    if p.is_dir():
        raise InputError(f"--kubeconfig {p} is a directory: raydlc writes the cluster's kubeconfig into a file", hint=f"raydlc up --kubeconfig {p / 'kubeconfig'}")
    parent = next((a for a in p.parents if a.exists()), None)
    if parent is not None and not parent.is_dir():
        raise InputError(f"--kubeconfig {p}: {parent} is a file, not a directory", hint="raydlc up --kubeconfig ~/.kube/raydlc-cluster")


def up(
    *, config: PathLike | None = None, settings: Mapping[str, Any] | None = None, only: str | None = None,
    from_: str | None = None, until: str | None = None, dry_run: bool = False, force: bool = False,
    kubeconfig: PathLike | None = None, reporter: Reporter | None = None, yes: bool = False,
) -> Run:
    """Create or resume the cluster: EKS, EFA GPU nodes, device plugins, KubeRay, the RayCluster.

    Steps whose needs are met run at the same time; each looks first and acts only on the
    difference, so a second call on a finished cluster changes nothing. `only`, `from_`, `until`
    pick steps as `--only/--from/--until` do; `dry_run` plans without changing anything (the
    result's `to_dict()` is `raydlc up --dry-run --json`). A RayCluster whose running pods differ
    from the rendered templates is recreated (stopping its running jobs) only with `yes`, or when
    the reporter's `confirm` says so; otherwise the step fails saying what changed. A failed step is in `result.failed`
    and skips what needs it; Ctrl-C raises `raydlc.lifecycle.Interrupted` with the results so far.

    Example:
        # An empty account (in the test suite AWS_ENDPOINT_URL is a moto server): a dry run
        # plans every step and changes nothing.
        plan = api.up(dry_run=True)
        for step in plan.results:
            print(step.step, step.action, step.reason)
        assert [(s.step, s.action) for s in plan.results] == [
            ("capacity", "none"), ("storage", "create"), ("cluster", "create"), ("gpu-nodegroup", "create"),
            ("kuberay", "create"), ("device-plugins", "create"), ("raycluster", "create"), ("autoscaler", "create")]
        assert "eksctl create cluster --config-file" in plan.to_dict()["steps"][2]["command"]
    """
    from raydlc.lifecycle import orders
    from raydlc.lifecycle.context import with_plain_kubeconfig

    cfg = load(config, settings, KUBECONFIG=_kubeconfig(kubeconfig))
    if cfg.cluster.attach and cfg.cluster.kube_context:  # the user's kubeconfig, read as kubectl reads it
        cfg = with_plain_kubeconfig(cfg)
    else:
        _check_kubeconfig_target(cfg)
    with aws.command_budget("up"):
        return orders.up(cfg, only=only, from_=from_, until=until, dry_run=dry_run, force=force, reporter=reporter, yes=yes)


def down(
    *, config: PathLike | None = None, settings: Mapping[str, Any] | None = None, keep_cluster: bool = False,
    delete_storage: bool = False, dry_run: bool = False, force: bool = False, kubeconfig: PathLike | None = None,
    reporter: Reporter | None = None,
) -> Run:
    """Remove everything `up` made, in reverse, until AWS lists nothing of the cluster that bills.

    The cluster's S3 bucket stays, with its checkpoints (the result lists it under `kept`), unless
    `delete_storage`: then it is emptied and deleted after the Ray pods are gone.

    `keep_cluster` stops after the node groups (the control plane and system node stay); `force`
    deletes a cluster without raydlc's ownership tag (otherwise refused with an InputError before
    any step). The result's `to_dict()` is `raydlc down --json`, with what was removed and what
    was already absent.

    Example:
        # An empty account (in the test suite AWS_ENDPOINT_URL is a moto server): nothing to remove.
        plan = api.down(dry_run=True)
        print(plan.to_dict())
        assert [s.step for s in plan.results] == [
            "autoscaler", "raycluster", "device-plugins", "kuberay", "gpu-nodegroup", "cluster", "storage", "capacity"]
        assert {s.action for s in plan.results} == {"none"}
    """
    from raydlc.lifecycle import orders
    from raydlc.lifecycle.context import with_plain_kubeconfig

    cfg = with_plain_kubeconfig(load(config, settings, KUBECONFIG=_kubeconfig(kubeconfig)))
    with aws.command_budget("down"):
        return orders.down(cfg, keep_cluster=keep_cluster, delete_storage=delete_storage, dry_run=dry_run, force=force,
                           reporter=reporter)


def status(
    *, config: PathLike | None = None, settings: Mapping[str, Any] | None = None, kubeconfig: PathLike | None = None,
) -> ClusterStatus:
    """Where the cluster stands: each step's state, the nodes and their GPUs/EFA, the Ray pods, the hourly cost.

    Reads only. The result's `to_dict()` is `raydlc status --json`.

    Example:
        # An empty account (in the test suite AWS_ENDPOINT_URL is a moto server).
        now = api.status()
        print(now.to_dict())
        assert now.status == "NOT_FOUND" and now.nodes == () and now.raycluster is None
        assert [(s.step, s.state) for s in now.steps] == [
            ("capacity", "ready"), ("storage", "absent"), ("cluster", "absent"), ("gpu-nodegroup", "absent"),
            ("kuberay", "absent"), ("device-plugins", "absent"), ("raycluster", "absent"), ("autoscaler", "absent")]
        assert now.cost["total_usd_per_hour"] == 0
    """
    from raydlc.lifecycle import orders
    from raydlc.lifecycle.context import with_plain_kubeconfig

    cfg = with_plain_kubeconfig(load(config, settings, KUBECONFIG=_kubeconfig(kubeconfig)))
    with aws.command_budget("status"):
        return orders.status(cfg)
