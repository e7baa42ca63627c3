#!/usr/bin/env python
"""The sample `raydlc status` in docs/lifecycle.md, produced for real: `up` on the default config, then `status`.

Nothing reaches AWS or a cluster: the world is the one tests/lifecycle runs against — a moto
server on 127.0.0.1, kmock as the Kubernetes API with the emulated KubeRay operator, and the
eksctl/helm/kubectl doubles of tests/doubles/ first on PATH. The output is `raydlc status` as a
120-column terminal shows it (the doubles name the nodes as EC2 would).

    python scripts/sample_status.py           # print it
    python scripts/sample_status.py --write   # put it into docs/lifecycle.md, between its markers
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "doubles"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
WIDTH = 120
PAGE = REPO / "docs" / "lifecycle.md"
BLOCK = "status-sample"


def sample() -> str:
    """`raydlc status` of a cluster `up` made against the doubles, as a 120-column terminal shows it."""
    import servers
    from kuberay import Operator

    with tempfile.TemporaryDirectory(prefix="raydlc-sample-") as d:
        tmp = Path(d)
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        servers.install_doubles(bin_dir, sys.executable)
        (tmp / "scenario.json").write_text("{}")
        for k in [k for k in os.environ if k.startswith(("RAYDLC_", "AWS_", "KUBECONFIG", "DOUBLES_"))]:
            del os.environ[k]
        with servers.moto_server() as moto, servers.kube_server(setattr) as kube, Operator(kube.url):
            os.environ.update(
                AWS_ENDPOINT_URL=moto, AWS_ACCESS_KEY_ID="sample", AWS_SECRET_ACCESS_KEY="sample", AWS_EC2_METADATA_DISABLED="true",
                AWS_MAX_ATTEMPTS="1", AWS_CONFIG_FILE=str(tmp / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp / "none"),
                PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", HOME=str(tmp / "home"),
                DOUBLES_SCENARIO=str(tmp / "scenario.json"), DOUBLES_KUBE_URL=kube.url, DOUBLES_LOG=str(tmp / "calls.jsonl"),
            )
            servers.reset_moto(moto, warm_regions=("us-east-2",))  # moto builds its EC2 backend on the first request: not part of `up`
            with _eks_state_answered(tmp / "scenario.json"):
                return _status_after_up()


@contextlib.contextmanager
def _eks_state_answered(scenario: Path) -> Iterator[None]:
    """The EKS calls moto lacks (add-ons, pod identity associations) answered from the eksctl double's state, as in tests/lifecycle."""
    import awsstub
    import eks_state

    import raydlc.edges.aws as edge

    make = edge.client
    edge.client = awsstub.hooked(make, eks_state.handlers(eks_state.path_for(scenario)))  # type: ignore[assignment]
    try:
        yield
    finally:
        edge.client = make  # type: ignore[assignment]


def _status_after_up() -> str:
    from raydlc import lifecycle
    from raydlc.cli import main as cli
    from raydlc.config import load_config
    from raydlc.lifecycle import Timings
    from raydlc.views import output

    quick = Timings(poll_s=0.1, cluster_s=60, nodegroup_s=60, stack_s=60, helm_s=60, nodes_s=60, plugins_s=60, pods_s=60)
    run = lifecycle.up(load_config(env={}), timings=quick)
    if not run.ok:
        raise SystemExit("up failed: " + "; ".join(f"{r.step}: {r.reason}" for r in run.failed))
    out = io.StringIO()
    output.console.file = out
    output.console.width = WIDTH
    with contextlib.redirect_stdout(out):
        code = cli(["status"])
    if code != 0:
        raise SystemExit(f"raydlc status exited {code}")
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


if __name__ == "__main__":
    text = sample()
    if sys.argv[1:] == ["--write"]:
        from docgen import write_block

        changed = write_block(PAGE, BLOCK, "scripts/sample_status.py", f"```\n{text}```")
        print(f"{PAGE.relative_to(REPO)}: {'updated' if changed else 'unchanged'}")
    else:
        sys.stdout.write(text)
