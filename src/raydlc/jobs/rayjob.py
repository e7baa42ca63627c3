"""A RayJob on the standing RayCluster and the Ray job it becomes: apply it, learn its submission id, see it submitted.

KubeRay v1.7.0 (`ray-operator/controllers/ray/rayjob_controller.go`) gives a RayJob its Ray submission id on
the first reconcile (`initRayJobStatusIfNeed`): `spec.jobId` when set, else `<name>-<5 random characters>`
(`utils.GenerateRayJobId`), written to `status.jobId` before anything is submitted. In K8sJobMode a submitter
Job then runs `ray job submit --submission-id $RAY_JOB_SUBMISSION_ID` against the head's dashboard, and the
controller mirrors the Ray job into `status.jobStatus` / `status.jobDeploymentStatus`. raydlc renders no
`spec.jobId`: a fixed id would make a second RayJob of the same name reattach to the first one's ended job
(the submitter runs `ray job status` first and only follows a job that exists). So the id is read from the
status, and from then on the job is an ordinary job of the head's Jobs API.

Deleting a RayJob whose job still runs makes KubeRay stop that job (its finalizer `ray.io/rayjob-finalizer`);
raydlc stops it first itself, so a replacement never shares the GPU nodes with the job it replaces.

Past `activeDeadlineSeconds` KubeRay only marks a RayJob `Failed` with reason `DeadlineExceeded`
(`checkActiveDeadlineAndUpdateStatusIfNeeded`); on a `clusterSelector` RayJob it then deletes and stops nothing
(the `Complete, Failed` case returns first), so the Ray job would keep the GPU nodes busy. `DeadlineGuard` stops
it through the head's Jobs API while raydlc follows the job; idle GPU workers then scale down as after any job.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydlc.edges import poll
from raydlc.errors import InputError, RayError

if TYPE_CHECKING:
    from raydlc.edges.kube import Kube
    from raydlc.edges.ray_dashboard import Dashboard, Job

API, KIND = "ray.io/v1", "RayJob"
FAILED = ("Failed", "ValidationFailed")
DEADLINE_EXCEEDED = "DeadlineExceeded"  # KubeRay's status.reason past activeDeadlineSeconds  # KubeRay's JobDeploymentStatus values that end a RayJob without its job
ID_TIMEOUT_S = 60.0  # the operator writes status.jobId on its first reconcile: a minute without it means no operator
SUBMIT_TIMEOUT_S = 600.0  # the submitter pod starts on the system node (the head's image, already pulled)
GONE_TIMEOUT_S = 120.0
POLL_S = 1.0


def where(doc: Mapping[str, Any]) -> tuple[str, str]:
    meta = doc["metadata"]
    return str(meta["namespace"]), str(meta["name"])


def describe(rj: Mapping[str, Any]) -> str:
    """`job <id>, <deployment status>` as KubeRay reports it, for a person."""
    st = rj.get("status") or {}
    parts = [f"job {st['jobId']}" if st.get("jobId") else "no job id yet",
             str(st.get("jobDeploymentStatus") or "not picked up by KubeRay")]
    if st.get("jobStatus"):
        parts.append(str(st["jobStatus"]))
    return ", ".join(parts)


def failure(rj: Mapping[str, Any]) -> str | None:
    """Why KubeRay gave the RayJob up before its Ray job ran (validation, a failed submitter); None otherwise."""
    st = rj.get("status") or {}
    if st.get("jobDeploymentStatus") not in FAILED or st.get("jobStatus"):
        return None
    return f"{st.get('jobDeploymentStatus')}: {st.get('reason') or 'no reason given'}: {st.get('message') or ''}".rstrip(": ")


def existing(kube: Kube, doc: Mapping[str, Any]) -> dict[str, Any] | None:
    ns, name = where(doc)
    return kube.get(API, KIND, name, ns)


def refuse_existing(rj: Mapping[str, Any], doc: Mapping[str, Any]) -> InputError:
    ns, name = where(doc)
    job = (rj.get("status") or {}).get("jobId")
    return InputError(
        f"RayJob {ns}/{name} already exists ({describe(rj)}); nothing was applied",
        hint="`raydlc submit --rayjob --yes` replaces it (its Ray job is stopped first), or --set RAY_JOB_NAME=<a new name>"
        + (f"; `raydlc job logs {job}` shows what it did" if job else ""),
    )


def remove(kube: Kube, dash: Dashboard, rj: Mapping[str, Any], doc: Mapping[str, Any]) -> None:
    """Stop the old RayJob's Ray job if it still runs, delete the RayJob and wait until it is gone."""
    from raydlc.jobs import control

    ns, name = where(doc)
    job = (rj.get("status") or {}).get("jobId")
    known = dash.job(job) if job else None
    if known is not None and not known.terminal:
        control.stop(dash, job, wait_s=60)
    kube.delete(API, KIND, name, ns)
    kube.wait(lambda: kube.get(API, KIND, name, ns), lambda got: got is None, timeout=GONE_TIMEOUT_S, interval=POLL_S,
              what=f"RayJob {ns}/{name} to be deleted")


