"""raydlc's probe pod run as the kubelet and EKS's network policy agent would run it: kmock runs no pods.

A pod labelled `app.kubernetes.io/name=raydlc-netprobe` with no phase yet is "run": its command's
last two arguments are the host (`<service>.<namespace>.svc`) and the port; the Service's selector
names the pods behind it, and the connect is judged the way Kubernetes defines NetworkPolicy
(`k8s.io/api/networking/v1` `NetworkPolicySpec`): a pod selected by a policy with Ingress in its
policyTypes is isolated, and then admits only what some ingress rule lists — `from` peers
(`podSelector` in the policy's namespace, `namespaceSelector` by the namespace's
`kubernetes.io/metadata.name` label, both at once meaning both) and `ports` (none listed: every
port; an empty `from`: every source). Only `matchLabels` is modelled; a `matchExpressions` is
refused loudly. Traffic a policy does not admit is dropped (the VPC CNI's eBPF agent drops, it
does not reset), so the connect times out; a host that is not a Service does not resolve; with
nothing to connect to (no pod behind the Service) it is refused. The pod then ends as the script
would: Succeeded (exit 0) or Failed (exit 1), its JSON line in the terminated state's `message`,
where Kubernetes puts a container's termination log.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from world import Kube

PROBE_LABEL = ("app.kubernetes.io/name", "raydlc-netprobe")


def _matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    selector = selector or {}
    if selector.get("matchExpressions"):
        raise NotImplementedError("the double models matchLabels only")
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_admits(peer: dict[str, Any], policy_ns: str, src_ns: str, src_labels: dict[str, str]) -> bool:
    ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
    if peer.get("ipBlock"):
        return False  # pod-to-pod traffic is judged by the pod peers; an ipBlock rule is not modelled as matching
    in_ns = src_ns == policy_ns if ns_sel is None else _matches(ns_sel, {"kubernetes.io/metadata.name": src_ns})
    return in_ns and (pod_sel is None or _matches(pod_sel, src_labels))


def admitted(policies: list[dict[str, Any]], dst: dict[str, Any], port: int, src_ns: str, src_labels: dict[str, str]) -> bool:
    """Does NetworkPolicy let a pod (src) open `port` on `dst`?"""
    dst_ns, dst_labels = dst["metadata"]["namespace"], dst["metadata"].get("labels") or {}
    selecting = [p for p in policies if p["metadata"].get("namespace") == dst_ns
                 and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
                 and _matches(p["spec"].get("podSelector"), dst_labels)]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get("ingress") or []:
            ports = rule.get("ports") or []
            if ports and not any(int(x.get("port", 0)) == port and x.get("protocol", "TCP") == "TCP" for x in ports):
                continue
            peers = rule.get("from") or []
            if not peers or any(_peer_admits(peer, dst_ns, src_ns, src_labels) for peer in peers):
                return True
    return False


def connect(kube: Kube, src: dict[str, Any], host: str, port: int) -> dict[str, Any]:
    """What `socket.create_connection((host, port))` in `src` would meet."""
    parts = host.split(".")
    svc = kube.get("Service", parts[0], parts[1]) if len(parts) >= 3 and parts[2] == "svc" else None
    if svc is None:
        return {"connected": False, "error": f"unresolved: [Errno -2] Name or service not known: {host}"}
    behind = [p for p in kube.list("Pod", svc["metadata"]["namespace"])
              if _matches({"matchLabels": svc["spec"].get("selector") or {}}, p["metadata"].get("labels") or {})
              and (p.get("status") or {}).get("phase") == "Running"]
    if not behind:
        return {"connected": False, "error": "refused"}
    policies = kube.list("NetworkPolicy", svc["metadata"]["namespace"])
    src_ns, src_labels = src["metadata"]["namespace"], src["metadata"].get("labels") or {}
    if admitted(policies, behind[0], port, src_ns, src_labels):
        return {"connected": True, "error": None}
    return {"connected": False, "error": "timeout"}


def run(kube: Kube, pod: dict[str, Any]) -> None:
    """End the probe pod as its script would, through its status."""
    cmd = pod["spec"]["containers"][0]["command"]
    said = connect(kube, pod, cmd[-2], int(cmd[-1]))
    code = 0 if said["connected"] else 1
    term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "message": json.dumps(said)}
    kube.patch("Pod", pod["metadata"]["name"], {"status": {
        "phase": "Succeeded" if code == 0 else "Failed",
        "containerStatuses": [{"name": "probe", "state": {"terminated": term}}],
    }}, pod["metadata"]["namespace"])


class Kubelet:
    """A thread that runs every new probe pod; `seen` lists the pods it ran, `errors` what went wrong."""

    def __init__(self, url: str, interval: float = 0.1) -> None:
        self.kube = Kube(url)
        self.interval = interval
        self.seen: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="netprobe-kubelet", daemon=True)

    def __enter__(self) -> Kubelet:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(5)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                for pod in self.kube.list("Pod"):
                    labels = pod["metadata"].get("labels") or {}
                    if labels.get(PROBE_LABEL[0]) == PROBE_LABEL[1] and not (pod.get("status") or {}).get("phase"):
                        self.seen.append(pod)
                        run(self.kube, pod)
            except Exception as e:  # kept for the test to see; the loop goes on
                self.errors.append(repr(e))
            self.stop_event.wait(self.interval)
