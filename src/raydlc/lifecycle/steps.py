"""Steps as data, and the scheduler that runs them: each step looks, acts on the difference, verifies.

A Step names the steps it needs; the scheduler starts every step whose needs are done, so
independent steps run at the same time and a run takes as long as its longest chain, not the
sum. Every step begins with `check` (the world as it is: absent / creating / ready / degraded,
and why), so a run that was interrupted, failed half-way or is repeated simply continues: a
step that finds its promise already kept does nothing but verify it.

Ctrl-C is caught on the main thread: the tools' children are ended by PID, running waits stop
at their next poll, and the result says which steps were in progress. Nothing is left that
`up` or `down` cannot resolve, because neither trusts memory over a fresh `check`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
from typing import TYPE_CHECKING

from raydlc.edges.poll import Cancelled
from raydlc.errors import InputError, RaydlcError
from raydlc.lifecycle.types import Interrupted, Observation, StepPlan, StepResult

if TYPE_CHECKING:
    from raydlc.lifecycle.context import Context


@dataclass(frozen=True)
class Step:
    """One resource in the direction of one command, as the scheduler sees it: a name, needs, four calls."""

    name: str
    needs: tuple[str, ...]
    summary: str
    check: Callable[[Context], Observation]
    plan: Callable[[Context, Observation], StepPlan]
    act: Callable[[Context, Observation], None]
    verify: Callable[[Context], str]  # the reason the promise holds; raises StepFailed when it does not


# ---------------------------------------------------------------------- the graph, pure


def order(steps: Sequence[Step]) -> list[Step]:
    """Dependency order, stable in the order the steps are declared; a cycle or unknown need is a bug.

    Passes over the declared order, each taking every step whose needs are placed (those placed
    earlier in the same pass included), so steps declared in a valid order keep it.
    """
    names = {s.name for s in steps}
    for s in steps:
        for need in s.needs:
            if need not in names:
                raise ValueError(f"step {s.name} needs unknown step {need}")
    sorter = TopologicalSorter({s.name: s.needs for s in steps})
    try:
        sorter.prepare()
    except CycleError as e:
        raise ValueError(f"steps form a cycle: {sorted(set(e.args[1]))}") from None
    done: list[Step] = []
    ready: set[str] = set()
    while sorter.is_active():
        for s in steps:
            ready.update(sorter.get_ready())
            if s.name in ready:
                ready.discard(s.name)
                sorter.done(s.name)
                done.append(s)
    return done


def ancestors(steps: Sequence[Step], name: str) -> set[str]:
    by_name = {s.name: s for s in steps}
    out: set[str] = set()
    todo = list(by_name[name].needs)
    while todo:
        n = todo.pop()
        if n not in out:
            out.add(n)
            todo.extend(by_name[n].needs)
    return out


def descendants(steps: Sequence[Step], name: str) -> set[str]:
    return {s.name for s in steps if name in ancestors(steps, s.name)}


def select(steps: Sequence[Step], *, only: str | None = None, from_: str | None = None,
           until: str | None = None) -> list[str]:
    """The steps a partial run covers, in dependency order.

    `--only X` is X alone; `--until X` is X and everything it needs; `--from X` is X and
    everything that needs it; `--from` and `--until` together take the steps between.
    """
    names = [s.name for s in order(steps)]
    for flag, value in (("--only", only), ("--from", from_), ("--until", until)):
        if value is not None and value not in names:
            raise InputError(f"{flag} {value!r}: no such step", hint=f"steps: {', '.join(names)}")
    if only is not None:
        if from_ is not None or until is not None:
            raise InputError("--only cannot be combined with --from or --until", hint="use --from X --until Y for a range")
        return [only]
    chosen = set(names)
    if from_ is not None:
        chosen &= {from_} | descendants(steps, from_)
    if until is not None:
        chosen &= {until} | ancestors(steps, until)
    if not chosen:
        raise InputError(f"--from {from_} --until {until} covers no step", hint=f"in order: {', '.join(names)}")
    return [n for n in names if n in chosen]


def critical_path(steps: Sequence[Step], durations: Mapping[str, float]) -> tuple[float, list[str]]:
    """The longest chain of needs by duration: the least time a concurrent run can take."""
    best: dict[str, tuple[float, list[str]]] = {}
    for s in order(steps):
        before = max((best[n] for n in s.needs if n in best), key=lambda t: (t[0], len(t[1])), default=(0.0, []))
        best[s.name] = (before[0] + durations.get(s.name, 0.0), [*before[1], s.name])
    return max(best.values(), key=lambda t: (t[0], len(t[1])), default=(0.0, []))


# ---------------------------------------------------------------------- running


def plan_all(steps: Sequence[Step], ctx: Context, selected: Iterable[str]) -> list[StepResult]:
    """Every selected step's check and plan, in order; nothing is changed (the dry run)."""
    chosen = set(selected)
    out: list[StepResult] = []
    for s in order(steps):
        if s.name not in chosen:
            continue
        t0 = time.monotonic()
        obs = s.check(ctx)
        p = s.plan(ctx, obs)
        out.append(StepResult(s.name, "planned", p.action, p.reason, list(p.commands), obs.state, time.monotonic() - t0,
                              found=obs.reason))
    return out


