"""A cold cluster, judged: are the job's GPU workers up, coming, or never coming — and why.

When the GPU node group scales to zero, a job's GPU worker pods start Pending: Ray's autoscaler
asks KubeRay for them, the scheduler finds no node (`FailedScheduling`), the Kubernetes Cluster
Autoscaler raises the node group's Auto Scaling group (`TriggeredScaleUp` on the pod) or says it
will not (`NotTriggerScaleUp`), and the ASG launches instances or fails to (its scaling
activities: `StatusCode` `Failed`, `StatusMessage` EC2's "We currently do not have sufficient
g6.12xlarge capacity in the Availability Zone you requested (us-east-2a)…"). This module reads
one snapshot of those facts and answers with a frozen `WorkerOutlook`: warm (the pods run), waiting
(with the reasons seen and the expected wait) or failed (one line naming the cause).

The event reasons and messages are the Cluster Autoscaler's (kubernetes/autoscaler
cluster-autoscaler-1.36.1: processors/status/eventing_scale_up_processor.go emits `TriggeredScaleUp`
"pod triggered scale-up: [{group 0->2 (max: 2)}]" and `NotTriggerScaleUp` "pod didn't trigger
scale-up: <n> <reason>, …" on pods; the skipped reasons are core/scaleup/orchestrator/
skippedreasons.go, the rest are the scheduler's predicates run against the group's template node).
Failures of a scale-up itself (`FailedToScaleUpGroup`, `ScaleUpTimedOut`) go to the
`cluster-autoscaler-status` ConfigMap, not to pods: the ASG's activities say the same, with the AZ.

The wait is bounded by the node group's own timeout: the Cluster Autoscaler's
`--max-node-provision-time` (default 15 min, FAQ "How does scale-up work?"; per group on AWS it
cannot be overridden), after which it gives the requested nodes up and reverts the scale-up
(clusterstate/clusterstate.go `updateScaleRequests`). Once the nodes are Ready the pods get
`POD_START_S` more to pull the (large) image and start.

Pure: pods, events, nodes and activities in (as the Kubernetes API and boto3 return them), a
worker outlook out; the clock is the caller's (`waited_s`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from raydlc.edges import kube as k8s
from raydlc.facts import instances
from raydlc.lifecycle.stuck import stuck_now
from raydlc.render import nodes as roles

OutlookState = Literal["warm", "waiting", "failed"]
WARM: Final = "warm"
WAITING: Final = "waiting"
FAILED: Final = "failed"

NODE_PROVISION_S = 15 * 60  # Cluster Autoscaler --max-node-provision-time default (FAQ.md, cluster-autoscaler-1.36.1)
POD_START_S = 15 * 60  # once the nodes are Ready: as `up` waits for pods (lifecycle Timings.pods_s), the DLC image is tens of GiB

SCHEDULER_REASONS = ("FailedScheduling",)
TRIGGERED, NOT_TRIGGERED = "TriggeredScaleUp", "NotTriggerScaleUp"
# NotTriggerScaleUp reasons that pass by themselves: a node group backing off after a failed
# scale-up (capacity) or not ready yet (skippedreasons.go). Every other reason — a predicate the
# group's template node fails, a group or cluster at its maximum — stays until someone changes
# the cluster or the job.
PASSING = ("in backoff after failed scale-up", "not ready for scale-up")
LAUNCHING = "Launching a new EC2 instance"
_AZ_IN_PARENS = re.compile(r"Availability Zone you requested \(([a-z]{2}(?:-gov)?-[a-z]+-\d[a-z])\)")
_AZ_BARE = re.compile(r"\b([a-z]{2}(?:-gov)?-[a-z]+-\d[a-z])\b")
_SHORT = 300


@dataclass(frozen=True)
class Demand:
    """What the job needs of the GPU worker group, and the most that group can ever hold."""

    gpus: int  # GPUs the job needs
    gpus_per_pod: int  # each GPU worker pod's nvidia.com/gpu (one pod per GPU node)
    max_pods: int  # the RayCluster's GPU worker pods at most (maxReplicas under autoscaling, else replicas)

    @property
    def pods(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_pod) if self.gpus > 0 and self.gpus_per_pod > 0 else 0

    @property
    def most_gpus(self) -> int:
        return self.max_pods * self.gpus_per_pod


def never_fits(d: Demand) -> str | None:
    """Why the job can never be placed on this RayCluster's GPU workers; None when it can."""
    if d.gpus <= 0:
        return None
    if d.gpus_per_pod <= 0 or d.max_pods <= 0:
        return f"the job needs {d.gpus} GPUs and the RayCluster has no GPU worker group that can hold any"
    if d.gpus > d.most_gpus:
        return (f"the job needs {d.gpus} GPUs and the RayCluster's GPU workers hold at most {d.most_gpus} "
                f"({d.max_pods} pods x {d.gpus_per_pod} GPUs)")
    return None


