"""What `up`, `down` and `status` look like to a person: a live table of the steps, plans, summaries.

The live display goes to stderr (stdout stays clean for `--json`): each step with its state,
elapsed time and the last line of the tool at work, because `eksctl create cluster` is quiet
for minutes at a time between lines. Without a terminal the same events become plain lines.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from raydlc.lifecycle.types import Goal, Reporter, Run, StepPlan, StepResult

_STYLE = {"done": "green", "failed": "bold red", "skipped": "yellow", "interrupted": "yellow", "planned": "cyan"}
_ACTION_STYLE = {"none": "dim", "create": "green", "delete": "red", "replace": "yellow", "repair": "yellow",
                 "wait": "cyan", "refuse": "bold red", "blocked": "bold red"}


class LiveReporter(Reporter):
    """A rich Live table of the steps, redrawn a few times a second from the step threads' events.

    Inside `with`, the table appears with the first step's first event, so an error found before
    any step (a bad setting, missing credentials, a cluster raydlc does not own) prints alone.
    """

    def __init__(self, console: Console, steps: list[str], title: str) -> None:
        self.console = console
        self.title = title
        self._lock = threading.Lock()
        self._rows: dict[str, dict[str, Any]] = {s: {"state": "waiting", "t0": None, "t1": None, "detail": ""} for s in steps}
        self._live: Any = None
        self._entered = False
        self._starting = threading.Lock()  # not _lock: starting draws the table, which takes _lock

    def __enter__(self) -> LiveReporter:
        self._entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        with self._starting:
            self._entered = False
            if self._live is not None:
                self._live.__exit__(None, None, None)
                self._live = None

    def _show(self) -> None:
        """Start the live table on the first event (once: events come from several step threads)."""
        with self._starting:
            if self._entered and self._live is None:
                from rich.live import Live

                self._live = Live(self, console=self.console, refresh_per_second=4, transient=False)
                self._live.__enter__()

    def __rich__(self) -> Table:
        table = Table(title=self.title, show_lines=False, expand=False)
        for col in ("step", "state", "elapsed", "detail"):
            table.add_column(col, overflow="fold" if col == "detail" else "ellipsis")
        now = time.monotonic()
        with self._lock:
            for name, row in self._rows.items():
                t0, t1 = row["t0"], row["t1"]
                elapsed = "" if t0 is None else f"{(t1 or now) - t0:6.1f}s"
                state = row["state"]
                detail = row["detail"] if state in _STYLE else row["detail"][-160:]  # a tool line may be long
                table.add_row(name, Text(state, style=_STYLE.get(state, "cyan" if state in ("checking", "acting") else "dim")),
                              elapsed, Text(detail))
        return table

    def _set(self, step: str, **kw: Any) -> None:
        with self._lock:
            self._rows.setdefault(step, {"state": "waiting", "t0": None, "t1": None, "detail": ""}).update(kw)
        self._show()

    def started(self, step: str) -> None:
        self._set(step, state="checking", t0=time.monotonic())

    def acting(self, step: str, plan: StepPlan) -> None:
        self._set(step, state="acting", detail=f"{plan.action}: {plan.reason}")

    def line(self, step: str, text: str) -> None:
        if text.strip():
            self._set(step, detail=text.strip())

    def finished(self, result: StepResult) -> None:
        with self._lock:
            row = self._rows.setdefault(result.step, {"state": "", "t0": None, "t1": None, "detail": ""})
            row.update(state=result.outcome, t1=time.monotonic(), detail=result.reason)
            if row["t0"] is None:
                row["t0"] = row["t1"]
        self._show()


    def confirm(self, step: str, question: str) -> bool:
        """Pause the table, ask on the terminal (only when stdin is one), and go on."""
        import sys

        if not sys.stdin.isatty():
            return False
        with self._starting:
            if self._live is not None:
                self._live.stop()
            try:
                answer = self.console.input(f"[bold]{escape(step)}[/]: {escape(question)} [y/N] ")
            except EOFError:
                answer = ""
            finally:
                if self._live is not None:
                    self._live.start()
        return answer.strip().lower() in ("y", "yes")


class LineReporter(Reporter):
    """Plain timestamped lines (a log file, CI, `--json` runs): one per event, tool lines included."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self.t0 = time.monotonic()
        self._lock = threading.Lock()

    def _out(self, step: str, text: str) -> None:
        with self._lock:
            self.write(f"[{time.monotonic() - self.t0:7.1f}s] {step}: {text}")

    def started(self, step: str) -> None:
        self._out(step, "checking")

    def acting(self, step: str, plan: StepPlan) -> None:
        self._out(step, f"{plan.action}: {plan.reason}")

    def line(self, step: str, text: str) -> None:
        if text.strip():
            self._out(step, "  " + text.strip())

    def finished(self, result: StepResult) -> None:
        self._out(result.step, f"{result.outcome} ({result.elapsed_s:.1f}s): {result.reason}")


