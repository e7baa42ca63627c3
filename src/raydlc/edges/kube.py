"""The one gateway to the Kubernetes API: get, apply, delete, list, wait, logs — errors mapped once.

Built on the official `kubernetes` client's ApiClient (its kubeconfig loading, exec credential
plugins such as `aws eks get-token`, TLS and retries) but speaking plain dicts: manifests are
Python data in raydlc, and a generic path per kind keeps custom resources (RayCluster) and core
kinds on one code path. `apply` is create-or-patch with a JSON merge patch, which every API
server and every kind accepts; a document that already matches is left alone, so a second `up`
changes nothing. The ApiClient is a parameter: tests hand in one that talks to a local server.

The predicates at the bottom (`node_ready`, `allocatable`, `deployment_available`, …) are pure:
they read an object and answer, so a wait's condition is testable without a cluster.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from raydlc.edges import poll
from raydlc.errors import InputError, KubeError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

T = TypeVar("T")
FIELD_MANAGER = "raydlc"
MERGE_PATCH = "application/merge-patch+json"
# Each request: a connect and a read timeout, as the AWS calls have (raydlc.edges.aws), and one retry of a
# connection that failed to open; a read that timed out is not retried. A server that accepts and never
# answers costs one read timeout per request, and once it has not answered for UNANSWERED_BUDGET_S in a
# row, every later request of the same client fails at once: a command ends within about 20 s, naming
# the endpoint. Waits and watches keep their own step timeouts (`Kube.wait`); an answer resets the count.
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 10.0
UNANSWERED_BUDGET_S = 20.0


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced:
            if namespace is None and name is not None:
                raise KubeError(f"{self.kind} {name}: a namespace is needed")
            if namespace is not None:
                base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name)}"
        if sub:
            base += f"/{sub}"
        return base


KINDS: dict[tuple[str, str], Kind] = {
    (k.api_version, k.kind): k
    for k in [
        Kind("v1", "Namespace", "namespaces", False),
        Kind("v1", "Node", "nodes", False),
        Kind("v1", "Pod", "pods", True),
        Kind("v1", "Secret", "secrets", True),
        Kind("v1", "ConfigMap", "configmaps", True),
        Kind("v1", "Service", "services", True),
        Kind("v1", "ServiceAccount", "serviceaccounts", True),
        Kind("v1", "Event", "events", True),
        Kind("apps/v1", "Deployment", "deployments", True),
        Kind("apps/v1", "DaemonSet", "daemonsets", True),
        Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", True),
        Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False),
        Kind("ray.io/v1", "RayCluster", "rayclusters", True),
        Kind("ray.io/v1", "RayJob", "rayjobs", True),
        Kind("karpenter.sh/v1", "NodePool", "nodepools", False),
    ]
}


def kind_of(api_version: str, kind: str) -> Kind:
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        raise KubeError(
            f"raydlc does not know the Kubernetes kind {api_version}/{kind}",
            hint="add it to raydlc.edges.kube.KINDS (plural name and whether it is namespaced)",
        ) from None


@dataclass(frozen=True)
class Applied:
    """What `apply` did to one object: created, patched (with the differing fields) or unchanged."""

    kind: str
    name: str
    namespace: str | None
    action: str
    changed: tuple[str, ...] = ()


class KubeTimeout(KubeError, poll.TimedOut):
    """A wait ran out of time; the message says what was last seen."""


class KubeUnreachable(KubeError):
    """The API server did not answer (wrong endpoint, cluster gone, network)."""


def load_client(kubeconfig: str | Path, context: str | None = None) -> ApiClient:
    """An ApiClient from a kubeconfig file (exec plugins such as `raydlc eks-token` included), retrying
    only a connection that could not be opened (a read that timed out is not sent again)."""
    from kubernetes import client, config
    from urllib3.util.retry import Retry

    path = check_kubeconfig(kubeconfig)
    conf = client.Configuration()
    try:
        config.load_kube_config(config_file=str(path), context=context, client_configuration=conf, persist_config=False)
    except Exception as e:  # the loader raises ConfigException, ValueError, yaml errors: the file is wrong
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise InputError(f"kubeconfig {path} cannot be used: {first[:200]}", hint="raydlc up --only cluster") from e
    conf.retries = Retry(total=1, connect=1, read=0, status=0, redirect=0, other=0, raise_on_status=False)
    return client.ApiClient(configuration=conf)


def check_kubeconfig(kubeconfig: str | Path) -> Path:
    """The kubeconfig the user named (or raydlc wrote) is a readable text file: exit 2 otherwise, one line."""
    path = Path(kubeconfig).expanduser()
    if path.is_dir():
        raise InputError(f"kubeconfig {path} is a directory, not a file", hint="raydlc status --kubeconfig PATH-TO-FILE")
    if not path.is_file():
        raise InputError(f"kubeconfig {path} does not exist", hint="raydlc up")
    try:
        head = path.open("rb").read(4096)
    except OSError as e:
        raise InputError(f"kubeconfig {path} cannot be read ({e.strerror or e})") from None
    if b"\0" in head:
        raise InputError(f"kubeconfig {path} is a binary file, not a kubeconfig", hint="raydlc up --only cluster")
    return path


def _labels(selector: Mapping[str, str] | str | None) -> str | None:
    if selector is None or isinstance(selector, str):
        return selector
    return ",".join(f"{k}={v}" for k, v in selector.items())


class Kube:
    """The Kubernetes API for one cluster, through one ApiClient."""

    def __init__(self, api: ApiClient, *, connect_s: float = CONNECT_TIMEOUT_S, read_s: float = READ_TIMEOUT_S,
                 budget_s: float = UNANSWERED_BUDGET_S) -> None:
        self.api = api
        self.timeout = (connect_s, read_s)
        self.budget_s = budget_s
        self._unanswered_s = 0.0  # time spent in a row on requests the server did not answer
        self._silent: KubeUnreachable | None = None

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    # ------------------------------------------------------------------ transport

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | None] | None = None,
        body: Any = None,
        content_type: str | None = None,
        raw: bool = False,
    ) -> tuple[int, Any]:
        """(status, decoded body); transport failures raise KubeUnreachable, HTTP errors do not."""
        from urllib3.exceptions import HTTPError

        if self._silent is not None:  # this command's budget for an API that does not answer is spent
            raise self._silent
        headers = {"Accept": "application/json" if not raw else "*/*", "User-Agent": "raydlc"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        started = time.monotonic()
        try:
            serialized = self.api.param_serialize(
                method=method, resource_path=path, query_params=params, header_params=headers, body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.api.call_api(*serialized, _request_timeout=self.timeout)
            resp.read()
        except HTTPError as e:
            self._unanswered_s += time.monotonic() - started
            err = KubeUnreachable(
                f"the Kubernetes API at {self.host} did not answer {method} {path} ({_why(e)})",
                hint="check the cluster exists (`raydlc status`) and the kubeconfig points at it",
            )
            if self._unanswered_s >= self.budget_s:
                self._silent = KubeUnreachable(
                    f"the Kubernetes API at {self.host} has not answered for {self._unanswered_s:.0f} s ({_why(e)})",
                    hint=err.hint)
            raise err from e
        except Exception as e:
            from kubernetes.client.exceptions import ApiException

            if isinstance(e, ApiException):
                return int(e.status or 0), _decode(e.body)
            raise
        self._unanswered_s = 0.0
        data = resp.data or b""
        if raw:
            return int(resp.status), data.decode("utf-8", "replace")
        return int(resp.status), _decode(data)

    def _call(self, method: str, path: str, what: str, *, ok_missing: bool = False, **kw: Any) -> Any:
        status, body = self.request(method, path, **kw)
        if 200 <= status < 300:
            return body
        if status == 404 and ok_missing:
            return None
        raise _error(status, body, f"{method} {path}", what)

    # ------------------------------------------------------------------ objects

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        k = kind_of(api_version, kind)
        return self._call("GET", k.path(namespace, name), f"read {kind} {name}", ok_missing=True)

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        labels: Mapping[str, str] | str | None = None,
        fields: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every object of a kind (in a namespace, or all namespaces), optionally by label/field selector."""
        k = kind_of(api_version, kind)
        query = {"labelSelector": _labels(labels), "fieldSelector": fields}
        body = self._call("GET", k.path(namespace), f"list {k.plural}", query=query, ok_missing=True)
        if body is None:  # the resource type is not served (e.g. a CRD not installed yet)
            return []
        return list(body.get("items") or [])

    def list_if_served(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict[str, Any]] | None:
        """Like `list`, but None when the API server does not serve the kind at all (its CRD or API group is absent:
        Karpenter's NodePool on a cluster without Karpenter), which `list` reads as no objects."""
        k = kind_of(api_version, kind)
        body = self._call("GET", k.path(namespace), f"list {k.plural}", ok_missing=True)
        return None if body is None else list(body.get("items") or [])

    def create(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        k, name, ns = _ident(doc)
        return self._call("POST", k.path(ns), f"create {k.kind} {name}", body=dict(doc), query={"fieldManager": FIELD_MANAGER})

    def patch(self, api_version: str, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None,
              *, subresource: str | None = None) -> dict[str, Any]:
        """A JSON merge patch (`None` removes a key); `subresource="status"` for a status."""
        k = kind_of(api_version, kind)
        return self._call(
            "PATCH", k.path(namespace, name, subresource), f"patch {kind} {name}", body=dict(patch),
            content_type=MERGE_PATCH, query={"fieldManager": FIELD_MANAGER},
        )

    def apply(self, doc: Mapping[str, Any]) -> list[Applied]:
        """Create or patch so the object holds at least `doc`; a `v1 List` applies each item."""
        if doc.get("kind") == "List":
            out: list[Applied] = []
            for item in doc.get("items") or []:
                out.extend(self.apply(item))
            return out
        k, name, ns = _ident(doc)
        current = self.get(k.api_version, k.kind, name, ns)
        if current is None:
            status, body = self.request("POST", k.path(ns), body=dict(doc), query={"fieldManager": FIELD_MANAGER})
            if 200 <= status < 300:
                return [Applied(k.kind, name, ns, "created")]
            if status != 409:  # 409: created meanwhile by someone else; patch it like any other
                raise _error(status, body, f"POST {k.path(ns)}", f"create {k.kind} {name}")
            current = self.get(k.api_version, k.kind, name, ns) or {}
        changed = differences(_writable(doc), current)
        if not changed:
            return [Applied(k.kind, name, ns, "unchanged")]
        self.patch(k.api_version, k.kind, name, _writable(doc), ns)
        return [Applied(k.kind, name, ns, "patched", tuple(changed))]

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        """Ask for deletion (dependents in the background); False when it was already gone."""
        k = kind_of(api_version, kind)
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        return self._call("DELETE", k.path(namespace, name), f"delete {kind} {name}", ok_missing=True, body=body) is not None

    # ------------------------------------------------------------------ reads people need

    def version(self) -> str:
        """The server's gitVersion: proof that the kubeconfig reaches a working API server."""
        body = self._call("GET", "/version", "read the server version")
        return str(body.get("gitVersion", "?"))

    def nodes(self, labels: Mapping[str, str] | str | None = None) -> list[dict[str, Any]]:
        return self.list("v1", "Node", labels=labels)

    def pods(self, namespace: str | None, *, labels: Mapping[str, str] | str | None = None,
             node: str | None = None) -> list[dict[str, Any]]:
        return self.list("v1", "Pod", namespace, labels=labels, fields=f"spec.nodeName={node}" if node else None)

    def events(self, namespace: str, *, involved: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """Events of a namespace (about one object when `involved` is given), oldest first."""
        sel = [f"involvedObject.name={involved}"] if involved else []
        if kind:
            sel.append(f"involvedObject.kind={kind}")
        items = self.list("v1", "Event", namespace, fields=",".join(sel) or None)
        return sorted(items, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))

    def may(self, verb: str, resource: str, *, group: str = "", subresource: str = "", namespace: str | None = None,
            name: str | None = None) -> bool:
        """Whether the caller may do this, as the API server's authorizer answers a SelfSubjectAccessReview
        (authorization.k8s.io/v1): asked before acting, so that every refusal can be named at once."""
        attrs = {"verb": verb, "group": group, "resource": resource, "subresource": subresource or None,
                 "namespace": namespace, "name": name}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {k: v for k, v in attrs.items() if v}}}
        answer = self._call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                            f"review access to {verb} {resource}", body=body)
        return bool(((answer or {}).get("status") or {}).get("allowed"))

    def logs(self, pod: str, namespace: str, *, container: str | None = None, tail: int | None = None) -> str:
        path = kind_of("v1", "Pod").path(namespace, pod, "log")
        query = {"container": container, "tailLines": str(tail) if tail else None}
        status, body = self.request("GET", path, query=query, raw=True)
        if not 200 <= status < 300:
            raise _error(status, _decode(body.encode()), f"GET {path}", f"read the log of pod {pod}")
        return str(body)

    def wait(self, fetch: Callable[[], T], done: Callable[[T], bool], *, timeout: float, interval: float, what: str,
             explain: Callable[[T], str] | None = None, cancel: threading.Event | None = None) -> T:
        """Poll until `done(value)` (pauses ramping up to `interval`); KubeTimeout with `explain(last value)` on timeout."""
        return poll.until(fetch, done, what=what, timeout=timeout, interval=interval, explain=explain, cancel=cancel,
                          ramp=True, error=KubeTimeout)