def _run_one(step: Step, ctx: Context) -> StepResult:
    t0 = time.monotonic()
    ctx.reporter.started(step.name)
    obs: Observation | None = None
    p: StepPlan | None = None
    try:
        obs = step.check(ctx)
        p = step.plan(ctx, obs)
        if p.acts:
            ctx.reporter.acting(step.name, p)
            step.act(ctx, obs)
        reason = step.verify(ctx)
        if p.acts:
            reason = f"{p.reason}; {reason}" if p.action != "wait" else reason
        result = StepResult(step.name, "done", p.action, reason, list(p.commands), obs.state, time.monotonic() - t0,
                            found=obs.reason)
    except Cancelled as e:
        result = StepResult(step.name, "interrupted", p.action if p else "", e.message, [], obs.state if obs else "",
                            time.monotonic() - t0, error=e)
    except RaydlcError as e:
        result = StepResult(step.name, "failed", p.action if p else "", e.message, list(p.commands) if p else [],
                            obs.state if obs else "", time.monotonic() - t0, error=e)
    except OSError as e:  # a file raydlc writes (~/.raydlc, the kubeconfig): the path named; exit 2 when it is the user's
        from raydlc.edges.files import os_error

        err = os_error(e)
        result = StepResult(step.name, "failed", p.action if p else "", err.message, list(p.commands) if p else [],
                            obs.state if obs else "", time.monotonic() - t0, error=err)
    except Exception as e:  # a bug or an unmapped library error: keep the traceback for --debug
        result = StepResult(step.name, "failed", p.action if p else "", f"{type(e).__name__}: {e}", [],
                            obs.state if obs else "", time.monotonic() - t0, error=e)
    ctx.reporter.finished(result)
    return result


def run_all(steps: Sequence[Step], ctx: Context, selected: Iterable[str]) -> list[StepResult]:
    """Run the selected steps, each as soon as the selected steps it needs are done.

    Needs outside the selection count as met (a partial run trusts the earlier one; the
    step's own check still looks). A failed step skips what needs it; independent steps go
    on, so a re-run has less left to do.
    """
    ordered = [s for s in order(steps) if s.name in set(selected)]
    chosen = {s.name for s in ordered}
    results: dict[str, StepResult] = {}
    running: dict[Future[StepResult], str] = {}
    interrupted = False
    with ThreadPoolExecutor(max_workers=max(1, len(ordered)), thread_name_prefix="step") as pool:
        try:
            while len(results) < len(ordered):
                for s in ordered:
                    if s.name in results or s.name in running.values():
                        continue
                    needs = [n for n in s.needs if n in chosen]
                    bad = [n for n in needs if n in results and results[n].outcome != "done"]
                    if bad or (interrupted and not all(n in results for n in needs)):
                        why = f"not run: {', '.join(bad)} did not finish" if bad else "not run: interrupted"
                        results[s.name] = StepResult(s.name, "skipped", "", why)
                        ctx.reporter.finished(results[s.name])
                        continue
                    if not interrupted and all(n in results for n in needs):
                        running[pool.submit(_run_one, s, ctx)] = s.name
                if not running:
                    if len(results) < len(ordered) and not interrupted:
                        raise RuntimeError("scheduler stalled")  # pragma: no cover
                    continue
                finished, _ = wait(list(running), timeout=0.2, return_when=FIRST_COMPLETED)
                for f in finished:
                    results[running.pop(f)] = f.result()
        except KeyboardInterrupt:
            interrupted = True
            ctx.interrupt()
            for f, name in list(running.items()):
                results[name] = f.result()
            running.clear()
            for s in ordered:
                if s.name not in results:
                    results[s.name] = StepResult(s.name, "skipped", "", "not run: interrupted")
    out = [results[s.name] for s in ordered]
    if interrupted:
        busy = [r.step for r in out if r.outcome == "interrupted"] or [r.step for r in out if r.outcome == "skipped"][:1]
        raise Interrupted(
            f"interrupted{' during ' + ', '.join(busy) if busy else ''}; nothing is half-owned: "
            "re-run the same command to continue, or `raydlc down` to remove what exists",
            out,
        )
    return out
