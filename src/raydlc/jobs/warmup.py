"""Following a cold cluster until a job's GPU workers run: the reads behind `cold_start.judge`, and the loop.

`submit` on the cluster target submits first — the job's placement group is what makes Ray's
autoscaler ask KubeRay for GPU worker pods, and their Pending state what makes the Cluster
Autoscaler raise the node group — and then, before streaming, follows the pods from Pending to
Running here: the first line says how far the GPU nodes are and how long it should take, then
each new reason (scheduler, cluster autoscaler, the Auto Scaling group's activities) once. It ends
warm, or raises `ColdStartFailed` (exit 1) with the judge's line.

Kubernetes is read through `raydlc.edges.kube` (the RayCluster, its worker pods, the namespace's events,
the GPU-role nodes, the cluster autoscaler's Deployment for its `--max-node-provision-time`); AWS
through `raydlc.edges.aws` (the GPU node group's ASG from `eks:DescribeNodegroup`, its
`autoscaling:DescribeScalingActivities`). AWS that cannot be read costs the ASG lines, never the wait.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from raydlc.edges import poll
from raydlc.errors import RaydlcError
from raydlc.jobs import cold_start
from raydlc.render import nodes as roles

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.edges.kube import Kube

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
        return float(cold_start.NODE_PROVISION_S), f"the cluster autoscaler's default max-node-provision-time ({e.message[:80]})"
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
            return float(cold_start.NODE_PROVISION_S), "the cluster autoscaler's default max-node-provision-time"
    return float(cold_start.NODE_PROVISION_S), "the cluster autoscaler's default max-node-provision-time (no autoscaler found)"


@dataclass
class AsgReader:
    """The GPU node group's Auto Scaling group and its newest activities; silent (no lines) when AWS cannot be read."""

    cfg: Config
    problem: str | None = None
    name: str | None = None
    _clients: tuple[Any, Any] | None = field(default=None, repr=False)

    def _asg(self) -> tuple[Any, str] | None:
        from raydlc.edges import aws

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
        from raydlc.edges import aws

        found = self._asg()
        if found is None:
            return ()
        asg, name = found
        try:
            return tuple(aws.call(asg, "describe_scaling_activities", AutoScalingGroupName=name, MaxRecords=ACTIVITIES).get("Activities") or [])
        except RaydlcError as e:
            self.problem = e.message
            return ()


def demand(kube: Kube, cfg: Config, gpus: int) -> cold_start.Demand:
    """The job's need against the RayCluster's GPU worker groups, as the cluster runs them."""
    rc = kube.get("ray.io/v1", "RayCluster", cfg.ray.cluster_name, cfg.cluster.namespace) or {}
    return cold_start.demand_of(rc, gpus)


def look(kube: Kube, cfg: Config, need: cold_start.Demand, asg: AsgReader | None) -> cold_start.Snapshot:
    """One snapshot of the GPU nodes, the RayCluster's GPU worker pods, their events and the ASG."""
    ns, name = cfg.cluster.namespace, cfg.ray.cluster_name
    rc = kube.get("ray.io/v1", "RayCluster", name, ns) or {}
    groups = {str(g.get("groupName")) for g in cold_start.gpu_groups(rc)}
    pods = [p for p in kube.pods(ns, labels={"ray.io/cluster": name, "ray.io/node-type": "worker"})
            if not groups or ((p.get("metadata") or {}).get("labels") or {}).get("ray.io/group") in groups]
    nodes = _gpu_nodes(kube, cfg)
    events = kube.events(ns, kind="Pod")
    acts = asg.activities() if asg is not None else ()
    return cold_start.Snapshot(need, tuple(nodes), tuple(pods), tuple(events), acts, asg.name if asg else None)


def _gpu_nodes(kube: Kube, cfg: Config) -> list[dict[str, Any]]:
    """raydlc's GPU node group by its role label; attached, the platform's nodes carry none of raydlc's labels: every
    node whose kubelet reports `nvidia.com/gpu` capacity."""
    if not cfg.cluster.attach:
        return kube.nodes(labels={roles.ROLE: roles.GPU_ROLE})
    from raydlc.edges.kube import allocatable

    return [n for n in kube.nodes() if allocatable(n, roles.GPU_RESOURCE) > 0
            or ((n.get("status") or {}).get("capacity") or {}).get(roles.GPU_RESOURCE)]


def follow(kube: Kube, cfg: Config, need: cold_start.Demand, notice: Callable[[str], None], *, asg: AsgReader | None = None,
           poll_s: float | None = None, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
           first: cold_start.Snapshot | None = None) -> cold_start.WorkerOutlook:
    """Poll until the job's GPU worker pods run (the warm outlook) or the judge fails the wait (ColdStartFailed).

    The wait has no budget of its own: the judge ends it, at the node group's scale-up time limit.
    """
    provision_s, limit_from = provision_limit(kube)
    start = clock()
    since = datetime.now(UTC) - timedelta(minutes=1)  # an activity the autoscaler started as the job was submitted
    told = _Told(notice, need.pods)
    ready_since: float | None = None
    snap = first or look(kube, cfg, need, asg)
    notice(cold_start.headline(snap, cfg.gpu_nodes.instance_type) + f"; gives up after {cold_start.took(provision_s)} ({limit_from})")
    snaps = itertools.chain([snap], iter(lambda: look(kube, cfg, need, asg), None))  # the first one, then a new look each time

    def judged() -> tuple[float, cold_start.WorkerOutlook]:
        nonlocal ready_since
        seen = next(snaps)
        now = clock()
        ready = cold_start.ready_nodes(seen.nodes)
        ready_since = (ready_since or now) if ready >= need.pods else None
        snap = replace(seen, since=since, waited_s=now - start, nodes_ready_s=None if ready_since is None else now - ready_since,
                       provision_s=provision_s)
        outlook = cold_start.judge(snap)
        told.tell(ready, outlook, asg)
        if outlook.failed:
            raise ColdStartFailed(outlook.reason, hint="`raydlc status` shows the nodes and pods; "
                                  "the node group's Auto Scaling activities: aws autoscaling describe-scaling-activities")
        return now, outlook

    now, outlook = poll.until(judged, lambda got: got[1].state == cold_start.WARM, what="the job's GPU worker pods to run",
                              timeout=None, interval=POLL_S if poll_s is None else poll_s, sleep=sleep)
    notice(f"{outlook.reason} after {cold_start.took(now - start)}")
    return outlook


@dataclass
class _Told:
    """What the wait has said: each new line once, the Ready count when it changes."""

    notice: Callable[[str], None]
    pods: int
    shown: set[str] = field(default_factory=set)
    last_nodes: int = -1

    def tell(self, ready: int, outlook: cold_start.WorkerOutlook, asg: AsgReader | None) -> None:
        if ready != self.last_nodes and self.last_nodes >= 0:
            self.notice(f"GPU nodes Ready: {ready} of {self.pods}")
        self.last_nodes = ready
        for line in outlook.lines:
            if line not in self.shown:
                self.shown.add(line)
                self.notice(line)
        if asg is not None and asg.problem and "asg" not in self.shown:
            self.shown.add("asg")
            self.notice(f"warning: the GPU node group's scaling activities cannot be read ({asg.problem})")
