"""Preparation with the real engine: Ray Data on a local Ray, S3 through a real moto server on
127.0.0.1 (pyarrow's S3 file system, pointed at it by AWS_ENDPOINT_URL), and a run on the result.

One Ray for the module: the moto server and the AWS environment come first, so Ray's worker
processes inherit them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "doubles"))
from servers import moto_server  # type: ignore[import-not-found]

from raydlc.data import dataset, pipeline, shards
from raydlc.data import tokenizer as T
from raydlc.data.corpus import bundled_corpus
from raydlc.data.sources import read_local
from reference_packing import pack

pytestmark = pytest.mark.slow
BUCKET = "raydlc-data-test"
CHAT = [{"messages": [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": f"What is {i} plus {i}?"},
                      {"role": "assistant", "content": f"{2 * i}"}]} for i in range(600)]
QA = [{"prompt": f"Question {i}: what is {i} times two?", "completion": f" It is {2 * i}."} for i in range(300)]


@pytest.fixture(scope="module")
def ray_and_s3() -> Iterator[str]:
    from raydlc.edges import ray_runtime

    with moto_server() as url, pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
            mp.setenv(k, v)
        import boto3

        boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
        import ray

        if ray.is_initialized():  # an earlier module's Ray: its workers never saw this environment
            ray.shutdown()
        with ray_runtime.connected(None, workers=2, log_to_driver=False):
            yield url


def recipe(seq_len: int = 32, **kw: str) -> pipeline.Recipe:
    return pipeline.Recipe(seq_len, kw.get("loss_on", "assistant"), "model", kw.get("on_bad_record", "fail"))


def all_rows(made: dataset.Made) -> tuple[np.ndarray, np.ndarray]:
    return shards.Rows.open(made.dest, made.manifest).take(np.arange(made.manifest.rows))


def test_ray_data_blocks_equal_the_in_driver_packing_and_a_second_run_reuses_them(ray_and_s3: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"], "response": r["completion"]}) + "\n" for r in QA))
    (src / "b.txt").write_text(" ".join(d.text for d in bundled_corpus(max_chars=30_000)))
    p = dataset.plan(str(src), out=None, storage_root=str(tmp_path / "runs"), model_id="tiny", vocab=512, recipe=recipe())
    made = dataset.make(p)
    assert made.dest.startswith(str(tmp_path / "runs" / "datasets")) and not made.reused
    docs = read_local(str(src))
    tok = T.train_bpe([t for d in docs for t in (d.prompt, d.text) if t], 512)
    assert tok.to_str() == made.tokenizer.tokenizer_json  # the driver trained the same tokenizer on the same text
    ref = pack(docs, T.encoder(tok), made.tokenizer.eos_id, 32)
    ids, labels = all_rows(made)
    assert np.array_equal(ids, ref.input_ids) and np.array_equal(labels, ref.labels)
    assert made.manifest.counts.records_used == len(QA) + 1
    again = dataset.make(dataset.plan(str(src), out=None, storage_root=str(tmp_path / "runs"), model_id="tiny", vocab=512, recipe=recipe()))
    assert again.reused and again.dest == made.dest and again.manifest == made.manifest


def test_s3_source_and_destination_give_the_blocks_a_local_preparation_gives(ray_and_s3: str, tmp_path: Path) -> None:
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq

    s3 = boto3.client("s3", endpoint_url=ray_and_s3)
    chat = "".join(json.dumps(r) + "\n" for r in CHAT)
    s3.put_object(Bucket=BUCKET, Key="raw/chat.jsonl", Body=chat.encode())
    local = tmp_path / "raw"
    local.mkdir()
    (local / "chat.jsonl").write_text(chat)
    pq.write_table(pa.table({"prompt": [r["prompt"] for r in QA], "completion": [r["completion"] for r in QA]}), local / "qa.parquet", row_group_size=100)
    s3.upload_file(str(local / "qa.parquet"), BUCKET, "raw/qa.parquet")

    remote = dataset.make(dataset.plan(f"s3://{BUCKET}/raw", out=f"s3://{BUCKET}/prepared", storage_root=str(tmp_path), model_id="tiny", vocab=512,
                                       recipe=recipe()))
    here = dataset.make(dataset.plan(str(local), out=str(tmp_path / "prepared"), storage_root=str(tmp_path), model_id="tiny", vocab=512,
                                     recipe=recipe()))
    assert remote.manifest.counts.records_used == here.manifest.counts.records_used == len(CHAT) + len(QA)
    assert [s.sha256 for s in remote.manifest.shards] == [s.sha256 for s in here.manifest.shards]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="prepared/")["Contents"]}
    assert {"prepared/manifest.json", "prepared/tokenizer.json", "prepared/shard-00000.bin"} <= keys
    rows = np.array([0, 5, here.manifest.rows - 1])  # ranged reads from S3
    a, b = shards.Rows.open(remote.dest, remote.manifest).take(rows)
    c, d = shards.Rows.open(here.dest, here.manifest).take(rows)
    assert np.array_equal(a, c) and np.array_equal(b, d)
    # Loss on assistant turns only: the share is well below all, and `all` puts it on every token.
    share = remote.manifest.counts.loss_tokens / remote.manifest.counts.tokens
    assert 0.05 < share < 0.6
    everything = dataset.make(dataset.plan(f"s3://{BUCKET}/raw", out=f"s3://{BUCKET}/prepared-all", storage_root=str(tmp_path), model_id="tiny",
                                           vocab=512, recipe=recipe(loss_on="all")))
    assert everything.manifest.counts.loss_tokens == everything.manifest.counts.tokens


def test_a_bad_record_deep_in_the_data_fails_naming_its_line_and_leaves_no_manifest(ray_and_s3: str, tmp_path: Path) -> None:
    from raydlc.errors import InputError

    lines = [json.dumps(r) for r in CHAT[:300]]
    lines[250] = json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]})
    (tmp_path / "chat.jsonl").write_text("\n".join(lines) + "\n")
    p = dataset.plan(str(tmp_path / "chat.jsonl"), out=str(tmp_path / "out"), storage_root=str(tmp_path), model_id="tiny", vocab=512, recipe=recipe())
    with pytest.raises(InputError, match=r"chat\.jsonl:251: turn 1: empty assistant turn"):
        dataset.make(p)
    assert shards.read_manifest(str(tmp_path / "out")) is None
    skip = dataset.plan(str(tmp_path / "chat.jsonl"), out=str(tmp_path / "out"), storage_root=str(tmp_path), model_id="tiny", vocab=512,
                        recipe=recipe(on_bad_record="skip"))
    made = dataset.make(skip)
    assert (made.manifest.counts.records_skipped, made.manifest.counts.skipped) == (1, {"turn N: empty assistant turn": 1})


def test_train_on_a_prepared_chat_dataset_reads_it_by_index(ray_and_s3: str, tmp_path: Path) -> None:
    import raydlc.api as api

    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CHAT))
    ds = api.data_prepare(str(tmp_path / "chat.jsonl"), out=str(tmp_path / "prepared"), seq_len=32, model="tiny")
    assert not ds.reused and 0 < ds.loss_share < 0.6
    shown = api.data_show(ds.dest)
    assert len(shown.examples) == 3 and "⟦<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\nWhat is 0 plus 0?" in shown.examples[0]
    result = api.train(data=ds.dest, steps=4, seq_len=32, batch_size=4, workers=2, checkpoint_every=0, lr=3e-3, out=str(tmp_path / "runs"),
                       log_to_driver=False)
    assert result.dataset == ds.dest and result.dataset_reused and result.steps == 4
    assert result.train_sequences + result.eval_sequences == ds.rows
    assert result.final_loss is not None and result.first_loss is not None and result.final_loss < result.first_loss


def test_the_cli_prepares_quietly_and_a_relative_source_is_found_again_by_its_absolute_path(tmp_path: Path) -> None:
    """`data prepare X` then the same source named absolutely (as `train --data X` resolves it) reuses the
    dataset; stderr holds no Ray Data warning (the progress bars are off: raydlc shows its own)."""
    import os
    import subprocess

    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": f"record {i} says hello to everyone here"}) + "\n" for i in range(60)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYDLC_", "RAY_"))} | {"HF_HUB_OFFLINE": "1"}
    runs = [subprocess.run([sys.executable, "-m", "raydlc", "data", "prepare", src, "--seq-len", "8", "--json"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=300) for src in ("d.jsonl", str(tmp_path / "d.jsonl"))]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Progress bars" not in r.stderr and "WARNING" not in r.stderr, r.stderr
    first, second = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert (first["reused"], second["reused"]) == (False, True) and first["dest"] == second["dest"]
