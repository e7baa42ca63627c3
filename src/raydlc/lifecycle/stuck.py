"""Pods that will not come up by themselves, told apart from pods that are only slow.

While `up` waits for pods (the device plugins, the KubeRay operator, the Ray head and workers),
waiting out the step's timeout on a pod that can never start wastes ten minutes or more and then
says less than the pod does. Two kinds end a wait early, named by node, pod, state and event:

- at once: a container the kubelet has given up pulling or configuring (`ImagePullBackOff`,
  `ErrImagePull`, `InvalidImageName`, `ErrImageNeverPull` — kubelet pkg/kubelet/images/types.go —
  and `CreateContainerConfigError`, a missing Secret or ConfigMap key), or one in
  `CrashLoopBackOff` that has restarted `CRASH_RESTARTS` times already;
- after `persist_s` (two minutes by default): a pod whose `FailedMount` or `FailedScheduling`
  event stays while no node joins or turns Ready (a new node can resolve both).

Pure but for the clock: pods, events and nodes in, a line or None out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from raydlc.edges import kube as k8s

AT_ONCE = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"})
CRASH_RESTARTS = 3
PERSISTING = ("FailedMount", "FailedScheduling")
PERSIST_S = 120.0


def _where(pod: Mapping[str, Any]) -> str:
    return f"pod {k8s.name_of(pod)} on node {k8s.pod_node(pod) or '(none)'}"


def _last_event(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]], reasons: Iterable[str] | None = None) -> Mapping[str, Any] | None:
    name, wanted = k8s.name_of(pod), set(reasons) if reasons is not None else None
    found = None
    for e in events:  # oldest first: the last one that matches is the newest
        if (e.get("involvedObject") or {}).get("name") == name and e.get("type", "Warning") == "Warning" and (
                wanted is None or e.get("reason") in wanted):
            found = e
    return found


def _event_text(e: Mapping[str, Any] | None) -> str:
    return f"; event {e.get('reason')}: {str(e.get('message', '')).strip()[:300]}" if e else ""


def stuck_now(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()) -> str | None:
    """The line for a pod whose container cannot start without someone changing something, else None."""
    statuses = [*((pod.get("status") or {}).get("initContainerStatuses") or []), *((pod.get("status") or {}).get("containerStatuses") or [])]
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        restarts = int(cs.get("restartCount") or 0)
        if reason in AT_ONCE or (reason == "CrashLoopBackOff" and restarts >= CRASH_RESTARTS):
            what = f"{reason}" + (f" after {restarts} restarts" if reason == "CrashLoopBackOff" else "")
            message = str(waiting.get("message") or "").strip()[:300]
            return (f"{_where(pod)}: container {cs.get('name', '?')} is {what}" + (f": {message}" if message else "")
                    + _event_text(_last_event(pod, events)))
    return None


def blocked(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The FailedMount or FailedScheduling event of a pod that is not running yet, else None."""
    if k8s.pod_phase(pod) not in ("Pending", "Unknown", ""):
        return None
    return _last_event(pod, events, PERSISTING)


class StuckWatch:
    """Across the polls of one wait: which pods are stuck, and since when a blocked pod has been blocked."""

    def __init__(self, persist_s: float = PERSIST_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.persist_s = persist_s
        self.clock = clock
        self._since: dict[str, float] = {}
        self._nodes: frozenset[tuple[str, bool]] | None = None

    def verdict(self, pods: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]],
                nodes: Iterable[Mapping[str, Any]]) -> str | None:
        """The line that ends the wait, or None while every pod may still come up."""
        now, events, pods = self.clock(), list(events), list(pods)
        for p in pods:
            line = stuck_now(p, events)
            if line:
                return line
        seen = frozenset((k8s.name_of(n), k8s.node_ready(n)) for n in nodes)
        if seen != self._nodes:  # a node joined, left or turned Ready: whatever was blocked may fit now
            self._nodes, self._since = seen, {}
        blocked_now = {k8s.name_of(p): (p, e) for p in pods if (e := blocked(p, events)) is not None}
        self._since = {n: self._since.get(n, now) for n in blocked_now}
        for name, (p, e) in sorted(blocked_now.items()):
            if now - self._since[name] >= self.persist_s:
                return (f"{_where(p)} is {k8s.pod_phase(p) or 'Pending'} for {now - self._since[name]:.0f} s with no node "
                        f"joining{_event_text(e)}")
        return None
