"""A recorded double of kubectl: `version --client` and `port-forward svc/NAME [LOCAL]:PORT`.

It logs its argv, refuses flags kubectl does not have, reads the Service from the Kubernetes
API the kubeconfig names (kmock) as kubectl does — a missing Service, a port the Service does
not expose, or no Running pod behind its selector fail with kubectl's own words — then listens
on the address asked (127.0.0.1 unless told otherwise), prints kubectl's `Forwarding from`
line, and relays every connection to where the scenario says that Service's pod really
listens (`forward`: {"NS/NAME:PORT": "host:port"}, the local Ray head's dashboard in the tests)
until it is terminated.

With a kubeconfig user's token (the platform world, tests/doubles/platform_world.py) every request is that
user's, authorised by the world's RBAC: the Service's get, the pods' list and the port-forward itself
(`authorize`: `get` or `create` on `pods/portforward`); a refusal fails with the API server's Forbidden message.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

from world import Kube, fail, log_call, say, scenario

VERSION = "Client Version: v1.33.1\nKustomize Version: v5.6.0"


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _relay(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(target, timeout=10)
        except OSError as e:
            sys.stderr.write(f"E1130 portforward.go:424] an error occurred forwarding -> {target[1]}: {e}\n")
            conn.close()
            continue
        upstream.settimeout(None)
        threading.Thread(target=_pipe, args=(conn, upstream), daemon=True).start()
        threading.Thread(target=_pipe, args=(upstream, conn), daemon=True).start()


def may(kube: Kube, verb: str, ns: str, pod: str) -> bool:
    """The API server's decision on `verb pods/portforward` for the kubeconfig's user (a SelfSubjectAccessReview
    answers it as the request would be answered); a kmock without the platform's authorizer (no review answered)
    allows everything, as it does every other request."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {"resourceAttributes": {
        "verb": verb, "group": "", "resource": "pods", "subresource": "portforward", "namespace": ns, "name": pod}}}
    _, body = kube.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    st = (body or {}).get("status") if isinstance(body, dict) else None
    return not isinstance(st, dict) or bool(st.get("allowed"))


def authorize(kube: Kube, ns: str, pod: str) -> None:
    """The port-forward request itself, as kubectl 1.33 makes it against an API server before 1.35: a WebSocket
    upgrade (a GET: `get pods/portforward`); refused, client-go's fallback dialer retries over SPDY (a POST:
    `create pods/portforward`), and the API server's refusal of that is what kubectl prints. Allowed, nothing is
    sent (kmock is no kubelet: the relay below stands in for the stream). A kubeconfig without a token is the
    test's own admin."""
    if not kube.token or may(kube, "get", ns, pod) or may(kube, "create", ns, pod):
        return
    code, body = kube.call("POST", f"/api/v1/namespaces/{ns}/pods/{pod}/portforward")  # refused: never reaches kmock
    if code == 403:
        fail(f"error: error upgrading connection: {(body or {}).get('message')}")


def port_forward(kube: Kube, ns: str, resource: str, ports: str, address: str) -> None:
    kind, _, name = resource.partition("/")
    if kind not in ("svc", "service", "services"):
        fail(f"error: this double forwards Services only, got {resource!r}")
    code, svc = kube.call("GET", kube.path("Service", ns, name))
    if code == 403:
        fail(f"Error from server (Forbidden): {svc.get('message')}")
    if code != 200:
        fail(f'Error from server (NotFound): services "{name}" not found')
    local, _, remote = ports.rpartition(":")
    svc_ports = [int(p["port"]) for p in (svc.get("spec") or {}).get("ports") or []]
    if int(remote) not in svc_ports:
        fail(f"error: Service {name} does not have a service port {remote}")
    selector = (svc.get("spec") or {}).get("selector") or {}
    code, listed = kube.call("GET", kube.path("Pod", ns))
    if code == 403:
        fail(f"Error from server (Forbidden): {listed.get('message')}")
    pods = [p for p in (listed or {}).get("items") or [] if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())]
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if not running:
        phase = (pods[0].get("status") or {}).get("phase", "Pending") if pods else "none"
        fail(f"error: unable to forward port because pod is not running. Current status={phase}")
    authorize(kube, ns, running[0]["metadata"]["name"])
    target = (scenario().get("forward") or {}).get(f"{ns}/{name}:{remote}")
    if not target:
        fail(f"error: the test gave no place to forward {ns}/{name}:{remote} to (scenario 'forward')")
    host, _, port = target.rpartition(":")
    listener = socket.socket()
    listener.bind((address, int(local or 0)))
    listener.listen(64)
    say(f"Forwarding from {address}:{listener.getsockname()[1]} -> {remote}")
    threading.Thread(target=_relay, args=(listener, (host, int(port))), daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    listener.close()


def main(argv: list[str]) -> int:
    t0 = time.time()
    ap = argparse.ArgumentParser(prog="kubectl", add_help=False)
    ap.add_argument("--kubeconfig")
    ap.add_argument("--context")
    ap.add_argument("-n", "--namespace", default="default")
    ap.add_argument("command")
    ap.add_argument("args", nargs="*")
    ap.add_argument("--client", action="store_true")
    ap.add_argument("--address", default="127.0.0.1")
    ns, unknown = ap.parse_known_args(argv)
    if unknown:
        fail(f"error: unknown flag: {unknown[0]}")
    log_call("kubectl", argv, 0, t0, pid=os.getpid())
    if ns.command == "version":
        say(VERSION)
        return 0
    if ns.command != "port-forward" or len(ns.args) != 2:
        fail(f"error: this double knows `version --client` and `port-forward TYPE/NAME [LOCAL]:REMOTE`, got {argv}")
    kubeconfig = ns.kubeconfig or os.environ.get("KUBECONFIG")
    if not kubeconfig:
        fail("error: no kubeconfig")
    port_forward(Kube.from_kubeconfig(kubeconfig, ns.context), ns.namespace, ns.args[0], ns.args[1], ns.address)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
