"""Flags declared once: a setting's field carries its flag, and every command line is built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer

from raydlc.cli import app, main
from raydlc.config import FIELDS, LOCAL_DEFAULTS, Flag, flags
from raydlc.train.__main__ import parse_args


def typer_options(command: str) -> dict[str, Any]:
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.name: p for p in cmd.params}


def test_raydlc_train_has_one_option_per_flagged_setting_with_its_name_and_help() -> None:
    opts = flags.options("train")
    got = typer_options("train")
    assert set(got) == {o.keyword for o in opts} | {"address", "json_"}
    for o in opts:
        param = got[o.keyword]
        assert param.opts[0] == o.names[0] and list(param.secondary_opts) == list(o.names[1:])
        assert param.help == o.help() and f"[{o.env}" in param.help
    assert got["out"].type_descriptor.annotation is str and got["out"].metavar == "PATH|URI" and got["resume"].is_flag and got["bf16"].secondary_opts == ["--fp32"]
    # Every training setting the flags name is a train field with its env name; the rest stay env/--set/YAML only.
    assert {o.env for o in opts} <= {f.env for f in FIELDS.values() if f.section == "train"}
    assert {"WEIGHT_DECAY", "USE_GPU", "COMPILE"}.isdisjoint({o.env for o in opts})


def test_the_job_entrypoint_parses_the_same_flags_into_the_settings() -> None:
    ns = parse_args(["--model", "tiny", "--steps", "3", "--out", "/o", "--fp32", "--resume", "--sync", "once", "--seed", "4",
                     "--grad-accum", "auto", "--max-failures", "2"])
    got = {k: v for k, v in vars(ns).items() if k.isupper() and v is not None}
    assert got == {"MODEL_ID": "tiny", "STEPS": 3, "STORAGE_PATH": "/o", "BF16": False, "RESUME": True, "GRAD_SYNC": "once",
                   "SEED": 4, "GRAD_ACCUM": "auto", "MAX_FAILURES": 2}
    assert parse_args(["--storage-path", "/p", "--bf16"]).STORAGE_PATH == "/p"  # its older spelling still works
    assert {k for k, v in vars(parse_args([])).items() if k.isupper()} == {o.env for o in flags.options("train")}
    with pytest.raises(SystemExit):
        parse_args(["--sharding", "zero3"])  # argparse lists a Literal's words


def test_help_states_each_default_once_from_the_local_table_or_the_flag() -> None:
    steps, seq, data, seed = (flags.option(n) for n in ("STEPS", "SEQ_LEN", "DATA", "SEED"))
    assert steps.help() == f"Optimizer steps [STEPS; local default: {LOCAL_DEFAULTS['STEPS']}]."
    assert seq.help() == "Tokens per sequence [SEQ_LEN; default: 128]." and seq.help(notes=False) == "Tokens per sequence [SEQ_LEN]."
    assert data.help().endswith("[DATA; default: bundled stdlib-docstring corpus].") and seed.help() == "Seed of the model init, data order and eval split [SEED]."


def test_a_command_can_name_a_setting_its_own_way() -> None:
    o = flags.option("BATCH_SIZE", Flag("--micro-batch", "Sequences per GPU per micro-batch"))
    assert (o.keyword, o.env, o.kind, o.help(notes=False)) == ("micro_batch", "BATCH_SIZE", int, "Sequences per GPU per micro-batch [BATCH_SIZE].")
    plan = typer_options("plan")
    assert {"model", "nodes", "seq_len", "micro_batch", "grad_accum", "sync", "max_global_batch", "instance_type"} <= set(plan)
    assert plan["nodes"].help == "GPU nodes [GPU_NODE_COUNT]." and plan["micro_batch"].opts == ["--micro-batch"]
    with pytest.raises(KeyError, match="has no flag"):
        flags.option("WEIGHT_DECAY")


def test_kinds_follow_the_field_types() -> None:
    kinds = {o.env: (o.kind, o.switch, o.choices) for o in flags.options("train")}
    assert kinds["STEPS"] == (int, False, None) and kinds["LEARNING_RATE"] == (float, False, None)
    assert kinds["GRAD_ACCUM"] == (str, False, None)  # a number or `auto`: the config reads it
    assert kinds["SHARDING"] == (str, False, ("fsdp", "hsdp", "auto"))
    assert kinds["RESUME"] == (bool, True, None) and kinds["BF16"] == (bool, False, None)  # tri-state: --bf16/--fp32 or unset


def test_given_drops_what_the_command_line_left_unset() -> None:
    opts = flags.options("train")
    assert flags.given(opts, {"steps": None, "resume": False, "bf16": False, "out": Path("/x")}) == {"bf16": False, "out": "/x"}
    assert flags.named_settings(opts, {"steps": 3, "seed": None}, caller="train") == {"STEPS": 3}
    with pytest.raises(TypeError, match=r"train\(\) got an unexpected keyword argument 'nope'"):
        flags.named_settings(opts, {"nope": 1}, caller="train")


def test_a_float_flag_refuses_infinity_before_the_config(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--lr", "inf"]) == 2
    assert "--lr" in capsys.readouterr().err