def submission_id(kube: Kube, doc: Mapping[str, Any], *, timeout_s: float = ID_TIMEOUT_S) -> str:
    """The Ray submission id KubeRay gave the RayJob (`status.jobId`)."""
    from raydlc.edges.kube import KubeTimeout

    ns, name = where(doc)
    try:
        rj = kube.wait(lambda: kube.get(API, KIND, name, ns) or {}, lambda got: bool((got.get("status") or {}).get("jobId"))
                       or failure(got) is not None, timeout=timeout_s, interval=POLL_S, what=f"KubeRay to take RayJob {ns}/{name}")
    except KubeTimeout:
        raise RayError(f"KubeRay gave RayJob {ns}/{name} no job id in {timeout_s:.0f} s: is the KubeRay operator running?",
                       hint=f"`raydlc status` shows the kuberay step; kubectl -n {ns} describe rayjob {name}") from None
    why = failure(rj)
    if why is not None:
        raise RayError(f"KubeRay refused RayJob {ns}/{name}: {why}", hint=f"kubectl -n {ns} describe rayjob {name}")
    return str(rj["status"]["jobId"])


def submitted(kube: Kube, dash: Dashboard, doc: Mapping[str, Any], job_id: str, notice: Callable[[str], None], *,
              timeout_s: float = SUBMIT_TIMEOUT_S) -> Job:
    """The Ray job once KubeRay's submitter has put it on the head; a RayJob KubeRay fails first is an error naming why."""
    ns, name = where(doc)
    said = False

    def look() -> tuple[Job | None, dict[str, Any]]:
        nonlocal said
        job = dash.job(job_id)
        if job is not None:
            return job, {}
        rj = kube.get(API, KIND, name, ns)
        if rj is None:
            raise RayError(f"RayJob {ns}/{name} was deleted before its job {job_id} reached the head")
        why = failure(rj)
        if why is not None:
            raise RayError(f"RayJob {ns}/{name} failed before its job {job_id} reached the head: {why}",
                           hint=f"kubectl -n {ns} logs job/{name} (the submitter); kubectl -n {ns} describe rayjob {name}")
        if not said:
            notice(f"waiting for KubeRay's submitter to submit job {job_id} ({describe(rj)})")
            said = True
        return None, rj

    job, rj = poll.until(look, lambda got: got[0] is not None, what=f"job {job_id} of RayJob {ns}/{name} to reach the head",
                         timeout=timeout_s, interval=POLL_S, or_last=True)
    if job is None:
        raise RayError(f"job {job_id} of RayJob {ns}/{name} did not reach the head in {timeout_s:.0f} s ({describe(rj)})",
                       hint=f"kubectl -n {ns} get pods -l job-name={name} shows the submitter pod; kubectl -n {ns} describe rayjob {name}")
    return job


def past_deadline(rj: Mapping[str, Any]) -> str | None:
    """KubeRay's message when it failed the RayJob for its activeDeadlineSeconds; None otherwise."""
    st = rj.get("status") or {}
    if st.get("jobDeploymentStatus") != "Failed" or st.get("reason") != DEADLINE_EXCEEDED:
        return None
    return str(st.get("message") or "the RayJob has passed its activeDeadlineSeconds")


@dataclass
class DeadlineGuard:
    """Stops the Ray job of a RayJob KubeRay has failed for its deadline: KubeRay itself leaves it running."""

    kube: Kube
    dash: Dashboard
    doc: Mapping[str, Any]
    job_id: str
    notice: Callable[[str], None]
    stopped: str | None = None  # KubeRay's message, once the guard stopped the job

    def check(self) -> bool:
        """One look: True once there is nothing more to watch (the job stopped here, or ended)."""
        from raydlc.jobs import control

        ns, name = where(self.doc)
        rj = self.kube.get(API, KIND, name, ns)
        why = past_deadline(rj) if rj is not None else None
        if why is None:
            return False
        job = self.dash.job(self.job_id)
        if job is None or job.terminal:
            return True
        control.stop(self.dash, self.job_id, wait_s=60)
        self.stopped = why
        self.notice(f"RayJob {ns}/{name} passed its deadline ({why}); KubeRay marks it Failed and leaves the job running on the "
                    f"standing cluster, so raydlc stopped job {self.job_id}: its GPU workers scale down once idle")
        return True

    @contextlib.contextmanager
    def watching(self, every_s: float = POLL_S) -> Iterator[DeadlineGuard]:
        """Check in a second thread while the caller follows the job."""
        done = threading.Event()

        def loop() -> None:
            while not done.wait(every_s):
                try:
                    if self.check():
                        return
                except Exception:  # a dropped connection: look again on the next tick
                    continue

        thread = threading.Thread(target=loop, name="rayjob-deadline", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            done.set()
            thread.join(timeout=5)
