"""Following a cold cluster until a job's GPU workers run: the reads behind `coldstart.judge`, and the loop.

`submit` on the cluster target submits first — the job's placement group is what makes Ray's
autoscaler ask KubeRay for GPU worker pods, and their Pending state what makes the Cluster
Autoscaler raise the node group — and then, before streaming, follows the pods from Pending to
Running here: the first line says how far the GPU nodes are and how long it should take, then
each new reason (scheduler, cluster autoscaler, the Auto Scaling group's activities) once. It ends
warm, or raises `ColdStartFailed` (exit 1) with the judge's line.

Kubernetes is read through `raydlc.kube` (the RayCluster, its worker pods, the namespace's events,
the GPU-role nodes, the cluster autoscaler's Deployment for its `--max-node-provision-time`); AWS
through `raydlc.aws` (the GPU node group's ASG from `eks:DescribeNodegroup`, its
`autoscaling:DescribeScalingActivities`). AWS that cannot be read costs the ASG lines, never the wait.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from raydlc import coldstart
from raydlc.errors import RaydlcError
from raydlc.render import nodes as roles

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.kube import Kube

POLL_S = 5.0
ACTIVITIES = 10  # the newest of the ASG's activities, one page
CA_BINARY = "cluster-autoscaler"  # the chart's container runs ./cluster-autoscaler with its flags (charts/cluster-autoscaler deployment.yaml)
PROVISION_FLAG = "--max-node-provision-time"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")


class ColdStartFailed(RaydlcError):
    """The job's GPU workers will not come up: never fits, refused, stuck, or past the node group's time limit."""


def parse_duration(text: str) -> float | None:
    """A Go duration (`15m0s`, `10m`, `1h30m`, `90s`) in seconds; None when it is not one."""
    t = text.strip()
    if not t or _DURATION.sub("", t):
        return None
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in _DURATION.findall(t))


def provision_limit(kube: Kube) -> tuple[float, str]:
    """The cluster autoscaler's `--max-node-provision-time` as its Deployment runs it, else its documented default
    (also when Deployments cannot be listed cluster-wide: a user's RBAC may not allow it)."""
    from raydlc.errors import KubeError

    try:
        deployments = kube.list("apps/v1", "Deployment")
    except KubeError as e:
        return float(coldstart.NODE_PROVISION_S), f"the cluster autoscaler's default max-node-provision-time ({e.message[:80]})"
    for dep in deployments:
        for c in (((dep.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []:
            argv = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
            if not any(a.rsplit("/", 1)[-1] == CA_BINARY for a in argv[:1]) and CA_BINARY not in str(c.get("image", "")):
                continue
            for a in argv:
                if a.startswith(PROVISION_FLAG + "="):
                    seconds = parse_duration(a.split("=", 1)[1])
                    if seconds is not None:
                        return seconds, f"{PROVISION_FLAG}={a.split('=', 1)[1]} of the cluster autoscaler"
            return float(coldstart.NODE_PROVISION_S), "the cluster autoscaler's default max-node-provision-time"
    return float(coldstart.NODE_PROVISION_S), "the cluster autoscaler's default max-node-provision-time (no autoscaler found)"


@dataclass
class AsgReader:
    """The GPU node group's Auto Scaling group and its newest activities; silent (no lines) when AWS cannot be read."""

    cfg: Config
    problem: str | None = None
    name: str | None = None
    _clients: tuple[Any, Any] | None = field(default=None, repr=False)

    def _asg(self) -> tuple[Any, str] | None:
        from raydlc import aws

        if self.problem is not None:
            return None
        try:
            if self._clients is None:
                sess = aws.session(self.cfg.cluster.region)
                self._clients = (aws.client(sess, "eks"), aws.client(sess, "autoscaling"))
            eks, asg = self._clients
            if self.name is None:
                ng = aws.call(eks, "describe_nodegroup", clusterName=self.cfg.cluster.name,
                              nodegroupName=self.cfg.gpu_nodes.nodegroup_name)["nodegroup"]
                groups = (ng.get("resources") or {}).get("autoScalingGroups") or []
                if not groups:
                    self.problem = f"node group {self.cfg.gpu_nodes.nodegroup_name} has no Auto Scaling group yet"
                    return None
                self.name = str(groups[0]["name"])
            return asg, self.name
        except RaydlcError as e:
            self.problem = e.message
            return None

    def activities(self) -> tuple[Mapping[str, Any], ...]:
        from raydlc import aws

        found = self._asg()
        if found is None:
            return ()
        asg, name = found
        try:
            return tuple(aws.call(asg, "describe_scaling_activities", AutoScalingGroupName=name, MaxRecords=ACTIVITIES).get("Activities") or [])
        except RaydlcError as e:
            self.problem = e.message
            return ()


def demand(kube: Kube, cfg: Config, gpus: int) -> coldstart.Demand:
    """The job's need against the RayCluster's GPU worker groups, as the cluster runs them."""
    rc = kube.get("ray.io/v1", "RayCluster", cfg.ray.cluster_name, cfg.cluster.namespace) or {}
    return coldstart.demand_of(rc, gpus)


def look(kube: Kube, cfg: Config, need: coldstart.Demand, asg: AsgReader | None) -> coldstart.Snapshot:
    """One snapshot of the GPU nodes, the RayCluster's GPU worker pods, their events and the ASG."""
    ns, name = cfg.cluster.namespace, cfg.ray.cluster_name
    rc = kube.get("ray.io/v1", "RayCluster", name, ns) or {}
    groups = {str(g.get("groupName")) for g in coldstart.gpu_groups(rc)}
    pods = [p for p in kube.pods(ns, labels={"ray.io/cluster": name, "ray.io/node-type": "worker"})
            if not groups or ((p.get("metadata") or {}).get("labels") or {}).get("ray.io/group") in groups]
    nodes = kube.nodes(labels={roles.ROLE: roles.GPU_ROLE})
    events = kube.events(ns, kind="Pod")
    acts = asg.activities() if asg is not None else ()
    return coldstart.Snapshot(need, tuple(nodes), tuple(pods), tuple(events), acts, asg.name if asg else None)


def follow(kube: Kube, cfg: Config, need: coldstart.Demand, notice: Callable[[str], None], *, asg: AsgReader | None = None,
           poll_s: float | None = None, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
           first: coldstart.Snapshot | None = None) -> coldstart.Verdict:
    """Poll until the job's GPU worker pods run (the warm verdict) or the judge fails the wait (ColdStartFailed)."""
    provision_s, limit_from = provision_limit(kube)
    start = clock()
    since = datetime.now(UTC) - timedelta(minutes=1)  # an activity the autoscaler started as the job was submitted
    shown: set[str] = set()
    ready_since: float | None = None
    last_nodes = -1
    snap = first or look(kube, cfg, need, asg)
    notice(coldstart.headline(snap, cfg.gpu_nodes.instance_type) + f"; gives up after {coldstart.took(provision_s)} ({limit_from})")
    while True:
        now = clock()
        ready = coldstart.ready_nodes(snap.nodes)
        ready_since = (ready_since or now) if ready >= need.pods else None
        snap = replace(snap, since=since, waited_s=now - start, nodes_ready_s=None if ready_since is None else now - ready_since,
                       provision_s=provision_s)
        verdict = coldstart.judge(snap)
        if ready != last_nodes and last_nodes >= 0:
            notice(f"GPU nodes Ready: {ready} of {need.pods}")
        last_nodes = ready
        for line in verdict.lines:
            if line not in shown:
                shown.add(line)
                notice(line)
        if asg is not None and asg.problem and "asg" not in shown:
            shown.add("asg")
            notice(f"warning: the GPU node group's scaling activities cannot be read ({asg.problem})")
        if verdict.state == coldstart.WARM:
            notice(f"{verdict.reason} after {coldstart.took(now - start)}")
            return verdict
        if verdict.failed:
            raise ColdStartFailed(verdict.reason, hint="`raydlc status` shows the nodes and pods; "
                                  "the node group's Auto Scaling activities: aws autoscaling describe-scaling-activities")
        sleep(POLL_S if poll_s is None else poll_s)
        snap = look(kube, cfg, need, asg)
