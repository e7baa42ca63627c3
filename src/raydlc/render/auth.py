"""Ray token auth on the RayCluster: the names that the manifest, `up` and every client of the head agree on.

KubeRay v1.7.0 (`ray-operator/apis/ray/v1/raycluster_types.go` AuthOptions; `controllers/ray/common/pod.go`
`SetContainerTokenAuthEnvVars`) turns `spec.authOptions: {mode: token, secretName: S}` into two variables in
every Ray container (and the `wait-gcs-ready` init container): `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN` from
the Secret S's key `auth_token` (`utils.RAY_AUTH_TOKEN_SECRET_KEY`). With `secretName` set the operator makes
no Secret of its own (`raycluster_controller.go` `reconcileAuthSecret`): raydlc's `up` creates it. The value is
read when a container starts, so a running pod keeps the token it started with. KubeRay's validation
(`utils/validation.go`) refuses token auth below Ray 2.52.0.

Ray 2.58's dashboard (`python/ray/_private/authentication/http_token_authentication.py`) accepts the token as
`Authorization: Bearer <token>` and answers 401 without one and 403 with a wrong one.
"""

from __future__ import annotations

from typing import Any

from raydlc.config import Config
from raydlc.errors import ConfigError

SECRET_KEY = "auth_token"  # the key KubeRay reads the token from (utils.RAY_AUTH_TOKEN_SECRET_KEY)
MIN_RAY = (2, 52, 0)  # KubeRay v1.7.0 validation.go: token auth needs Ray 2.52.0 or later
TOKEN_BYTES = 32  # 256 bits of randomness


def secret_name(cfg: Config) -> str:
    """One Secret per RayCluster, in its namespace, named after it."""
    return f"{cfg.ray.cluster_name}-ray-token"


def auth_options(cfg: Config) -> dict[str, Any]:
    """`spec.authOptions` of the RayCluster; refused for a Ray that KubeRay would refuse it for."""
    version = tuple(int(p) for p in cfg.images.ray_version.split(".")[:3] if p.isdigit())
    if version < MIN_RAY:
        raise ConfigError([f"RAY_VERSION ({cfg.origin('RAY_VERSION')}): {cfg.images.ray_version} has no token auth; "
                           "KubeRay v1.7.0 needs Ray 2.52.0 or later for authOptions.mode token"])
    return {"mode": "token", "secretName": secret_name(cfg)}
