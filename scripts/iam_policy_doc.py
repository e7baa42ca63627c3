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


def _attach(policies: list[tuple[str, dict]]) -> list[str]:
    """The shell lines that create the policies from their files and attach them to the identity that runs raydlc."""
    arn = f"arn:aws:iam::{PLACEHOLDERS.account}:policy"
    lines = ["```sh"]
    lines += [f"aws iam create-policy --policy-name {name} --policy-document file://{name}.json" for name, _ in policies]
    lines += [f"aws iam attach-role-policy --role-name <your-role> --policy-arn {arn}/{name}" for name, _ in policies]
    lines.append("# or, for a user: aws iam attach-user-policy --user-name <your-user> --policy-arn …")
    return [*lines, "```"]


def text() -> str:
    rows = ["| statement | order: step | from | policy | actions | resources |", "|---|---|---|---|---|---|"]
    for need in (*permissions.NEEDS, permissions.SELF_CHECK):
        actions = ", ".join(f"`{a}`" for a in need.actions)
        res = ", ".join(f"`{r}`" for r in permissions.resources(need, PLACEHOLDERS))
        if need.condition:
            res += f" when `{need.condition[0]}` = `{need.condition[1]}`"
        where = f"{'/'.join(need.orders)}: {need.step or '(the check itself)'}"
        rows.append(f"| {need.sid} | {where} | {need.origin} | {permissions.purpose(need)} | {actions} | {res} |")
    policies = permissions.managed_policies(PLACEHOLDERS)
    out = [*rows, "", f"The {len(policies)} managed policies (each within IAM's {permissions.POLICY_SIZE_QUOTA:,} characters, "
           f"white space not counted; attach all {len(policies)}: a user or role takes {permissions.ATTACHED_POLICIES_QUOTA} "
           "managed policies by default). Save each as `<name>.json`, then:", "", *_attach(policies)]
    for name, doc in policies:
        sids = ", ".join(st["Sid"] for st in doc["Statement"])
        out += ["", f"`{name}` ({permissions.iam_size(doc):,} characters; {sids}):", "",
                "```json", json.dumps(doc, indent=2), "```"]
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print(f"{PAGE}: {'updated' if write_block(PAGE, BLOCK, 'scripts/iam_policy_doc.py', text()) else 'unchanged'}")
    else:
        print(text())
