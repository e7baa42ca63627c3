"""What every step of one `up`/`down`/`status` shares: config, clients, the tool runner, the notes.

Clients are made once and lazily (a dry run on an account with no cluster never needs a
kubeconfig), from `raydlc.edges.aws` and `raydlc.edges.kube` only. Files raydlc writes for a cluster — the
rendered manifests and its kubeconfig — live in one raydlc-owned directory per cluster and
region, so `~/.kube/config` is never touched unless KUBECONFIG (the setting) points there.

Decisions (the GPU Availability Zone, …) are not kept here: the resource that makes one returns it as
a frozen value to the resources that need it (see `raydlc.lifecycle.orders`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from raydlc.edges.tools import Command, Result, Runner
from raydlc.errors import InputError
from raydlc.lifecycle.types import Reporter

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.edges.kube import Kube

T = TypeVar("T")


@dataclass(frozen=True)
class Timings:
    """How long to wait for each kind of change, and how often to look; tests make them short."""

    poll_s: float = 10.0
    cluster_s: float = 45 * 60  # eksctl's control plane + VPC + add-ons: 15-20 min, often more
    nodegroup_s: float = 35 * 60  # eksctl's own wait is 25 min
    stack_s: float = 20 * 60
    helm_s: float = 10 * 60
    nodes_s: float = 10 * 60
    plugins_s: float = 10 * 60
    pods_s: float = 15 * 60  # the DLC image is large: first pulls take minutes
    stuck_s: float = 120.0  # how long a FailedMount/FailedScheduling may last with no node joining (lifecycle.stuck)


def cluster_dir(cfg: Config) -> Path:
    return Path.home() / ".raydlc" / f"{cfg.cluster.name}-{cfg.cluster.region}"


def kubeconfig_path(cfg: Config) -> Path:
    return Path(cfg.cluster.kubeconfig).expanduser() if cfg.cluster.kubeconfig else cluster_dir(cfg) / "kubeconfig"


def kube_target(cfg: Config) -> tuple[Path, str | None]:
    """The kubeconfig file and context raydlc reaches the cluster through. Attached with KUBE_CONTEXT: the user's own
    kubeconfig (KUBECONFIG, else ~/.kube/config, as kubectl reads it) at that context; otherwise raydlc's
    kubeconfig of the EKS cluster CLUSTER_NAME at its current context."""
    c = cfg.cluster
    if c.attach and c.kube_context:
        first = c.kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0].strip()
        return (Path(first).expanduser() if first else Path.home() / ".kube" / "config"), c.kube_context
    return kubeconfig_path(cfg), None


def with_plain_kubeconfig(cfg: Config) -> Config:
    """For a command that reads the cluster (status, down, jobs, verify): a plain KUBECONFIG (its
    first file, the one kubectl reads first) where neither --kubeconfig nor RAYDLC_KUBECONFIG is
    given. `up` does not take it: raydlc writes its kubeconfig, and KUBECONFIG is the user's own
    kubectl configuration."""
    plain = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0].strip()
    if cfg.cluster.kubeconfig or not plain:
        return cfg
    return cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"kubeconfig": plain})})


class Context:
    def __init__(
        self,
        cfg: Config,
        *,
        runner: Runner | None = None,
        reporter: Reporter | None = None,
        timings: Timings | None = None,
        force: bool = False,
        dry_run: bool = False,
        yes: bool = False,
    ) -> None:
        self.cfg = cfg
        self.runner = runner or Runner(dry_run=dry_run)
        self.reporter = reporter or Reporter()
        self.timings = timings or Timings()
        self.force = force
        self.dry_run = dry_run
        self.yes = yes  # the user agreed beforehand to what stops running work (`up --yes`)
        self.dir = cluster_dir(cfg)
        self.kubeconfig, self.kube_context = kube_target(cfg)
        self._lock = threading.RLock()
        self._session: Any = None
        self._clients: dict[str, Any] = {}
        self._kube: Kube | None = None
        self.notes: dict[str, list[str]] = {}  # per step: what was removed / found absent (down)
        self.attach = cfg.cluster.attach  # found platform vs made: which resources this run may act on (orders.resources)
        self._facts: Any = None
        self.target: Any = None  # attached: the worker group's WorkerTarget, from the found capacity (lifecycle.attach)
        self.keeps_cluster = False  # `down --keep-cluster`: what is inside the cluster must be removed, not left to go with it

    # ------------------------------------------------------------------ edges

    @property
    def cancel(self) -> threading.Event:
        return self.runner.cancel

    def interrupt(self) -> None:
        self.runner.interrupt()

    def aws_session(self) -> Any:
        """The one boto3 session of this run (credentials checked when it is made)."""
        from raydlc.edges import aws

        with self._lock:
            if self._session is None:
                self._session = aws.session(self.cfg.cluster.region)
            return self._session

    def aws(self, service: str) -> Any:
        from raydlc.edges import aws

        with self._lock:
            if service not in self._clients:
                self._clients[service] = aws.client(self.aws_session(), service)
            return self._clients[service]

    def kube(self) -> Kube:
        """The cluster's API through raydlc's kubeconfig; InputError when it was never written."""
        from raydlc.edges.kube import Kube, load_client

        with self._lock:
            if self._kube is None:
                self._kube = Kube(load_client(self.kubeconfig, self.kube_context))
            return self._kube

    @property
    def where(self) -> str:
        """The kubeconfig (and context) raydlc reaches the cluster through, as messages name it."""
        return f"{self.kubeconfig} (context {self.kube_context})" if self.kube_context else str(self.kubeconfig)

    def kube_or_none(self) -> Kube | None:
        if not self.kubeconfig.is_file():
            return None
        try:
            return self.kube()
        except InputError:
            if self.kubeconfig.is_file():  # there, but unusable: the user's to fix, not "no cluster"
                raise
            return None

    def forget_kube(self) -> None:
        """After the kubeconfig is (re)written: the next `kube()` reads it again."""
        with self._lock:
            self._kube = None

    def tool(self, step: str, cmd: Command, *, timeout: float | None = None, check: bool = True) -> Result:
        """Run a tool for a step; each output line goes to the live display as the step's detail."""
        return self.runner.run(cmd, on_line=lambda line: self.reporter.line(step, line), timeout=timeout, check=check)

    def wait(
        self, step: str, fetch: Callable[[], T], done: Callable[[T], bool], *, timeout: float, what: str,
        explain: Callable[[T], str] | None = None, stuck: Callable[[T], str | None] | None = None,
        hint: str | None = None,
    ) -> T:
        """Poll until `done`; `stuck(value)` returning a line ends the wait early as the step's failure (with `hint`).

        The same wait serves AWS and Kubernetes; running out of time is a KubeTimeout either way.
        """
        from raydlc.edges import poll
        from raydlc.edges.kube import KubeTimeout
        from raydlc.lifecycle.types import StepFailed

        def finished(value: T) -> bool:
            if done(value):
                return True
            line = stuck(value) if stuck is not None else None
            if line:
                raise StepFailed(f"{line} (waiting for {what})", hint=hint)
            return False

        self.reporter.line(step, f"waiting for {what}")
        return poll.until(fetch, finished, what=what, timeout=timeout, interval=self.timings.poll_s, explain=explain,
                          cancel=self.cancel, ramp=True, error=KubeTimeout)

    def note(self, step: str, text: str) -> None:
        with self._lock:
            self.notes.setdefault(step, []).append(text)

    # ------------------------------------------------------------------ documents

    def documents(self, only: str, zones: Sequence[str] = (), cfg: Config | None = None) -> dict[str, dict[str, Any]]:
        """The rendered documents of one kind (schema-checked by render); eksctl's need the zones, GPU AZ first.
        `cfg`: a variant of the run's config (spot-then-on-demand's on-demand fallback group)."""
        from raydlc.render import render_all

        return render_all(cfg or self.cfg, list(zones), only=only, target=self.target)

    def path_of(self, name: str) -> Path:
        return self.dir / name

    def write(self, docs: dict[str, dict[str, Any]]) -> None:
        """Write the documents a tool will read; a dry run writes nothing."""
        from raydlc.render import write

        if self.dry_run:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        write(docs, self.dir)
