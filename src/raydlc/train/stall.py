"""The stall guard: a run whose optimizer steps stop is ended with evidence instead of hanging.

The driver already hears from every rank (train.heartbeat: each rank posts where it is every few
seconds, from a thread beside the training thread). `Watch` folds those records into when the
last step completed; `StallGuard.check` decides, as a frozen `StallCheck`, whether the wait has
passed STALL_MINUTES (the first step of each attempt gets STALL_FIRST_MINUTES: weights load,
kernels compile). On a stall the driver asks every rank for its threads' Python stacks and
its last log lines, names the ranks that are not waiting in a collective (those the others
wait for), writes `<run>/stall/evidence.json` and a stack file per rank, and aborts the run.

The stacks come from inside each worker (`sys._current_frames`), not from the dashboard's
`/worker/traceback`: in Ray 2.58 that endpoint is off unless the head runs with
RAY_DASHBOARD_ENABLE_PROFILING=1, needs py-spy allowed to ptrace the worker, and a local run
has no dashboard. A thread waiting in a gloo or NCCL collective, or sleeping, releases the GIL,
so the heartbeat thread still runs; a rank whose heartbeat stopped too is named as such.
Pure except `write_evidence`.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydlc.errors import TrainError

# Function names of torch.distributed's collectives and waits: a training thread whose stack ends
# in one of them is waiting for the others.
COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "barrier",
    "all_to_all", "all_to_all_single", "wait", "reduce", "gather", "scatter", "send", "recv", "monitored_barrier",
})
SLOW_PHASES = ("checkpoint", "finishing", "preempted")  # heartbeat phases that legitimately take a while without a step (train.preempt's hold)
TRAINING_FRAME = "run_loop"  # the loop's function: the thread that has it is the training thread


class Stalled(TrainError):
    """No optimizer step completed within the stall allowance; the run was stopped (exit 1), its checkpoints kept."""


@dataclass(frozen=True)
class StallCheck:
    """Whether the run has stalled, with the figures a person reads."""

    stalled: bool
    waited_s: float
    limit_s: float
    step: int  # the last completed step
    first: bool  # the allowance was the first step's


@dataclass(frozen=True)
class StallGuard:
    """STALL_MINUTES and STALL_FIRST_MINUTES as seconds; a limit of 0 is off."""

    limit_s: float
    first_limit_s: float

    @classmethod
    def of(cls, stall_minutes: float, first_minutes: float) -> StallGuard:
        return cls(stall_minutes * 60.0, max(first_minutes, stall_minutes) * 60.0 if stall_minutes > 0 else 0.0)

    @property
    def on(self) -> bool:
        return self.limit_s > 0

    def check(self, now: float, last_step_at: float, step: int, *, first: bool) -> StallCheck:
        """`last_step_at`: when the last step completed (or the attempt began, while `first`)."""
        limit = self.first_limit_s if first else self.limit_s
        waited = max(0.0, now - last_step_at)
        return StallCheck(self.on and waited > limit, waited, limit, step, first)

    def beat_every_s(self) -> float:
        """How often each rank reports where it is: a tenth of the allowance, between 0.5 and 30 s."""
        return min(30.0, max(0.5, self.limit_s / 10.0))


@dataclass
class Watch:
    """What the driver knows of each rank, fed with the mailbox's records in arrival order (driver's clock)."""

    since: float  # when the last step completed, or the current attempt began
    step: int = 0
    first: bool = True
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its last heartbeat, with `seen`
    stacks: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its answer to `ask("stacks")`

    def see(self, rec: dict[str, Any], now: float) -> None:
        if "beat" in rec:
            rank = int(rec["rank"])
            before = self.ranks.get(rank)
            if before is not None and before.get("attempt") != rec.get("attempt"):
                self._new_attempt(now)
            self.ranks[rank] = {**rec, "seen": now}
            if rec.get("completed", 0) > 0:
                self._stepped(int(rec["step"]), now)
            phase = str(rec.get("phase", ""))
            if before is not None and phase != before.get("phase") and phase.startswith(SLOW_PHASES):
                self.since = now  # a checkpoint or the export gets its own allowance
        elif "stacks" in rec:
            self.stacks[int(rec["rank"])] = rec
        elif rec.get("resumed"):
            self._new_attempt(now)
            self.step = int(rec["step"])
        elif "loss" in rec:
            self._stepped(int(rec["step"]), now)

    def _new_attempt(self, now: float) -> None:
        self.since, self.first = now, True

    def _stepped(self, step: int, now: float) -> None:
        if step > self.step or self.first:
            self.step, self.since, self.first = max(step, self.step), now, False


# ---- evidence -----------------------------------------------------------------------------------


def training_frames(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The frames (outermost first) of the rank's training thread, else of its first thread."""
    threads = answer.get("threads") or []
    for t in threads:
        if any(f["name"] == TRAINING_FRAME for f in t["frames"]):
            return list(t["frames"])
    return list(threads[0]["frames"]) if threads else []


