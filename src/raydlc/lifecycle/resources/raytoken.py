"""The Ray token Secret the RayCluster's `authOptions.secretName` names (raydlc.render.auth), part of the raycluster step.

`up` creates it once with 256 random bits, before the RayCluster that reads it, and never changes it: a
second `up` keeps the token the pods started with. Its value is never shown: not in a plan, a line, a
rendered file or an error. Since KubeRay puts the token into each Ray container's environment when the
container starts (`secretKeyRef`, v1.7.0 common/pod.go), a Secret deleted by hand leaves the running pods
on the old token and new pods failing to start; a new Secret reaches the head only through new pods.
"""

from __future__ import annotations

import base64
import secrets
from typing import TYPE_CHECKING, Any

from raydlc.edges import kube as k8s
from raydlc.render import auth, ownership
from raydlc.render.eksctl import OWNER_TAG

if TYPE_CHECKING:
    from raydlc.lifecycle.context import Context

MANAGED_BY = {"app.kubernetes.io/managed-by": "raydlc"}


def exists(kube: k8s.Kube, ctx: Context) -> bool:
    return kube.get("v1", "Secret", auth.secret_name(ctx.cfg), ctx.cfg.cluster.namespace) is not None


def _secret(ctx: Context) -> dict[str, Any]:
    cfg = ctx.cfg
    token = secrets.token_urlsafe(auth.TOKEN_BYTES)
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": auth.secret_name(cfg), "namespace": cfg.cluster.namespace,
                     "labels": {**MANAGED_BY, OWNER_TAG: cfg.cluster.name, "ray.io/cluster": cfg.ray.cluster_name,
                                **ownership.labels(cfg)}},
        "data": {auth.SECRET_KEY: base64.b64encode(token.encode()).decode()},
    }


def ensure(kube: k8s.Kube, ctx: Context) -> bool:
    """Create the Secret when it does not exist (never replace one); whether it was created."""
    if exists(kube, ctx):
        return False
    kube.create(_secret(ctx))
    return True
