"""The Config's layers: defaults < a YAML file < `RAYDLC_*` variables < flags, merged here and validated at once.

pydantic-settings' nested env convention (`RAYDLC_GPU_NODES__COUNT`) would break the env.sh
names, so the layering is done here and pydantic (`raydlc.config.schema`) only validates the
merged result. Also here: `--set NAME=VALUE`, the commented `raydlc.yaml` template, and the
local defaults `raydlc train` uses on a laptop.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raydlc.config.fieldtypes import shown
from raydlc.config.schema import ENV_PREFIX, FIELDS, FIELDS_BY_PATH, SECTIONS, Config, cross_field_problems
from raydlc.errors import ConfigError

DEFAULT_FILE = "raydlc.yaml"

# env.sh names raydlc refuses, with the reason: setting them would otherwise be silently ignored.
RETIRED: dict[str, str] = {
    "EFA_DEVICE_PLUGIN_VERSION": (
        "eksctl owns the EFA device plugin (`efaEnabled: true` installs the version that eksctl release pins) "
        "and raydlc installs no EFA chart; unset it (to change the plugin, change eksctl)"
    ),
}


def _label(key: Any) -> str:
    """A name read from the file, as it can be shown on one line: quoted when it is not plain text."""
    s = str(key)
    return s if s and s.isprintable() and s.strip() == s else repr(s)


_SHELL = re.compile(r"(^|\s)(export\s+)?[A-Z_][A-Z0-9_]*=")
_LEADING_ZERO = re.compile(r"^[-+]?0[0-9_]+$")  # YAML 1.1 reads 010 as octal 8; YAML 1.2 and people read 10


class _StrictLoader(yaml.SafeLoader):
    """safe_load's loader, refusing what it would read silently otherwise: a key given twice in one
    mapping (the last one would win), and a number with a leading zero (read as octal)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise ConfigError([f"{_label(key)} is given twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1} "
                                   f"of {self.name}): keep one"])
            if isinstance(key, (str, int, float, bool)):
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        text = str(node.value)
        if _LEADING_ZERO.match(text):
            raise ConfigError([f"{text} (line {node.start_mark.line + 1} of {self.name}): a number with a leading zero, "
                               f"which YAML 1.1 reads as octal ({int(text.replace('_', ''), 8) if set(text) <= set('+-01234567_') else 'not a number'}); "
                               f"write {int(text.replace('_', ''))}, or quote it as text"])
        return super().construct_yaml_int(node)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:map", _StrictLoader.construct_yaml_map)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        if not stat.S_ISREG(path.stat().st_mode) and not path.is_dir():  # a FIFO would block the read forever
            raise ConfigError([f"config file {path}: not a regular file (a FIFO, socket or device): give a YAML file"])
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"config file {path}: cannot read it ({e.strerror or e})"]) from e
    except UnicodeDecodeError as e:
        raise ConfigError([f"config file {path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})"]) from e
    try:
        loader = _StrictLoader(text)
        loader.name = str(path)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError([f"config file {path}: not valid YAML ({' '.join(str(e).split())})"]) from e
    except RecursionError as e:  # the composer recurses once per level
        raise ConfigError([f"config file {path}: nested too deeply to be a raydlc config (sections hold fields, two levels)"]) from e
    if data is None:
        return {}
    if isinstance(data, str) and _SHELL.search(data):
        raise ConfigError([f"config file {path}: a shell file of NAME=value lines, not YAML: `source {path}` to set its RAYDLC_* "
                           "variables (raydlc reads them), or write a YAML config with `raydlc config init`"])
    if not isinstance(data, dict):
        raise ConfigError([f"config file {path}: must be a mapping of sections, got {type(data).__name__}"])
    return data


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Config:
    """Layer default < file < env < flags, then validate everything at once.

    `overrides` are flags keyed by env.sh name (`{"GPU_NODE_COUNT": 3}`). The file is
    `path`, else `$RAYDLC_CONFIG`, else `./raydlc.yaml` when it exists. Nothing is written
    and nothing is called: a bad value stops here with every problem listed.
    """
    env = os.environ if env is None else env
    layers = _Layers()
    file_path = _config_file(path, env, cwd)
    if file_path is not None:
        layers.add_file(file_path, _read_file(file_path))
    layers.add_env(env)
    layers.add_flags(overrides or {})
    if layers.problems:
        raise ConfigError(layers.problems)
    return _validated(layers)


