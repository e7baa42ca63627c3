"""Where an --address target's token comes from: where Ray 2.58's own clients look (AuthenticationTokenLoader:
RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raydlc.errors import InputError
from raydlc.jobs.targets import address_token


def test_the_variable_wins_then_the_named_file_then_the_default_file(tmp_path: Path) -> None:
    named, home = tmp_path / "named", tmp_path / "home"
    named.write_text("from-path\n")
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("from-home")
    assert address_token({"RAY_AUTH_TOKEN": " from-env ", "RAY_AUTH_TOKEN_PATH": str(named)}, home) == "from-env"
    assert address_token({"RAY_AUTH_TOKEN_PATH": str(named)}, home) == "from-path"
    assert address_token({}, home) == "from-home"
    assert address_token({}, tmp_path / "nobody") is None


def test_a_named_file_that_is_missing_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"RAY_AUTH_TOKEN_PATH names .* which does not exist"):
        address_token({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "absent")}, tmp_path)
