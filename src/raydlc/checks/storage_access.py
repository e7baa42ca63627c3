"""Can this node write its runs, and only its runs? A probe object under the run prefix, and one outside it.

Run on each GPU node as a pinned Ray task (`python -m raydlc.checks.node_probe --storage`): it writes, reads back
and deletes an object under STORAGE_PATH, then tries to write one in the same bucket outside the
prefix, which the pods' identity policy (`raydlc.render.bucket.pod_policy`) must refuse. It goes
through `pyarrow.fs.FileSystem.from_uri`, the call Ray Train v2 makes for `storage_path`
(`ray/train/v2/_internal/execution/storage.py` `get_fs_and_path`), so it proves the client, the
credentials chain (EKS Pod Identity's container credentials) and the policy the checkpoints meet.
`judge` is pure: one node's answer in, a `StoreAnswer` out. The answer names the credential
source by which variables are set, never their values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

INSIDE_NAME = ".raydlc-verify-{token}"  # directly under the prefix: its parent is the prefix itself
OUTSIDE_NAME = "raydlc-verify-outside-{token}"  # at the bucket's root, beside the prefix
STEPS = ("create_dir", "list", "write", "read", "delete", "gone")
_DENIED = ("ACCESS_DENIED", "AccessDenied", "403")
_CREDENTIALS = (  # the AWS SDKs' chain, in order; the first whose variables are set is the source
    ("static keys (AWS_ACCESS_KEY_ID)", ("AWS_ACCESS_KEY_ID",)),
    ("EKS Pod Identity (AWS_CONTAINER_CREDENTIALS_FULL_URI + token file)", ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")),
    ("IRSA (AWS_WEB_IDENTITY_TOKEN_FILE)", ("AWS_WEB_IDENTITY_TOKEN_FILE",)),
)


def credential_source(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    return next((name for name, keys in _CREDENTIALS if all(env.get(k) for k in keys)), "no variables: instance profile or none")


def split(uri: str) -> tuple[str, str]:
    """(bucket, prefix without slashes) of `s3://bucket/a/b/`."""
    rest = uri.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


def check(uri: str, token: str) -> dict[str, Any]:
    """Write, read, delete under `uri`; then try a write outside its prefix. Each step's outcome, never raising."""
    out: dict[str, Any] = {"uri": uri, "credentials": credential_source()}
    try:
        import pyarrow
        import pyarrow.fs

        out["pyarrow"] = pyarrow.__version__
        fs, root = pyarrow.fs.FileSystem.from_uri(uri)
    except Exception as e:
        return {**out, "steps": {"open": _error(e)}}
    bucket, prefix = split(uri)
    inside = f"{root.rstrip('/')}/{INSIDE_NAME.format(token=token)}"
    body = f"raydlc verify {token}".encode()
    steps: dict[str, str] = {}
    # As Ray Train's StorageContext starts (create_dir recursive: HeadBucket, then a directory marker), and as
    # `--resume` and the run listing read the prefix (get_file_info: HeadObject on the prefix's key, then a list).
    steps["create_dir"] = _step(lambda: fs.create_dir(root, recursive=True))
    steps["list"] = _step(lambda: fs.get_file_info(root))
    steps["write"] = _step(lambda: _write(fs, inside, body))
    if steps["write"] == "ok":
        steps["read"] = _step(lambda: _read(fs, inside, body))
        steps["delete"] = _step(lambda: fs.delete_file(inside))
        if steps["delete"] == "ok":
            steps["gone"] = _step(lambda: _gone(fs, inside))
    out["steps"] = steps
    if prefix:
        outside = f"{bucket}/{OUTSIDE_NAME.format(token=token)}"
        out["outside"] = outside
        out["outside_write"] = _step(lambda: _write(fs, outside, body))
        if out["outside_write"] == "ok":  # the policy let it through: take it back, and say whether that worked
            out["outside_cleanup"] = _step(lambda: fs.delete_file(outside))
    return out


def _write(fs: Any, path: str, body: bytes) -> None:
    with fs.open_output_stream(path) as f:
        f.write(body)


def _read(fs: Any, path: str, body: bytes) -> None:
    with fs.open_input_stream(path) as f:
        got = bytes(f.read())
    if got != body:
        raise ValueError(f"read {len(got)} bytes back that differ from the {len(body)} written")


def _gone(fs: Any, path: str) -> None:
    import pyarrow.fs

    if fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound:
        raise ValueError("the probe object is still listed after its delete")


def _step(fn: Any) -> str:
    try:
        fn()
    except Exception as e:
        return _error(e)
    return "ok"


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:400]


def refused(outcome: str) -> bool:
    """An S3 answer that says no (403 AccessDenied), not a network or client error that proves nothing."""
    return outcome != "ok" and any(word in outcome for word in _DENIED)


@dataclass(frozen=True)
class StoreAnswer:
    node: str
    ok: bool
    evidence: str


def judge(node: str, answer: dict[str, Any]) -> StoreAnswer:
    """One node's answer: every step under the prefix "ok", and the write outside refused by S3."""
    if answer.get("failed") or answer.get("missing"):
        return StoreAnswer(node, False, f"{node}: {answer.get('missing') or answer.get('error') or 'the probe task did not run'}")
    steps: dict[str, str] = answer.get("steps") or {}
    how = f"{answer.get('credentials', '?')}, pyarrow {answer.get('pyarrow', '?')}"
    bad = [f"{step} {outcome}" for step, outcome in steps.items() if outcome != "ok"]
    if bad or set(steps) != set(STEPS):
        return StoreAnswer(node, False, f"{node}: under {answer.get('uri')}: {'; '.join(bad) or 'incomplete'} ({how})")
    outside = answer.get("outside_write")
    if outside is None:
        return StoreAnswer(node, False, f"{node}: {answer.get('uri')} is a whole bucket: no key outside the run prefix to be refused")
    if outside == "ok":
        left = "" if answer.get("outside_cleanup") == "ok" else f", and left there ({answer.get('outside_cleanup')})"
        return StoreAnswer(node, False, f"{node}: a write outside the prefix was allowed: {answer.get('outside')}{left}")
    if not refused(outside):
        return StoreAnswer(node, False, f"{node}: the write outside the prefix failed, but not as refused: {outside[:200]}")
    return StoreAnswer(node, True, f"{node}: wrote, read and deleted under {answer.get('uri')}; "
                                   f"a write to s3://{answer.get('outside')} was refused (AccessDenied) ({how})")
