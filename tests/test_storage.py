"""Where runs keep their files: the one URI check (raydlc.storage), and the file-system calls resume and publish use (raydlc.edges.storage)."""

from __future__ import annotations

from pathlib import Path

from raydlc import storage
from raydlc.edges import storage as files


def test_uri_or_path_is_decided_in_one_place() -> None:
    assert storage.scheme("s3://bucket/runs") == "s3" and storage.scheme("GS://b") == "gs"
    assert storage.is_uri("file:///tmp/x") and not storage.is_uri("/tmp/x") and not storage.is_uri("runs/a:b")
    assert storage.resolve("s3://b/p") == "s3://b/p"
    assert storage.resolve("~/runs").startswith("/") and not storage.resolve("~/runs").startswith("~")
    assert storage.join("s3://b/p/", "run-1", "checkpoint_000002") == "s3://b/p/run-1/checkpoint_000002"


def test_only_remote_uris_or_declared_mounts_reach_every_node() -> None:
    assert storage.reaches_every_node("s3://b/p", False)
    assert not storage.reaches_every_node("file:///mnt/x", False)  # a local path by another name
    assert not storage.reaches_every_node("/mnt/efs/x", False) and storage.reaches_every_node("/mnt/efs/x", True)
    assert not storage.reaches_every_node(None, True)


def test_listing_reading_downloading_and_publishing_through_a_uri(tmp_path: Path) -> None:
    src = tmp_path / "store" / "run-1" / "checkpoint_000002"
    src.mkdir(parents=True)
    (src / "a.bin").write_bytes(b"12345")
    (src / "m.json").write_text('{"x": 1}')
    uri = f"file://{tmp_path / 'store'}"
    assert files.list_dirs(uri) == ["run-1"] and files.list_dirs(f"{uri}/nowhere") == []
    assert files.file_sizes(f"{uri}/run-1/checkpoint_000002") == {"a.bin": 5, "m.json": 8}
    assert files.read_text(f"{uri}/run-1/checkpoint_000002/m.json") == '{"x": 1}'
    got = files.download(f"{uri}/run-1/checkpoint_000002", tmp_path / "local")
    assert (got / "a.bin").read_bytes() == b"12345"
    files.publish(got, f"{uri}/run-2")
    files.publish(got, str(tmp_path / "plain"))
    assert (tmp_path / "store" / "run-2" / "a.bin").read_bytes() == b"12345"
    assert (tmp_path / "plain" / "m.json").read_text() == '{"x": 1}'
