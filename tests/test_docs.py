"""README.md and docs/: the generated parts match their generators, the links resolve, CI finds its commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
README_MAX_LINES = 250
sys.path.insert(0, str(REPO / "scripts"))

import commands_doc  # noqa: E402
import config_table  # noqa: E402
import docgen  # noqa: E402


def test_config_table_in_docs_is_the_one_generated_from_the_model() -> None:
    """A setting added later needs its field and one run of the script; the table is never edited by hand."""
    from raydlc.config import FIELDS

    page = docgen.block(DOCS / "config.md", "config-table")
    assert page is not None, "docs/config.md lost its config-table markers"
    assert page == config_table.table(), "docs/config.md's table is stale: run `python scripts/config_table.py --write`"
    assert len(page.splitlines()) == len(FIELDS) + 2
    assert all(f"`{f.env_var}`" in page for f in FIELDS.values())


def test_commands_reference_is_the_one_generated_from_the_cli() -> None:
    page = docgen.block(DOCS / "commands.md", "commands")
    assert page is not None, "docs/commands.md lost its commands markers"
    assert page == commands_doc.reference().rstrip("\n"), "docs/commands.md is stale: run `python scripts/commands_doc.py --write`"


def test_commands_reference_names_every_command_and_flag() -> None:
    """The generator walks what typer built: every leaf command and every flag of it is on the page."""
    import typer

    from raydlc.cli import app

    found = dict(commands_doc.leaves(typer.main.get_command(app), "raydlc"))
    assert {"raydlc plan", "raydlc config show", "raydlc job logs", "raydlc bench-transport"} <= set(found)
    text = (DOCS / "commands.md").read_text()
    for path, cmd in found.items():
        section = text.split(f"### `{path}`\n", 1)[1].split("\n### ", 1)[0]
        for p in cmd.params:
            for opt in [*p.opts, *p.secondary_opts] if p.param_type_name == "option" else []:
                assert opt in section, (path, opt)
    assert "| `--bf16/--fp32` |" in text and "| `--gpus-per-node` | INTEGER ≤ 16 |" in text
    assert "raydlc nccl [OPTIONS] [PATH\\|DIR\\|-]..." not in text and "raydlc nccl [OPTIONS] [PATH|DIR|-]..." in text


def test_readme_is_short_and_names_every_command() -> None:
    import typer

    from raydlc.cli import app

    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, f"README.md is for newcomers: at most {README_MAX_LINES} lines; the reference lives in docs/"
    paths = [p for p, _ in commands_doc.leaves(typer.main.get_command(app), "raydlc")]
    assert [p for p in paths if f"`{p}" not in text] == [], "each command gets a row in the README's table"


def test_ci_finds_the_readme_install_and_test_commands() -> None:
    """`.ci/run`'s own extraction lines, run on the README: the two commands newcomers read are the ones CI runs."""
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    extract = [line for line in ci if line.startswith(("install=", "test_cmd="))]
    assert len(extract) == 2, extract
    r = subprocess.run(["bash", "-c", "\n".join([*extract, 'printf "%s\\n%s\\n" "$install" "$test_cmd"'])], cwd=REPO,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    install, test_cmd = r.stdout.splitlines()
    assert install == "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]'"
    assert test_cmd.startswith(".venv/bin/python -m pytest")
    first = README.read_text().split("\n## ", 1)[0]
    assert "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/raydlc train" in first


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fence = False
    for line in path.read_text().splitlines():
        fence ^= line.startswith("```")
        if fence or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_every_docs_page_is_listed_in_the_readme() -> None:
    text = README.read_text()
    assert [p.name for p in DOCS.glob("*.md") if f"(docs/{p.name})" not in text] == []


def test_anchor_slugs_follow_github() -> None:
    assert _slug(" Scale-out: `raydlc plan --scan-nodes`") == "scale-out-raydlc-plan---scan-nodes"
    assert _slug(" `raydlc config show`") == "raydlc-config-show"
    assert _slug(" Up, down, status") == "up-down-status"


def test_models_table_is_the_built_in_specs() -> None:
    from raydlc.facts.models import SPECS

    text = (DOCS / "training.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z0-9.\-]+)` \| .*$", text, re.M) if m.group(1) in SPECS}
    assert set(rows) == set(SPECS)
    for name, row in rows.items():
        s = SPECS[name]
        want = [f"`{name}`", s.hub_id or "—", f"{s.param_count():,}", str(s.num_layers), str(s.hidden_size),
                f"{s.num_heads} / {s.num_kv_heads}", str(s.intermediate_size), str(s.vocab_size), "yes" if s.tie_embeddings else "no",
                str(s.max_position_embeddings)]
        assert [c.strip() for c in row.strip("|").split("|")] == want, name


def _pick(cell: str, i: int) -> str:
    """The i-th of `a / b / c` (a cell that holds one value for every type of its row holds just one)."""
    values = [v.strip() for v in cell.split(" / ")]
    return values[i] if len(values) > 1 else values[0]


