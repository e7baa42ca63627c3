"""Ray token auth in the rendered RayCluster (raydlc.render.auth): the field KubeRay v1.7.0 reads, valid against
the packaged schema, naming the Secret `up` creates; a Ray too old for token auth is refused as KubeRay would."""

from __future__ import annotations

from pathlib import Path

import pytest

from raydlc import schemas
from raydlc.config import load_config
from raydlc.edges import ray_dashboard
from raydlc.errors import ConfigError
from raydlc.render.raycluster import render_raycluster


def test_the_raycluster_names_the_token_secret_and_passes_its_schema(tmp_path: Path) -> None:
    cfg = load_config(env={}, overrides={"STORAGE_PATH": "s3://raydlc-runs/team"}, cwd=tmp_path)
    rc = render_raycluster(cfg)
    assert rc["spec"]["authOptions"] == {"mode": "token", "secretName": f"{cfg.ray.cluster_name}-ray-token"}
    assert schemas.problems(rc) == []
    broken = {**rc, "spec": {**rc["spec"], "authOptions": {"mode": "bearer"}}}  # the schema does check the field
    assert any(p.startswith("spec.authOptions.mode") for p in schemas.problems(broken))


def test_a_ray_without_token_auth_is_refused(tmp_path: Path) -> None:
    cfg = load_config(env={}, overrides={"STORAGE_PATH": "s3://raydlc-runs/team", "RAY_VERSION": "2.51.1",
                                         "FORCE_RAY_VERSION": True}, cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"RAY_VERSION .*2\.51\.1 has no token auth"):
        render_raycluster(cfg)


def test_the_header_is_the_one_rays_clients_send() -> None:
    assert ray_dashboard.headers("abc") == {"Authorization": "Bearer abc"}
    assert ray_dashboard.headers(None) == {} and ray_dashboard.headers("") == {}