def where(frames: list[dict[str, Any]]) -> str:
    """`all_reduce (torch/distributed/distributed_c10d.py:2950)`: the collective it waits in, else its innermost frame."""
    for f in reversed(frames):
        if f["name"] in COLLECTIVES and "distributed" in f["file"]:
            return f"{f['name']} ({_short(f['file'])}:{f['line']})"
    return f"{frames[-1]['name']} ({_short(frames[-1]['file'])}:{frames[-1]['line']})" if frames else "unknown"


def in_collective(frames: list[dict[str, Any]]) -> bool:
    return any(f["name"] in COLLECTIVES and "distributed" in f["file"] for f in frames)


def suspects(watch: Watch) -> list[int]:
    """The ranks the others wait for: behind the rest in step, or not inside a collective, or silent.

    In a collective hang every healthy rank sits in the collective; the ones that never arrived
    are the cause. When every rank is inside a collective (a network or NCCL hang), none is named.
    """
    ranks = sorted(watch.ranks)
    if not ranks:
        return []
    entered = {r: int(watch.ranks[r].get("entered", 0)) for r in ranks}
    behind = {r for r in ranks if entered[r] < max(entered.values())}
    silent = {r for r in ranks if r not in watch.stacks}
    outside = {r for r in ranks if r in watch.stacks and not in_collective(training_frames(watch.stacks[r]))}
    return sorted(behind | silent | outside)


def evidence(watch: Watch, d: StallCheck, now: float) -> dict[str, Any]:
    """The stall's record: the decision, the suspects and, per rank, its last heartbeat, where it is and its last log lines."""
    named = suspects(watch)
    ranks = []
    for r in sorted(watch.ranks):
        beat = watch.ranks[r]
        answer = watch.stacks.get(r)
        frames = training_frames(answer) if answer else []
        ranks.append({
            "rank": r, "node_ip": beat.get("node_ip"), "node_id": beat.get("node_id"), "pid": beat.get("pid"),
            "step": beat.get("step"), "entered": beat.get("entered"), "phase": beat.get("phase"),
            "last_seen_s_ago": round(now - beat["seen"], 1), "gpu_mem_mb": beat.get("gpu_mem_mb"),
            "where": where(frames) if answer else "no answer: its heartbeat thread is stuck too (a call holding the GIL) or the process is gone",
            "in_collective": in_collective(frames) if answer else None,
            "stack_file": f"rank-{r}.stack.txt" if answer else None,
            "nccl_lines": (answer or {}).get("nccl_lines", []), "log_tail": (answer or {}).get("log_tail", []),
        })
    return {"reason": reason(watch, d, named), "suspects": named, "waited_s": round(d.waited_s, 1), "limit_s": d.limit_s,
            "first_step_allowance": d.first, "last_step": d.step, "ranks": ranks}


def reason(watch: Watch, d: StallCheck, named: list[int]) -> str:
    """`no step for 20.0 min; rank 1 last seen at step 3 in hang (loop.py:530) on node 10.0.0.2`: one line."""
    what = "the first step" if d.first else "an optimizer step"
    head = f"no step for {d.waited_s / 60:.1f} min (limit {d.limit_s / 60:g} min for {what})"
    if not named:
        wait = sorted({where(training_frames(watch.stacks[r])) for r in watch.stacks})
        return f"{head}; every rank waits in a collective ({', '.join(wait) or 'unknown'}): the network or a peer outside the run"
    parts = []
    for r in named:
        beat = watch.ranks.get(r, {})
        at = where(training_frames(watch.stacks[r])) if r in watch.stacks else "(no stack: its heartbeat stopped)"
        parts.append(f"rank {r} last seen at step {beat.get('step', '?')} in {at} on node {beat.get('node_ip') or '?'}")
    return f"{head}; " + "; ".join(parts)


def stack_text(answer: dict[str, Any]) -> str:
    """Every thread of the rank, outermost frame first, as Python prints a traceback."""
    out = [f"rank {answer.get('rank')} pid {answer.get('pid')} on {answer.get('node_ip')}"]
    for t in answer.get("threads", []):
        out.append(f"\nThread {t['name']} ({t['ident']}):")
        out += [f'  File "{f["file"]}", line {f["line"]}, in {f["name"]}' + (f"\n    {f['code']}" if f.get("code") else "") for f in t["frames"]]
    return "\n".join(out) + "\n"


def write_evidence(doc: dict[str, Any], watch: Watch, run_dir: str) -> str:
    """`<run_dir>/stall/evidence.json` and `rank-<r>.stack.txt` (run_dir may be a URI); returns the evidence's path."""
    from raydlc import storage
    from raydlc.edges.storage import publish

    with tempfile.TemporaryDirectory(prefix="raydlc-stall-") as tmp:
        out = Path(tmp)
        (out / "evidence.json").write_text(json.dumps(doc, indent=1))
        for r, answer in watch.stacks.items():
            (out / f"rank-{r}.stack.txt").write_text(stack_text(answer))
        dest = storage.join(run_dir, "stall")
        publish(out, dest)
    return storage.join(dest, "evidence.json")


def _short(path: str) -> str:
    parts = Path(path).parts
    return "/".join(parts[-3:]) if "site-packages" in parts or len(parts) > 3 else path
