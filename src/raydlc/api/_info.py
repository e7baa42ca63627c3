"""What raydlc knows about itself: its version next to the image's, and the effective configuration."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydlc.api._config import load

if TYPE_CHECKING:
    from raydlc.config import Config


@dataclass(frozen=True)
class VersionInfo:
    """raydlc, Ray, PyTorch and Python here (`local`), what the DLC image ships (`image`), and where they differ."""

    local: Mapping[str, str | None]
    image: Mapping[str, str]
    mismatch: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"local": dict(self.local), "image": dict(self.image), "mismatch": list(self.mismatch)}


def version() -> VersionInfo:
    """raydlc's version, the local Ray and PyTorch, and what the default DLC image ships.

    A local Ray or PyTorch that differs from the image's (`mismatch`) runs the same program
    differently on a laptop and on the cluster; nothing is imported to find the versions.

    Example:
        import raydlc.api as api

        info = api.version()
        print(info.local["raydlc"], info.image["ray"], info.image["torch"], info.mismatch)
    """
    from importlib import metadata

    from raydlc import __version__
    from raydlc.facts import images

    def installed(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    img = images.IMAGES[images.DEFAULT_IMAGE]
    local = {"raydlc": __version__, "ray": installed("ray"), "torch": installed("torch"), "python": sys.version.split()[0]}
    image = {"image": img.image, "ray": img.ray, "torch": img.torch, "cuda": img.cuda, "nccl": img.nccl}
    mismatch = tuple(k for k in ("ray", "torch") if local[k] and str(local[k]).split("+")[0] != image[k])
    return VersionInfo(local, image, mismatch)


@dataclass(frozen=True)
class EffectiveConfig:
    """The configuration a command would run with, and where each value came from."""

    config: Config

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every field: env.sh name, variable, path, value, source (default/file/env/flag) and exact origin."""
        return self.config.rows()

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.as_dict(), "fields": self.config.rows()}


def config_show(*, config: str | os.PathLike[str] | None = None, settings: Mapping[str, Any] | None = None) -> EffectiveConfig:
    """The effective configuration (default < file < RAYDLC_* env < `settings`), validated, with each value's origin.

    Example:
        import raydlc.api as api

        shown = api.config_show(settings={"GPU_NODE_COUNT": 4})
        row = next(r for r in shown.rows if r["name"] == "GPU_NODE_COUNT")
        print(row["value"], row["source"], shown.to_dict()["config"]["gpu_nodes"]["count"])
    """
    return EffectiveConfig(load(config, settings))
