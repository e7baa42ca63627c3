"""docs/api.md is what scripts/api_doc.py renders from raydlc.api, and every example in it runs.

Each example runs in its own subprocess, in a sandbox: a temporary HOME and working directory,
no RAYDLC_* variable, a moto server on 127.0.0.1 as AWS (AWS_ENDPOINT_URL, fake credentials, a
region), kmock with the emulated KubeRay operator as the Kubernetes API, and the eksctl, helm and
kubectl doubles first on PATH (installed as tests/lifecycle installs them). The generator and the
sandbox are also tested on a small API-shaped package written by the test, so both are held to
account while raydlc.api exports nothing yet.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DOUBLES = REPO / "tests" / "doubles"
sys.path.insert(0, str(DOUBLES))
sys.path.insert(0, str(REPO / "scripts"))

import servers  # noqa: E402

import api_doc  # noqa: E402
import docgen  # noqa: E402

REGION = "us-east-2"
FAST_TIMEOUT_S = 300
SLOW_TIMEOUT_S = 800


def _api_examples() -> list[Any]:
    import raydlc.api

    try:
        return api_doc.examples(raydlc.api)
    except api_doc.MissingExample:  # test_api_md_is_the_generated_page fails with the name
        return []


# Examples another test already runs as written, in-process, asserting what they print or return
# (the job examples share one local head there, in order): the sandbox runs the others, so no
# example is run twice and none is run nowhere (test_every_example_runs_somewhere).
TESTS = Path(__file__).parent
RUN_ELSEWHERE: dict[str, Path] = {
    **dict.fromkeys(("job_list", "job_status", "job_logs", "job_stop", "verify", "bench_transport", "submit", "down_local"), TESTS / "jobs" / "test_api_jobs.py"),
    **dict.fromkeys(("version", "config_show", "nccl", "render", "preflight"), TESTS / "test_api_read_commands.py"),
    **dict.fromkeys(("plan", "scan", "train"), TESTS / "test_api_train_plan.py"),
    "capacity": TESTS / "aws" / "test_api_capacity.py",
    **dict.fromkeys(("generate", "evaluate"), TESTS / "test_evaluate_e2e.py"),
}

FIXTURE = "<fixture>"
CASES = [FIXTURE, *(pytest.param(e.name, marks=pytest.mark.slow) if e.slow else e.name
                    for e in _api_examples() if e.name not in RUN_ELSEWHERE)]


# ---------------------------------------------------------------------- a package shaped like raydlc.api

FIXTURE_INIT = '''\
"""A package shaped like raydlc.api, for the generator's tests.

    import apifixture
    apifixture.sandbox_facts()

Conventions: one function per use case.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "sandbox_facts": "apifixture._facts",
    "Facts": "apifixture._facts",
    "broken": "apifixture._facts",
    "slow_thing": "apifixture._facts",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)
