"""Storage locations stay as given: `s3://` stays a URI on every flag and setting that takes one (`--out`,
`--data`, `--resume-from`, STORAGE_PATH, DATA, RESUME_FROM), a local path stays a path; `s3:/b` (a URI
squashed by a path parser, or a typo) is refused rather than written to a local folder named `s3:`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raydlc.cli import main
from raydlc.config import load_config
from raydlc.errors import RaydlcError

KEYS = ("STORAGE_PATH", "DATA", "RESUME_FROM")


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("value", ["s3://bucket/runs", "s3://bucket", "s3://Legacy_Bucket/x/y/", "./local/out", "/abs/out", "rel"])
def test_a_storage_setting_keeps_its_text_from_env_file_and_overrides(key: str, value: str, tmp_path: Path) -> None:
    field = {"STORAGE_PATH": "storage_path", "DATA": "data", "RESUME_FROM": "resume_from"}[key]
    assert getattr(load_config(env={f"RAYDLC_{key}": value}, cwd=tmp_path).train, field) == value
    assert getattr(load_config(env={}, overrides={key: value}, cwd=tmp_path).train, field) == value


@pytest.mark.parametrize("key", KEYS)
def test_a_squashed_uri_is_refused_naming_the_setting(key: str, tmp_path: Path) -> None:
    with pytest.raises(RaydlcError) as e:
        load_config(env={f"RAYDLC_{key}": "s3:/bucket/runs"}, cwd=tmp_path)
    assert key in str(e.value) and "s3://bucket/prefix" in str(e.value) and "'s3:/bucket/runs'" in str(e.value)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("value, says", [("gs://b/x", "the gs:// scheme is not one raydlc stores to"), ("http://x/y", "the http:// scheme"),
                                         ("s3:///x", "an s3:// URI needs a bucket"), ("s3://", "an s3:// URI needs a bucket"),
                                         ("s3://Bad_Bucket!/x", "the bucket name 'Bad_Bucket!' is invalid")])
def test_a_uri_raydlc_cannot_store_to_is_refused_before_pyarrow_reaches_for_it(key: str, value: str, says: str, tmp_path: Path) -> None:
    """pyarrow's GCS lookup hung 400 s; http:// and s3:///x were ArrowInvalid tracebacks; s3:// wrote a local folder `s3:`."""
    with pytest.raises(RaydlcError) as e:
        load_config(env={f"RAYDLC_{key}": value}, cwd=tmp_path)
    assert key in str(e.value) and says in str(e.value)


def test_a_hub_path_as_data_passes_the_setting_to_be_refused_by_name_later(tmp_path: Path) -> None:
    assert load_config(env={"RAYDLC_DATA": "hf://datasets/a/b"}, cwd=tmp_path).train.data == "hf://datasets/a/b"


def test_a_windows_drive_is_not_taken_for_a_scheme(tmp_path: Path) -> None:
    assert load_config(env={"RAYDLC_STORAGE_PATH": "C:/runs"}, cwd=tmp_path).train.storage_path == "C:/runs"


@pytest.mark.parametrize("flag, field", [("--out", "storage_path"), ("--data", "data"), ("--resume-from", "resume_from")])
def test_raydlc_train_passes_an_s3_uri_through_unchanged(flag: str, field: str, clean_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from raydlc.errors import InputError
    from raydlc.train import launch

    seen: dict[str, Any] = {}

    def check(request: Any, where: Any) -> None:
        seen.update(request.model_dump())
        raise InputError("stopped by the test before Ray")

    monkeypatch.setattr(launch, "check", check)
    assert main(["train", "--model", "tiny", "--workers", "1", flag, "s3://bucket/runs"]) == 2
    assert "stopped by the test" in capsys.readouterr().err
    assert seen[field] == "s3://bucket/runs"
    assert not (clean_env / "s3:").exists()


def test_raydlc_train_keeps_a_local_out_a_path(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from raydlc.errors import InputError
    from raydlc.train import launch

    seen: dict[str, Any] = {}

    def check(request: Any, where: Any) -> None:
        seen.update(request.model_dump())
        raise InputError("stopped")

    monkeypatch.setattr(launch, "check", check)
    assert main(["train", "--model", "tiny", "--workers", "1", "--out", "here/out"]) == 2
    assert Path(seen["storage_path"]).resolve() == (Path.cwd() / "here/out").resolve()
