"""raydlc.api: a light import, and every exported name resolves to what its module defines."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_import_api_loads_no_heavy_library() -> None:
    code = "import sys, raydlc.api; print(sorted(m for m in ('torch','ray','transformers','kubernetes','boto3') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_every_export_resolves() -> None:
    import raydlc.api as api

    for name in api.__all__:
        assert getattr(api, name) is not None, name
    with pytest.raises(AttributeError):
        api.no_such_use_case  # noqa: B018


def test_load_layers_settings_under_named_arguments(clean_env) -> None:
    from raydlc.api._config import load

    cfg = load(settings={"RAYDLC_GPU_NODE_COUNT": 3, "steps": 7}, STEPS=9, SEQ_LEN=None)
    assert cfg.gpu_nodes.count == 3
    assert cfg.train.steps == 9
    assert cfg.source("STEPS") == "flag"
    assert cfg.source("SEQ_LEN") == "default"