def _config_file(path: str | os.PathLike[str] | None, env: Mapping[str, str], cwd: str | os.PathLike[str] | None) -> Path | None:
    """The file layer's path: named, else $RAYDLC_CONFIG, else ./raydlc.yaml if present; a named one must exist."""
    if path is not None:
        if not Path(path).exists():
            raise ConfigError([f"config file {path} does not exist"])
        return Path(path)
    if env.get(ENV_PREFIX + "CONFIG"):
        named = Path(env[ENV_PREFIX + "CONFIG"])
        if not named.exists():
            raise ConfigError([f"config file {named} (from RAYDLC_CONFIG) does not exist"])
        return named
    candidate = Path(cwd or ".") / DEFAULT_FILE
    return candidate if candidate.exists() else None


@dataclass
class _Layers:
    """The raw values of each section as the file, the environment and the flags set them, and where each came from."""

    raw: dict[str, dict[str, Any]] = field(default_factory=lambda: {s: {} for s in SECTIONS})
    sources: dict[str, str] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def set(self, info: Any, value: Any, source: str, origin: str) -> None:
        self.raw[info.section][info.key] = value
        self.sources[info.env] = source
        self.origins[info.env] = origin

    def where(self, env_name: str) -> str:
        return self.origins.get(env_name, "default")

    def add_file(self, file_path: Path, data: Mapping[str, Any]) -> None:
        for section, values in data.items():
            if section not in SECTIONS:
                self.problems.append(f"{_label(section)} (file {file_path}): unknown section; expected one of {', '.join(SECTIONS)}")
            elif values is not None and not isinstance(values, dict):
                self.problems.append(f"{section} (file {file_path}): must be a mapping of fields")
            else:
                for key, value in (values or {}).items():
                    self._add_file_value(file_path, section, key, value)

    def _add_file_value(self, file_path: Path, section: str, key: Any, value: Any) -> None:
        info = FIELDS_BY_PATH.get((section, key))
        if info is None and str(key).upper() in RETIRED:
            self.problems.append(f"{section}.{key} (file {file_path}): not a setting: {RETIRED[str(key).upper()]}")
        elif info is None:
            known = ", ".join(SECTIONS[section].model_fields)
            self.problems.append(f"{section}.{_label(key)} (file {file_path}): unknown field; {section} has {known}")
        else:
            self.set(info, value, "file", f"file {file_path}")

    def add_env(self, env: Mapping[str, str]) -> None:
        self.problems += [f"{name} (env {ENV_PREFIX}{name}): not a setting: {why}" for name, why in RETIRED.items() if ENV_PREFIX + name in env]
        for info in FIELDS.values():
            if info.env_var in env:
                self.set(info, env[info.env_var].strip(), "env", f"env {info.env_var}")

    def add_flags(self, overrides: Mapping[str, Any]) -> None:
        for name, value in overrides.items():
            info = FIELDS.get(name.upper())
            if value is None:
                continue
            if info is None and name.upper() in RETIRED:
                self.problems.append(f"{name} (flag): not a setting: {RETIRED[name.upper()]}")
            elif info is None:
                self.problems.append(f"{name} (flag): unknown setting; see `raydlc config show` for the names")
            else:
                self.set(info, value, "flag", "flag")


def _validated(layers: _Layers) -> Config:
    """Each section's model over its raw values, then the cross-field rules; every problem names its setting and source."""
    sections: dict[str, Any] = {}
    problems: list[str] = []
    for section, model in SECTIONS.items():
        try:
            sections[section] = model(**layers.raw[section])
        except ValidationError as e:
            problems += [_field_problem(section, err, layers) for err in e.errors()]
    if problems:
        raise ConfigError(problems)
    cfg = Config(**sections)
    cfg._sources.update(layers.sources)
    cfg._origins.update(layers.origins)
    cross = [f"{name} ({layers.where(name)}): {msg}" for name, msg in cross_field_problems(cfg)]
    if cross:
        raise ConfigError(cross)
    return cfg


def _field_problem(section: str, err: Any, layers: _Layers) -> str:
    key = str(err["loc"][0]) if err["loc"] else ""
    info = FIELDS_BY_PATH.get((section, key))
    label = info.env if info else f"{section}.{key}"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] not in ("value_error",) and "input" in err:
        msg = f"{msg}, got {shown(err['input'])}"
    return f"{label} ({layers.where(label)}): {msg}"


