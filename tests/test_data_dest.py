"""Where `data prepare` writes: only into a folder raydlc made, one writer at a time; and the source
listing that ends on a link loop. Pure data-layer checks, no Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raydlc.data import dataset
from raydlc.data.pipeline import Recipe, dataset_key
from raydlc.data.sources import list_source
from raydlc.errors import InputError

RECIPE = Recipe(16, "all", "model", "fail")


def _plan(tmp: Path, out: Path) -> dataset.DatasetPlan:
    (tmp / "d.jsonl").write_text('{"text": "hello"}\n')
    return dataset.plan(str(tmp / "d.jsonl"), out=str(out), storage_root=str(tmp / "store"), model_id="tiny", vocab=256, recipe=RECIPE)


def test_a_new_or_empty_folder_or_an_unfinished_dataset_of_raydlc_is_accepted(tmp_path: Path) -> None:
    assert _plan(tmp_path, tmp_path / "new").dest == str(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    _plan(tmp_path, tmp_path / "empty")
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / dataset.LOCK).write_text("")
    (tmp_path / "ours" / "shard-00000.bin").write_bytes(b"\0" * 8)
    _plan(tmp_path, tmp_path / "ours")
    assert not (tmp_path / "new").exists()  # planning writes nothing


def test_a_folder_with_raydlc_names_but_no_sign_of_raydlc_is_refused(tmp_path: Path) -> None:
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "tokenizer.json").write_text("{}")
    with pytest.raises(InputError, match="did not write"):
        _plan(tmp_path, tmp_path / "export")
    (tmp_path / "export" / "manifest.json").write_text('{"someone": "else"}')  # a manifest, not raydlc's
    with pytest.raises(InputError, match="did not write"):
        _plan(tmp_path, tmp_path / "export")
    assert sorted(os.listdir(tmp_path / "export")) == ["manifest.json", "tokenizer.json"]


HOLD = """
import sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1]); lock.acquire(); print("held", flush=True); time.sleep(60)
"""


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(tmp_path: Path) -> None:
    p = _plan(tmp_path, tmp_path / "out")
    second = _plan(tmp_path, tmp_path / "out")
    with dataset.writing(p), pytest.raises(InputError, match="another raydlc is preparing"), dataset.writing(second):  # first, second
        pass
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "out" / dataset.LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match="another raydlc is preparing"), dataset.writing(p):
            pass
    finally:
        holder.kill()
        holder.wait()
    with dataset.writing(p):  # the holder is gone: its flock went with it
        pass


def test_a_folder_made_for_a_failed_prepare_is_removed_and_one_that_was_there_is_kept(tmp_path: Path) -> None:
    p = _plan(tmp_path, tmp_path / "out")
    with pytest.raises(RuntimeError), dataset.writing(p):
        assert (tmp_path / "out" / dataset.LOCK).exists()
        raise RuntimeError("Ray failed")
    assert not (tmp_path / "out").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError), dataset.writing(_plan(tmp_path, tmp_path / "kept")):
        raise RuntimeError("Ray failed")
    assert (tmp_path / "kept").is_dir()


def test_a_link_loop_is_listed_once_and_each_file_counted(tmp_path: Path) -> None:
    d = tmp_path / "src"
    (d / "sub").mkdir(parents=True)
    (d / "a.jsonl").write_text('{"text": "a"}\n')
    (d / "sub" / "b.jsonl").write_text('{"text": "b"}\n')
    (d / "sub" / "back").symlink_to("..")
    (d / "self").symlink_to(".")
    src = list_source(str(d))
    assert src.files == 2
    assert sorted(Path(u.path).name for u in src.units) == ["a.jsonl", "b.jsonl"]


def test_the_key_of_a_relative_source_is_the_key_of_its_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n')
    monkeypatch.chdir(tmp_path)
    rel, absolute = list_source("d.jsonl"), list_source(str(tmp_path / "d.jsonl"))
    assert dataset_key(rel, "bpe-256", RECIPE) == dataset_key(absolute, "bpe-256", RECIPE)
    assert dataset_key(rel, "bpe-256", RECIPE) != dataset_key(rel, "bpe-512", RECIPE)


def test_local_gpus_counts_what_cuda_visible_devices_or_the_driver_shows(tmp_path: Path) -> None:
    from raydlc.jobs.targets import local_gpus

    assert local_gpus({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == 0
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, tmp_path) == 2
    assert local_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, tmp_path) == 0
    assert local_gpus({}, tmp_path / "no-driver") == 0
    for bus in ("0000:00:1e.0", "0000:00:1f.0"):
        (tmp_path / bus).mkdir()
    assert local_gpus({}, tmp_path) == 2
