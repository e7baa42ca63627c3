"""The experiment trackers raydlc writes to, and the client packages a cluster job installs for them.

TensorBoard's writer (tensorboardX) is in the Ray Train DLC image (tests/doubles/dlc_packages.json); the
MLflow and W&B clients are not, so a job that logs to them brings them in its runtime env, pinned: an
unpinned package would resolve differently on the cluster than where it was tested. `mlflow-skinny` is
MLflow's client without the server and its UI: all a worker needs. Neither pulls torch or ray.
"""

from __future__ import annotations

KINDS = ("tensorboard", "mlflow", "wandb")

# name in TRACKING -> the pinned requirement a cluster job installs (None: the image has it)
PACKAGES: dict[str, str | None] = {
    "tensorboard": None,  # tensorboardx 2.6.5 in the DLC image
    "mlflow": "mlflow-skinny==3.17.2",
    "wandb": "wandb==0.31.0",
}


def chosen(tracking: str) -> tuple[str, ...]:
    """TRACKING as the trackers it names, once each, in order; `none` is none."""
    return tuple(k for k in dict.fromkeys(p.strip() for p in tracking.split(",")) if k in KINDS)


def packages(tracking: str) -> list[str]:
    """The pinned client packages a cluster job needs for TRACKING (none for TensorBoard)."""
    return [p for k in chosen(tracking) if (p := PACKAGES[k]) is not None]
