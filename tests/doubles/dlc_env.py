"""The Ray Train image's Python, as far as imports go: cluster-side code run here sees only what the image has.

`dlc_packages.json` is the image's package set, derived by `scripts/dlc_packages.py` from the lock file the
image is built from (aws/deep-learning-containers docker/ray-train/uv.lock, `uv sync --frozen`). A
`sitecustomize.py` on PYTHONPATH puts an import finder first on `sys.meta_path` of every Python process
started with `env()`: the driver, and the raylet's workers it starts (they inherit its environment). It wraps
each of the interpreter's finders so that they find nothing (an import raises ModuleNotFoundError,
`importlib.util.find_spec` answers None, as for an absent module) for any top-level module that is not

- the standard library,
- a module of an installed distribution the image's lock also installs (by normalized name),
- `raydlc` itself (it travels with every job as a `py_modules` entry: jobs/runtime_env.py),

and always refuses matplotlib, kubernetes and pathspec (not in the image) and typer unless this venv's typer
is the image's version (0.26.8 there; raydlc's CLI needs a newer one, so the job must not import it).
Versions are otherwise this venv's, not the image's: the guard is about what exists, not which release.
Every refusal is appended to `refused.log` (pid and module), so a test can tell which optional imports a
library tried and gave up on.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

FACTS = Path(__file__).with_name("dlc_packages.json")
REPO = Path(__file__).resolve().parents[2]
NOT_IN_IMAGE = ("matplotlib", "kubernetes", "pathspec")
TRAVELS = ("raydlc",)  # with every job (py_modules)

SITECUSTOMIZE = '''
import os as _os
import sys as _sys

def _install():
    allowed_file = _os.environ.get("RAYDLC_DLC_ALLOWED")
    if not allowed_file:
        return
    with open(allowed_file) as f:
        allowed = frozenset(f.read().split())
    log = _os.environ.get("RAYDLC_DLC_REFUSED_LOG")
    dists_file = _os.environ.get("RAYDLC_DLC_DISTS")
    with open(dists_file) as f:
        dists = frozenset(f.read().split())
    with open(_os.environ["RAYDLC_DLC_DIRS"]) as f:
        dirs = tuple(line for line in f.read().splitlines() if line)

    class NotInImage:
        """One of the interpreter's finders, blind to top-level modules the Ray Train image does not have
        (tests/doubles/dlc_env.py): for them it finds nothing, so an import fails and importlib.util.find_spec
        answers None, exactly as where the module is absent."""

        def __init__(self, inner):
            self.inner = inner

        def find_spec(self, fullname, path=None, target=None):
            top = fullname.partition(".")[0]
            find = getattr(self.inner, "find_spec", None)
            if find is None:
                return None
            if top in allowed or top in _sys.builtin_module_names or top.startswith(("_sysconfigdata_", "_cython_", "__editable__")):
                return find(fullname, path, target)
            spec = find(fullname, path, target)  # a script's own sibling module (Ray's agents put their directory first)
            if spec is not None and (spec.origin or "").startswith(dirs):
                return spec
            if log and spec is not None:
                with open(log, "a") as f:
                    f.write(f"{_os.getpid()} {top}\\n")
            return None

        def find_distributions(self, context=None, **kw):
            find = getattr(self.inner, "find_distributions", None)
            if find is None:
                return iter(())
            import re
            from importlib.metadata import DistributionFinder

            found = find(context if context is not None else DistributionFinder.Context(**kw))
            return (d for d in found if re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() in dists)

        def invalidate_caches(self):
            inv = getattr(self.inner, "invalidate_caches", None)
            if inv is not None:
                inv()

    _sys.meta_path[:] = [NotInImage(f) for f in _sys.meta_path]

_install()
'''


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def facts() -> dict[str, Any]:
    return json.loads(FACTS.read_text())


def image_packages() -> dict[str, str]:
    return dict(facts()["packages"])


def typer_matches() -> bool:
    try:
        return metadata.version("typer") == image_packages().get("typer")
    except metadata.PackageNotFoundError:
        return False


def local_closure(names: set[str]) -> set[str]:
    """`names` and what their versions installed here require, transitively (extras left out).

    This venv's releases are not the image's (huggingface-hub 2.x here imports httpx2, the image's 1.x
    does not): an image package works here only with its own dependencies, so they are let through too.
    raydlc's own imports are held to the lock itself (tests/test_dlc_env.py reads them)."""
    from packaging.requirements import Requirement

    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for r in reqs:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(normalized(req.name))
    return seen


