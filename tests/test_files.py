"""raydlc.edges.files: output locations checked before the work, writes all or nothing, OS errors in one line."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from raydlc.edges import files
from raydlc.errors import InputError, MachineError


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_check_output_dir_accepts_a_creatable_path_and_leaves_nothing(tmp_path: Path) -> None:
    assert files.check_output_dir(tmp_path / "a" / "b", "--out") == tmp_path / "a" / "b"
    assert files.check_output_dir(tmp_path, "--out") == tmp_path
    assert tree(tmp_path) == []  # the writability probe is gone, and nothing was created


@pytest.mark.parametrize(
    ("make", "path", "says"),
    [
        (lambda d: (d / "f").write_text("x"), "f", "f: exists and is not a directory"),
        (lambda d: (d / "f").write_text("x"), "f/sub/dir", "f is a file, not a directory"),
        (lambda d: None, "/proc/raydlc-test", "cannot create files in /proc"),
    ],
)
def test_check_output_dir_refuses_with_the_path(tmp_path: Path, make, path: str, says: str) -> None:
    make(tmp_path)
    with pytest.raises(InputError, match=says) as e:
        files.check_output_dir(path if path.startswith("/") else tmp_path / path, "--out")
    assert e.value.exit_code == 2 and "--out" in e.value.message


def test_a_read_only_file_system_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run as root, for whom a 0555 directory is writable: the read-only case is the file system's EROFS."""
    def read_only(**kw: object) -> tuple[int, str]:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    with pytest.raises(InputError, match=r"cannot create files in .* \(read-only file system\)"):
        files.check_output_dir(tmp_path, "--out")


def test_write_all_replaces_every_file_with_ordinary_permissions(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("old")
    written = files.write_all({tmp_path / "a.yaml": "new a", tmp_path / "sub" / "b.yaml": "new b"}, "--out")
    assert sorted(written) == [tmp_path / "a.yaml", tmp_path / "sub" / "b.yaml"]
    assert (tmp_path / "a.yaml").read_text() == "new a" and (tmp_path / "sub" / "b.yaml").read_text() == "new b"
    assert tree(tmp_path) == ["a.yaml", "sub", "sub/b.yaml"]
    assert (tmp_path / "a.yaml").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_write_all_checks_every_target_before_writing_any(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("old")
    (tmp_path / "c.yaml").mkdir()
    with pytest.raises(InputError, match=r"c\.yaml exists and is a directory; nothing was written"):
        files.write_all({tmp_path / "a.yaml": "new", tmp_path / "b.yaml": "new", tmp_path / "c.yaml": "new"}, "--out")
    assert (tmp_path / "a.yaml").read_text() == "old"
    assert tree(tmp_path) == ["a.yaml", "c.yaml"]


def test_a_failure_while_writing_leaves_the_old_files_and_no_temporaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.yaml").write_text("old")
    real = files.tempfile.mkstemp
    calls = []

    def disk_full_on_third(**kw: object) -> tuple[int, str]:
        calls.append(kw)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(kw["dir"]))
        return real(**kw)  # type: ignore[arg-type]

    targets = {out / "a.yaml": "new", out / "helm" / "b.yaml": "new", out / "helm" / "c.yaml": "new"}
    files.check_output_dir(out, "--out")  # the probe's mkstemp, before counting
    monkeypatch.setattr(files, "check_output_dir", lambda *a, **kw: None)
    monkeypatch.setattr(files.tempfile, "mkstemp", disk_full_on_third)
    with pytest.raises(OSError) as e:
        files.write_all(targets, "--out")
    assert e.value.errno == errno.ENOSPC
    assert tree(out) == ["a.yaml"]  # no temporaries, and the helm/ directory made for them is gone
    assert (out / "a.yaml").read_text() == "old"


@pytest.mark.parametrize(
    ("err", "cls", "code", "says"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "/etc/x"), InputError, 2, "/etc/x: permission denied"),
        (IsADirectoryError(errno.EISDIR, "Is a directory", "d"), InputError, 2, "d: is a directory"),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory", "f/x"), InputError, 2, "f/x: a part of the path is not a directory"),
        (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/x"), InputError, 2, "/mnt/ro/x: is on a read-only file system"),
        (OSError(errno.ENOSPC, "No space left on device", "/data/x"), MachineError, 1, "/data/x: no space left on device"),
        (OSError(errno.EIO, "Input/output error", "/data/x"), MachineError, 1, "/data/x: input/output error"),
    ],
)
def test_os_errors_become_one_line_naming_the_path(err: OSError, cls: type, code: int, says: str) -> None:
    e = files.os_error(err)
    assert type(e) is cls and e.exit_code == code and e.message == says