'''

FIXTURE_FACTS = '''\
"""What an example sees of the sandbox it runs in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Facts:
    """HOME, the working directory, the RAYDLC_* variables, the eksctl on PATH, AWS's zones, Kubernetes' answer."""

    home: str
    cwd: str
    raydlc_vars: list[str]
    eksctl: str | None
    eksctl_version: str
    zones: list[str]
    kube_nodes_status: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def sandbox_facts(*, region: str = "us-east-2", write: str | None = "facts.json") -> Facts:
    """Read the sandbox from inside: where the example runs and which AWS and tools it reaches.

    The facts go to `write` in the working directory, for the test to check.

    Example:
        import apifixture

        facts = apifixture.sandbox_facts(region="us-east-2")
        assert facts.zones, facts
        print(facts.to_dict())
    """
    import boto3

    zones = [z["ZoneName"] for z in boto3.client("ec2", region_name=region).describe_availability_zones()["AvailabilityZones"]]
    eksctl = shutil.which("eksctl")
    version = subprocess.run([eksctl, "version"], capture_output=True, text=True).stdout.strip() if eksctl else ""
    with urllib.request.urlopen(os.environ["DOUBLES_KUBE_URL"] + "/api/v1/nodes", timeout=10) as r:
        status = r.status
    facts = Facts(str(Path.home()), os.getcwd(), sorted(k for k in os.environ if k.startswith("RAYDLC_")), eksctl, version, zones, status)
    if write:
        Path(write).write_text(json.dumps(facts.to_dict()))
    return facts


def broken(reason: str = "as documented") -> None:
    """Fails on purpose, so the runner's failure path is tested.

    Example:
        import apifixture

        apifixture.broken("from its example")
    """
    raise RuntimeError(f"broken {reason}")


def slow_thing(n: int, /, *args: int, scale: float = 1.5, **extra: str) -> list[int]:
    """Every kind of parameter, and an example marked slow.

    Example:
        >>> # slow: a marker line, so this example runs as a slow test
        >>> import apifixture
        >>> apifixture.slow_thing(1)
    """
    return [n, *args]
'''


def write_fixture(root: Path, facts: str = FIXTURE_FACTS) -> ModuleType:
    pkg = root / "apifixture"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FIXTURE_INIT)
    (pkg / "_facts.py").write_text(facts)
    sys.path.insert(0, str(root))
    for name in [n for n in sys.modules if n == "apifixture" or n.startswith("apifixture.")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    return importlib.import_module("apifixture")


@pytest.fixture
def fixture_api(tmp_path: Path) -> Iterator[ModuleType]:
    root = tmp_path / "mods"
    mod = write_fixture(root)
    try:
        yield mod
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == "apifixture" or n.startswith("apifixture.")]:
            del sys.modules[name]


# ---------------------------------------------------------------------- the sandbox


@dataclass
class Sandbox:
    root: Path
    home: Path
    cwd: Path
    bin: Path
    env: dict[str, str]

    def run(self, example: Any, timeout: float) -> subprocess.CompletedProcess[str]:
        """One example as a program of its own: the prelude, then its code, from the sandbox's cwd."""
        program = self.root / "examples" / f"{example.name}.py"
        program.parent.mkdir(exist_ok=True)
        program.write_text(api_doc.PRELUDE + example.code)
        return subprocess.run([sys.executable, str(program)], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with servers.moto_server() as url:
        yield url


@contextlib.contextmanager
def sandbox(root: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch, pythonpath: Path | None = None) -> Iterator[Sandbox]:
    from kuberay import Operator

    servers.reset_moto(moto_url, warm_regions=(REGION,))
    home, cwd, bin_dir = root / "home", root / "work", root / "bin"
    for d in (home, cwd, bin_dir):
        d.mkdir(parents=True)
    servers.install_doubles(bin_dir, sys.executable)
    (root / "scenario.json").write_text("{}")
    dropped = ("RAYDLC_", "AWS_", "DOUBLES_", "KUBECONFIG", "HF_", "RAY_ADDRESS", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    with servers.kube_server(monkeypatch.setattr) as kube, Operator(kube.url) as operator:
        env.update({
            "HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "AWS_ENDPOINT_URL": moto_url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION, "AWS_CONFIG_FILE": str(root / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(root / "no-aws-credentials"), "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_MAX_ATTEMPTS": "1", "HF_HUB_OFFLINE": "1",  # no KUBECONFIG: status would read it (HOME is the box)
            "DOUBLES_LOG": str(root / "calls.jsonl"), "DOUBLES_SCENARIO": str(root / "scenario.json"), "DOUBLES_KUBE_URL": kube.url,
            **({"PYTHONPATH": str(pythonpath)} if pythonpath else {}),
        })
        yield Sandbox(root, home, cwd, bin_dir, env)
    assert not operator.errors, operator.errors[:3]


# ---------------------------------------------------------------------- docs/api.md


def test_api_md_is_the_generated_page() -> None:
    import raydlc.api

    page = (REPO / "docs" / "api.md").read_text()
    assert page == api_doc.render(raydlc.api), "docs/api.md is stale: run `python scripts/api_doc.py --write`"
    assert page.startswith("# Python API: `raydlc.api`\n")
    assert "import raydlc.api as api" in page  # the module docstring's own example, as code
    for name in raydlc.api._EXPORTS:
        assert f"## `{name}`" in page, name


def test_every_export_of_raydlc_api_is_a_documented_function_or_type() -> None:
    """A function must carry an example; each one is a case of test_example_runs below, or run by the test RUN_ELSEWHERE names."""
    import inspect

    import raydlc.api

    names = {e.name for e in api_doc.examples(raydlc.api)}
    for name, obj in api_doc.exported(raydlc.api):
        assert inspect.isfunction(obj) or inspect.isclass(obj), f"{name}: export functions and result types"
        assert not inspect.isfunction(obj) or name in names, name
    cases = [FIXTURE, *(e.name for e in api_doc.examples(raydlc.api) if e.name not in RUN_ELSEWHERE)]
    assert [c if isinstance(c, str) else c.values[0] for c in CASES] == cases


# ---------------------------------------------------------------------- the generator, on the fixture package


def test_generator_renders_signature_docstring_and_example(fixture_api: ModuleType) -> None:
    page = api_doc.render(fixture_api)
    assert page.startswith("# Python API: `apifixture`\n")
    assert "```python\nimport apifixture\napifixture.sandbox_facts()\n```" in page  # the module docstring's indented code
    assert page.index("## `sandbox_facts`") < page.index("## `Facts`") < page.index("## `broken`") < page.index("## `slow_thing`")
    assert "sandbox_facts(*, region: str = 'us-east-2', write: str | None = 'facts.json') -> Facts" in page
    assert "class Facts(\n    home: str,\n    cwd: str,\n    raydlc_vars: list[str],\n" in page  # too long for one line
    assert "slow_thing(n: int, /, *args: int, scale: float = 1.5, **extra: str) -> list[int]" in page
    assert "The facts go to `write` in the working directory, for the test to check." in page
    assert "RAYDLC_* variables" in page and "Example:\n\n```python\nimport apifixture\n\nfacts = apifixture.sandbox_facts(" in page
    assert "- [`broken`](#broken): Fails on purpose, so the runner's failure path is tested." in page
    assert ">>>" not in page and "# slow: a marker line, so this example runs as a slow test\nimport apifixture\n" in page
    examples = {e.name: e for e in api_doc.examples(fixture_api)}
    assert set(examples) == {"sandbox_facts", "broken", "slow_thing"}  # a class needs no example
    assert [examples[n].slow for n in ("sandbox_facts", "broken", "slow_thing")] == [False, False, True]
    assert examples["sandbox_facts"].code.startswith("import apifixture\n\nfacts = ")


def test_a_function_without_an_example_is_refused(tmp_path: Path) -> None:
    facts = FIXTURE_FACTS.replace('''    Example:
        import apifixture

        apifixture.broken("from its example")
''', "")
    mod = write_fixture(tmp_path / "mods", facts)
    try:
        with pytest.raises(api_doc.MissingExample, match=r"apifixture\.broken: its docstring has no `Example:`"):
            api_doc.render(mod)
    finally:
        sys.path.remove(str(tmp_path / "mods"))


def test_escaping_keeps_code_spans_and_drops_no_text() -> None:
    assert api_doc.escape("a <b> `c <d>` e") == "a &lt;b> `c <d>` e"
    assert docgen.cell("x | `y|z`\n w") == "x \\| `y\\|z` w"


def test_module_without_exports_still_gets_a_page(tmp_path: Path) -> None:
    empty = ModuleType("emptyapi", "An API with nothing in it yet.")
    page = api_doc.render(empty)
    assert page.splitlines()[0] == "# Python API: `emptyapi`" and "An API with nothing in it yet." in page
    assert page.rstrip().endswith("No use case is exported yet.")


# ---------------------------------------------------------------------- every example runs


def test_the_runner_reports_a_failing_example(fixture_api: ModuleType, tmp_path: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = next(e for e in api_doc.examples(fixture_api) if e.name == "broken")
    with sandbox(tmp_path / "box", moto_url, monkeypatch, pythonpath=tmp_path / "mods") as box:
        r = box.run(broken, FAST_TIMEOUT_S)
    assert r.returncode == 1 and "RuntimeError: broken from its example" in r.stderr


def test_every_example_runs_somewhere() -> None:
    """Each example left out of the sandbox is named by the test file that runs it."""
    names = {e.name for e in _api_examples()}
    assert set(RUN_ELSEWHERE) <= names, set(RUN_ELSEWHERE) - names
    for name, where in RUN_ELSEWHERE.items():
        text = where.read_text()
        assert f"api.{name}" in text or f'"{name}"' in text, f"{where.name} does not run the {name} example"
    assert names - set(RUN_ELSEWHERE) <= {c if isinstance(c, str) else c.values[0] for c in CASES}


@pytest.mark.parametrize("name", CASES)
def test_example_runs(name: str, tmp_path: Path, moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """raydlc.api's examples, one case each, plus the fixture package's, which checks the sandbox itself."""
    monkeypatch.setenv("RAYDLC_STEPS", "7")  # the sandbox must not let this through
    if name == FIXTURE:
        mod = write_fixture(tmp_path / "mods")
        try:
            example = next(e for e in api_doc.examples(mod) if e.name == "sandbox_facts")
        finally:
            sys.path.remove(str(tmp_path / "mods"))
        pythonpath: Path | None = tmp_path / "mods"
    else:
        import raydlc.api

        example = next(e for e in api_doc.examples(raydlc.api) if e.name == name)
        pythonpath = None
    with sandbox(tmp_path / "box", moto_url, monkeypatch, pythonpath=pythonpath) as box:
        r = box.run(example, SLOW_TIMEOUT_S if example.slow else FAST_TIMEOUT_S)
        assert r.returncode == 0, f"the example of {name} failed:\n{textwrap.indent(example.code, '    ')}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        if name == FIXTURE:
            facts = json.loads((box.cwd / "facts.json").read_text())
            assert facts["home"] == str(box.home) and facts["cwd"] == str(box.cwd)
            assert facts["raydlc_vars"] == []
            assert facts["eksctl"] == str(box.bin / "eksctl") and "0.230.0" in facts["eksctl_version"]
            assert facts["zones"] and all(z.startswith(REGION) for z in facts["zones"])
            assert facts["kube_nodes_status"] == 200
            assert "'zones': [" in r.stdout
