"""`raydlc tb RUN`: the one command that opens a run's TensorBoard events (train.tracking writes them)."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TensorBoardRun:
    """Where a run's TensorBoard events are and the command that opens them; `to_dict()` is `raydlc tb --json`."""

    run: str
    logdir: str
    command: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tb(run: str, *, out: str | None = None) -> TensorBoardRun:
    """The `tensorboard --logdir …` of a run: RUN a run directory, or a run name under `out` (default raydlc-out).
    A local `--resume` into a new run directory writes into the run where tracking began (its run.json says which).

    Example:
        >>> import raydlc.api as api
        >>> api.tb("run-1", out="s3://bucket/runs").command
        'tensorboard --logdir s3://bucket/runs/run-1/tb'
    """
    from raydlc import storage
    from raydlc.errors import InputError
    from raydlc.train.prepare import DEFAULT_OUT

    if not isinstance(run, str) or not run:
        raise InputError("RUN is empty: give a run directory, or a run name under --out", hint="raydlc tb run-<UTC time>")

    run_dir = run if (storage.is_uri(run) or os.path.isdir(run)) and out is None else storage.join(storage.resolve(out or DEFAULT_OUT), run)
    if not storage.is_uri(run_dir):
        run_dir = os.path.abspath(run_dir)
    if not storage.is_uri(run_dir) and not os.path.isdir(run_dir):  # a typo would print a command that opens nothing
        raise InputError(f"{run}: no such run ({run_dir} does not exist)", hint="raydlc tb RUN takes a run directory, or a run name under --out")
    began = run_dir
    try:  # a local run's settings; an s3:// run is named by the directory given (no network for a command line)
        if not storage.is_uri(run_dir):
            began = json.loads(Path(run_dir, "run.json").read_text()).get("tracking_dir") or run_dir
    except (OSError, ValueError):
        pass  # a run still going, or one from before tracking: its own directory
    logdir = storage.join(began, "tb")
    return TensorBoardRun(run, logdir, f"tensorboard --logdir {shlex.quote(logdir)}")
