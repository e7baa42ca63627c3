"""Who can open the head's dashboard port: a pod without the Ray labels must not, the Ray pods must.

The NetworkPolicy (`raydlc.render.netpol`) admits only pods carrying the cluster's label (and the
operator), so the proof is from inside the cluster, both ways: a short-lived pod in the namespace
with none of those labels tries a TCP connect to the head Service's dashboard port, and a Ray task
on each GPU node (`python -m raydlc.checks.node_probe --head auto`) tries the dashboard address the head
registered (its pod IP: the policy guards the pod, whichever way it is addressed). A connect that times out or is
refused is the policy at work (EKS's VPC CNI drops the packets); a name that does not resolve
proves nothing. The pod runs the Ray image, already on the head's node (pinned there with
`nodeName`, every taint tolerated): nothing is pulled. It reports through its termination message,
read from the pod's status, and is deleted whatever happens. `judge` is pure: outcomes in, a row out.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raydlc.edges import poll

if TYPE_CHECKING:
    from raydlc.edges.kube import Kube

CONNECT_TIMEOUT_S = 5.0
POD_TIMEOUT_S = 120.0
PROBE_LABELS = {"app.kubernetes.io/name": "raydlc-netprobe", "app.kubernetes.io/managed-by": "raydlc"}
TERMINATION_LOG = "/dev/termination-log"

# Runs in the Ray image's python, which has no raydlc: `connect` below, inlined, writing its answer
# where Kubernetes copies it into the pod's status. Exit 0 means "connected".
POD_SCRIPT = f"""
import json, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    socket.create_connection((host, port), timeout={CONNECT_TIMEOUT_S}).close()
    out = {{"connected": True, "error": None}}
except socket.gaierror as e:
    out = {{"connected": False, "error": "unresolved: %s" % e}}
except socket.timeout:
    out = {{"connected": False, "error": "timeout"}}
except ConnectionRefusedError:
    out = {{"connected": False, "error": "refused"}}
except OSError as e:
    out = {{"connected": False, "error": "%s: %s" % (type(e).__name__, e)}}
line = json.dumps(out)
print(line)
open("{TERMINATION_LOG}", "w").write(line)
sys.exit(0 if out["connected"] else 1)
"""


def connect(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """One TCP connect from where this runs (a Ray task's node): connected, or why not."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.gaierror as e:
        return {"connected": False, "error": f"unresolved: {e}"}
    except TimeoutError:
        return {"connected": False, "error": "timeout"}
    except ConnectionRefusedError:
        return {"connected": False, "error": "refused"}
    except OSError as e:
        return {"connected": False, "error": f"{type(e).__name__}: {e}"}
    return {"connected": True, "error": None}


def pod_doc(name: str, namespace: str, image: str, node: str | None, host: str, port: int) -> dict[str, Any]:
    """The probe pod: no Ray label, no service account token, small, never restarted, on the head's node."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "tolerations": [{"operator": "Exists"}],
        "containers": [{
            "name": "probe",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["python3", "-c", POD_SCRIPT, host, str(port)],
            "terminationMessagePath": TERMINATION_LOG,
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "256Mi"}},
        }],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": dict(PROBE_LABELS)}, "spec": spec}


@dataclass(frozen=True)
class PodOutcome:
    """What the unlabelled pod saw: `connected` None when it never ran to an answer (then `detail` says why)."""

    pod: str
    connected: bool | None
    error: str | None = None
    detail: str = ""


def run_pod(kube: Kube, doc: dict[str, Any], *, timeout: float = POD_TIMEOUT_S, poll_s: float = 1.0) -> PodOutcome:
    """Create the pod, wait for it to end, read its answer; delete it on every way out (Ctrl-C included)."""
    meta = doc["metadata"]
    name, ns = meta["name"], meta["namespace"]
    try:
        kube.create(doc)
        pod = poll.until(lambda: kube.get("v1", "Pod", name, ns), _ended, what=f"pod {ns}/{name} to end", timeout=timeout,
                         interval=poll_s, or_last=True)
        return outcome(name, pod)
    finally:
        kube.delete("v1", "Pod", name, ns)


def _ended(pod: dict[str, Any] | None) -> bool:
    return pod is not None and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def outcome(name: str, pod: dict[str, Any] | None) -> PodOutcome:
    """The pod's answer from its status: the termination message it wrote, else why there is none."""
    status = (pod or {}).get("status") or {}
    phase = status.get("phase") or "unknown"
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        message = (term.get("message") or "").strip()
        if message:
            try:
                said = json.loads(message.splitlines()[-1])
            except ValueError:
                return PodOutcome(name, None, detail=f"exit {term.get('exitCode')}: {message[:200]}")
            return PodOutcome(name, bool(said.get("connected")), said.get("error"))
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return PodOutcome(name, None, detail=f"{phase}: {waiting['reason']} {waiting.get('message') or ''}".strip())
    return PodOutcome(name, None, detail=f"the pod ended {phase} without an answer" if _ended(pod) else f"no answer within the wait ({phase})")


@dataclass(frozen=True)
class HeadReach:
    """Both sides of the head-port criterion, as facts."""

    target: str  # host:port tried
    outside: PodOutcome | None  # the unlabelled pod; None when it could not be made
    inside: dict[str, dict[str, Any]] = field(default_factory=dict)  # GPU node -> its Ray task's `connect` answer (to the head pod's registered address)
    note: str | None = None  # why a side is missing


def judge(reach: HeadReach) -> tuple[bool, list[str], list[str]]:
    """(passed, evidence, failed nodes): the unlabelled pod was kept out (timeout or refused), every GPU node got in."""
    evidence, failed = [], []
    out = reach.outside
    kept_out = out is not None and out.connected is False and out.error in ("timeout", "refused")
    if out is None:
        evidence.append(f"no probe pod: {reach.note or 'not created'}")
    elif out.connected:
        evidence.append(f"pod {out.pod} without the Ray labels opened {reach.target}: the NetworkPolicy does not hold")
    elif out.connected is None:
        evidence.append(f"pod {out.pod} without the Ray labels gave no answer: {out.detail}")
    elif kept_out:
        evidence.append(f"pod {out.pod} without the Ray labels could not open {reach.target} ({out.error})")
    else:
        evidence.append(f"pod {out.pod}'s connect to {reach.target} failed in a way that proves nothing: {out.error}")
    if not reach.inside:
        evidence.append(f"no Ray pod tried {reach.target}" + (f": {reach.note}" if reach.note and out is not None else ""))
    for node, said in sorted(reach.inside.items()):
        where = said.get("address") or reach.target
        if said.get("connected"):
            evidence.append(f"{node} (Ray pod) opened {where}")
        else:
            failed.append(node)
            evidence.append(f"{node} (Ray pod) could not open {where}: {said.get('error') or 'the probe task did not run'}")
    return kept_out and bool(reach.inside) and not failed, evidence, failed
