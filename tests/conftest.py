"""Shared fixtures. Local servers (moto, kmock) live here; nothing outside the repo is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import setuptools  # noqa: F401  (before anything imports the stdlib distutils: inductor's C++ build asserts setuptools' copy)

REPO = Path(__file__).resolve().parents[1]

@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No RAYDLC_* variables and an empty working directory, so defaults are really defaults."""
    for k in list(os.environ):
        if k.startswith("RAYDLC_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def _ray_session():
    """Ends the in-process Ray at the end of the session, whoever started it last."""
    import ray

    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(_ray_session):
    """An in-process local Ray for the tests that run Ray Train: the running one, else a new one.

    Module-scoped so that a module whose own Ray ended (test_data_ray starts one with the AWS
    environment its workers must inherit, and ends it) leaves the next module a working Ray.
    """
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # never a `ray start` head found in /tmp/ray
    return ray


def _api_example(fn: object) -> str:
    """Run the `Example:` block that ends a raydlc.api function's docstring, as a user would paste it; what it printed."""
    import contextlib
    import inspect
    import io
    import textwrap

    doc = inspect.getdoc(fn) or ""
    head = "\nExample:\n"
    assert head in doc, f"{fn}: no Example: block"
    code = textwrap.dedent(doc[doc.index(head) + len(head):])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"<{getattr(fn, '__name__', fn)} example>", "exec"), {})
    return out.getvalue()


@pytest.fixture
def api_example():
    """`api_example(fn)` runs fn's docstring example and returns its output."""
    return _api_example