def print_plan(run: Run, console: Console) -> None:
    table = Table(title=f"raydlc {run.command} --dry-run: nothing is changed", show_lines=True)
    for col in ("step", "action", "why", "command or API call"):
        table.add_column(col, overflow="fold")
    home = str(Path.home())
    for r in run.results:
        table.add_row(r.step, Text(r.action, style=_ACTION_STYLE.get(r.action, "")), escape(r.reason),
                      escape("\n".join(c.replace(home, "~") for c in r.commands)))
    console.print(table)


def print_run(run: Run, console: Console) -> None:
    table = Table(title=f"raydlc {run.command}")
    for col in ("step", "outcome", "action", "elapsed", "result"):
        table.add_column(col, overflow="fold")
    for r in run.results:
        table.add_row(r.step, Text(r.outcome, style=_STYLE.get(r.outcome, "")), r.action or "-",
                      f"{r.elapsed_s:.1f}s" if r.elapsed_s else "", escape(r.reason))
    console.print(table)
    print_removed(run, console)


def print_removed(run: Run, console: Console) -> None:
    if run.command == "down" and not run.dry_run:
        doc = run.to_dict()
        if doc["removed"]:
            console.print("removed: " + "; ".join(doc["removed"]), highlight=False)
        if doc.get("kept"):
            console.print("kept: " + "; ".join(doc["kept"]) + " (raydlc down --delete-storage removes it)", highlight=False)
        if doc["absent"]:
            console.print("[dim]already absent: " + "; ".join(doc["absent"]) + "[/]", highlight=False)


def _work(n: dict[str, Any]) -> str:
    """What a node holds of Ray's: its pod's kind (the name is in --json), or for a GPU node without one how
    long it has been up without one (in 5-minute steps: the figure is an upper bound of the idle time, not a stopwatch)."""
    pod = n.get("ray_pod")
    if pod:
        return "head" if str(pod).endswith("-head") or "-head-" in str(pod) else "worker"
    empty = n.get("empty_min")
    if empty is None:
        return "-"
    return "none <5 min" if empty < 5 else f"none {int(empty // 5 * 5)}+ min"


def _idle_line(cost: dict[str, Any]) -> str:
    idle = cost.get("idle_minutes", 0)
    if not idle:
        return (f"idle: ${cost['total_usd_per_hour']:,.2f}/h — IDLE_MINUTES=0 keeps the GPU nodes "
                "(set IDLE_MINUTES to let idle ones leave)")
    return (f"idle: ${cost['when_idle_usd_per_hour']:,.2f}/h once the GPU nodes have left "
            f"(after {idle} min without Ray work; they come back for a job)")


