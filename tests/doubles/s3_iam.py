"""An S3 front that authorises each request as AWS does, in front of moto (which ignores IAM conditions).

Clients (boto3, pyarrow's S3 file system, Ray Train through pyarrow) talk to the front on 127.0.0.1 with
path-style URLs. For each request the front works out what S3 would authorise:

- `operation(method, path, query, headers, body)` maps the REST call to one or more `Check`s: the IAM action,
  the resource ARN and the request's condition context, as the S3 User Guide's "Actions, resources, and
  condition keys for Amazon S3" and the API reference's "Permissions" sections give them (HeadBucket is
  `s3:ListBucket` with no `s3:prefix`; ListObjects(V2) is `s3:ListBucket` with `s3:prefix`, `s3:delimiter`,
  `s3:max-keys` when the request has them; GetObject/HeadObject `s3:GetObject`; the multipart calls
  `s3:PutObject` / `s3:AbortMultipartUpload` / `s3:ListMultipartUploadParts`; DeleteObjects one
  `s3:DeleteObject` per key; CopyObject `s3:GetObject` on the source and `s3:PutObject` on the target).
- `evaluate(policy, check)` is IAM's decision for one identity policy: an explicit Deny wins, else an Allow
  whose Action, Resource and every Condition match, else an implicit deny. Condition operators: String*,
  Numeric*, Bool, Null, Arn*, each with `…IfExists`; a key absent from the context makes a condition false,
  except for the negated operators (true) and `…IfExists` (true) — IAM User Guide, "Condition operators".
- A denied request gets S3's 403 AccessDenied XML (no body for HEAD); the rest goes to moto. A 404 of
  GetObject/HeadObject becomes 403 unless the caller may `s3:ListBucket` the bucket (GetObject's
  "Permissions" section). DeleteObjects answers per key: denied keys come back as `<Error>` entries.

Every decision is appended to `front.log` (`Decision`), so a test can name the call that was refused.
"""

from __future__ import annotations

import contextlib
import fnmatch
import http.client
import http.server
import threading
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
ET.register_namespace("", _NS.strip("{}"))


@dataclass(frozen=True)
class Check:
    action: str
    resource: str
    context: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    operation: str
    check: Check
    allowed: bool


# ------------------------------------------------------------------ the policy evaluator


def _listed(x: Any) -> list[Any]:
    return x if isinstance(x, list) else [x]


def _like(pattern: str, value: str, *, case: bool = True) -> bool:
    pattern = pattern.replace("[", "[[]")  # IAM wildcards are * and ? only
    return fnmatch.fnmatchcase(value, pattern) if case else fnmatch.fnmatchcase(value.lower(), pattern.lower())


def _num(a: str, b: str, op: str) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return {"Equals": x == y, "NotEquals": x != y, "LessThan": x < y, "LessThanEquals": x <= y,
            "GreaterThan": x > y, "GreaterThanEquals": x >= y}[op]


def _one(op: str, value: str, wanted: str) -> bool:
    """Does one context value match one policy value under `op` (an operator without IfExists, positive form)?"""
    if op == "StringEquals":
        return value == wanted
    if op == "StringEqualsIgnoreCase":
        return value.lower() == wanted.lower()
    if op in ("StringLike", "ArnLike", "ArnEquals"):
        return _like(wanted, value)
    if op == "Bool":
        return value.lower() == str(wanted).lower()
    if op.startswith("Numeric"):
        return _num(value, wanted, op[len("Numeric"):])
    raise ValueError(f"condition operator {op} is not modelled")


_NEGATED = {"StringNotEquals": "StringEquals", "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
            "StringNotLike": "StringLike", "ArnNotLike": "ArnLike", "ArnNotEquals": "ArnEquals"}


def condition_holds(op: str, key: str, wanted: Any, context: dict[str, str]) -> bool:
    """One operator/key pair of a Condition block, IAM's rules for absent keys included."""
    if_exists = op.endswith("IfExists")
    base = op[: -len("IfExists")] if if_exists else op
    value = context.get(key)
    if base == "Null":
        return (value is None) == (str(_listed(wanted)[0]).lower() == "true")
    if value is None:
        return if_exists or base in _NEGATED  # absent: false, but true for IfExists and the negated operators
    if base in _NEGATED:
        return not any(_one(_NEGATED[base], value, str(w)) for w in _listed(wanted))
    if base == "NumericNotEquals":
        return not any(_num(value, str(w), "Equals") for w in _listed(wanted))
    return any(_one(base, value, str(w)) for w in _listed(wanted))


