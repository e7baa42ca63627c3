#!/usr/bin/env python
"""What `up` and `down` need from the caller's AWS identity, for docs/lifecycle.md: generated from raydlc.lifecycle.permissions.

    python scripts/iam_policy_doc.py           # print it
    python scripts/iam_policy_doc.py --write   # put it into docs/lifecycle.md, between its markers

tests/test_docs.py checks the page holds exactly this, so the list `up` simulates and the policy shown cannot drift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docgen import DOCS, write_block
from raydlc.lifecycle import permissions

PAGE = DOCS / "lifecycle.md"
BLOCK = "iam-policy"
PLACEHOLDERS = permissions.Names(
    account="<account_id>", region="<region>", cluster="<cluster>", bucket="<bucket>",
    pod_roles=("raydlc-<cluster>-<region>-ray", "raydlc-<cluster>-<region>-ray-worker",
               "raydlc-<cluster>-<region>-autoscaler"),
)


def text() -> str:
    rows = ["| statement | order: step | from | actions | resources |", "|---|---|---|---|---|"]
    for need in (*permissions.NEEDS, permissions.SELF_CHECK):
        actions = ", ".join(f"`{a}`" for a in need.actions)
        res = ", ".join(f"`{r}`" for r in permissions.resources(need, PLACEHOLDERS))
        if need.condition:
            res += f" when `{need.condition[0]}` = `{need.condition[1]}`"
        where = f"{'/'.join(need.orders)}: {need.step or '(the check itself)'}"
        rows.append(f"| {need.sid} | {where} | {need.origin} | {actions} | {res} |")
    policy = json.dumps(permissions.minimal_policy(PLACEHOLDERS), indent=2)
    return "\n".join([*rows, "", "```json", policy, "```"])


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print(f"{PAGE}: {'updated' if write_block(PAGE, BLOCK, 'scripts/iam_policy_doc.py', text()) else 'unchanged'}")
    else:
        print(text())