def _why(e: Exception) -> str:
    """A transport failure in a few words: urllib3 wraps the cause in MaxRetryError's `reason`."""
    cause = getattr(e, "reason", None) or e
    text = str(cause)
    if "timed out" in text.lower():
        return f"no answer within the {READ_TIMEOUT_S:g} s read timeout" if "read" in text.lower() else \
            f"no connection within {CONNECT_TIMEOUT_S:g} s"
    return f"{type(cause).__name__}: {text[:200]}"


def _decode(data: bytes | str | None) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _error(status: int, body: Any, request: str, what: str) -> KubeError:
    msg = body.get("message") if isinstance(body, dict) else (str(body)[:200] if body else "")
    reason = body.get("reason") if isinstance(body, dict) else None
    text = f"kubernetes: cannot {what} ({status}{' ' + reason if reason else ''}: {msg})" if msg else f"kubernetes: cannot {what} ({status})"
    hint = {
        401: "the credentials in the kubeconfig were refused; rewrite it with `raydlc up --only cluster` "
        "(and check `aws sts get-caller-identity`)",
        403: "your identity lacks RBAC permission for this; EKS access entries grant it",
        422: "the object was rejected as invalid; `raydlc render` shows what raydlc sends",
    }.get(status)
    err = KubeError(text, hint=hint)
    err.status = status  # type: ignore[attr-defined]
    err.request = request  # type: ignore[attr-defined]
    return err