def allowed_distributions() -> set[str]:
    """The distributions (normalized names) the guard shows `importlib.metadata`: the image's and their local needs."""
    refused = {normalized(n) for n in NOT_IN_IMAGE} | (set() if typer_matches() else {"typer"})
    return (local_closure(set(image_packages()) | {normalized(n) for n in facts().get("built_on_top", {})}) | set(TRAVELS)) - refused


def allowed_modules() -> set[str]:
    """Top-level modules the image's Python can import, as far as this venv can tell."""
    image = allowed_distributions()
    # An image package this venv lacks fails to import here anyway, as the finder's refusal would; its name is let through
    # so that the failure is the natural one (a module name is usually the package's, `-` as `_`).
    out = set(sys.stdlib_module_names) | set(TRAVELS) | {n.replace("-", "_") for n in image}
    for module, dists in metadata.packages_distributions().items():
        if any(normalized(d) in image for d in dists):
            out.add(module)
    refused = set(NOT_IN_IMAGE) | (set() if typer_matches() else {"typer"})
    return {m for m in out if m not in refused and not m.endswith(".py")}


def allowed_dirs() -> set[str]:
    """Directories inside the image's packages (with a trailing slash): a module found there by a top-level name
    is a script's sibling (Ray's runtime env agent imports `runtime_env_consts` next to its main.py), not a package."""
    import importlib.util

    out = set()
    for m in allowed_modules():
        try:
            spec = importlib.util.find_spec(m)
        except (ImportError, ValueError):
            continue
        for d in map(str, (spec.submodule_search_locations or []) if spec is not None else []):  # an entry may be a Path
            if "site-packages" in d:  # as found and as resolved (the venv may be a link)
                out |= {str(Path(d)) + os.sep, str(Path(d).resolve()) + os.sep}
    return out


def allowed_pattern_names() -> set[str]:
    """Names in sys.modules that no distribution provides: the interpreter's and Cython's own (the finder also
    lets through `_sysconfigdata_*`, `_cython_*`, `__editable__*` by prefix)."""
    return {"__main__", "__mp_main__", "cython_runtime", "_distutils_hack"}


def prepare(where: Path) -> dict[str, str]:
    """Write the guard into `where` (sitecustomize.py, allowed.txt); the environment that puts it into every Python started with it."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (where / "allowed.txt").write_text("\n".join(sorted(allowed_modules() | allowed_pattern_names())) + "\n")
    (where / "dists.txt").write_text("\n".join(sorted(allowed_distributions())) + "\n")
    (where / "dirs.txt").write_text("\n".join(sorted(allowed_dirs())) + "\n")
    log = where / "refused.log"
    log.touch()
    return env(where)


def env(where: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    base = dict(os.environ if base is None else base)
    base.pop("RAY_ADDRESS", None)
    return {
        **base,
        "PYTHONPATH": os.pathsep.join([str(where), str(REPO / "src"), str(REPO)]),
        "RAYDLC_DLC_ALLOWED": str(where / "allowed.txt"),
        "RAYDLC_DLC_REFUSED_LOG": str(where / "refused.log"),
        "RAYDLC_DLC_DISTS": str(where / "dists.txt"),
        "RAYDLC_DLC_DIRS": str(where / "dirs.txt"),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def refused(where: Path) -> set[str]:
    """The top-level modules some guarded process tried and was refused."""
    return {line.split()[1] for line in (where / "refused.log").read_text().splitlines() if line.strip()}


def run(argv: list[str], where: Path, *, extra_env: dict[str, str] | None = None, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python ARGV…` under the guard (prepared in `where`)."""
    return subprocess.run([sys.executable, *argv], env={**env(where), **(extra_env or {})}, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, check=False)
