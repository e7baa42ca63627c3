#!/usr/bin/env python
"""Print the README's configuration table from the Config model (raydlc.config.FIELDS).

    python scripts/config_table.py      # paste over the table under "## Configuration"

tests/test_cli.py checks that every row of the README is the one printed here.
"""

from __future__ import annotations

from raydlc.config import FIELDS, FieldInfo


def row(f: FieldInfo) -> str:
    default = "" if f.default is None else f.default
    return f"| `{f.section}.{f.key}` | `{f.env_var}` | `{default}` | {f.help} |"


def table() -> str:
    return "\n".join(["| setting (YAML) | environment | default | meaning |", "|---|---|---|---|", *(row(f) for f in FIELDS.values())])


if __name__ == "__main__":
    print(table())