def _ident(doc: Mapping[str, Any]) -> tuple[Kind, str, str | None]:
    k = kind_of(str(doc.get("apiVersion")), str(doc.get("kind")))
    meta = doc.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise KubeError(f"{k.kind} without metadata.name cannot be applied")
    return k, str(name), meta.get("namespace") if k.namespaced else None


def _writable(doc: Mapping[str, Any]) -> dict[str, Any]:
    """What a client may set: everything but `status` (a subresource, owned by controllers)."""
    return {k: v for k, v in doc.items() if k != "status"}


# ---------------------------------------------------------------------- pure reads of objects


def differences(desired: Any, actual: Any, path: str = "") -> list[str]:
    """Field paths where `actual` does not hold `desired`; fields only the server set do not count.

    Dicts compare key by key (extra keys in `actual` are defaults or status), lists of equal
    length item by item, anything else by equality.
    """
    if isinstance(desired, Mapping):
        if not isinstance(actual, Mapping):
            return [path or "."]
        out: list[str] = []
        for key, want in desired.items():
            out.extend(differences(want, actual.get(key), f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(desired, list):
        if not isinstance(actual, list) or len(actual) != len(desired):
            return [path or "."]
        out = []
        for i, (want, have) in enumerate(zip(desired, actual)):
            out.extend(differences(want, have, f"{path}[{i}]"))
        return out
    return [] if desired == actual or (str(desired) == str(actual) and _scalar(actual)) else [path or "."]


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool))


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def condition(obj: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def node_ready(node: Mapping[str, Any]) -> bool:
    c = condition(node, "Ready")
    return c is not None and c.get("status") == "True"


def allocatable(node: Mapping[str, Any], resource: str) -> int:
    """A node's allocatable count of an extended resource (`nvidia.com/gpu`); 0 when absent."""
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    try:
        return int(str(raw)) if raw is not None else 0
    except ValueError:
        return 0


def taints_tolerated(taints: Iterable[Mapping[str, Any]], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether every NoSchedule/NoExecute taint is tolerated (the scheduler's rule, simplified)."""
    tols = list(tolerations)
    for t in taints:
        if t.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(tol, t) for tol in tols):
            return False
    return True


def _tolerates(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if tol.get("effect") and tol.get("effect") != taint.get("effect"):
        return False
    if tol.get("operator") == "Exists":
        return not tol.get("key") or tol.get("key") == taint.get("key")
    return tol.get("key") == taint.get("key") and str(tol.get("value", "")) == str(taint.get("value", ""))


def deployment_available(dep: Mapping[str, Any] | None) -> bool:
    if not dep:
        return False
    c = condition(dep, "Available")
    want = int((dep.get("spec") or {}).get("replicas", 1) or 0)
    have = int((dep.get("status") or {}).get("availableReplicas", 0) or 0)
    return (c is None or c.get("status") == "True") and have >= max(want, 1)


def crd_established(crd: Mapping[str, Any] | None) -> bool:
    if not crd:
        return False
    c = condition(crd, "Established")
    return c is not None and c.get("status") == "True"


def pod_phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def pod_ready(pod: Mapping[str, Any]) -> bool:
    c = condition(pod, "Ready")
    return pod_phase(pod) == "Running" and c is not None and c.get("status") == "True"


def pod_node(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName")


def pending_reason(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()) -> str:
    """Why a pod is not running: the scheduler's event message, else its conditions/containers."""
    name = name_of(pod)
    for e in reversed(list(events)):
        if (e.get("involvedObject") or {}).get("name") == name and e.get("reason") in ("FailedScheduling", "Failed", "FailedMount", "BackOff"):
            return f"{e.get('reason')}: {e.get('message', '').strip()}"
    c = condition(pod, "PodScheduled")
    if c is not None and c.get("status") == "False":
        return f"{c.get('reason', 'Unschedulable')}: {c.get('message', '').strip()}"
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', 'Waiting')}: {waiting.get('message', '').strip()}".rstrip(": ")
    return pod_phase(pod)
