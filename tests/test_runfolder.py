"""The run folder (train.runfolder): raydlc's own by its start record, one writer at a time (a real flock
held by another process), --overwrite the only way to replace a run, and staging folders of ended processes swept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raydlc.errors import InputError
from raydlc.train import runfolder as F
from raydlc.train.checkpoint import sweep_staging


def test_the_checkpoint_manifest_name_is_the_checkpoints_own() -> None:
    from raydlc.train.checkpoint import MANIFEST

    assert F.CHECKPOINT_MANIFEST == MANIFEST


def test_a_new_run_gets_its_record_and_lock_and_a_reused_name_is_refused(tmp_path: Path) -> None:
    c = F.claim(str(tmp_path), "r", resume=False, overwrite=False)
    assert not c.existed
    with F.held(c, overwrite=False):
        (tmp_path / "r" / "metrics.jsonl").write_text("{}\n")
        rec = json.loads((tmp_path / "r" / F.RECORD).read_text())
        assert rec["run_name"] == "r" and abs(rec["started_at"] - time.time()) < 60
    with pytest.raises(InputError, match="already holds a run") as e:
        F.claim(str(tmp_path), "r", resume=False, overwrite=False)
    assert "--overwrite replaces it" in (e.value.hint or "")
    assert F.claim(str(tmp_path), "r", resume=True, overwrite=False).existed


def test_overwrite_replaces_the_run_and_a_folder_not_raydlcs_is_never_written(tmp_path: Path) -> None:
    run = tmp_path / "r"
    (run / "checkpoint_000002").mkdir(parents=True)
    (run / F.RECORD).write_text(json.dumps({"started_at": 1.0}))
    c = F.claim(str(tmp_path), "r", resume=False, overwrite=True)
    with F.held(c, overwrite=True):
        assert sorted(p.name for p in run.iterdir()) == sorted([F.RECORD, F.LOCK])
        assert json.loads((run / F.RECORD).read_text())["started_at"] > 1.0
    mine = tmp_path / "mine"
    (mine / "export").mkdir(parents=True)
    (mine / "export" / "config.json").write_text("{}")
    for resume, overwrite in ((False, False), (False, True), (True, False)):
        with pytest.raises(InputError, match="holds files raydlc did not write"):
            F.claim(str(tmp_path), "mine", resume=resume, overwrite=overwrite)
    (mine / "checkpoint_000004").mkdir()
    (mine / "checkpoint_000004" / "raydlc_checkpoint.json").write_text("{}")  # a run from before records: --resume takes it
    assert F.claim(str(tmp_path), "mine", resume=True, overwrite=False).existed


def test_a_run_that_wrote_nothing_leaves_its_name_free(tmp_path: Path) -> None:
    c = F.claim(str(tmp_path), "r", resume=False, overwrite=False)
    with pytest.raises(RuntimeError), F.held(c, overwrite=False):
        raise RuntimeError("bad input found late")
    assert not (tmp_path / "r").exists()
    assert not F.claim(str(tmp_path), "r", resume=False, overwrite=False).existed


def test_a_second_writer_is_refused_at_once_naming_the_first(tmp_path: Path) -> None:
    c = F.claim(str(tmp_path), "r", resume=False, overwrite=False)
    with F.held(c, overwrite=False):
        first = subprocess.run(  # another process, as a second `raydlc train` would be
            [sys.executable, "-c", "import sys; from raydlc.train import runfolder as F\n"
             "try:\n  F.held(F.Claim(sys.argv[1], False, None), overwrite=False).__enter__()\nexcept Exception as e: print(e)",
             str(tmp_path / "r")], capture_output=True, text=True, timeout=60)
        assert f"being written by another raydlc train (PID {os.getpid()})" in first.stdout, first.stderr
        with pytest.raises(InputError, match=f"being written by another raydlc train \\(PID {os.getpid()}\\)"):
            F.claim(str(tmp_path), "r", resume=False, overwrite=False)  # said before "already holds a run"
    assert "PID" not in subprocess.run(
        [sys.executable, "-c", "import sys; from raydlc.train import runfolder as F\n"
         "with F.held(F.Claim(sys.argv[1], True, None), overwrite=False): print('held')", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=60).stdout  # released with the first writer


def test_nothing_is_written_through_a_symlink_leaving_out(tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "r" / "checkpoint_000002").mkdir(parents=True)
    (out / "r" / F.RECORD).write_text(json.dumps({"started_at": 1.0}))
    (out / "r" / "checkpoint_000002" / "shard").symlink_to(elsewhere / "shard")
    with pytest.raises(InputError, match="is a symlink leading outside"):
        F.claim(str(out), "r", resume=True, overwrite=False)
    (out / "r" / "checkpoint_000002" / "shard").unlink()
    (out / "inside").mkdir()
    (out / "r" / "export").symlink_to(out / "inside")  # a link that stays under --out is fine
    assert F.claim(str(out), "r", resume=True, overwrite=False).existed
    (out / "linked").symlink_to(elsewhere)
    with pytest.raises(InputError, match="linked is a symlink leading outside"):
        F.claim(str(out), "linked", resume=False, overwrite=False)


def test_staging_folders_of_ended_processes_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead = int(ended.stdout)
    for name in (f"raydlc-ckpt-r0-p{dead}-abc", f"raydlc-export-r1-p{dead}-x", f"raydlc-ckpt-r0-p{os.getpid()}-me", "raydlc-ckpt-r0-old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__0_0.distcp").write_bytes(b"x" * 10)
    gone = sweep_staging(tmp_path)
    assert sorted(p.name for p in gone) == sorted([f"raydlc-ckpt-r0-p{dead}-abc", f"raydlc-export-r1-p{dead}-x"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"raydlc-ckpt-r0-p{os.getpid()}-me", "raydlc-ckpt-r0-old"])
