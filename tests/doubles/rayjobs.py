"""KubeRay's RayJob controller for a RayJob on a standing RayCluster (`clusterSelector`), in K8sJobMode: a thread.

What it does, each as KubeRay v1.7.0 does it (`ray-operator/controllers/ray/rayjob_controller.go` unless named):
- first reconcile (`initRayJobStatusIfNeed`): `status.jobId` = `spec.jobId`, else `<name>-<5 characters>`
  (`utils.GenerateRayJobId`, apimachinery's rand.String alphabet), `status.rayClusterName` from the selector,
  `jobDeploymentStatus: Initializing`, the head's `dashboardURL`; nothing is submitted yet;
- the submitter Job (`common/job.go` `BuildJobSubmitCommand`, `getRuntimeEnvJson`; `configureSubmitterContainer`
  gives it the cluster's token): `ray job status $ID` and, when the head does not know the id, `ray job submit
  --no-wait --runtime-env-json <runtimeEnvYAML as JSON> --submission-id $ID -- <entrypoint>`. Here that is the
  same Jobs API request, POST /api/jobs/, with `Authorization: Bearer <token>`, after `submit_delay` seconds
  (the submitter pod's start);
- while Running it mirrors GetJobInfo: `jobStatus`, `message`; a terminal job makes the RayJob `Complete`,
  or `Failed` with reason `AppFailed` when the Ray job FAILED;
- `activeDeadlineSeconds` (`checkActiveDeadlineAndUpdateStatusIfNeeded`, checked while Initializing or Running):
  once `status.startTime` + the deadline has passed, the RayJob is `Failed` with reason `DeadlineExceeded` and
  that message, and nothing else happens: a terminal RayJob on a `clusterSelector` cluster is left as it is (the
  `Complete, Failed` case returns before any deletion), so its Ray job keeps running. `clock` stands in for
  the operator's `time.Now()` (a test moves it on instead of waiting out a deadline);
- deletion: the finalizer `ray.io/rayjob-finalizer` stops a job that is not terminal (StopJob) before the
  RayJob goes. kmock has no finalizers and deletes at once, so the double stops the job of a RayJob that is gone
  (or whose `status.jobId` is another one's now) on its next tick.
The test maps `<namespace>/<cluster>` to the URL of the real Ray head standing in for that cluster's head pod.
"""

from __future__ import annotations

import calendar
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

