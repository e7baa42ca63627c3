"""Property-based fuzzing of what the config layer reads: any value, any YAML document, either
loads or fails with ConfigError (exit 2) whose every problem names a field, a section or the file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raydlc.cli import main
from raydlc.config import FIELDS, RETIRED, SECTIONS, load_config
from raydlc.errors import ConfigError, RaydlcError
from raydlc.views.output import to_json

# "ci" (the default): the same 300 examples on every run, so a failure reproduces.
# HYPOTHESIS_PROFILE=explore: thousands of fresh ones, to look for new failures locally.
settings.register_profile("ci", max_examples=300, derandomize=True)
settings.register_profile("explore", max_examples=3000, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
FUZZ = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NAMES = sorted(FIELDS) + sorted(RETIRED)
KEYS = sorted({f.key for f in FIELDS.values()} | {n.lower() for n in RETIRED})

# Values shaped like what people type: numbers of every kind, words, paths, injections, odd bytes.
numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["inf", "-inf", "nan", "NaN", "1e308", "1e400", "0x10", "1_000", "", " ", "+3", "-0"]),
).map(str)
words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
value_text = st.one_of(numbers, words, st.sampled_from(["g6.12xlarge; rm -rf /", "../../etc", "us-east-2a\n", "true", "null"]))


def assert_names_a_field(e: ConfigError, allowed: set[str]) -> None:
    """Every problem starts with the field, section or file it is about."""
    assert e.exit_code == 2
    for problem in e.problems:
        assert len(problem.splitlines()) == 1, problem  # one line, whatever the input held
        assert any(problem.startswith(a) for a in allowed), problem


def shown(keys: Any) -> set[str]:
    """How names read from a file may appear: as they are, or quoted when they are not plain text."""
    return {str(k) for k in keys} | {repr(str(k)) for k in keys}


@FUZZ
@given(values=st.dictionaries(st.sampled_from(NAMES), value_text, max_size=4))
def test_any_environment_values_load_or_name_their_field(values: dict[str, str], tmp_path: Path) -> None:
    env = {f"RAYDLC_{k}": v for k, v in values.items()}
    try:
        cfg = load_config(env=env, cwd=tmp_path)
    except ConfigError as e:
        assert_names_a_field(e, set(NAMES))
        return
    json.loads(to_json(cfg.as_dict()))  # what loads prints as strict JSON
    for row in cfg.rows():
        if isinstance(row["value"], float):
            assert math.isfinite(row["value"])


@FUZZ
@given(values=st.dictionaries(st.sampled_from(NAMES), value_text, max_size=3))
def test_any_set_flags_load_or_name_their_field(values: dict[str, str], tmp_path: Path) -> None:
    try:
        load_config(env={}, overrides=values, cwd=tmp_path)
    except ConfigError as e:
        assert_names_a_field(e, set(NAMES))


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), words)
yaml_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3), max_leaves=8)
sections = st.dictionaries(
    st.sampled_from([*SECTIONS, "clustr", ""]) | words,
    st.one_of(yaml_values, st.dictionaries(st.sampled_from(KEYS) | words, yaml_values, max_size=4)),
    max_size=4,
)


@FUZZ
@given(doc=st.one_of(sections, yaml_values))
def test_any_yaml_document_loads_or_names_a_field(doc: Any, tmp_path: Path) -> None:
    path = tmp_path / "raydlc.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    try:
        load_config(path, env={})
    except ConfigError as e:
        allowed = {"config file"} | set(NAMES)
        read = yaml.safe_load(path.read_text())  # what the file holds after YAML's own folding of odd characters
        if isinstance(read, dict):
            allowed |= shown(read)
        assert_names_a_field(e, allowed)


@FUZZ
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_as_a_config_file_load_or_name_the_file_or_field(raw: bytes, tmp_path: Path) -> None:
    path = tmp_path / "raydlc.yaml"
    path.write_bytes(raw)
    try:
        load_config(path, env={})
    except ConfigError as e:
        data = None
        with contextlib.suppress(yaml.YAMLError, UnicodeDecodeError):
            data = yaml.safe_load(raw)
        allowed = {"config file"} | set(NAMES) | (shown(data) if isinstance(data, dict) else set())
        assert_names_a_field(e, allowed)


@settings(FUZZ, max_examples=max(60, settings.default.max_examples // 5))
@given(values=st.dictionaries(st.sampled_from(NAMES), value_text.filter(lambda s: "\x00" not in s), max_size=3))
def test_config_show_exits_0_with_strict_json_or_2_with_one_error(values: dict[str, str], tmp_path_factory: pytest.TempPathFactory,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Through the CLI: `config show --json` either prints strict JSON (exit 0) or an error (exit 2), never a traceback."""
    saved = dict(os.environ)
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("fuzz"))
    try:
        for k in [k for k in os.environ if k.startswith("RAYDLC_")]:
            del os.environ[k]
        os.environ.update({f"RAYDLC_{k}": v for k, v in values.items()})
        capsys.readouterr()
        rc = main(["config", "show", "--json"])
        out, err = capsys.readouterr()
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)
    assert rc in (0, 2), err
    if rc == 0:
        json.loads(out, parse_constant=lambda c: pytest.fail(f"non-finite {c} in JSON output"))
    else:
        assert err.startswith("error: invalid configuration") and "Traceback" not in err


