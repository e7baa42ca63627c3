#!/usr/bin/env python
"""The configuration table of docs/config.md, generated from the Config model (raydlc.config.FIELDS).

    python scripts/config_table.py           # print it
    python scripts/config_table.py --write   # put it into docs/config.md, between its markers

tests/test_docs.py checks that the table in docs/config.md is exactly the one printed here, so a new
setting is one field in raydlc/config/schema.py and one run of this script.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docgen import DOCS, cell, write_block
from raydlc.config import FIELDS, FieldInfo

PAGE = DOCS / "config.md"
BLOCK = "config-table"


def row(f: FieldInfo) -> str:
    default = "" if f.default is None else f.default
    return f"| `{f.section}.{f.key}` | `{f.env_var}` | `{default}` | {cell(f.help)} |"


def table() -> str:
    return "\n".join(["| setting (YAML) | environment | default | meaning |", "|---|---|---|---|", *(row(f) for f in FIELDS.values())])


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print(f"{PAGE}: {'updated' if write_block(PAGE, BLOCK, 'scripts/config_table.py', table()) else 'unchanged'}")
    else:
        print(table())