def _applies(stmt: dict[str, Any], check: Check) -> bool:
    if "Action" in stmt:
        if not any(_like(a, check.action, case=False) for a in _listed(stmt["Action"])):
            return False
    elif any(_like(a, check.action, case=False) for a in _listed(stmt.get("NotAction", []))):
        return False
    if "Resource" in stmt:
        if not any(_like(r, check.resource) for r in _listed(stmt["Resource"])):
            return False
    elif any(_like(r, check.resource) for r in _listed(stmt.get("NotResource", []))):
        return False
    return all(condition_holds(op, key, wanted, check.context)
               for op, keys in (stmt.get("Condition") or {}).items() for key, wanted in keys.items())


def evaluate(policy: dict[str, Any], check: Check) -> bool:
    """IAM's decision for one identity policy: explicit Deny > Allow > implicit deny."""
    effects = [s["Effect"] for s in _listed(policy.get("Statement", [])) if _applies(s, check)]
    return "Deny" not in effects and "Allow" in effects


# ------------------------------------------------------------------ REST call -> checks


def _arn(bucket: str, key: str | None = None) -> str:
    return f"arn:aws:s3:::{bucket}" if key is None else f"arn:aws:s3:::{bucket}/{key}"


_LIST_KEYS = (("prefix", "s3:prefix"), ("delimiter", "s3:delimiter"), ("max-keys", "s3:max-keys"))
_BUCKET_GETS = {"location": "s3:GetBucketLocation", "uploads": "s3:ListBucketMultipartUploads",
                "versions": "s3:ListBucketVersions", "policy": "s3:GetBucketPolicy", "acl": "s3:GetBucketAcl",
                "versioning": "s3:GetBucketVersioning", "tagging": "s3:GetBucketTagging"}


def operation(method: str, bucket: str, key: str, query: dict[str, str], headers: dict[str, str],
              body: bytes) -> tuple[str, list[Check]]:
    """(S3 operation name, the checks IAM makes for it) of one path-style REST request."""
    if not bucket:
        return "ListBuckets", [Check("s3:ListAllMyBuckets", "*")]
    if not key:
        return _bucket_operation(method, bucket, query, body)
    obj = _arn(bucket, key)
    if method == "GET":
        if "uploadId" in query:
            return "ListParts", [Check("s3:ListMultipartUploadParts", obj)]
        if "tagging" in query:
            return "GetObjectTagging", [Check("s3:GetObjectTagging", obj)]
        return "GetObject", [Check("s3:GetObject", obj)]
    if method == "HEAD":
        return "HeadObject", [Check("s3:GetObject", obj)]
    if method == "DELETE":
        if "uploadId" in query:
            return "AbortMultipartUpload", [Check("s3:AbortMultipartUpload", obj)]
        return "DeleteObject", [Check("s3:DeleteObject", obj)]
    if method == "POST":
        name = "CreateMultipartUpload" if "uploads" in query else "CompleteMultipartUpload"
        return name, [Check("s3:PutObject", obj)]
    # PUT
    source = headers.get("x-amz-copy-source")
    name = "UploadPart" if "uploadId" in query else "PutObject"
    if source is None:
        return name, [Check("s3:PutObject", obj)]
    src = urllib.parse.unquote(source.split("?", 1)[0]).lstrip("/")
    sb, _, sk = src.partition("/")
    return ("UploadPartCopy" if name == "UploadPart" else "CopyObject"), [Check("s3:GetObject", _arn(sb, sk)),
                                                                          Check("s3:PutObject", obj)]


def _bucket_operation(method: str, bucket: str, query: dict[str, str], body: bytes) -> tuple[str, list[Check]]:
    arn = _arn(bucket)
    if method == "HEAD":
        return "HeadBucket", [Check("s3:ListBucket", arn)]
    if method == "PUT":
        return "CreateBucket", [Check("s3:CreateBucket", arn)]
    if method == "DELETE":
        return "DeleteBucket", [Check("s3:DeleteBucket", arn)]
    if method == "POST" and "delete" in query:
        return "DeleteObjects", [Check("s3:DeleteObject", _arn(bucket, k)) for k in deleted_keys(body)]
    for sub, action in _BUCKET_GETS.items():
        if sub in query:
            return f"GetBucket:{sub}", [Check(action, arn)]
    context = {name: query[q] for q, name in _LIST_KEYS if q in query}
    return ("ListObjectsV2" if query.get("list-type") == "2" else "ListObjects"), [Check("s3:ListBucket", arn, context)]


def deleted_keys(body: bytes) -> list[str]:
    root = ET.fromstring(body)
    return [el.text or "" for el in root.iter() if el.tag in ("Key", f"{_NS}Key")]


# ------------------------------------------------------------------ the HTTP front


_DENIED_XML = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>User: {who} is not '
               'authorized to perform: {action} on resource: "{resource}" because no identity-based policy allows the '
               '{action} action</Message><RequestId>front</RequestId></Error>')
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade", "host", "content-length"}


