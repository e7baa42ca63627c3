"""What travels with a job, decided and checked on this machine before anything is sent.

A job reaches the cluster as an entrypoint and a Ray runtime_env: raydlc itself as a
`py_modules` entry (so the DLC image needs nothing installed), the user's working dir, pip
packages the image lacks, and environment variables. Everything that can be wrong with those
is found here, without Ray: the dashboard takes the working dir as one upload capped at
100 MiB and answers a bigger one with an opaque `HTTPRequestEntityTooLarge`; an unpinned
package resolves differently on the cluster than here; a package that pulls another torch
or ray replaces the image's own build (CUDA, NCCL, EFA plugin) without a word. Secrets never
travel this way: runtime_env and metadata are readable by anyone who reaches the dashboard;
the pods get credentials from the Kubernetes Secret that `up` creates.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from raydlc.errors import InputError

if TYPE_CHECKING:
    from raydlc.config import Config
    from raydlc.jobs.targets import TargetKind

UPLOAD_LIMIT = 100 * 2**20  # the dashboard's request size cap (ray_constants.DASHBOARD_CLIENT_MAX_SIZE)
# Ray uploads these unless told not to; bytecode differs per Python and is rewritten by any import
# while Ray hashes and zips the directory (raydlc's own package travels the same way).
ALWAYS_EXCLUDED = (".git", "__pycache__", "*.pyc")
IGNORE_FILES = (".gitignore", ".rayignore")  # read per directory, as Ray reads them
IMAGE_OWNED = ("torch", "ray")  # the image's own builds: a job must not replace them
BUILTIN_ENTRYPOINT = ("python", "-m", "raydlc.train")
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW(OR)?D|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|SESSION_?KEY|AUTH", re.I)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
# A zip entry costs its name twice (local header 30 B + central directory 46 B) beyond its bytes.
ZIP_ENTRY_BYTES = 76
ZIP_END_BYTES = 22


@dataclass(frozen=True)
class Upload:
    """The files of a working dir that Ray would upload, and the size of that upload."""

    root: Path
    files: tuple[tuple[str, int], ...]  # (path relative to root, bytes)

    @property
    def size(self) -> int:
        """Bytes of the stored (uncompressed) zip Ray sends: contents plus each entry's headers."""
        return sum(n + ZIP_ENTRY_BYTES + 2 * len(rel.encode()) for rel, n in self.files) + ZIP_END_BYTES

    def largest(self, k: int = 3) -> list[tuple[str, int]]:
        return sorted(self.files, key=lambda f: -f[1])[:k]


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _ignore_spec(directory: Path) -> list[Callable[[str], bool]]:
    from pathspec import GitIgnoreSpec

    out: list[Callable[[str], bool]] = []
    for name in IGNORE_FILES:
        f = directory / name
        if f.is_file():
            try:
                spec = GitIgnoreSpec.from_lines(f.read_text(encoding="utf-8", errors="replace").splitlines())
            except (OSError, ValueError) as e:
                raise InputError(f"{f}: cannot read it as an ignore file ({e})") from None
            out.append(lambda rel, spec=spec: spec.match_file(rel))
    return out


def working_dir_upload(root: Path, excludes: Sequence[str] = ALWAYS_EXCLUDED) -> Upload:
    """The files Ray uploads from `root`: without `excludes` and what each directory's
    .gitignore/.rayignore names, matched as Ray matches them (each file's patterns against
    paths relative to the directory that holds it)."""
    from pathspec import GitIgnoreSpec

    root = root.resolve()
    top = GitIgnoreSpec.from_lines(list(excludes))
    found: list[tuple[str, int]] = []

    def walk(d: Path, rules: list[tuple[Path, Callable[[str], bool]]]) -> None:
        rules = rules + [(d, m) for m in _ignore_spec(d)]
        try:
            entries = sorted(d.iterdir())
        except OSError as e:
            raise InputError(f"working dir: cannot list {d} ({e.strerror or e})") from None
        for p in entries:
            rel = p.relative_to(root).as_posix()
            if top.match_file(rel) or any(m(p.relative_to(base).as_posix()) for base, m in rules):
                continue
            if p.is_symlink() and p.is_dir():
                continue  # Ray's zip writes a symlinked dir as an entry, never its tree
            if p.is_dir():
                walk(p, rules)
            elif p.is_file():
                found.append((rel, p.stat().st_size))

    walk(root, [])
    return Upload(root, tuple(found))


def check_upload(upload: Upload, limit: int = UPLOAD_LIMIT) -> None:
    if upload.size <= limit:
        return
    big = ", ".join(f"{rel} ({mib(n)})" for rel, n in upload.largest())
    raise InputError(
        f"working dir {upload.root} is {mib(upload.size)} to upload (without .git and ignored files), "
        f"over the Ray dashboard's {mib(limit)} limit; largest: {big}",
        hint=f"list them in {upload.root}/.rayignore (or .gitignore), or pass a smaller --working-dir; data belongs in STORAGE_PATH or S3",
    )


