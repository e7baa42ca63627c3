"""A head record is a claim: no command ends a process or deletes a directory raydlc did not make,
whatever `~/.raydlc/local/head.json` holds. Each test writes the record a stale or edited file
would hold, runs the real commands in-process, and checks that the process and the directory
it names are still there (and that read-only commands leave even the record in place).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raydlc.cli import main
from raydlc.edges import local_head
from raydlc.edges.files import OWNED_MARKER, make_owned_dir, owned, remove_owned_dir
from raydlc.jobs import targets


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for k in ("RAYDLC_CONFIG", "RAY_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not raydlc's head; ended by its own PID."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A directory a record may name: outside anything raydlc made, with a file worth keeping."""
    d = tmp_path / "precious"
    d.mkdir()
    (d / "thesis.tex").write_text("years of work\n")
    return d


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def write_record(home: Path, pid: int, temp_dir: Path, start_ticks: int | None) -> Path:
    path = home / ".raydlc" / "local" / "head.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"pid": pid, "start_ticks": start_ticks, "dashboard_url": "http://127.0.0.1:9", "address": "127.0.0.1:9",
           "temp_dir": str(temp_dir), "log": str(temp_dir / "ray-head.log"), "python": "python", "started_at": time.time()}
    path.write_text(json.dumps(rec))
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


READ_ONLY = (("job", "list", "--local"), ("job", "status", "x", "--local"), ("job", "logs", "x", "--local"),
             ("verify", "--local"))


def assert_read_only_commands_touch_nothing(capsys: pytest.CaptureFixture[str], record: Path, victim: Path, says: str) -> None:
    for args in READ_ONLY:
        rc, out, err = run(capsys, *args)
        assert rc == 1 and out == "", err
        assert err.startswith("error: no local Ray head of raydlc runs: the local head record") and says in err, err
        assert "hint: raydlc down --local" in err
        assert record.exists(), args  # read-only: not even the record goes
        assert (victim / "thesis.tex").read_text() == "years of work\n"


def test_a_dead_pid_deletes_nothing_and_down_removes_only_the_record(home: Path, victim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pid = dead_pid()
    record = write_record(home, pid, victim, start_ticks=12345)
    assert targets.running_head() is None
    assert_read_only_commands_touch_nothing(capsys, record, victim, f"PID {pid} is not running")
    rc, out, _ = run(capsys, "down", "--local", "--dry-run")
    assert rc == 0 and "would remove the local head record" in out and record.exists()
    rc, out, _ = run(capsys, "down", "--local", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["local"]["ended"] is False and f"PID {pid} is not running" in doc["local"]["doubted_record"]
    assert not record.exists() and (victim / "thesis.tex").exists()


def test_a_live_unrelated_pid_without_a_start_time_is_neither_ended_nor_reported_as_the_head(
        home: Path, victim: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]) -> None:
    record = write_record(home, sleeper.pid, victim, start_ticks=None)
    assert targets.running_head() is None
    assert_read_only_commands_touch_nothing(capsys, record, victim, "records no start time")
    rc, out, _ = run(capsys, "down", "--local")
    assert rc == 0 and "removed the local head record" in out and "nothing it names was touched" in out
    assert sleeper.poll() is None and local_head.process_alive(sleeper.pid)  # still running
    assert (victim / "thesis.tex").exists() and not record.exists()


def test_a_record_whose_command_line_is_not_raydlcs_head_is_refused(
        home: Path, victim: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]) -> None:
    """The PID runs and its start time matches (as after an edit, or a PID reused at once): the command line decides."""
    record = write_record(home, sleeper.pid, victim, start_ticks=local_head.start_ticks(sleeper.pid))
    claim = targets.check_record()
    assert claim is not None and claim.doubt is not None and "is not raydlc's Ray head" in claim.doubt
    assert_read_only_commands_touch_nothing(capsys, record, victim, "is not raydlc's Ray head")
    rc, _, _ = run(capsys, "down", "--local")
    assert rc == 0 and sleeper.poll() is None and (victim / "thesis.tex").exists()


def test_a_start_time_that_does_not_match_is_a_reused_pid(home: Path, victim: Path, sleeper: subprocess.Popen[bytes]) -> None:
    ticks = local_head.start_ticks(sleeper.pid)
    assert ticks is not None
    write_record(home, sleeper.pid, victim, start_ticks=ticks - 1)
    claim = targets.check_record()
    assert claim is not None and "started after the head did" in str(claim.doubt)


@pytest.mark.parametrize("content", ["{", "[]", '{"pid": "one"}', b"\xff\xfe"])
def test_a_damaged_record_stops_read_only_commands_and_down_removes_it(
        home: Path, content: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = home / ".raydlc" / "local" / "head.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    rc, out, err = run(capsys, "job", "list", "--local")
    assert rc == 1 and out == "" and "damaged" in err and len(err.strip().splitlines()) == 2 and path.exists()
    rc, out, _ = run(capsys, "down", "--local")
    assert rc == 0 and "removed the local head record" in out and not path.exists()


def test_raydlc_deletes_only_a_directory_holding_its_own_marker(tmp_path: Path, victim: Path) -> None:
    assert not owned(victim) and remove_owned_dir(victim) is False and (victim / "thesis.tex").exists()
    ours = make_owned_dir("raydlc-test-", tmp_path)
    assert (ours / OWNED_MARKER).is_file() and owned(ours)
    # A marker copied into another directory does not make it ours: it names the directory it was written in.
    (victim / OWNED_MARKER).write_text((ours / OWNED_MARKER).read_text())
    assert remove_owned_dir(victim) is False and (victim / "thesis.tex").exists()
    # Nor does a name that looks like ours, or a link to a directory of ours.
    lookalike = tmp_path / "raydlc-head-lookalike"
    lookalike.mkdir()
    assert remove_owned_dir(lookalike) is False and lookalike.is_dir()
    link = tmp_path / "link"
    link.symlink_to(ours)
    assert remove_owned_dir(link) is False and ours.is_dir()
    assert remove_owned_dir(ours) is True and not ours.exists()


def test_ending_a_head_by_pid_leaves_a_temp_dir_without_the_marker(victim: Path) -> None:
    """`end_head` for a PID that already ended: the directory it was told about is not raydlc's, so it stays."""
    local_head.end_head(dead_pid(), victim, timeout=1)
    assert (victim / "thesis.tex").exists()
