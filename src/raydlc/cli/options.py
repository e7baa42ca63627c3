"""The options several commands share, declared once: `--json`, and the three that choose a job's target.

A command names one as its parameter's default (`json_: bool = JSON`); typer copies it per command.
The target options mean the same wherever they appear (`raydlc.jobs.targets`): raydlc's local head,
a dashboard address, or the cluster through its kubeconfig.
"""

from __future__ import annotations

import typer

JSON = typer.Option(False, "--json", help="Print JSON.")
LOCAL = typer.Option(False, "--local", help="raydlc's local Ray head on this machine (`submit --local` starts it; `down --local` ends it).")
ADDRESS = typer.Option(None, "--address", help="A Ray dashboard you already reach, e.g. http://127.0.0.1:8265.")
KUBECONFIG = typer.Option(None, "--kubeconfig", help="The cluster's kubeconfig, for the cluster target [RAYDLC_KUBECONFIG, else KUBECONFIG].")