# ---- pip packages ---------------------------------------------------------------------------------


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The import names a distribution installs (top_level.txt, else its RECORD's first parts)."""
    text = dist.read_text("top_level.txt")
    if text:
        return {line.strip() for line in text.splitlines() if line.strip()}
    return {Path(str(f)).parts[0].removesuffix(".py") for f in dist.files or () if not str(f).startswith("..")}


def _replaces(req_name: str, dist: metadata.Distribution | None, image: Mapping[str, str]) -> str | None:
    """Why installing this distribution would replace the image's torch or ray; None if it would not."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    name = canonicalize_name(req_name)
    if name in IMAGE_OWNED:
        return f"it is the image's own {name} {image[name]}"
    if dist is None:
        return None
    shadowed = sorted(_top_level(dist) & set(IMAGE_OWNED))
    if shadowed:
        return f"it installs a module named {shadowed[0]!r} over the image's {shadowed[0]} {image[shadowed[0]]}"
    for line in dist.requires or ():
        try:
            dep = Requirement(line)
        except InvalidRequirement:
            continue
        dep_name = canonicalize_name(dep.name)
        if dep_name not in IMAGE_OWNED or (dep.marker is not None and not dep.marker.evaluate({"extra": ""})):
            continue
        if dep.specifier and not dep.specifier.contains(image[dep_name], prereleases=True):
            return f"it requires {dep_name}{dep.specifier}, which would replace the image's {dep_name} {image[dep_name]}"
    return None


def pin_packages(
    specs: Iterable[str],
    image: Mapping[str, str],
    *,
    installed: Callable[[str], metadata.Distribution | None] | None = None,
) -> list[str]:
    """Each package as NAME==VERSION: a bare name takes the version installed here; anything
    looser than `==` is refused, as is a package that would replace the image's torch or ray."""
    from packaging.requirements import InvalidRequirement, Requirement

    def local(name: str) -> metadata.Distribution | None:
        try:
            return metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return None

    find = installed or local
    out: list[str] = []
    for spec in specs:
        try:
            req = Requirement(spec)
        except InvalidRequirement as e:
            raise InputError(f"--pip {spec!r} is not a requirement ({e})", hint="give NAME or NAME==VERSION") from None
        if req.url:
            raise InputError(f"--pip {spec!r}: a URL cannot be pinned to a version", hint="give NAME==VERSION from an index")
        dist = find(req.name)
        why = _replaces(req.name, dist, image)
        if why:
            raise InputError(f"--pip {spec!r} is refused: {why}", hint="the DLC image's torch and ray are built for its CUDA, NCCL and EFA; use a version that accepts them")
        pins = [s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
        if not req.specifier:
            if dist is None:
                raise InputError(f"--pip {spec!r} is unpinned and not installed here to pin it from", hint=f"give {req.name}==VERSION")
            op, version = "==", dist.version
        elif len(pins) == 1 and len(req.specifier) == 1:
            op, version = pins[0].operator, pins[0].version
        else:
            local_hint = f" (installed here: {dist.version})" if dist is not None else ""
            raise InputError(f"--pip {spec!r} is not pinned to one version{local_hint}", hint=f"give {req.name}==VERSION: a range resolves differently on the cluster")
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        marker = f"; {req.marker}" if req.marker else ""
        out.append(f"{req.name}{extras}{op}{version}{marker}")
    return out


# ---- environment --------------------------------------------------------------------------------


def parse_env(pairs: Iterable[str]) -> dict[str, str]:
    """`--env K=V` pairs; names that look like credentials are refused, whatever their value."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not ENV_NAME.match(name):
            raise InputError(f"--env {pair!r} is not NAME=VALUE", hint="e.g. --env NCCL_DEBUG=INFO")
        if SECRET_NAME.search(name):
            raise InputError(
                f"--env {name} looks like a secret: runtime_env and job metadata are readable by anyone who reaches the dashboard",
                hint="secrets reach the pods from the Kubernetes Secret `raydlc up` creates (HF_TOKEN); on a local run, set it in the environment of the head",
            )
        env[name] = value
    return env


def check_name(name: str) -> str:
    if not JOB_NAME.match(name):
        raise InputError(f"--name {name!r}: use letters, digits, '.', '_' or '-' (at most 100, starting with a letter or digit)")
    return name


# ---- the job ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    """One submission: what runs, with what, under which id. Pure data, checked when built."""

    entrypoint: str
    runtime_env: dict[str, object]
    metadata: dict[str, str]
    submission_id: str | None = None
    builtin: bool = False
    upload: Upload | None = None
    warnings: list[str] = field(default_factory=list)


def raydlc_module_dir() -> Path:
    import raydlc

    return Path(raydlc.__file__).resolve().parent


def check_compiles(script: Path) -> None:
    """The script compiles here, as the job's Python would compile it: a syntax error is found before
    the upload, as one line naming the file and line, not in the job's log a minute later."""
    try:
        source = script.read_bytes()
        compile(source, str(script), "exec", dont_inherit=True)
    except SyntaxError as e:
        where = f"{script}:{e.lineno}" if e.lineno else str(script)
        raise InputError(f"SCRIPT {where}: {e.msg} (Python cannot compile it)", hint=f"python -m py_compile {script}") from None
    except ValueError as e:  # NUL bytes
        raise InputError(f"SCRIPT {script} is not Python source ({e})") from None


def build(
    *,
    script: Path | None,
    args: Sequence[str],
    working_dir: Path | None,
    pip: Sequence[str],
    env: Mapping[str, str],
    settings_env: Mapping[str, str],
    image: Mapping[str, str],
    name: str | None,
    target: str,
    limit: int = UPLOAD_LIMIT,
) -> JobSpec:
    """Everything checked, in the order a person fixes things: the program, the upload, packages, env."""
    from raydlc import __version__

    warnings: list[str] = []
    if script is not None:
        if not script.exists():
            raise InputError(f"SCRIPT {script}: no such file", hint="give the path of the training script, or --builtin for raydlc's own program")
        if not script.is_file():
            raise InputError(f"SCRIPT {script} is not a file")
        check_compiles(script)
    wd = working_dir if working_dir is not None else (script.resolve().parent if script is not None else None)
    if wd is not None:
        if not wd.exists():
            raise InputError(f"--working-dir {wd}: no such directory")
        if not wd.is_dir():
            raise InputError(f"--working-dir {wd} is not a directory")
        wd = wd.resolve()
    rel: str | None = None
    if script is not None:
        assert wd is not None
        try:
            rel = script.resolve().relative_to(wd).as_posix()
        except ValueError:
            raise InputError(f"SCRIPT {script} is not inside --working-dir {wd}", hint="the script travels in the working dir: pass one that contains it") from None
    upload = working_dir_upload(wd) if wd is not None else None
    if upload is not None:
        check_upload(upload, limit)
        if rel is not None and rel not in {f for f, _ in upload.files}:
            raise InputError(f"SCRIPT {rel} is left out of the upload by an ignore file in {wd}", hint="remove it from .gitignore/.rayignore, or move it")
    packages = pin_packages(pip, image)
    user_env = dict(env)
    nccl_debug = user_env.get("NCCL_DEBUG")
    if nccl_debug is not None and nccl_debug.upper() not in ("INFO", "TRACE"):
        warnings.append(f"NCCL_DEBUG={nccl_debug}: NCCL will not print the lines `raydlc verify` proves the transport from")

    argv = list(BUILTIN_ENTRYPOINT) if script is None else ["python", rel or ""]
    entrypoint = " ".join(shlex.quote(a) for a in [*argv, *args])
    runtime_env: dict[str, object] = {
        "py_modules": [str(raydlc_module_dir())], "excludes": list(ALWAYS_EXCLUDED), "env_vars": {**settings_env, **user_env},
    }
    if upload is not None:
        runtime_env["working_dir"] = str(upload.root)
    if packages:
        runtime_env["pip"] = packages
    meta = {"raydlc": __version__, "program": "builtin" if script is None else rel or "", "target": target}
    return JobSpec(entrypoint, runtime_env, meta, check_name(name) if name else None, script is None, upload, warnings)


def builtin_env(cfg: Config, target: TargetKind) -> dict[str, str]:
    """The config's training settings as the RAYDLC_* variables `python -m raydlc.train` reads; on a cluster
    USE_GPU left empty is true: a GPU group scaled to zero has no GPU yet, and the job must ask for them."""
    from raydlc.config import with_local_defaults
    from raydlc.render.raycluster import cluster_job_env, job_env

    if target == "local":
        return absolute_local_paths(job_env(with_local_defaults(cfg)))
    return cluster_job_env(cfg) if target == "cluster" else job_env(cfg)  # --address: a head raydlc did not make, as given


def image_versions(cfg: Config, target: TargetKind) -> dict[str, str]:
    """The torch and ray a job must not replace: this machine's on the local target, else the image's."""
    from raydlc.facts import images

    img = images.IMAGES.get(cfg.images.dlc_image)
    if target != "local" and img is not None:
        return {"torch": img.torch, "ray": img.ray}
    return {"torch": installed_version("torch") or (img.torch if img else "2.13.0"), "ray": installed_version("ray") or cfg.images.ray_version}


def absolute_local_paths(settings_env: Mapping[str, str], cwd: Path | None = None) -> dict[str, str]:
    """On the local target the job's driver runs in Ray's session dir: relative paths are made
    absolute against where `raydlc submit` was run, so a run writes where a person looks."""
    from raydlc.config import FIELDS

    base = cwd or Path.cwd()
    out = dict(settings_env)
    storage = FIELDS["STORAGE_PATH"].env_var
    from raydlc import storage as S

    value = out.get(storage) or "raydlc-out"
    if not S.is_uri(value):
        out[storage] = str((base / os.path.expanduser(value)).resolve())
    for name in ("DATA", "MODEL_ID", "RESUME_FROM"):  # a local file or directory; ids and URIs stay as they are
        key = FIELDS[name].env_var
        value = out.get(key)
        if value and not S.is_uri(value) and (base / os.path.expanduser(value)).exists():
            out[key] = str((base / os.path.expanduser(value)).resolve())
    return out
