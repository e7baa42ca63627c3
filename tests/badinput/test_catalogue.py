"""Every bad input in the catalogue: the right exit code, one line naming the problem, no traceback,
no file left behind, no connection to AWS unless the row is about AWS, and Ray never started.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from catalogue import DIR, FIFO, ROWS, Link, Row, Sparse, command_of  # type: ignore[import-not-found]

from raydlc.cli import app, main

# The real entry point (the console script's `run`), reporting at exit which heavy modules it imported.
HARNESS = (
    "import atexit, os, sys\n"
    "out = os.environ.pop('BADINPUT_MODULES_OUT')\n"
    "atexit.register(lambda: open(out, 'w').write(' '.join(m for m in ('ray', 'torch', 'boto3') if m in sys.modules)))\n"
    "from raydlc.cli import run\n"
    "sys.argv[0] = 'raydlc'\n"
    "run()\n"
)


def _env(row: Row, black_hole: str, refused: str, work: Path) -> dict[str, str | None]:
    """No RAYDLC_* or AWS_* from outside; AWS pointed at the black hole with throwaway credentials."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("RAYDLC_", "AWS_"))}
    env.update(
        AWS_ENDPOINT_URL=black_hole, AWS_ACCESS_KEY_ID="badinput", AWS_SECRET_ACCESS_KEY="badinput",
        AWS_CONFIG_FILE="/nonexistent/aws-config", AWS_SHARED_CREDENTIALS_FILE="/nonexistent/aws-credentials",
        AWS_EC2_METADATA_DISABLED="true", HF_HUB_OFFLINE="1",
    )
    env.update({k: None if v is None else v.format(black_hole=black_hole, refused=refused, work=work) for k, v in row.env.items()})
    return env


def _make(work: Path, files: dict[str, bytes | str | int | None]) -> None:
    for name, content in files.items():
        p = work / name
        if content is DIR:
            p.mkdir(parents=True, exist_ok=True)
        elif content is FIFO:
            p.parent.mkdir(parents=True, exist_ok=True)
            os.mkfifo(p)
        elif isinstance(content, Link):
            p.parent.mkdir(parents=True, exist_ok=True)
            p.symlink_to(content)
        elif isinstance(content, Sparse):
            p.parent.mkdir(parents=True, exist_ok=True)
            with p.open("wb") as f:
                f.truncate(content)
        else:  # "{work}" in a text file: the working directory (a record naming a path in it)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content if isinstance(content, bytes) else content.replace("{work}", str(work)).encode())


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under root (hidden ones too), with a digest for files (a link by its target, never followed)."""
    return {
        str(p.relative_to(root)): f"-> {os.readlink(p)}" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file()
        else "dir" if p.is_dir() else "other"
        for p in sorted(root.rglob("*"))
    }


def _subprocess(args: list[str], env: dict[str, str | None], work: Path, stdin_closed: bool) -> tuple[int, str, str, str]:
    modules = work.parent / "modules.txt"
    full = {k: v for k, v in os.environ.items() if env.get(k, "") is not None}
    full.update({k: v for k, v in env.items() if v is not None})
    full["BADINPUT_MODULES_OUT"] = str(modules)
    argv = [sys.executable, "-c", HARNESS, *args]
    if stdin_closed:  # the shell closes fd 0 before exec: Python then starts with sys.stdin = None
        argv = ["/bin/sh", "-c", 'exec "$0" "$@" <&-', *argv]
    p = subprocess.run(argv, capture_output=True, text=True, env=full, cwd=work, timeout=90,
                       stdin=None if stdin_closed else subprocess.DEVNULL)
    assert modules.exists(), p.stderr  # the harness ran to its exit
    return p.returncode, p.stdout, p.stderr, modules.read_text()


def _in_process(args: list[str], env: dict[str, str | None], work: Path, monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str, str]:
    for k, v in env.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    monkeypatch.chdir(work)
    ray_before = "ray" in sys.modules
    capsys.readouterr()
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err, "ray" if "ray" in sys.modules and not ray_before else ""


def assert_one_line(err: str, says: str) -> None:
    """The failure is one `error:` line naming the problem, at most one `  hint:` line, nothing else."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[0].startswith("error: "), err
    assert says in lines[0], f"{says!r} not in {lines[0]!r}"
    assert len(lines[0]) <= 700, f"a {len(lines[0])}-character error line: long values are shown cut"
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  hint: ")), err


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_bad_input_gives_one_line_and_leaves_nothing(
    row: Row, tmp_path: Path, black_hole: Any, refused_url: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    _make(work, dict(row.files))
    for name in row.locks:  # another raydlc at work: it holds this lock for the whole row
        from filelock import FileLock

        held = FileLock(str(work / name))
        held.acquire()
        request.addfinalizer(held.release)
    before = _snapshot(work)
    env = _env(row, black_hole.url, refused_url, work)
    args = [a.format(black_hole=black_hole.url, refused=refused_url, work=work, black_hole_gcs=black_hole.url.removeprefix("http://"))
            for a in row.args]
    connections = black_hole.accepted
    if row.sub or row.stdin_closed:
        rc, out, err, heavy = _subprocess(args, env, work, row.stdin_closed)
    else:
        rc, out, err, heavy = _in_process(args, env, work, monkeypatch, capsys)
    assert rc == row.code, err
    assert_one_line(err, row.says.format(black_hole=black_hole.url, refused=refused_url))
    assert not row.hint_lacks or row.hint_lacks not in err, err
    assert out == "", out  # nothing half-printed either: no table, no JSON with NaN in it
    assert _snapshot(work) == before
    assert "ray" not in heavy.split()  # failed before Ray was even imported, let alone started
    if not row.reaches_aws:
        assert black_hole.accepted == connections, "the row reached for AWS before failing"
    else:
        assert black_hole.accepted > connections


def test_every_command_has_catalogue_rows_and_the_subprocess_runs_cover_it() -> None:
    """A new command (up, down, status, submit, job, verify …) fails this until it has its rows."""
    def names(group: typer.core.TyperGroup, prefix: str = "") -> list[str]:
        out = []
        for name, cmd in group.commands.items():
            if isinstance(cmd, typer.core.TyperGroup):
                out += names(cmd, f"{prefix}{name} ")
            else:
                out.append(prefix + name)
        return out

    commands = set(names(typer.main.get_command(app)))  # type: ignore[arg-type]
    covered = {command_of(row.args) for row in ROWS}
    in_subprocess = {command_of(row.args) for row in ROWS if row.sub}
    assert commands - covered == set()
    assert commands - in_subprocess - {"config show", "config init"} == set()
    assert {"config show", "config init"} <= in_subprocess
    assert len({row.id for row in ROWS}) == len(ROWS)