def parse_assignments(items: list[str] | None) -> dict[str, str]:
    """`--set NAME=VALUE` flags into overrides; NAME is the env.sh name, with or without RAYDLC_."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError([f"--set {item!r}: expected NAME=VALUE, e.g. --set GPU_NODE_COUNT=4"])
        out[name.strip().upper().removeprefix(ENV_PREFIX)] = value
    return out


def render_yaml_template() -> str:
    """A commented raydlc.yaml with every field at its default, for `config init`."""
    lines = [
        "# raydlc configuration. Precedence: flag > RAYDLC_* environment > this file > default.",
        "# Every field can be overridden by the environment variable named in its comment.",
        "",
    ]
    for section in SECTIONS:
        lines.append(f"{section}:")
        for info in (f for f in FIELDS.values() if f.section == section):
            lines.append(f"  # {info.help} [{info.env_var}]")
            value = yaml.safe_dump({info.key: info.default}, default_flow_style=False).strip()
            lines.append(f"  {value}")
        lines.append("")
    return "\n".join(lines)


# `raydlc train` on a laptop: a model and a run size that show the loss falling within minutes
# on 2 CPU cores. The one table of local values; `with_local_defaults` applies it only where a
# value's source is `default`, so env, file and flags always win. Documented in the README.
LOCAL_DEFAULTS: dict[str, Any] = {
    "MODEL_ID": "tiny",
    "STEPS": 300,
    "BATCH_SIZE": 8,
    "LEARNING_RATE": 2e-3,
    "NUM_WORKERS": 2,
    "CHECKPOINT_EVERY": 100,
}


# A run on a GPU cluster: the planner decides the layout (GRAD_ACCUM=auto with SHARDING and
# GRAD_SYNC auto and ACTIVATION_CHECKPOINTING empty, as they default) and the sequences are as
# long as the built-in corpus and the registry's models support. Applied by
# `with_cluster_defaults` only where a value's source is `default`.
CLUSTER_SEQ_LEN = 2048
CLUSTER_DEFAULTS: dict[str, Any] = {"GRAD_ACCUM": "auto", "SEQ_LEN": CLUSTER_SEQ_LEN}
# LoRA trains a few adapter weights from zero: the usual rate is ten times full fine-tuning's (2e-5).
CLUSTER_LORA_LEARNING_RATE = 2e-4


def with_cluster_defaults(cfg: Config) -> Config:
    """The same Config with CLUSTER_DEFAULTS in place of untouched defaults (origin `cluster default`).

    SEQ_LEN becomes 2048 only for the built-in corpus (DATA unset) and a model of the registry
    whose positions reach it; GRAD_ACCUM auto only where BATCH_SIZE is untouched too (auto
    would replace it); LEARNING_RATE 2e-4 under LoRA (LORA_RANK > 0); anything else keeps its default.
    """
    from raydlc.facts.models import resolve_spec

    spec = resolve_spec(cfg.train.model_id)  # a built-in name or its hub id: the registry, never a directory
    long_ok = not cfg.train.data and spec is not None and spec.max_position_embeddings >= CLUSTER_SEQ_LEN
    # GRAD_ACCUM=auto chooses the micro-batch too: a BATCH_SIZE the user set stays, without accumulation.
    batch_set = cfg.source("BATCH_SIZE") != "default"
    cluster = {name: v for name, v in CLUSTER_DEFAULTS.items()
               if cfg.source(name) == "default" and (name != "SEQ_LEN" or long_ok) and (name != "GRAD_ACCUM" or not batch_set)}
    if cfg.train.lora_rank > 0 and cfg.source("LEARNING_RATE") == "default":
        cluster["LEARNING_RATE"] = CLUSTER_LORA_LEARNING_RATE
    return _with_training_values(cfg, cluster, "cluster default") if cluster else cfg


def with_local_defaults(cfg: Config) -> Config:
    """The same Config with LOCAL_DEFAULTS in place of untouched defaults (origin `local default`)."""
    local = {name: v for name, v in LOCAL_DEFAULTS.items() if cfg.source(name) == "default"}
    return _with_training_values(cfg, local, origin="local default")


def _with_training_values(cfg: Config, values: dict[str, Any], origin: str) -> Config:
    """The same Config with training `values` (by setting name) in place, each said to come from `origin`."""
    train = cfg.train.updated(**{FIELDS[name].key: v for name, v in values.items()})
    out = Config(**{s: getattr(cfg, s) for s in SECTIONS if s != "train"}, train=train)
    out._sources.update(cfg._sources)
    out._origins.update(cfg._origins)
    out._origins.update(dict.fromkeys(values, origin))
    return out
