"""The one runner of the external tools raydlc drives: eksctl, helm, kubectl.

A command is data (`Command`: the tool, its arguments, whether it changes the world) so that a
plan can print it, a dry run can skip it and a test double can log it; running one streams its
output line by line to the caller (cluster creation takes 15-20 minutes, and a silent terminal
looks hung). A missing or too-old tool is an error naming the tool, the minimum version raydlc
needs and how to install it, found before anything is changed.

Children are ended only by their own PID, on interruption or a timeout.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from raydlc.edges import poll
from raydlc.edges.poll import Cancelled
from raydlc.errors import RaydlcError, ToolMissingError

LineSink = Callable[[str], None]


@dataclass(frozen=True)
class Tool:
    """What raydlc needs of one program: the version it requires and how a person gets it."""

    name: str
    minimum: str
    version_args: tuple[str, ...]
    install: str
    why: str


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in [
        # The ClusterConfig is validated against eksctl 0.230.0's schema; older releases may
        # reject fields raydlc renders (and lack the newer Kubernetes versions).
        Tool("eksctl", "0.230.0", ("version",), "https://eksctl.io/installation/",
             "creates and deletes the EKS cluster and its node groups"),
        Tool("helm", "3.14.0", ("version", "--short"), "https://helm.sh/docs/intro/install/",
             "installs the KubeRay operator and the NVIDIA device plugin"),
        Tool("kubectl", "1.30.0", ("version", "--client"), "https://kubernetes.io/docs/tasks/tools/",
             "port-forwards to the Ray head"),
    ]
}

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


class ToolVersionError(RaydlcError):
    """An external tool is installed but older than raydlc needs."""


class ToolFailed(RaydlcError):
    """A tool ran and exited non-zero; `lines` holds the tail of its output."""

    def __init__(self, message: str, *, returncode: int, lines: Sequence[str], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.returncode = returncode
        self.lines = list(lines)


def parse_version(text: str) -> tuple[int, int, int] | None:
    """The first `X.Y[.Z]` in a tool's version output (`v3.17.2+g…`, `0.230.0`, `Client Version: v1.33.1`)."""
    m = _VERSION.search(text)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@dataclass(frozen=True)
class Command:
    """One invocation: `tool args…`; `mutates` says whether a dry run must skip it."""

    tool: str
    args: tuple[str, ...]
    mutates: bool = True

    @property
    def argv(self) -> list[str]:
        return [self.tool, *self.args]

    def __str__(self) -> str:
        return shlex.join(self.argv)


def command(tool: str, *args: str, mutates: bool = True) -> Command:
    return Command(tool, tuple(str(a) for a in args), mutates)


@dataclass
class Result:
    command: Command
    returncode: int
    lines: list[str]
    skipped: bool = False  # a dry run did not execute it

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