def print_status(doc: dict[str, Any], console: Console) -> None:
    c = doc["cluster"]
    attached = doc.get("attach")
    title = f"cluster {c['name']} ({c['region']}): {c['status']}"
    if attached:
        title = f"attached through {c['kubeconfig']}, namespace {attached['namespace']}"
    steps = Table(title=title)
    for col in ("step", *(("found/made",) if attached else ()), "state", "reason"):
        steps.add_column(col, overflow="fold")
    colors = {"ready": "green", "absent": "dim", "creating": "cyan", "degraded": "bold red", "deleting": "yellow"}
    for s in doc["steps"]:
        reason = escape(s["reason"]) + (f" [dim](from {escape(s['source'])})[/]" if attached and s.get("source") else "")
        steps.add_row(s["step"], *((s.get("ownership", "made"),) if attached else ()),
                      Text(s["state"], style=colors.get(s["state"], "")), reason)
    parts: list[Any] = [steps]
    if attached:
        found = Table(title="found (the platform's, never changed)")
        for col in ("what", "found", "read from"):
            found.add_column(col, overflow="fold")
        for row in attached.get("found") or []:
            found.add_row(row["what"], escape(row["found"]), escape(row["source"]))
        parts.append(found)
        made = ", ".join(attached["made"]) or "nothing yet"
        parts.append(Text(f"made by raydlc ({attached['selector']}): {made}"))
    if doc["nodes"]:
        nodes = Table(title="nodes")
        for col in ("node", "role", "type", "AZ", "ready", "GPU", "EFA", "Ray pod"):
            nodes.add_column(col)
        for n in doc["nodes"]:
            nodes.add_row(n["name"], n["role"], n["instance_type"], n["zone"], "yes" if n["ready"] else "no",
                          str(n["gpu"]), str(n["efa"]), _work(n))
        parts.append(nodes)
    rc = doc["raycluster"]
    if rc:
        pods = Table(title=f"RayCluster {rc['namespace']}/{rc['name']}: {rc['state']}")
        for col in ("pod", "type", "phase", "ready", "node"):
            pods.add_column(col)
        for p in rc["pods"]:
            pods.add_row(p["name"], p["type"], p["phase"], "yes" if p["ready"] else "no", p["node"] or "-")
        parts.append(pods)
    store = doc.get("storage")
    if store:
        from raydlc.lifecycle.resources.bucket import human

        title = f"storage {store['uri']}: {store['objects']} objects, {human(store['size_bytes'])}"
        if store["newest_checkpoints"]:
            runs = Table(title=title)
            for col in ("run", "newest checkpoint"):
                runs.add_column(col, overflow="fold")
            for run, uri in store["newest_checkpoints"].items():
                runs.add_row(escape(run), escape(uri))
            parts.append(runs)
        else:
            parts.append(Text(f"{title}; no checkpoints yet"))
    cost = doc["cost"]
    unknown = f" + unknown price: {', '.join(cost['unpriced'])}" if cost["unpriced"] else ""  # never counted as $0
    money = Table(title=f"hourly cost: ${cost['total_usd_per_hour']:,.2f}/h (estimate){unknown}")
    for col in ("item", "count", "USD/h"):
        money.add_column(col)
    for i in cost["items"]:
        money.add_row(i["item"], str(i["count"]), f"{i['usd_per_hour']:,.4f}")
    parts.append(money)
    parts.append(Text(_idle_line(cost)))
    if doc.get("gpu_prices"):
        from raydlc.capacity.prices import GpuPrices

        parts.append(Text(GpuPrices.from_dict(doc["gpu_prices"]).line()))
    console.print(Group(*parts))
    console.print(f"[dim]{cost['prices']}[/]" + (f"; unpriced: {', '.join(cost['unpriced'])}" if cost["unpriced"] else ""),
                  highlight=False)


def execute(command: Goal, fn: Callable[[Reporter | None], Run], *, json_: bool, dry_run: bool) -> int:
    """Run `up`/`down` with the right display; returns the exit code (0 ok, 1 a step failed, 2 each failure was
    the user's input, 130 Ctrl-C)."""
    import sys

    from raydlc.lifecycle.orders import names
    from raydlc.lifecycle.types import Interrupted
    from raydlc.views.output import console, emit_json, err_console

    if dry_run:
        run = fn(None)
        if json_:
            emit_json(run.to_dict())
        else:
            print_plan(run, console)
        return 0
    code = 0
    live = not json_ and err_console.is_terminal
    reporter: Reporter = (LiveReporter(err_console, names(command), f"raydlc {command}") if live
                          else LineReporter(lambda s: (sys.stderr.write(s + "\n"), sys.stderr.flush())))
    try:
        if isinstance(reporter, LiveReporter):
            with reporter:
                run = fn(reporter)
        else:
            run = fn(reporter)
    except Interrupted as e:
        run, code = Run(command, False, e.results), e.exit_code
        err_console.print(f"[yellow]{escape(e.message)}[/]", highlight=False)
    # A run that failed or stopped leaves stdout empty (a script reads it only on success): its table goes to stderr.
    table = console if code == 0 and run.ok else err_console
    if json_:
        emit_json(run.to_dict())
    elif live:
        print_removed(run, table)  # the live table already shows each step
    else:
        print_run(run, table)
    for r in run.failed:
        err_console.print(f"[bold red]{r.step} failed:[/] {escape(r.reason)}", highlight=False)
        hint = getattr(r.error, "hint", None)
        if hint:
            err_console.print(f"  hint: {escape(hint)}", highlight=False)
    if code or run.ok:
        return code
    # 2 when every failure is the user's to fix (a path, a kubeconfig), as for any other command; else 1
    return 2 if run.failed and all(getattr(r.error, "exit_code", 1) == 2 for r in run.failed) else 1
