"""The eksctl and helm invocations raydlc makes, as data, and what helm says about a release.

Every command names its files and kubeconfig explicitly: eksctl reads the rendered
ClusterConfig and writes raydlc's own kubeconfig; helm installs from a pinned chart version
with `--repo` (no `helm repo add`, so the user's helm repositories are never touched) and
`--kubeconfig` (so a release never lands in whatever cluster `~/.kube/config` points at).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydlc.edges.tools import Command, command
from raydlc.render import FILES
from raydlc.render.eksctl import CREATE_FLAGS
from raydlc.render.helm import Release

if TYPE_CHECKING:
    from raydlc.lifecycle.context import Context

EKSCTL_FILE = FILES["eksctl"]
POD_IDENTITY_FILE = "eksctl-pod-identities.yaml"  # the associations `up` repairs: only the missing ones


# ---------------------------------------------------------------------- eksctl


def create_cluster(ctx: Context) -> Command:
    """Control plane, VPC (private subnets, one NAT gateway), OIDC and add-ons; node groups come next."""
    return command(
        "eksctl", "create", "cluster", "--config-file", str(ctx.path_of(EKSCTL_FILE)), "--without-nodegroup",
        "--kubeconfig", str(ctx.kubeconfig), *CREATE_FLAGS,
    )


def create_addons(ctx: Context) -> Command:
    """The config's add-ons as `create cluster` makes them (forced over the self-managed defaults); eksctl
    skips one already present as an EKS add-on (pkg/actions/addon/create.go `Create`)."""
    return command("eksctl", "create", "addon", "--config-file", str(ctx.path_of(EKSCTL_FILE)), "--force")


def create_pod_identities(ctx: Context) -> Command:
    """The associations of the repair file, which lists only the missing ones: eksctl makes each one's role
    stack and association and fails on one that exists (pkg/actions/podidentityassociation/creator.go)."""
    return command("eksctl", "create", "podidentityassociation", "--config-file", str(ctx.path_of(POD_IDENTITY_FILE)))


def create_nodegroup(ctx: Context, name: str) -> Command:
    return command(
        "eksctl", "create", "nodegroup", "--config-file", str(ctx.path_of(EKSCTL_FILE)), "--include", name, *CREATE_FLAGS,
    )


def write_kubeconfig(ctx: Context) -> Command:
    c = ctx.cfg.cluster
    return command("eksctl", "utils", "write-kubeconfig", "--cluster", c.name, "--region", c.region,
                   "--kubeconfig", str(ctx.kubeconfig))


def delete_nodegroup(ctx: Context, name: str) -> Command:
    c = ctx.cfg.cluster
    return command("eksctl", "delete", "nodegroup", "--cluster", c.name, "--region", c.region, "--name", name, "--wait")


def delete_cluster(ctx: Context) -> Command:
    c = ctx.cfg.cluster
    return command("eksctl", "delete", "cluster", "--name", c.name, "--region", c.region, "--wait")


# ---------------------------------------------------------------------- helm


def chart_name(r: Release) -> str:
    return r.chart.split("/", 1)[-1]


def install(ctx: Context, r: Release) -> Command:
    return command(
        "helm", "upgrade", "--install", r.name, chart_name(r), "--repo", r.repo_url, "--version", r.version,
        "--namespace", r.namespace, "--create-namespace", "--values", str(ctx.path_of(r.filename)),
        "--kubeconfig", str(ctx.kubeconfig), "--wait", "--timeout", f"{int(ctx.timings.helm_s)}s",
    )


def uninstall(ctx: Context, r: Release) -> Command:
    return command("helm", "uninstall", r.name, "--namespace", r.namespace, "--kubeconfig", str(ctx.kubeconfig), "--wait")


def _metadata(ctx: Context, r: Release) -> Command:
    """`helm get metadata` (Helm >= 3.13): the release's status and chart version. `helm status -o json` cannot
    say the version: it prints the release with its chart stripped (cmd/helm/status.go, `rel.Chart = nil`)."""
    return command("helm", "get", "metadata", r.name, "--namespace", r.namespace, "--kubeconfig", str(ctx.kubeconfig),
                   "--output", "json", mutates=False)


def _values(ctx: Context, r: Release) -> Command:
    return command("helm", "get", "values", r.name, "--namespace", r.namespace, "--kubeconfig", str(ctx.kubeconfig),
                   "--output", "json", mutates=False)


@dataclass(frozen=True)
class ReleaseState:
    """`absent`, or helm's status (deployed, failed, pending-install, …) with what is installed."""

    status: str
    version: str | None = None
    values: dict[str, Any] | None = None

    def matches(self, r: Release) -> bool:
        from raydlc.edges.kube import differences

        return (self.status == "deployed" and self.version == r.version
                and not differences(r.values, self.values or {}) and not differences(self.values or {}, r.values))

    def describe(self, r: Release) -> str:
        if self.status == "absent":
            return f"release {r.name} is not installed"
        if self.status != "deployed":
            return f"release {r.name} is {self.status}"
        if self.version != r.version:
            return f"release {r.name} has chart {self.version}, the config pins {r.version}"
        if not self.matches(r):
            return f"release {r.name} has other values than {r.filename}"
        return f"release {r.name} {r.version} deployed"


def release_state(ctx: Context, r: Release) -> ReleaseState:
    """What helm says about a release (a read: it runs in a dry run too): its status and chart version from
    `helm get metadata`, and, once deployed, the values it was given from `helm get values`."""
    res = ctx.runner.run(_metadata(ctx, r), check=False)  # a read: its "not found" is no news for the display
    if res.returncode != 0:
        if "not found" in res.output:
            return ReleaseState("absent")
        from raydlc.edges.tools import ToolFailed

        raise ToolFailed(f"`{res.command}` failed: {res.output.strip()[-300:]}", returncode=res.returncode, lines=res.lines)
    doc = _json(res.output)
    status = str(doc.get("status") or "unknown")
    version = doc.get("version") or None
    values: dict[str, Any] | None = None
    if status == "deployed":
        got = ctx.runner.run(_values(ctx, r), check=False)
        values = _json(got.output) if got.returncode == 0 else None
    return ReleaseState(status, version, values or {})


def _json(text: str) -> dict[str, Any]:
    """The JSON document in a tool's output (helm may print warnings before it)."""
    start = text.find("{")
    if start < 0:
        return {}
    try:
        doc = json.loads(text[start:])
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