def test_instance_table_is_the_catalogue() -> None:
    from raydlc.facts import instances

    text = (DOCS / "render.md").read_text()
    table = text.split("| type | GPUs |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    seen = set()
    for row in table:
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = [n if "." in n else f"{cells[0].split('.')[0]}.{n}" for n in (v.strip() for v in cells[0].split(" / "))]
        for i, name in enumerate(names):
            t = instances.INSTANCE_TYPES[name]
            gpu = t.gpu_model
            assert gpu is not None
            seen.add(name)
            assert _pick(cells[1], i).split(" × ")[0] == str(t.gpus) and gpu.name.split("-")[0] in cells[1], name
            assert _pick(cells[2].removesuffix(" GiB"), i) == f"{gpu.memory_gib:g}", name
            assert cells[3].split()[0] == f"{gpu.bf16_tflops:g}", name
            assert cells[4].startswith("NVLink" if t.nvlink else "PCIe") and f"{t.gpu_link_gbytes_s:g} GB/s" in cells[4], name
            assert _pick(cells[5].removesuffix(" Gb/s"), i) == f"{t.network_gbps:g}", name
            assert _pick(cells[6], i) == str(t.efa_interfaces), name
            assert cells[7] == ("yes" if t.gpudirect_rdma else "no"), name
    assert seen == {n for n, t in instances.INSTANCE_TYPES.items() if t.gpus}


def test_lifecycle_steps_are_the_ones_up_runs() -> None:
    """docs/lifecycle.md's diagram and table name each step of `raydlc.lifecycle.orders`, the table in up's order;
    neither it nor the README counts them in prose, where a new step would leave the number behind."""
    from raydlc.lifecycle.orders import names

    steps = names("up")
    text = (DOCS / "lifecycle.md").read_text()
    diagram = text.split("```\n", 2)[1]
    assert [s for s in steps if not re.search(rf"(?<![\w-]){s}(?![\w-])", diagram)] == [], diagram
    table = text.split("## Steps\n", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| `([a-z-]+)`", table, re.M) == steps
    counting = r"\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\s+(?:\w+\s+)?steps\b"  # "six idempotent steps"
    for page in (README, DOCS / "lifecycle.md"):
        assert re.findall(counting, page.read_text(), re.I) == [], page.name


@pytest.mark.slow
def test_lifecycle_status_sample_is_what_status_prints() -> None:
    """`up` then `status` against the doubles, as scripts/sample_status.py runs them: docs/lifecycle.md shows that output."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "sample_status.py")], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    shown = docgen.block(DOCS / "lifecycle.md", "status-sample")
    assert shown is not None, "docs/lifecycle.md lost its status-sample markers"
    assert shown == f"```\n{r.stdout}```", "docs/lifecycle.md's status sample is stale: run `python scripts/sample_status.py --write`"
    assert "hourly cost: $9.55/h (estimate)" in r.stdout and "release cluster-autoscaler 9.59.0 deployed" in r.stdout


def test_lora_tables_are_the_planners_now(clean_env: object) -> None:
    """docs/lora.md's tables come from the planner: a change to its arithmetic or the registry is one run of
    scripts/lora_tables.py. The acceptance figures of issue 36 are in them: Qwen2.5-32B LoRA on 2 x g6.12xlarge
    (full fine-tuning needs 10), Qwen2.5-7B LoRA on one."""
    import lora_tables

    shown = docgen.block(DOCS / "lora.md", "lora-tables")
    assert shown is not None, "docs/lora.md lost its lora-tables markers"
    assert shown == lora_tables.tables(), "docs/lora.md's tables are stale: run `python scripts/lora_tables.py --write`"
    assert "| qwen2.5-32b | 32.8 B | 134.2 M | 2 · 10 | 2 · 10 |" in shown
    g6 = shown.split("#### g6.12xlarge", 1)[1].split("####", 1)[0]
    assert re.search(r"^\| qwen2\.5-7b \| LoRA r16 \| 1 \|", g6, re.M) and re.search(r"^\| qwen2\.5-32b \| LoRA r16 \| 2 \|", g6, re.M)
    assert all(f"| {m} |" in shown for m in lora_tables.MODELS) and "| tiny |" not in shown


@pytest.mark.parametrize("generator", ["config_table", "commands_doc", "api_doc", "lora_tables"])
def test_generators_run_as_scripts(generator: str) -> None:
    r = subprocess.run([sys.executable, str(REPO / "scripts" / f"{generator}.py")], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_the_iam_policy_in_docs_is_the_list_up_simulates() -> None:
    """docs/lifecycle.md's actions and minimal policy come from raydlc.lifecycle.permissions.NEEDS, the list `up`
    checks with IAM's simulator: a new action is one entry there and one run of scripts/iam_policy_doc.py."""
    import iam_policy_doc
    from raydlc.lifecycle import permissions

    shown = docgen.block(DOCS / "lifecycle.md", "iam-policy")
    assert shown is not None, "docs/lifecycle.md lost its iam-policy markers"
    assert shown == iam_policy_doc.text(), "docs/lifecycle.md's IAM policy is stale: run `python scripts/iam_policy_doc.py --write`"
    for need in permissions.NEEDS:
        assert all(f"`{a}`" in shown for a in need.actions)
    assert "arn:aws:iam::<account_id>:role/raydlc-<cluster>-<region>-ray-worker" in shown and "iam:PassRole" in shown
