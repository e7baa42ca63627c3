#!/usr/bin/env python
"""The Ray Train DLC image's Python package set, derived from its published uv lock file.

aws/deep-learning-containers builds the image's venv with `uv sync --frozen` from
docker/ray-train/uv.lock (docker/ray-train/Dockerfile.cuda), so the lock's packages are what the
image's Python has (plus Transformer Engine and flash-attn, built on top). This keeps the
structural fact only: package name -> version, and where it came from. tests/doubles/dlc_env.py
runs cluster-side code against it.

    python scripts/dlc_packages.py GIT_DIR [COMMIT]   # GIT_DIR: a clone of aws/deep-learning-containers
    python scripts/dlc_packages.py --lock uv.lock --commit SHA
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "tests" / "doubles" / "dlc_packages.json"
LOCK = "docker/ray-train/uv.lock"
# Built on top of the locked venv by the Dockerfile (pip install after `uv sync`), not in the lock.
BUILT_ON_TOP = {"transformer-engine": "2.13.0", "flash-attn": "2.8.3"}


def normalized(name: str) -> str:
    """PEP 503: lower case, runs of `-_.` as one `-`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def packages(lock_text: str) -> dict[str, str]:
    """name -> version of every package the lock installs, the lock's own project left out."""
    lock = tomllib.loads(lock_text)
    out = {}
    for p in lock["package"]:
        if p.get("source", {}).get("virtual") or p.get("source", {}).get("editable"):
            continue  # the project itself (dlc-ray-train), installed with --no-install-project
        out[normalized(p["name"])] = str(p["version"]).split("+")[0]
    return dict(sorted(out.items()))


def facts(lock_text: str, commit: str) -> dict[str, Any]:
    lock = tomllib.loads(lock_text)
    found = packages(lock_text)
    return {
        "source": {"repo": "aws/deep-learning-containers", "path": LOCK, "commit": commit},
        "requires_python": lock.get("requires-python"),
        "ray": found.get("ray"),
        "packages": found,
        "built_on_top": BUILT_ON_TOP,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("git_dir", nargs="?")
    ap.add_argument("commit", nargs="?", default="HEAD")
    ap.add_argument("--lock", help="a uv.lock file instead of a git dir")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    if args.lock:
        text, commit = Path(args.lock).read_text(), args.commit
    elif args.git_dir:
        commit = subprocess.run(["git", "-C", args.git_dir, "rev-parse", args.commit], capture_output=True, text=True, check=True).stdout.strip()
        text = subprocess.run(["git", "-C", args.git_dir, "show", f"{commit}:{LOCK}"], capture_output=True, text=True, check=True).stdout
    else:
        ap.error("give a git dir of aws/deep-learning-containers or --lock")
    Path(args.out).write_text(json.dumps(facts(text, commit), indent=1) + "\n")
    print(f"{args.out}: {len(packages(text))} packages, ray {packages(text).get('ray')}, from {LOCK} at {commit}")


if __name__ == "__main__":
    main()