@FUZZ
@given(obj=st.recursive(st.floats() | st.integers() | words | st.none(),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3), max_leaves=10))
def test_json_output_is_strict_or_refused_naming_where(obj: Any) -> None:
    def finite(o: Any) -> bool:
        if isinstance(o, float):
            return math.isfinite(o)
        if isinstance(o, dict):
            return all(map(finite, o.values()))
        if isinstance(o, list):
            return all(map(finite, o))
        return True

    if finite(obj):
        assert json.loads(to_json(obj)) == obj
    else:
        with pytest.raises(RaydlcError, match=r"refusing to print invalid JSON: \$.* is not a finite number"):
            to_json(obj)


# ---- head records and kubeconfigs: files raydlc reads back, as a stale, edited or foreign file holds them ----


@pytest.fixture(scope="module")
def bystander() -> Any:
    """A live process that is not raydlc's head (any record may name it); ended by its own PID."""
    import subprocess

    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def _pids(bystander: Any) -> Any:
    from raydlc.edges.local_head import start_ticks

    return st.one_of(st.sampled_from([bystander.pid, os.getpid(), os.getppid(), 999_999_999, 0, -1, 1]),
                     st.integers(min_value=-(2**63), max_value=2**63)), st.one_of(
        st.none(), st.integers(), st.sampled_from([start_ticks(bystander.pid), start_ticks(os.getpid())]))


@settings(FUZZ, max_examples=max(30, settings.default.max_examples // 8))
@given(data=st.data())
def test_any_head_record_ends_nothing_and_deletes_nothing(data: st.DataObject, bystander: Any, tmp_path_factory: pytest.TempPathFactory,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever head.json holds (any field, any PID, a directory that is not raydlc's), no command ends a
    process or deletes a directory; read-only commands do not even remove the record."""
    pids, ticks = _pids(bystander)
    work = tmp_path_factory.mktemp("rec")
    victim = work / "precious"
    victim.mkdir()
    (victim / "keep.txt").write_text("x")
    record = {"pid": data.draw(pids), "start_ticks": data.draw(ticks), "dashboard_url": data.draw(st.sampled_from(["http://127.0.0.1:9", ""]) | words),
              "address": "127.0.0.1:9", "temp_dir": data.draw(st.sampled_from([str(victim), str(work), "/", "/tmp"]) | words),
              "log": "x", "python": "python", "started_at": data.draw(st.floats(allow_nan=False) | st.integers())}
    keys = data.draw(st.sets(st.sampled_from(sorted(record))))
    doc = data.draw(st.one_of(st.just({k: v for k, v in record.items() if k not in keys}), yaml_values))
    raw = json.dumps(doc).encode() if data.draw(st.booleans()) else data.draw(st.binary(max_size=80))
    path = work / "home" / ".raydlc" / "local" / "head.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(raw)
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(work / "home")
    try:
        for args, reads_only in ((["job", "list", "--local"], True), (["verify", "--local", "--json"], True), (["down", "--local", "--json"], False)):
            capsys.readouterr()
            rc = main(args)
            out, err = capsys.readouterr()
            assert "Traceback" not in err and (out == "" or not reads_only)
            assert bystander.poll() is None and (victim / "keep.txt").exists() and Path("/tmp").is_dir()
            if reads_only:
                assert rc == 1 and path.read_bytes() == raw and err.startswith("error: no local Ray head of raydlc runs"), err
            else:
                assert rc == 0 and not path.exists(), err
    finally:
        os.environ["HOME"] = saved or ""


kube_docs = st.one_of(
    yaml_values,
    st.fixed_dictionaries({"apiVersion": st.just("v1"), "kind": st.just("Config"), "current-context": words | st.none(),
                           "contexts": st.lists(st.fixed_dictionaries({"name": words, "context": yaml_values}), max_size=2),
                           "clusters": st.lists(st.fixed_dictionaries({"name": words, "cluster": yaml_values}), max_size=2),
                           "users": st.lists(yaml_values, max_size=2)}),
)


@settings(FUZZ, max_examples=max(60, settings.default.max_examples // 3))
@given(doc=kube_docs, raw=st.binary(max_size=120), as_yaml=st.booleans())
def test_any_kubeconfig_gives_a_client_or_one_line_exit_2(doc: Any, raw: bytes, as_yaml: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    from raydlc.edges.kube import load_client

    path = tmp_path_factory.mktemp("kc") / "kubeconfig"
    path.write_bytes(yaml.safe_dump(doc, allow_unicode=True).encode() if as_yaml else raw)
    try:
        load_client(path)
    except RaydlcError as e:
        assert e.exit_code == 2 and len(e.message.splitlines()) == 1 and str(path) in e.message, e.message
        assert len(e.message) < 500
