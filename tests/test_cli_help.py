"""--help shows a value placeholder only where an option takes a value: a switch (`--json`) shows none."""

from __future__ import annotations

import pytest
import typer

from raydlc.cli import app, main


def _leaves(group: typer.core.TyperGroup, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name, cmd in group.commands.items():
        out += _leaves(cmd, (*prefix, name)) if isinstance(cmd, typer.core.TyperGroup) else [(*prefix, name)]
    return out


def test_no_switch_shows_a_value_placeholder(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    leaves = _leaves(typer.main.get_command(app))  # type: ignore[arg-type]
    assert ("data", "prepare") in leaves
    for path in leaves:
        capsys.readouterr()
        assert main([*path, "--help"]) == 0
        out = capsys.readouterr().out
        assert "--help" in out and "<bool>" not in out, (path, out)
    main(["train", "--help"])
    assert "<int>" in capsys.readouterr().out  # an option that takes a value still says what kind
