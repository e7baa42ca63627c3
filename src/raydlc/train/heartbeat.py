"""Each rank's heartbeat: a thread beside the training thread that tells the driver where the rank
is, and answers the stall guard's request for stacks and log lines (train.stall).

The loop updates `Heartbeat.step`/`entered`/`phase` (plain attribute writes, no lock: the thread
reads whole values). The thread posts every `every_s` through the session (the driver's
mailbox actor, which answers what the driver asks for); it keeps running while the training
thread waits in a collective or sleeps, since both release the GIL.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any

LOG_TAIL_BYTES = 64 * 1024
NCCL_LINES = 20
TAIL_LINES = 10


class Quiet:
    """Where the rank is, without a thread to post it: the loop's heartbeat while the stall guard is off."""

    def __init__(self) -> None:
        self.step = self.entered = self.completed = 0
        self.phase = "starting"

    def __enter__(self) -> Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Heartbeat:
    def __init__(self, session: Any, *, rank: int, every_s: float, device: Any = None) -> None:
        self.session, self.rank, self.every_s, self.device = session, rank, every_s, device
        self.step = 0  # the last completed step
        self.entered = 0  # the step being run (entered, not yet completed)
        self.completed = 0  # steps completed in this attempt
        self.phase = "starting"
        self.attempt = f"{os.getpid()}-{time.time():.3f}"
        self._stop = threading.Event()
        self._answered: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="raydlc-heartbeat", daemon=True)
        self._node = _node()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def record(self) -> dict[str, Any]:
        return {"beat": True, "rank": self.rank, "step": self.step, "entered": self.entered, "completed": self.completed,
                "phase": self.phase, "attempt": self.attempt, "pid": os.getpid(), "time": time.time(),
                "gpu_mem_mb": _gpu_mem_mb(self.device), **self._node}

    def _run(self) -> None:
        while True:
            try:
                asked = self.session.beat(self.record())
                if asked and asked not in self._answered:
                    self._answered.add(asked)
                    self.session.progress([self.stacks()])
            except Exception:  # the driver may be gone or busy: the next beat tries again
                pass
            if self._stop.wait(self.every_s):
                return

    def stacks(self) -> dict[str, Any]:
        """Every thread's Python stack but this one's, and the process's last log lines."""
        names = {t.ident: t.name for t in threading.enumerate()}
        me = threading.get_ident()
        threads = [
            {"ident": ident, "name": names.get(ident, "?"),
             "frames": [{"file": f.filename, "line": f.lineno, "name": f.name, "code": f.line} for f in traceback.extract_stack(frame)]}
            for ident, frame in sys._current_frames().items() if ident != me
        ]
        lines = _log_lines()
        return {"stacks": True, "rank": self.rank, "pid": os.getpid(), **self._node, "threads": threads,
                "nccl_lines": [ln for ln in lines if "NCCL" in ln][-NCCL_LINES:], "log_tail": lines[-TAIL_LINES:]}


def _node() -> dict[str, Any]:
    try:
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address()}
    except Exception:
        return {"node_id": None, "node_ip": None}


def _gpu_mem_mb(device: Any) -> float | None:
    """Memory the rank's CUDA allocator holds, MiB; None on a CPU."""
    if device is None or getattr(device, "type", None) != "cuda":
        return None
    import torch

    return torch.cuda.memory_reserved(device) / 2**20


def _log_lines() -> list[str]:
    """The last lines this process wrote to stdout and stderr (a Ray worker's are its log files in
    the node's session dir, where NCCL's own lines land)."""
    out: list[str] = []
    for fd in (1, 2):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if not path.startswith("/"):
                continue
            with open(path, "rb") as f:
                start = max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES)
                f.seek(start)
                out += f.read().decode("utf-8", "replace").splitlines()[1 if start else 0:]  # a cut first line is dropped
        except OSError:
            continue
    return out
