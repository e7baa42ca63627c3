"""The one HTTP edge to a Ray head: its dashboard, reached at one URL, every error mapped once.

`Dashboard(url)` speaks two of the dashboard's interfaces. The Jobs API (submit, get, list,
stop, logs, the log tail) goes through Ray's own `JobSubmissionClient`, which also uploads a
job's `py_modules`/`working_dir` packages the way the head expects them. The state and log
endpoints, which the SDK only offers against a GCS address, are plain REST on the same port:
`/api/v0/nodes`, `/api/v0/actors`, `/api/v0/logs`, `/api/v0/logs/file`, and `/api/version`.

Every call goes through `Dashboard._call`, which turns whatever the SDK (requests, aiohttp)
or urllib raised into one of three errors: `HeadRefused` (the head answered, with an error),
`HeadUnreachable` (no answer: refused, reset, timed out) and plain `RayError` (the call could
not be made, e.g. a package that does not pack). Results are frozen values.

Sources read (Ray 2.58.0): `python/ray/dashboard/modules/job/sdk.py` (JobSubmissionClient:
RuntimeError "Request failed with status code N: …" for an HTTP error, the websocket tail),
`python/ray/dashboard/modules/dashboard_sdk.py` (SubmissionClient: the version check on
construction, `headers` sent on every request, the 401/403 AuthenticationError),
`python/ray/dashboard/modules/state/state_head.py` and `python/ray/dashboard/state_api_utils.py`
(the list endpoints' `{"result", "msg", "data": {"result": {"result": [...]}}}` reply, `detail`,
`limit`, `filter_keys/filter_predicates/filter_values`), `python/ray/util/state/common.py`
(NodeState, ActorState), `python/ray/dashboard/modules/job/job_head.py` (`/api/version`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from raydlc.edges import poll
from raydlc.errors import InputError, RaydlcError, RayError

T = TypeVar("T")
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
HTTP_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 5.0
READ_CHUNK = 1 << 20
LIST_LIMIT = 10_000  # RAY_MAX_LIMIT_FROM_API_SERVER's default: the most one list call may ask for
AGENT_WAIT_S = 120.0
NO_AGENT = "No available agent to submit job"  # job_head.py's answer while the head's job agent is not registered
UNREACHABLE_HINT = "check the head is up (raydlc status, or the --address URL); through a port-forward, that it is open"
_RAISE: Any = object()  # `missing=` default: a 404 is an error like any other


class HeadRefused(RayError):
    """The head answered, with an error (an HTTP 4xx/5xx, or the SDK's RuntimeError saying so)."""


class HeadUnreachable(RayError):
    """Nothing answered at the dashboard's URL: connection refused or reset, or no reply in time."""


@dataclass(frozen=True)
class Job:
    """What the Jobs API says about one submission."""

    submission_id: str
    job_id: str | None  # Ray's core job id, assigned once the driver connects to Ray
    status: str
    entrypoint: str
    message: str | None
    start_time: float | None  # seconds since the epoch
    end_time: float | None
    metadata: dict[str, str]
    driver_exit_code: int | None
    runtime_env: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def duration_s(self) -> float | None:
        if self.start_time is None:
            return None
        return (self.end_time or time.time()) - self.start_time

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duration_s": self.duration_s}

    @classmethod
    def from_details(cls, d: Any) -> Job:
        """From the SDK's JobDetails (times in milliseconds, status an enum)."""

        def secs(ms: int | None) -> float | None:
            return ms / 1000.0 if ms else None

        status = getattr(d.status, "value", str(d.status))
        return cls(
            submission_id=d.submission_id or d.job_id or "", job_id=d.job_id, status=str(status), entrypoint=d.entrypoint or "",
            message=d.message, start_time=secs(d.start_time), end_time=secs(d.end_time), metadata=dict(d.metadata or {}),
            driver_exit_code=d.driver_exit_code, runtime_env=dict(d.runtime_env or {}),
        )


@dataclass(frozen=True)
class RayNode:
    node_id: str
    ip: str
    is_head: bool
    alive: bool
    gpus: float

    @property
    def name(self) -> str:
        """How a person tells nodes apart: IP and a short node id (two nodes of one machine share the IP)."""
        return f"{self.ip}/{self.node_id[:8]}" + (" (head)" if self.is_head else "")


@dataclass(frozen=True)
class Actor:
    """One actor as the state API lists it (ActorState): which class, where, in which process and job."""

    actor_id: str
    class_name: str
    state: str
    job_id: str
    node_id: str | None
    pid: int | None  # 0 until the actor's process exists
    name: str | None


@dataclass(frozen=True)
class Version:
    """`/api/version`: the head's Ray, and the dashboard API's own version."""

    ray_version: str
    api_version: str | None
    session_name: str | None


def _short(e: BaseException) -> str:
    """The first line, or for a server-side traceback (a dashboard 500) its first line and its last: the error itself."""
    text = [line for line in str(e).strip().splitlines() if line.strip()]
    if not text:
        return type(e).__name__
    if len(text) > 1 and text[0].rstrip().endswith("Traceback (most recent call last):"):
        return f"{text[0].removesuffix('Traceback (most recent call last):').rstrip()} {text[-1].strip()}".strip()[:300]
    return text[0][:300]


def _not_found(e: BaseException) -> bool:
    if isinstance(e, urllib.error.HTTPError):
        return e.code == 404
    return isinstance(e, RuntimeError) and ("status code 404" in str(e) or "does not exist" in str(e))


def _no_answer(e: BaseException) -> bool:
    """Transport failures: requests' and urllib's errors are OSErrors (timeouts too); aiohttp's are its own."""
    return (isinstance(e, OSError) and not isinstance(e, urllib.error.HTTPError)) or type(e).__module__.split(".")[0] == "aiohttp"


def _refusal(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        body = e.read().decode(errors="replace")[:2000] if e.fp else ""
        return f"HTTP {e.code}: {_short(Exception(body)) if body.strip() else e.reason}"
    return _short(e)


def _auth_refused(e: BaseException) -> bool:
    """A 401/403 from the dashboard's token middleware, through urllib or the SDK (ray.exceptions.AuthenticationError)."""
    if isinstance(e, urllib.error.HTTPError):
        return e.code in (401, 403)
    return type(e).__name__ == "AuthenticationError"


AUTH_HEADER = "Authorization"


TOKEN_MAX_CHARS = 4096  # far above any token Ray makes (a 32-byte hex), far below a header a server takes


def check_token(token: str, field: str) -> str:
    """`token` can travel in an HTTP header: printable ASCII without spaces, at most TOKEN_MAX_CHARS long.

    The error names where the token came from (`field`) and what is wrong with it, never a byte of it:
    http.client's own error would echo the header, and a server's the first part of a long one.
    """
    if len(token) > TOKEN_MAX_CHARS:
        raise InputError(f"{field}: the Ray token is {len(token):,} characters long, at most {TOKEN_MAX_CHARS:,} fit a header "
                         "(the token is not shown)", hint="set it to the head's token alone (`ray get-auth-token` prints it)")
    if not all("!" <= ch <= "~" for ch in token):
        bad = ("line breaks" if any(ch in "\r\n" for ch in token) else "control characters" if any(ord(ch) < 32 or ord(ch) == 127 for ch in token)
               else "non-ASCII characters" if any(ord(ch) > 127 for ch in token) else "spaces")
        raise InputError(f"{field}: the Ray token holds {bad}, which an HTTP header cannot carry (the token is not shown)",
                         hint="set it to the head's token alone (`ray get-auth-token` prints it)")
    return token


def address_token(env: Mapping[str, str] | None = None, home: Path | None = None) -> str | None:
    """The token for an --address head, where Ray's own clients look (Ray 2.58 AuthenticationTokenLoader):
    RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token; None when none is set."""
    env = os.environ if env is None else env
    if env.get("RAY_AUTH_TOKEN", "").strip():
        return check_token(env["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN")
    named = env.get("RAY_AUTH_TOKEN_PATH", "").strip()
    path = Path(named).expanduser() if named else (home or Path.home()) / ".ray" / "auth_token"
    try:
        text = path.read_text(errors="replace").strip()
        return check_token(text, f"the token file {path}") if text else None
    except FileNotFoundError:
        if named:
            raise InputError(f"RAY_AUTH_TOKEN_PATH names {path}, which does not exist",
                             hint="point it at the file that holds the head's token, or unset it") from None
        return None
    except OSError as e:
        raise InputError(f"cannot read the Ray token file {path}: {e.strerror}", hint="check its permissions") from None


def headers(token: str | None) -> dict[str, str]:
    """What Ray's own clients send (AUTHORIZATION_HEADER_NAME, AUTHORIZATION_BEARER_PREFIX); nothing without a token."""
    return {AUTH_HEADER: f"Bearer {check_token(token, 'the Ray token')}"} if token else {}


class Dashboard:
    """A Ray head's dashboard at `url` (http://host:port), for the length of one command."""

    def __init__(self, url: str, *, timeout_s: float = HTTP_TIMEOUT_S, token: str | None = None,
                 token_hint: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        # Sent with every request, the SDK's and REST's alike: Ray's token as its own clients send it. An
        # Authorization header the SDK is given stops it adding one from this process's RAY_AUTH_* settings.
        self._headers: dict[str, str] = headers(token)
        self._token_hint = token_hint  # where this target's token comes from, for a head that refuses it
        self._client: Any = None

    # ------------------------------------------------------------------ the one chokepoint

    def _call(self, fn: Callable[[], T], doing: str, *, hint: str | None = None, missing: Any = _RAISE,
              refused: str | None = None, unreachable: str | None = None) -> T:
        """`fn()`, with every failure of the SDK or urllib mapped to raydlc's errors.

        `doing` starts each message ("cannot read job X"); `refused` and `unreachable` replace
        it for those two causes; a 404 returns `missing` when one is given.
        """
        try:
            return fn()
        except RaydlcError:
            raise
        except Exception as e:
            if missing is not _RAISE and _not_found(e):
                return missing  # type: ignore[no-any-return]
            if _auth_refused(e):
                raise HeadRefused(self._auth_message(), hint=self._auth_hint()) from e
            if isinstance(e, RuntimeError | urllib.error.HTTPError):
                raise HeadRefused(f"{refused or doing}: {_refusal(e)}", hint=hint) from e
            if _no_answer(e):
                reason = getattr(e, "reason", None) or _short(e)
                what = unreachable or f"{doing}: the dashboard at {self.url} did not answer"
                raise HeadUnreachable(f"{what} ({reason})", hint=hint or UNREACHABLE_HINT) from e
            raise RayError(f"{doing}: {_short(e)}", hint=hint) from e

    def _auth_message(self) -> str:
        if self._headers:
            return f"the head at {self.url} refused raydlc's token (401/403 from its dashboard)"
        return f"the head at {self.url} wants a Ray token and raydlc has none for it (401 from its dashboard)"

    def _auth_hint(self) -> str:
        return self._token_hint or "set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH (or ~/.ray/auth_token) to the head's token"

    # ------------------------------------------------------------------ the Jobs API, through Ray's SDK

    def _jobs(self) -> Any:
        """The SDK client, made on first use (its constructor checks the head's version)."""
        if self._client is None:
            import logging

            from ray.job_submission import JobSubmissionClient

            # The SDK logs each upload and websocket close at INFO on stderr; raydlc says what matters itself.
            for name in ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk", "ray._private.runtime_env.packaging"):
                logging.getLogger(name).setLevel(logging.WARNING)
            what = f"the Ray Jobs API at {self.url} does not answer"
            self._client = self._call(lambda: JobSubmissionClient(self.url, headers=dict(self._headers)), what, refused=what,
                                      unreachable=what, hint="check the head is up (raydlc status, or the --address URL)")
        return self._client

    def submit(self, *, entrypoint: str, submission_id: str | None, runtime_env: Mapping[str, Any], metadata: Mapping[str, str]) -> str:
        """POST /api/jobs/ (after the SDK uploads the runtime env's local packages): the submission id.

        A head that has just started may not have its job agent registered yet: job_head.py then
        answers 500 "No available agent to submit job, please try again later." after waiting
        WAIT_AVAILABLE_AGENT_TIMEOUT (10 s), before anything is submitted; that answer is retried
        for up to AGENT_WAIT_S.
        """
        c = self._jobs()

        def attempt() -> str | HeadRefused:
            try:
                return str(self._call(
                    lambda: c.submit_job(entrypoint=entrypoint, submission_id=submission_id, runtime_env=dict(runtime_env), metadata=dict(metadata)),
                    "could not submit the job", refused="the dashboard refused the job",
                    hint="the runtime_env is in `raydlc job status ID --json`; the head's logs say more",
                ))
            except HeadRefused as e:
                if NO_AGENT not in e.message:
                    raise
                return e

        got = poll.until(attempt, lambda r: isinstance(r, str), what="the head's job agent to take the job", timeout=AGENT_WAIT_S,
                         interval=2.0, or_last=True)
        if isinstance(got, HeadRefused):
            raise got
        return got

    def job(self, job_id: str) -> Job | None:
        """GET /api/jobs/{id}: the job, or None when the head knows no such submission."""
        c = self._jobs()
        details = self._call(lambda: c.get_job_info(job_id), f"cannot read job {job_id}", missing=None)
        return None if details is None else Job.from_details(details)

    def jobs(self) -> list[Job]:
        """GET /api/jobs/: every job the head knows, in the head's order."""
        c = self._jobs()
        return [Job.from_details(d) for d in self._call(c.list_jobs, "cannot list jobs")]

    def logs(self, job_id: str) -> str:
        """GET /api/jobs/{id}/logs: the driver's whole output so far."""
        c = self._jobs()
        return str(self._call(lambda: c.get_job_logs(job_id), f"cannot read the logs of job {job_id}"))

    def stop(self, job_id: str) -> bool | None:
        """POST /api/jobs/{id}/stop: whether it was still running; None when there is no such job."""
        c = self._jobs()
        found = self._call(lambda: c.stop_job(job_id), f"cannot stop job {job_id}", missing=None)
        return None if found is None else bool(found)

    def tail(self, job_id: str, write: Callable[[str], None]) -> None:
        """The websocket /api/jobs/{id}/logs/tail, each chunk to `write`, until the head closes it.

        Closing says nothing about the job (a dropped port-forward closes it too); a stream that
        breaks raises like any other call.
        """
        c = self._jobs()

        async def tail() -> None:
            async for chunk in c.tail_job_logs(job_id):
                write(chunk)

        self._call(lambda: asyncio.run(tail()), f"the log stream of job {job_id} broke")

    # ------------------------------------------------------------------ REST: version, nodes, actors, logs

    def _open(self, path: str, params: Sequence[tuple[str, str]] | Mapping[str, str] | None, timeout: float | None) -> Any:
        q = f"?{urllib.parse.urlencode(params, doseq=True)}" if params else ""
        req = urllib.request.Request(f"{self.url}{path}{q}", headers=dict(self._headers))
        return urllib.request.urlopen(req, timeout=self.timeout_s if timeout is None else timeout)

    def _get_json(self, path: str, params: Sequence[tuple[str, str]] | Mapping[str, str] | None, doing: str, *,
                  timeout: float | None = None, **kw: Any) -> Any:
        def get() -> Any:
            with self._open(path, params, timeout) as r:
                return json.loads(r.read())

        return self._call(get, doing, **kw)

    def _result(self, doc: Any, path: str) -> Any:
        """The state API's payload: `data.result` of its reply."""
        try:
            return doc["data"]["result"]
        except (KeyError, TypeError):
            raise RayError(f"the dashboard's {path} answer has no data.result: {str(doc)[:200]}") from None

    def version(self, timeout: float = PROBE_TIMEOUT_S) -> Version:
        """GET /api/version, or an error saying that nothing Ray answers there."""
        nothing = f"no Ray dashboard answers at {self.url}"
        doc = self._get_json(
            "/api/version", None, nothing, timeout=timeout, unreachable=nothing,
            hint="check the head is running and the URL is its dashboard (port 8265 by default); through a port-forward, that it is open",
        )
        if not isinstance(doc, dict) or "ray_version" not in doc:
            raise RayError(f"{self.url} answers, but not as a Ray dashboard (no ray_version in /api/version)")
        return Version(str(doc["ray_version"]), doc.get("version"), doc.get("session_name"))

    def nodes(self) -> list[RayNode]:
        """GET /api/v0/nodes: every node the head knows, alive or not (a dead node's logs may still be asked for)."""
        doc = self._result(self._get_json("/api/v0/nodes", {"detail": "1", "limit": str(LIST_LIMIT)}, "cannot list the Ray nodes"), "/api/v0/nodes")
        out = []
        for n in doc.get("result", []) if isinstance(doc, dict) else doc:
            res = n.get("resources_total") or {}
            out.append(RayNode(n["node_id"], n.get("node_ip", "?"), bool(n.get("is_head_node")), n.get("state") == "ALIVE", float(res.get("GPU", 0))))
        return sorted(out, key=lambda n: (not n.is_head, n.ip, n.node_id))

    def actors(self, *, job_id: str | None = None, class_name: str | None = None) -> list[Actor]:
        """GET /api/v0/actors, filtered on the head by job id and class name (state API filters, `=`)."""
        params: list[tuple[str, str]] = [("detail", "1"), ("limit", str(LIST_LIMIT))]
        for key, value in (("job_id", job_id), ("class_name", class_name)):
            if value is not None:
                params += [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]
        doc = self._result(self._get_json("/api/v0/actors", params, "cannot list the Ray actors"), "/api/v0/actors")
        rows = doc.get("result", []) if isinstance(doc, dict) else doc
        return [Actor(a["actor_id"], a.get("class_name", ""), a.get("state", ""), a.get("job_id", ""), a.get("node_id"),
                      a.get("pid"), a.get("name") or None) for a in rows]

    def log_files(self, node_id: str, glob: str = "*") -> dict[str, list[str]]:
        """GET /api/v0/logs: one node's log file names matching `glob`, by category (worker_out, worker_err, …)."""
        doc = self._result(self._get_json("/api/v0/logs", {"node_id": node_id, "glob": glob}, f"cannot list the logs of node {node_id[:8]}"),
                           "/api/v0/logs")
        return {str(k): list(v or []) for k, v in doc.items()} if isinstance(doc, dict) else {}

    def read_log(self, node_id: str, filename: str) -> Iterator[bytes]:
        """GET /api/v0/logs/file: one log file of one node, whole, streamed in chunks (worker logs can be gigabytes)."""
        doing = f"cannot read {filename} of node {node_id[:8]} through the dashboard"
        r = self._call(lambda: self._open("/api/v0/logs/file", {"node_id": node_id, "filename": filename, "lines": "-1"}, None), doing)
        with r:
            while chunk := self._call(lambda: r.read(READ_CHUNK), doing):
                yield chunk
