"""raydlc.api's job use cases against a real local head: each docstring's Example runs as written, in the
order a person would try them, and each result's to_dict() is what the command's --json prints.

The module has a HOME and working directory of its own; the first use case starts raydlc's local head
there (as `submit --local` does) and the `submit` example's `down_local()` ends it.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raydlc.api as api
from raydlc.api import _jobs
from raydlc.edges.ray_dashboard import Dashboard
from raydlc.jobs import targets

pytestmark = pytest.mark.slow

RAYDLC = Path(sys.executable).with_name("raydlc")
# The order of a first session: a job of one's own, then looking at it, then the gate, then cleaning up.
ORDER = ("job_list", "job_status", "job_logs", "job_stop", "verify", "bench_transport", "submit", "down_local")
GREETER = """import time
import ray

ray.init(address="auto")

@ray.remote(num_cpus=0)
class Greeter:
    def hello(self):
        return "hi"

g = Greeter.remote()
print(ray.get(g.hello.remote()), flush=True)
time.sleep(600)
"""


def example(fn: Any) -> str:
    """The indented block after `Example:` in a docstring, dedented: the code docs/api.md shows."""
    doc = inspect.getdoc(fn) or ""
    _, found, rest = doc.partition("\nExample:\n")
    assert found, f"{fn.__name__} has no Example: block"
    lines = []
    for line in rest.splitlines():
        if line.strip() and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines)).strip() + "\n"


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home, work = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        for k in [k for k in os.environ if k.startswith("RAYDLC_") or k == "RAY_ADDRESS"]:
            mp.delenv(k)
        mp.chdir(work)
        try:
            yield work
        finally:
            if targets.running_head() is not None:  # a test failed before the examples' down_local()
                targets.stop_local_head()


def cli_json(*args: str) -> dict[str, Any]:
    p = subprocess.run([str(RAYDLC), *args, "--json"], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert p.returncode == 0, p.stderr[-2000:]
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def test_every_job_use_case_is_exported_and_has_an_example() -> None:
    assert set(ORDER) <= set(api.__all__)
    for name in ORDER:
        assert getattr(api, name) is getattr(_jobs, name)
        compile(example(getattr(api, name)), name, "exec")


def test_results_are_what_the_commands_print_as_json(place: Path) -> None:
    (place / "hi").mkdir()
    (place / "hi" / "hi.py").write_text("print('hi there')\n")
    notices: list[str] = []
    done = api.submit("hi/hi.py", local=True, name="api-hi", notice=notices.append)
    assert done.ok and not done.attached and "summary" not in done.to_dict()
    assert notices[0].startswith(f"working dir {place / 'hi'}: 1 files") and notices[1:] == [targets.STARTING, "submitted job api-hi on the local target"]
    assert api.job_status("api-hi", local=True).to_dict() == cli_json("job", "status", "api-hi", "--local")
    assert api.job_list(local=True).to_dict() == cli_json("job", "list", "--local")
    assert api.job_logs("api-hi", local=True).to_dict() == cli_json("job", "logs", "api-hi", "--local")
    assert api.verify(job="api-hi", local=True).to_dict() == cli_json("verify", "--local", "--job", "api-hi")
    assert api.bench_transport(local=True, steps=3).to_dict() == cli_json("bench-transport", "--local", "--steps", "3")
    assert api.down_local(dry_run=True).to_dict() == cli_json("down", "--local", "--dry-run")


def test_the_actor_api_finds_a_jobs_actor_by_class_with_its_process_and_node(place: Path) -> None:
    (place / "greeter").mkdir()
    (place / "greeter" / "greeter.py").write_text(GREETER)
    started = api.submit("greeter/greeter.py", local=True, no_wait=True)
    rec = targets.running_head()
    assert rec is not None
    dash = Dashboard(rec.dashboard_url)
    deadline = time.monotonic() + 180
    while "hi" not in dash.logs(started.job.submission_id):
        assert time.monotonic() < deadline and not dash.job(started.job.submission_id).terminal, dash.logs(started.job.submission_id)  # type: ignore[union-attr]
        time.sleep(1)
    job = dash.job(started.job.submission_id)
    assert job is not None and job.job_id
    (actor,) = dash.actors(job_id=job.job_id, class_name="Greeter")
    assert actor.state == "ALIVE" and actor.job_id == job.job_id and actor.pid and actor.pid > 0
    assert actor.node_id in {n.node_id for n in dash.nodes()}
    assert dash.actors(job_id=job.job_id, class_name="NoSuchClass") == []
    assert api.job_stop(started.job.submission_id, local=True).job.status == "STOPPED"


@pytest.mark.parametrize("name", ORDER)
def test_the_example_runs_as_written(name: str, place: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(example(getattr(api, name)), f"<example of raydlc.api.{name}>", "exec"), {})
    assert capsys.readouterr().out.strip()  # every example prints what it found
    if name == "submit":
        assert targets.running_head() is None  # its down_local() ended the head