def demand_of(raycluster: Mapping[str, Any], gpus: int) -> Demand:
    """The GPU worker groups of a RayCluster as KubeRay runs them: pods per group and GPUs per pod.

    Under `enableInTreeAutoscaling` Ray's autoscaler moves `replicas` between min and max, so the
    most is `maxReplicas`; without it KubeRay keeps `replicas` (KubeRay v1.7.0 raycluster_types.go).
    """
    spec = raycluster.get("spec") or {}
    scaling = bool(spec.get("enableInTreeAutoscaling"))
    per_pod, most = 0, 0
    for g in gpu_groups(raycluster):
        n = _gpus_of(g)
        per_pod = max(per_pod, n)
        most += int(g.get("maxReplicas", g.get("replicas", 0)) if scaling else g.get("replicas", 0) or 0)
    return Demand(gpus, per_pod, most)


def gpu_groups(raycluster: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The worker groups whose pods ask for GPUs."""
    return [g for g in (raycluster.get("spec") or {}).get("workerGroupSpecs") or [] if _gpus_of(g) > 0]


def _gpus_of(group: Mapping[str, Any]) -> int:
    total = 0
    for c in ((group.get("template") or {}).get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        raw = (res.get("limits") or {}).get(roles.GPU_RESOURCE) or (res.get("requests") or {}).get(roles.GPU_RESOURCE)
        try:
            total += int(str(raw)) if raw is not None else 0
        except ValueError:
            continue
    if total == 0:
        try:
            total = int(float(str((group.get("rayStartParams") or {}).get("num-gpus", 0))))
        except ValueError:
            total = 0
    return total


@dataclass(frozen=True)
class Snapshot:
    """One look at the world while the job waits for its GPU workers."""

    demand: Demand
    nodes: tuple[Mapping[str, Any], ...]  # the GPU-role nodes
    pods: tuple[Mapping[str, Any], ...]  # the RayCluster's GPU worker pods
    events: tuple[Mapping[str, Any], ...]  # the namespace's events, oldest first
    activities: tuple[Mapping[str, Any], ...] = ()  # the GPU node group's ASG activities, newest first (as AWS lists them)
    asg: str | None = None  # that ASG's name
    since: datetime | None = None  # when the wait began: older activities are history, not this scale-up
    waited_s: float = 0.0
    nodes_ready_s: float | None = None  # how long the needed GPU nodes have all been Ready; None while they are not
    provision_s: float = NODE_PROVISION_S
    pod_start_s: float = POD_START_S


@dataclass(frozen=True)
class WorkerOutlook:
    """Whether the job's GPU workers are up, coming or never coming: the judge's answer to one snapshot."""

    state: OutlookState
    reason: str  # one line: the state now, or why it failed
    lines: tuple[str, ...] = ()  # what the world says now (each shown once by the caller)

    @property
    def failed(self) -> bool:
        return self.state == FAILED


def ready_nodes(nodes: Iterable[Mapping[str, Any]]) -> int:
    return sum(1 for n in nodes if k8s.node_ready(n))


def running_pods(pods: Iterable[Mapping[str, Any]]) -> int:
    return sum(1 for p in pods if k8s.pod_ready(p))


def judge(s: Snapshot) -> WorkerOutlook:
    """warm, waiting or failed: in that order of evidence, so a pod that cannot start beats a timeout."""
    need, up = s.demand.pods, running_pods(s.pods)
    if up >= need:
        return WorkerOutlook(WARM, f"{up} of {need} GPU worker pods running")
    why = never_fits(s.demand)
    if why:
        return WorkerOutlook(FAILED, why)
    lines = tuple(reasons(s))
    events = list(s.events)
    for p in s.pods:
        line = stuck_now(p, events)
        if line:
            return WorkerOutlook(FAILED, line, lines)
    refusal = refused(s.pods, events)
    if refusal:
        return WorkerOutlook(FAILED, refusal, lines)
    ready = ready_nodes(s.nodes)
    if s.nodes_ready_s is None and s.waited_s >= s.provision_s:
        return WorkerOutlook(FAILED, f"GPU nodes still at {ready} of {need} after {took(s.waited_s)}, the node group's scale-up "
                               f"time limit ({took(s.provision_s)}, the cluster autoscaler's max-node-provision-time): "
                               + last_word(s), lines)
    if s.nodes_ready_s is not None and s.nodes_ready_s >= s.pod_start_s:
        return WorkerOutlook(FAILED, f"the GPU nodes are Ready but {need - up} of {need} GPU worker pods have not started after "
                               f"{took(s.nodes_ready_s)}: " + _pod_word(s), lines)
    return WorkerOutlook(WAITING, f"GPU nodes at {ready} of {need}, GPU worker pods running {up} of {need}", lines)


def reasons(s: Snapshot) -> list[str]:
    """What the scheduler, the cluster autoscaler and the ASG say now, one line each, without repeats."""
    out: list[str] = []
    events = list(s.events)
    for p in s.pods:
        if k8s.pod_ready(p):
            continue
        for e in _latest_per_reason(p, events):
            out.append(f"{_who(str(e.get('reason')))}: {_clean(e.get('message'))}")
    act = latest_activity(s.activities, s.since)
    if act is not None:
        out.append(activity_line(act, s.asg))
    return list(dict.fromkeys(out))


def _who(reason: str) -> str:
    return {"FailedScheduling": "scheduler", TRIGGERED: "cluster-autoscaler", NOT_TRIGGERED: "cluster-autoscaler"}.get(reason, reason)


def _latest_per_reason(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pod's newest scheduler event and its newest autoscaler event (a newer TriggeredScaleUp supersedes a NotTriggerScaleUp)."""
    name = k8s.name_of(pod)
    mine = [e for e in events if (e.get("involvedObject") or {}).get("name") == name]
    sched = [e for e in mine if e.get("reason") in SCHEDULER_REASONS]
    ca = [e for e in mine if e.get("reason") in (TRIGGERED, NOT_TRIGGERED)]
    return [x[-1] for x in (sched, ca) if x]


def refused(pods: Iterable[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]) -> str | None:
    """A Pending pod whose newest autoscaler word is a NotTriggerScaleUp that will not pass by itself."""
    for p in pods:
        if k8s.pod_phase(p) != "Pending":
            continue
        latest = next((e for e in reversed(_latest_per_reason(p, events)) if e.get("reason") in (TRIGGERED, NOT_TRIGGERED)), None)
        if latest is None or latest.get("reason") != NOT_TRIGGERED:
            continue
        message = _clean(latest.get("message"))
        if not any(r in message for r in PASSING):
            return f"no GPU node can ever hold pod {k8s.name_of(p)}: cluster-autoscaler: {message}"
    return None


def latest_activity(activities: Iterable[Mapping[str, Any]], since: datetime | None = None) -> Mapping[str, Any] | None:
    """The ASG's newest activity that started at or after `since` (all, when None)."""
    acts = [a for a in activities if since is None or _started(a) is None or _started(a) >= since]  # type: ignore[operator]
    return max(acts, key=lambda a: _started(a) or datetime.min.replace(tzinfo=since.tzinfo if since else None), default=None)


def _started(a: Mapping[str, Any]) -> datetime | None:
    t = a.get("StartTime")
    return t if isinstance(t, datetime) else None


def capacity_zone(text: str) -> str | None:
    """The AZ EC2 names in an insufficient-capacity message."""
    m = _AZ_IN_PARENS.search(text) or _AZ_BARE.search(text)
    return m.group(1) if m else None


def is_capacity(text: str) -> bool:
    return "InsufficientInstanceCapacity" in text or "do not have sufficient" in text


def activity_line(a: Mapping[str, Any], asg: str | None = None) -> str:
    """One ASG activity as a person reads it; insufficient capacity is called that, with its AZ."""
    who = f"ASG {asg}" if asg else "ASG"
    status = str(a.get("StatusCode") or "?")
    message = _clean(a.get("StatusMessage"))
    what = _clean(a.get("Description"))
    if is_capacity(message) or is_capacity(what):
        zone = capacity_zone(message) or capacity_zone(what)
        return f"{who}: InsufficientInstanceCapacity" + (f" in {zone}" if zone else "") + f" ({status}): {message or what}"
    return f"{who}: {what} ({status})" + (f": {message}" if message and message not in what else "")


def last_word(s: Snapshot) -> str:
    """What to name when the wait ends: the ASG's last activity, else the newest autoscaler or scheduler line."""
    act = latest_activity(s.activities, s.since) or latest_activity(s.activities)
    if act is not None:
        return "last activity of " + activity_line(act, s.asg)
    said = reasons(s)
    return said[-1] if said else "no event from the scheduler or the cluster autoscaler, and no ASG activity"


def _pod_word(s: Snapshot) -> str:
    waiting = [p for p in s.pods if not k8s.pod_ready(p)]
    if not waiting:
        return "no GPU worker pod exists (is Ray's autoscaler asking for them?)"
    p = waiting[0]
    return f"pod {k8s.name_of(p)}: {k8s.pending_reason(p, s.events)}"


def expected_wait(activities: Iterable[Mapping[str, Any]], instance_type: str) -> tuple[float, str]:
    """Seconds a scale-up is expected to take, and on what that rests: the node group's last
    successful launch (its ASG activity, StartTime to EndTime), else the catalogue's estimate."""
    done = [a for a in activities if a.get("StatusCode") == "Successful" and str(a.get("Description", "")).startswith(LAUNCHING)
            and isinstance(a.get("StartTime"), datetime) and isinstance(a.get("EndTime"), datetime)]
    if done:
        last = max(done, key=lambda a: a["StartTime"])
        seconds = max((last["EndTime"] - last["StartTime"]).total_seconds(), 0.0)
        return seconds, f"the node group's last scale-up took {took(seconds)}"
    est = instances.scale_up_estimate_s(instance_type)
    return est, f"raydlc's estimate for {instance_type} nodes, no scale-up of this node group seen yet"


def headline(s: Snapshot, instance_type: str) -> str:
    """The first line a person sees: how far the GPU nodes are and how long it should take."""
    wait_s, basis = expected_wait(s.activities, instance_type)
    return (f"GPU nodes are at {ready_nodes(s.nodes)} of {s.demand.pods}; expected wait ~{max(1, round(wait_s / 60))} min "
            f"({basis}); the job starts once its GPU workers run")


def took(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _clean(text: Any) -> str:
    t = " ".join(str(text or "").split())
    return t if len(t) <= _SHORT else t[: _SHORT - 1] + "…"
