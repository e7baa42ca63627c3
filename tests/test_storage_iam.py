"""The Ray pods' rendered policy, through the S3 IAM front (tests/doubles/s3_iam.py) in front of a real moto:
the calls Ray Train 2.58's own StorageContext makes (create_dir recursive -> HeadBucket, its validation marker,
a checkpoint's upload, the checkpoint manager's snapshot, an old checkpoint's delete), the ones `--resume` and
the run listing make (get_file_info on the prefix = HeadObject `runs` + ListObjectsV2 `runs/`), raydlc's
publish and download, a prepared dataset's "does it exist yet" read, the code zip a RayJob's `py_modules`
names, and verify's storage criterion (`checks.storage_access`) all pass; a write outside the prefix is refused.

The mutation tests: removing any one statement makes a call these flows make refused, and widening the
run statement to the whole bucket lets verify's outside write through, which its judge reports.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "doubles"))
from s3_iam import s3_front  # type: ignore[import-not-found]
from servers import fresh_moto, moto_server  # type: ignore[import-not-found]

from raydlc.checks import storage_access
from raydlc.config import load_config
from raydlc.edges import storage as store
from raydlc.render import bucket as B

ACCOUNT = "123456789012"
PROBE = "arn:aws:s3:::$extremelyunlikelytoexist$"


def _default_policy(tmp: Path) -> tuple[dict[str, Any], str]:
    """The permission policy `render` gives the Ray pods for the default config, and its runs URI."""
    cfg = B.for_cluster(load_config(env={}, overrides={}, cwd=tmp), lambda: ACCOUNT)
    identities = B.pod_identities(cfg)
    assert identities and all(i["permissionPolicy"] == identities[0]["permissionPolicy"] for i in identities)
    return identities[0]["permissionPolicy"], cfg.train.storage_path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    import boto3

    policy, runs = _default_policy(tmp_path_factory.mktemp("cfg"))
    name = runs.split("/")[2]
    with moto_server() as url, fresh_moto(url) as url, s3_front(url, policy) as front, pytest.MonkeyPatch.context() as mp:
        admin = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
        admin.create_bucket(Bucket=name)
        admin.put_object(Bucket=name, Key="code/raydlc-0.1.0-abc.zip", Body=b"zip")
        for k, v in {"AWS_ENDPOINT_URL": front.url, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
            mp.setenv(k, v)
        yield front, runs


def ray_train_storage(runs: str, run: str, tmp: Path) -> None:
    """What Ray Train 2.58 does with `RunConfig(storage_path=runs, name=run)`, with its own StorageContext."""
    from ray.train import Checkpoint
    from ray.train.v2._internal.execution.storage import StorageContext, _exists_at_fs_path, delete_fs_path

    ctx = StorageContext(storage_path=runs, experiment_dir_name=run)  # create_dir + marker + its check
    local = tmp / f"{run}-ckpt"
    local.mkdir(exist_ok=True)
    (local / "model.distcp").write_bytes(b"w" * 1000)
    first = ctx.persist_current_checkpoint(Checkpoint(str(local)), "checkpoint_000001")
    ctx.persist_current_checkpoint(Checkpoint(str(local)), "checkpoint_000002")
    with ctx.storage_filesystem.open_output_stream(ctx.checkpoint_manager_snapshot_path) as f:
        f.write(b"{}")
    assert _exists_at_fs_path(ctx.storage_filesystem, ctx.checkpoint_manager_snapshot_path)
    delete_fs_path(first.filesystem, first.path)  # num_to_keep
    assert not _exists_at_fs_path(ctx.storage_filesystem, first.path)


def raydlc_storage(runs: str, run: str, tmp: Path) -> None:
    """raydlc's own calls: the run listing `--resume` reads, publish, download, a dataset's manifest probe."""
    assert run in store.list_dirs(runs)
    assert store.list_dirs(f"{runs}/{run}") == ["checkpoint_000002"]
    export = tmp / f"{run}-export"
    export.mkdir(exist_ok=True)
    (export / "config.json").write_text("{}")
    store.publish(export, f"{runs}/{run}/export")
    assert store.file_sizes(f"{runs}/{run}/export") == {"config.json": 2}
    assert (store.download(f"{runs}/{run}/export", tmp / f"{run}-down") / "config.json").read_text() == "{}"
    with pytest.raises(FileNotFoundError):  # not yet prepared: S3 says 404, as the caller may list
        store.read_text(f"{runs}/data/{run}/manifest.json")


def code_zip(runs: str) -> None:
    """Ray's runtime-env agent fetches a RayJob's `py_modules` zip with boto3's get_object."""
    import boto3

    name = runs.split("/")[2]
    assert boto3.client("s3").get_object(Bucket=name, Key="code/raydlc-0.1.0-abc.zip")["Body"].read() == b"zip"


