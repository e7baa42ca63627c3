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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from raydlc.errors import InputError, RayError

if TYPE_CHECKING:
    from raydlc.dashboard import Dashboard, Job
    from raydlc.kube import Kube

API, KIND = "ray.io/v1", "RayJob"
FAILED = ("Failed", "ValidationFailed")  # KubeRay's JobDeploymentStatus values that end a RayJob without its job
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
    from raydlc import jobs

    ns, name = where(doc)
    job = (rj.get("status") or {}).get("jobId")
    known = dash.job(job) if job else None
    if known is not None and not known.terminal:
        jobs.stop(dash, job, wait_s=60)
    kube.delete(API, KIND, name, ns)
    kube.wait(lambda: kube.get(API, KIND, name, ns), lambda got: got is None, timeout=GONE_TIMEOUT_S, interval=POLL_S,
              what=f"RayJob {ns}/{name} to be deleted")


def submission_id(kube: Kube, doc: Mapping[str, Any], *, timeout_s: float = ID_TIMEOUT_S) -> str:
    """The Ray submission id KubeRay gave the RayJob (`status.jobId`)."""
    from raydlc.kube import KubeTimeout

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
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        job = dash.job(job_id)
        if job is not None:
            return job
        rj = kube.get(API, KIND, name, ns)
        if rj is None:
            raise RayError(f"RayJob {ns}/{name} was deleted before its job {job_id} reached the head")
        why = failure(rj)
        if why is not None:
            raise RayError(f"RayJob {ns}/{name} failed before its job {job_id} reached the head: {why}",
                           hint=f"kubectl -n {ns} logs job/{name} (the submitter); kubectl -n {ns} describe rayjob {name}")
        if time.monotonic() >= deadline:
            raise RayError(f"job {job_id} of RayJob {ns}/{name} did not reach the head in {timeout_s:.0f} s ({describe(rj)})",
                           hint=f"kubectl -n {ns} get pods -l job-name={name} shows the submitter pod; kubectl -n {ns} describe rayjob {name}")
        if not said:
            notice(f"waiting for KubeRay's submitter to submit job {job_id} ({describe(rj)})")
            said = True
        time.sleep(POLL_S)
