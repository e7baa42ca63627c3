"""The tool runner against small real programs on a PATH of the test's own (never a real eksctl/helm)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from raydlc.edges.poll import Cancelled
from raydlc.edges.tools import Runner, ToolFailed, ToolVersionError, command, parse_version
from raydlc.errors import ToolMissingError


def tool(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    return d


def runner(bin_dir: Path, **kw: object) -> Runner:
    return Runner(env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(bin_dir)}, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "want"), [
    ("0.230.0", (0, 230, 0)), ("v3.17.3+ge4da497", (3, 17, 3)),
    ("Client Version: v1.33.1\nKustomize Version: v5.6.0", (1, 33, 1)), ("version.BuildInfo{Version:\"v3.9\"}", (3, 9, 0)),
    ("nothing here", None),
])
def test_versions_are_read_from_what_each_tool_prints(text: str, want: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == want


def test_a_missing_tool_names_itself_the_minimum_version_and_how_to_install(bin_dir: Path) -> None:
    with pytest.raises(ToolMissingError) as e:
        runner(bin_dir).require("eksctl")
    assert "eksctl is not on PATH" in e.value.message and "0.230.0 or newer" in e.value.message
    assert "https://eksctl.io/installation/" in (e.value.hint or "")


def test_a_too_old_tool_is_refused_before_it_runs_anything(bin_dir: Path) -> None:
    tool(bin_dir, "helm", 'if [ "$1" = version ]; then echo v3.9.4+g1234; exit 0; fi\necho RAN >> "$HOME/ran"\n')
    r = runner(bin_dir)
    with pytest.raises(ToolVersionError) as e:
        r.run(command("helm", "upgrade", "--install", "x", "y"))
    assert "helm 3.9.4" in e.value.message and "3.14.0 or newer" in e.value.message
    assert "helm.sh" in (e.value.hint or "")
    assert not (bin_dir / "ran").exists()


def test_output_is_streamed_line_by_line_while_the_tool_runs(bin_dir: Path) -> None:
    tool(bin_dir, "slow", 'echo one; sleep 0.4; echo two >&2; sleep 0.4; echo three\n')
    seen: list[tuple[float, str]] = []
    res = runner(bin_dir).run(command("slow"), on_line=lambda s: seen.append((time.monotonic(), s)))
    assert [s for _, s in seen] == ["one", "two", "three"] == res.lines
    assert seen[1][0] - seen[0][0] > 0.25 and seen[2][0] - seen[1][0] > 0.25, "lines arrive as printed, not at exit"


def test_a_failing_tool_raises_with_its_last_line_unless_unchecked(bin_dir: Path) -> None:
    tool(bin_dir, "bad", 'echo working\necho "Error: stack already exists" >&2\nexit 3\n')
    r = runner(bin_dir)
    with pytest.raises(ToolFailed) as e:
        r.run(command("bad", "--flag"))
    assert e.value.returncode == 3 and "`bad --flag` failed (exit 3): Error: stack already exists" in e.value.message
    assert r.run(command("bad"), check=False).returncode == 3


def test_dry_run_skips_what_mutates_and_runs_what_reads(bin_dir: Path) -> None:
    tool(bin_dir, "t", 'echo "$@" >> "$HOME/ran"\n')
    r = runner(bin_dir, dry_run=True)
    skipped = r.run(command("t", "create", "thing"))
    read = r.run(command("t", "status", mutates=False))
    assert skipped.skipped and not read.skipped
    assert (bin_dir / "ran").read_text() == "status\n"
    assert [str(c) for c in r.planned] == ["t create thing"]


def test_a_timeout_ends_the_child_and_says_so(bin_dir: Path) -> None:
    tool(bin_dir, "hang", 'echo start\nexec sleep 30\n')
    t0 = time.monotonic()
    with pytest.raises(ToolFailed, match="did not finish within 1 s"):
        runner(bin_dir).run(command("hang"), timeout=1)
    assert time.monotonic() - t0 < 10


def test_interrupt_ends_running_children_by_pid_and_starts_nothing_new(bin_dir: Path) -> None:
    tool(bin_dir, "hang", 'echo $$ > "$HOME/pid"\nexec sleep 30\n')
    r = runner(bin_dir)
    box: dict[str, BaseException] = {}

    def go() -> None:
        try:
            r.run(command("hang"))
        except BaseException as e:
            box["e"] = e

    t = threading.Thread(target=go)
    t.start()
    for _ in range(600):
        if (bin_dir / "pid").exists() and (bin_dir / "pid").read_text().strip():
            break
        time.sleep(0.05)
    pid = int((bin_dir / "pid").read_text())
    r.interrupt()
    t.join(15)
    assert isinstance(box.get("e"), Cancelled)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(Cancelled):
        r.run(command("hang"))


def test_a_long_lived_command_is_waited_on_by_its_output_and_stopped(bin_dir: Path) -> None:
    """What a port-forward needs: wait for the line that says it is ready, then end it by its PID."""
    tool(bin_dir, "fwd", 'echo "Forwarding from 127.0.0.1:41234 -> 8265"\nexec sleep 30\n')
    r = runner(bin_dir)
    with r.start(command("fwd", "svc/head", ":8265", mutates=False)) as running:
        m = running.wait_for(r"Forwarding from 127\.0\.0\.1:(\d+)", timeout=10)
        assert m.group(1) == "41234" and running.running
    assert not running.running


def test_a_wait_for_a_line_ends_when_the_command_exits_or_the_time_is_up(bin_dir: Path) -> None:
    tool(bin_dir, "quits", 'echo "error: no such service"\nexit 1\n')
    tool(bin_dir, "mute", "exec sleep 30\n")
    r = runner(bin_dir)
    with r.start(command("quits", mutates=False)) as running, pytest.raises(ToolFailed, match=r"exited \(1\) before printing") as e:
        running.wait_for("Forwarding", timeout=10)
    assert e.value.lines == ["error: no such service"]
    t0 = time.monotonic()
    with r.start(command("mute", mutates=False)) as running, pytest.raises(ToolFailed, match="printed nothing matching 'Forwarding' within 1 s"):
        running.wait_for("Forwarding", timeout=1)
    assert time.monotonic() - t0 < 10


def test_commands_print_as_a_shell_would_read_them() -> None:
    c = command("helm", "upgrade", "--install", "x", "--values", "/tmp/a b.yaml")
    assert str(c) == "helm upgrade --install x --values '/tmp/a b.yaml'" and c.mutates