import yaml
from world import Kube

ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class RayJobController:
    def __init__(self, url: str, heads: Mapping[str, str], token: str | None, *, interval: float = 0.2,
                 submit_delay: float = 0.5, clock: Callable[[], float] = time.time) -> None:
        self.kube = Kube(url)
        self.heads = dict(heads)
        self.token = token
        self.interval, self.submit_delay, self.clock = interval, submit_delay, clock
        self.submitted: dict[tuple[str, str], tuple[str, str]] = {}  # (ns, name) -> (head URL, job id)
        self.initialized: dict[tuple[str, str], float] = {}
        self.errors: list[str] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="rayjob-controller", daemon=True)

    def __enter__(self) -> RayJobController:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(5)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.tick()
            except Exception as e:  # kept for the test to see; the loop goes on
                self.errors.append(repr(e))
            self.stop_event.wait(self.interval)

    # ------------------------------------------------------------------ the head's Jobs API, as the submitter calls it

    def _http(self, url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.token}"} if self.token else {})}
        data = json.dumps(body).encode() if body is not None else None
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers), timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, None

    # ------------------------------------------------------------------ reconcile

    def tick(self) -> None:
        seen: dict[tuple[str, str], str | None] = {}
        for rj in self.kube.list("RayJob"):
            key = (rj["metadata"]["namespace"], rj["metadata"]["name"])
            seen[key] = (rj.get("status") or {}).get("jobId")
            self._reconcile(key, rj)
        for key, (head, job) in list(self.submitted.items()):
            if seen.get(key) != job:  # the RayJob was deleted: its finalizer stops a job that still runs
                status, info = self._http(f"{head}/api/jobs/{job}")
                if status == 200 and info.get("status") not in TERMINAL:
                    self._http(f"{head}/api/jobs/{job}/stop", "POST")
                del self.submitted[key]

    def _reconcile(self, key: tuple[str, str], rj: dict[str, Any]) -> None:
        ns, name = key
        spec, st = rj.get("spec") or {}, rj.get("status") or {}
        cluster = (spec.get("clusterSelector") or {}).get("ray.io/cluster")
        if not cluster or spec.get("submissionMode", "K8sJobMode") != "K8sJobMode":
            return  # only what raydlc renders is modelled
        if not st.get("jobId"):
            job = spec.get("jobId") or f"{name}-{''.join(random.choice(ALPHABET) for _ in range(5))}"
            self._status(ns, name, {"jobId": job, "rayClusterName": cluster, "jobDeploymentStatus": "Initializing",
                                    "dashboardURL": f"{cluster}-head-svc.{ns}.svc.cluster.local:8265",
                                    "startTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))})
            self.initialized[key] = time.monotonic()
            return
        head = self.heads.get(f"{ns}/{cluster}")
        if head is None or st.get("jobDeploymentStatus") in ("Complete", "Failed"):
            return  # terminal: on a clusterSelector RayJob KubeRay deletes and stops nothing
        if self._past_deadline(ns, name, spec, st):
            return
        job = st["jobId"]
        status, info = self._http(f"{head}/api/jobs/{job}")
        if status == 404:
            if time.monotonic() - self.initialized.get(key, 0.0) >= self.submit_delay:
                self._submit(head, ns, name, spec, job)
            return
        if status != 200:
            return
        done = info["status"] in TERMINAL
        deployment = ("Failed" if info["status"] == "FAILED" else "Complete") if done else "Running"
        self._status(ns, name, {"jobStatus": info["status"], "jobDeploymentStatus": deployment, "message": info.get("message"),
                                "reason": "AppFailed" if deployment == "Failed" else None})

    def _past_deadline(self, ns: str, name: str, spec: dict[str, Any], st: dict[str, Any]) -> bool:
        """checkActiveDeadlineAndUpdateStatusIfNeeded: past startTime + activeDeadlineSeconds, Failed/DeadlineExceeded; the job is left running."""
        deadline, start = spec.get("activeDeadlineSeconds"), st.get("startTime")
        if deadline is None or not start or self.clock() < calendar.timegm(time.strptime(start, "%Y-%m-%dT%H:%M:%SZ")) + int(deadline):
            return False
        self._status(ns, name, {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded",
                                "message": f"The RayJob has passed the activeDeadlineSeconds. StartTime: {start}. ActiveDeadlineSeconds: {deadline}"})
        return True

    def _submit(self, head: str, ns: str, name: str, spec: dict[str, Any], job: str) -> None:
        runtime_env = yaml.safe_load(spec.get("runtimeEnvYAML") or "{}") or {}  # sigs.k8s.io/yaml YAMLToJSON
        body = {"entrypoint": spec["entrypoint"], "submission_id": job, "runtime_env": runtime_env,
                "metadata": spec.get("metadata") or {}}
        status, _ = self._http(f"{head}/api/jobs/", "POST", body)
        if status != 200:
            self.errors.append(f"submitter of {ns}/{name}: the head answered {status}")
            return
        self.submitted[(ns, name)] = (head, job)
        self._status(ns, name, {"jobDeploymentStatus": "Running"})

    def _status(self, ns: str, name: str, fields: dict[str, Any]) -> None:
        try:
            self.kube.patch("RayJob", name, {"status": fields}, ns, sub="status")
        except RuntimeError as e:
            if ": 404 " not in str(e):  # deleted meanwhile, as a controller sees it
                raise
