"""The `raydlc` command line: parse, call `raydlc.api`, print. Nothing heavy at import time.

One typer app (`cli/app.py`: the root, its global flags, `config`, `version`, `main`); each command
family registers its commands on it when imported here: `cli/cluster.py` (capacity, render, up,
status, down), `cli/jobs.py` (submit, verify, bench-transport, preflight, nccl, job …) and
`cli/train.py` (plan, train, data …) and `cli/evaluate.py` (generate, eval).
"""

from raydlc.cli import cluster, jobs, train  # noqa: F401, I001  (each registers its commands on `app`, in this order)
from raydlc.cli import evaluate  # noqa: F401  (generate, eval: after train)
from raydlc.cli.app import app, main, run

__all__ = ["app", "main", "run"]