class S3Front:
    """The front's state: the upstream (moto) URL, the identity policy, and the log of decisions."""

    def __init__(self, upstream: str, policy: dict[str, Any], who: str = "arn:aws:sts::123456789012:assumed-role/raydlc-ray/pod") -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.policy = policy
        self.who = who
        self.log: list[Decision] = []
        self.url = ""
        self._lock = threading.Lock()

    def decide(self, name: str, check: Check) -> bool:
        ok = evaluate(self.policy, check)
        with self._lock:
            self.log.append(Decision(name, check, ok))
        return ok

    def refused(self) -> list[Decision]:
        return [d for d in self.log if not d.allowed]

    def denied_xml(self, check: Check) -> bytes:
        return _DENIED_XML.format(who=self.who, action=check.action, resource=check.resource).encode()

    def forward(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=120)
        try:
            out = {k: v for k, v in headers.items() if k.lower() not in _HOP}
            out["Host"] = self.upstream.netloc
            out["Content-Length"] = str(len(body))
            conn.request(method, target, body=body, headers=out)
            resp = conn.getresponse()
            data = resp.read()
            keep = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
            if method == "HEAD":  # no body, but the object's size stays what the client reads
                keep += [(k, v) for k, v in resp.getheaders() if k.lower() == "content-length"]
            return resp.status, keep, data
        finally:
            conn.close()


def _read_body(handler: http.server.BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(handler.rfile.read(size))
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def _handler(front: S3Front) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # the decisions are the log
            pass

        def _any(self) -> None:
            body = _read_body(self)
            split = urllib.parse.urlsplit(self.path)
            bucket, _, key = urllib.parse.unquote(split.path).lstrip("/").partition("/")
            query = {k: v[0] for k, v in urllib.parse.parse_qs(split.query, keep_blank_values=True).items()}
            headers = {k.lower(): v for k, v in self.headers.items()}
            name, checks = operation(self.command, bucket, key, query, headers, body)
            if "authorization" not in headers and "X-Amz-Credential" not in query:  # anonymous: no identity policy applies
                front.log.append(Decision(name, Check(checks[0].action if checks else "?", checks[0].resource if checks else "*",
                                                      {"anonymous": "true"}), False))
                return self._send(403, [("Content-Type", "application/xml")], front.denied_xml(checks[0] if checks else Check("?", "*")))
            if name == "DeleteObjects":
                return self._delete_objects(split, headers, body, checks)
            for check in checks:
                if not front.decide(name, check):
                    return self._send(403, [("Content-Type", "application/xml")], front.denied_xml(check))
            status, out, data = front.forward(self.command, self.path, dict(self.headers.items()), body)
            if status == 404 and name in ("GetObject", "HeadObject") and not front.decide(
                    f"{name}:404-or-403", Check("s3:ListBucket", _arn(bucket))):
                return self._send(403, [("Content-Type", "application/xml")], front.denied_xml(checks[0]))
            self._send(status, out, data)

        def _delete_objects(self, split: Any, headers: dict[str, str], body: bytes, checks: list[Check]) -> None:
            denied = [c.resource.split("/", 1)[1] for c in checks if not front.decide("DeleteObjects", c)]
            root = ET.fromstring(body)
            for obj in [o for o in root if o.tag in ("Object", f"{_NS}Object")]:
                k = next((el.text for el in obj if el.tag in ("Key", f"{_NS}Key")), None)
                if k in denied:
                    root.remove(obj)
            if len(denied) < len(checks):
                sent = {k: v for k, v in self.headers.items() if not k.lower().startswith(("content-md5", "x-amz-checksum"))}
                status, out, data = front.forward("POST", self.path, sent, ET.tostring(root))
                result = ET.fromstring(data)
            else:
                status, out = 200, [("Content-Type", "application/xml")]
                result = ET.Element(f"{_NS}DeleteResult")
            for k in denied:
                err = ET.SubElement(result, f"{_NS}Error")
                for tag, text in (("Key", k), ("Code", "AccessDenied"), ("Message", "Access Denied")):
                    ET.SubElement(err, f"{_NS}{tag}").text = text
            self._send(status, [(h, v) for h, v in out if h.lower() not in ("content-md5", "etag")], ET.tostring(result))

        def _send(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            if not any(k.lower() == "content-length" for k, _ in headers):
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    return Handler


@contextlib.contextmanager
def s3_front(upstream: str, policy: dict[str, Any]) -> Iterator[S3Front]:
    """The front on 127.0.0.1 (a free port) in a thread; `front.url` is its endpoint, `front.policy` can change."""
    front = S3Front(upstream, policy)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(front))
    server.daemon_threads = True
    front.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield front
    finally:
        server.shutdown()
        server.server_close()
