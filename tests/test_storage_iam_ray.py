"""A real local Ray Train run with its storage on S3 through the S3 IAM front (tests/doubles/s3_iam.py) that
authorises every request by the policy `render` gives the Ray pods for the default config: the run writes
its checkpoints to the cluster's default storage path (`s3://<bucket>/runs`), `--resume` continues it,
`data prepare` writes a dataset there, and a dataset outside the prefix is refused.

One Ray for the module, started after the AWS environment is set so its workers inherit it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "doubles"))
from s3_iam import s3_front  # type: ignore[import-not-found]
from servers import fresh_moto, moto_server  # type: ignore[import-not-found]

from raydlc.config import TrainConfig, load_config
from raydlc.data.corpus import bundled_corpus
from raydlc.edges import storage as store
from raydlc.render import bucket as B
from raydlc.train.launch import run
from raydlc.train.runspec import RunTarget

pytestmark = pytest.mark.slow
PROBE = "arn:aws:s3:::$extremelyunlikelytoexist$"  # pyarrow's backend probe (s3fs.cc GetBackend): refused, and fine


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, str]]:
    import boto3

    from raydlc.edges import ray_runtime

    cfg = B.for_cluster(load_config(env={}, overrides={}, cwd=tmp_path_factory.mktemp("cfg")), lambda: "123456789012")
    identity = B.pod_identities(cfg)[0]
    runs = cfg.train.storage_path
    corpus = tmp_path_factory.mktemp("data") / "docstrings.txt"
    corpus.write_text("\n\n".join(d.text for d in bundled_corpus(max_chars=150_000)))
    with moto_server() as url, fresh_moto(url) as url, s3_front(url, identity["permissionPolicy"]) as front, pytest.MonkeyPatch.context() as mp:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="k",
                     aws_secret_access_key="s").create_bucket(Bucket=runs.split("/")[2])
        for k, v in {"AWS_ENDPOINT_URL": front.url, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
            mp.setenv(k, v)
        import ray

        if ray.is_initialized():  # an earlier module's Ray: its workers never saw this environment
            ray.shutdown()
        with ray_runtime.connected(None, workers=2, log_to_driver=False):
            yield front, runs, str(corpus)


def _refused(front: Any, since: int) -> list[Any]:
    return [d for d in front.log[since:] if not d.allowed and d.check.resource != PROBE]


def test_train_writes_checkpoints_to_the_default_storage_path_and_resume_continues(world: tuple[Any, str, str]) -> None:
    front, runs, corpus = world
    base = TrainConfig(model_id="tiny", steps=4, seq_len=32, batch_size=2, num_workers=2, learning_rate=2e-3,
                       checkpoint_every=2, data=corpus, storage_path=runs)
    before = len(front.log)
    first = run(base, RunTarget(log_to_driver=False))
    assert first["steps"] == 4
    run_name = first["run_dir"].rstrip("/").rsplit("/", 1)[1]
    assert run_name in store.list_dirs(runs)
    assert {"checkpoint_000002", "checkpoint_000004"} & set(store.list_dirs(f"{runs}/{run_name}"))
    resumed = run(base.updated(steps=6, resume=True), RunTarget(log_to_driver=False))
    assert resumed["resumed_from"] and resumed["resumed_from"].startswith(f"{runs}/{run_name}/checkpoint_00000")
    assert resumed["steps"] == 6
    assert _refused(front, before) == []
    assert {"HeadBucket", "HeadObject", "ListObjectsV2", "GetObject"} <= {d.operation for d in front.log[before:]}


def test_data_prepare_writes_under_the_prefix_and_is_refused_outside_it(world: tuple[Any, str, str]) -> None:
    import raydlc.api as api

    front, runs, corpus = world
    before = len(front.log)
    made = api.data_prepare(corpus, out=f"{runs}/datasets/doc", model="tiny", seq_len=32)
    assert made.manifest["counts"]["tokens"] > 0
    assert "manifest.json" in store.file_sizes(f"{runs}/datasets/doc")
    assert _refused(front, before) == []
    outside = runs.rsplit("/", 1)[0] + "/elsewhere/doc"
    with pytest.raises(OSError) as e:  # the first call outside the prefix is refused (its line: tests/test_storage_errors.py)
        api.data_prepare(corpus, out=outside, model="tiny", seq_len=32)
    mapped = store.s3_error(e.value, outside)
    assert mapped is not None and "access denied to s3://" in str(mapped) and "/elsewhere" in str(mapped)
    refused = _refused(front, before)
    assert refused and all("/elsewhere" in d.check.resource or "elsewhere" in d.check.context.get("s3:prefix", "") for d in refused)