def verify_storage(runs: str, run: str) -> storage_access.StoreAnswer:
    return storage_access.judge("node-a", storage_access.check(runs, run))


def test_ray_train_raydlc_and_verify_work_under_the_rendered_policy(world: tuple[Any, str], tmp_path: Path) -> None:
    front, runs = world
    before = len(front.log)
    ray_train_storage(runs, "r1", tmp_path)
    raydlc_storage(runs, "r1", tmp_path)
    code_zip(runs)
    verdict = verify_storage(runs, "t1")
    assert verdict.ok, verdict.evidence
    # PROBE: pyarrow's backend probe (s3fs.cc GetBackend) heads a bucket that should not exist: any answer does
    refused = {(d.check.action, d.check.resource) for d in front.log[before:] if not d.allowed and d.check.resource != PROBE}
    name = runs.split("/")[2]
    assert refused == {("s3:PutObject", f"arn:aws:s3:::{name}/raydlc-verify-outside-t1")}  # verify's outside write, only
    ops = {d.operation for d in front.log[before:]}
    assert {"HeadBucket", "HeadObject", "ListObjectsV2", "PutObject", "GetObject", "DeleteObjects"} <= ops


@pytest.mark.parametrize("sid, first", [
    ("ListRunPrefix", ("s3:ListBucket", "")),  # HeadBucket of create_dir
    ("ReadWriteRuns", ("s3:PutObject", "/runs/")),  # create_dir's directory marker
    ("HeadRunPrefix", ("s3:GetObject", "/runs")),  # get_file_info("bucket/runs"): the run listing, --resume
    ("ReadCode", ("s3:GetObject", "/code/raydlc-0.1.0-abc.zip")),
])
def test_removing_any_statement_refuses_a_call_the_run_makes(world: tuple[Any, str], tmp_path: Path, sid: str,
                                                             first: tuple[str, str]) -> None:
    front, runs = world
    saved = front.policy
    front.policy = copy.deepcopy(saved)
    front.policy["Statement"] = [s for s in front.policy["Statement"] if s["Sid"] != sid]
    assert len(front.policy["Statement"]) == len(saved["Statement"]) - 1
    before = len(front.log)
    try:
        with pytest.raises(Exception):  # noqa: B017 - whichever client meets the refusal first
            ray_train_storage(runs, f"m-{sid}", tmp_path)
            raydlc_storage(runs, f"m-{sid}", tmp_path)
            code_zip(runs)
    finally:
        front.policy = saved
    refused = [d.check for d in front.log[before:] if not d.allowed and d.check.resource != PROBE]
    assert refused and (refused[0].action, refused[0].resource) == (first[0], f"arn:aws:s3:::{runs.split('/')[2]}{first[1]}")


def test_widening_the_run_statement_to_the_bucket_is_caught_by_verify(world: tuple[Any, str]) -> None:
    front, runs = world
    saved = front.policy
    front.policy = copy.deepcopy(saved)
    (rw,) = [s for s in front.policy["Statement"] if s["Sid"] == "ReadWriteRuns"]
    rw["Resource"] = [rw["Resource"][0].rsplit("/", 2)[0] + "/*"]
    try:
        verdict = verify_storage(runs, "w1")
    finally:
        front.policy = saved
    assert not verdict.ok and "a write outside the prefix was allowed" in verdict.evidence