@dataclass
class Runner:
    """Runs Commands; one per `up`/`down`, shared by its concurrent steps.

    `dry_run` skips every command that mutates (reads still run, so a plan can look at the
    world) and records it in `planned`. `cancel` is set on Ctrl-C: running children are
    terminated by PID and no new command starts.
    """

    dry_run: bool = False
    env: Mapping[str, str] | None = None
    tail: int = 200
    planned: list[Command] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    _versions: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _children: set[subprocess.Popen[str]] = field(default_factory=set)

    def _environ(self) -> dict[str, str]:
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def which(self, tool: str) -> str:
        path = shutil.which(tool, path=self._environ().get("PATH"))
        if path is None:
            t = TOOLS.get(tool)
            need = f" {t.minimum} or newer" if t else ""
            raise ToolMissingError(
                f"{tool} is not on PATH; raydlc needs {tool}{need}" + (f" ({t.why})" if t else ""),
                hint=f"install it: {t.install}" if t else f"install {tool} and put it on PATH",
            )
        return path

    def require(self, tool: str) -> tuple[int, int, int]:
        """The tool's version, once per runner; raises when missing or older than TOOLS says."""
        with self._lock:
            if tool in self._versions:
                return self._versions[tool]
        t = TOOLS[tool]
        exe = self.which(tool)
        try:
            out = subprocess.run(
                [exe, *t.version_args], capture_output=True, text=True, timeout=60, env=self._environ(), check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ToolMissingError(f"{tool} at {exe} could not be run ({e})", hint=f"reinstall it: {t.install}") from e
        found = parse_version(out.stdout + "\n" + out.stderr)
        minimum = parse_version(t.minimum)
        assert minimum is not None
        if found is None:
            raise ToolVersionError(
                f"{tool} at {exe} did not report a version (`{shlex.join([tool, *t.version_args])}` printed "
                f"{(out.stdout or out.stderr).strip()[:120]!r}); raydlc needs {t.minimum} or newer",
                hint=f"install a current release: {t.install}",
            )
        if found < minimum:
            raise ToolVersionError(
                f"{tool} {'.'.join(map(str, found))} at {exe} is too old; raydlc needs {t.minimum} or newer ({t.why})",
                hint=f"upgrade it: {t.install}",
            )
        with self._lock:
            self._versions[tool] = found
        return found

    def run(
        self,
        cmd: Command,
        *,
        on_line: LineSink | None = None,
        check: bool = True,
        timeout: float | None = None,
        stdin: str | None = None,
    ) -> Result:
        """Run to completion, streaming each output line (stdout and stderr merged) to `on_line`."""
        if self.dry_run and cmd.mutates:
            with self._lock:
                self.planned.append(cmd)
            return Result(cmd, 0, [], skipped=True)
        if self.cancel.is_set():
            raise Cancelled(f"not started, interrupted: {cmd}")
        if cmd.tool in TOOLS:
            self.require(cmd.tool)
        exe = self.which(cmd.tool)
        lines: list[str] = []
        proc = self._spawn([exe, *cmd.args], stdin is not None)
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            self._end(proc)

        timer = None
        if timeout is not None:
            timer = threading.Timer(timeout, expire)
            timer.daemon = True
            timer.start()
        try:
            if stdin is not None:
                assert proc.stdin is not None
                proc.stdin.write(stdin)
                proc.stdin.close()
            assert proc.stdout is not None
            for line in _lines(proc.stdout):
                lines.append(line)
                if len(lines) > self.tail:
                    del lines[0]
                if on_line is not None:
                    on_line(line)
            rc = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
            if proc.poll() is None:
                self._end(proc)
            with self._lock:
                self._children.discard(proc)
        if self.cancel.is_set():
            raise Cancelled(f"interrupted: {cmd}")
        if timed_out.is_set():
            raise ToolFailed(f"`{cmd}` did not finish within {timeout:.0f} s", returncode=rc, lines=lines)
        if check and rc != 0:
            last = next((ln for ln in reversed(lines) if ln.strip()), "")
            raise ToolFailed(f"`{cmd}` failed (exit {rc}): {last.strip()}", returncode=rc, lines=lines)
        return Result(cmd, rc, lines)

    def start(self, cmd: Command, *, on_line: LineSink | None = None) -> Running:
        """Start a long-lived command (a port-forward); the caller stops it with `Running.stop()`."""
        if self.cancel.is_set():
            raise Cancelled(f"not started, interrupted: {cmd}")
        if cmd.tool in TOOLS:
            self.require(cmd.tool)
        proc = self._spawn([self.which(cmd.tool), *cmd.args], False)
        return Running(self, cmd, proc, on_line)

    def _spawn(self, argv: list[str], with_stdin: bool) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=self._environ(),
            start_new_session=True,  # Ctrl-C reaches raydlc alone; raydlc ends the child by its PID
        )
        with self._lock:
            self._children.add(proc)
        return proc

    def _end(self, proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
        if proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def interrupt(self) -> None:
        """Stop everything: no new command starts, running children are terminated by PID."""
        self.cancel.set()
        with self._lock:
            children = list(self._children)
        for proc in children:
            self._end(proc)


class Running:
    """A started command whose lines are read on a thread; `stop()` ends it by its PID."""

    def __init__(self, runner: Runner, cmd: Command, proc: subprocess.Popen[str], on_line: LineSink | None) -> None:
        self.runner, self.command, self.proc = runner, cmd, proc
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._on_line = on_line
        self._reader = threading.Thread(target=self._read, name=f"{cmd.tool}-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in _lines(self.proc.stdout):
            with self._cond:
                self.lines.append(line)
                del self.lines[: -self.runner.tail]
                self._cond.notify_all()
            if self._on_line is not None:
                self._on_line(line)
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """Block until a line matches `pattern` (e.g. 'Forwarding from 127.0.0.1:(\\d+)')."""
        rx = re.compile(pattern)
        seen = 0

        def look() -> re.Match[str] | None:
            nonlocal seen
            found = next((m for line in self.lines[seen:] if (m := rx.search(line))), None)
            seen = len(self.lines)
            if found is None and self.proc.poll() is not None and not self._reader.is_alive():
                raise ToolFailed(f"`{self.command}` exited ({self.proc.returncode}) before printing {pattern!r}",
                                 returncode=self.proc.returncode or 0, lines=self.lines)
            return found

        with self._cond:  # the lines are read under the lock; a new line wakes the pause
            m = poll.until(look, lambda m: m is not None, what=f"`{self.command}` to print {pattern!r}", timeout=timeout,
                           interval=0.5, or_last=True, sleep=self._cond.wait)
            if m is None:
                raise ToolFailed(f"`{self.command}` printed nothing matching {pattern!r} within {timeout:.0f} s",
                                 returncode=-1, lines=self.lines)
            return m

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        self.runner._end(self.proc)
        self._reader.join(5)
        with self.runner._lock:
            self.runner._children.discard(self.proc)
        return self.proc.returncode if self.proc.returncode is not None else -1

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _lines(stream: IO[str]) -> Iterator[str]:
    for raw in iter(stream.readline, ""):
        yield raw.rstrip("\r\n")
