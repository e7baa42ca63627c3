#!/usr/bin/env python
"""docs/api.md, generated from `raydlc.api`: its docstring, then each exported name's signature, docstring and example.

    python scripts/api_doc.py            # print the page
    python scripts/api_doc.py --write    # write docs/api.md

What a use case must look like to be documented here: an exported function (a name in the
package's `_EXPORTS`) whose docstring ends with a line `Example:` and, below it, indented
Python code. The example is a whole program once `import raydlc.api as api` has run; a line
`# slow` in it marks it as a slow test. A function without an example is an error here, so
the page, and the test that runs every example (tests/test_api_doc.py), cover every function.
Exported classes (the result types) are documented with their signature and docstring.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docgen import DOCS, escape

PAGE = DOCS / "api.md"
PRELUDE = "import raydlc.api as api\n"
SLOW_MARK = re.compile(r"^\s*#\s*slow\b", re.M)
_WIDTH = 100  # a longer signature is written one parameter per line


class MissingExample(ValueError):
    """An exported function whose docstring does not end with its example."""


@dataclass(frozen=True)
class Example:
    """One `Example:` block: the exported name it belongs to, its code, and whether it is slow."""

    name: str
    code: str
    slow: bool


class _Raw:
    """An annotation shown as written (`from __future__ import annotations` leaves strings)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def split_example(doc: str) -> tuple[str, str | None]:
    """(the docstring without its example, the example's code), or (doc, None) without one."""
    lines = doc.splitlines()
    at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip() in ("Example:", "Examples:")), None)
    if at is None:
        return doc, None
    code = textwrap.dedent("\n".join(lines[at + 1 :])).strip("\n")
    code = "\n".join(_unprompt(line) for line in code.splitlines())
    return "\n".join(lines[:at]).rstrip(), (code + "\n") if code.strip() else None


def _unprompt(line: str) -> str:
    """Doctest prompts are shown as plain code: `>>> x` and `... x` become `x`."""
    for prompt in (">>> ", "... "):
        if line.startswith(prompt):
            return line[len(prompt) :]
    return line.rstrip() if line.strip() not in (">>>", "...") else ""


def exported(module: ModuleType) -> list[tuple[str, Any]]:
    """The package's exports in the order `_EXPORTS` lists them, each resolved from its module."""
    table: dict[str, str] = getattr(module, "_EXPORTS", {})
    return [(name, getattr(importlib.import_module(where), name)) for name, where in table.items()]


def examples(module: ModuleType) -> list[Example]:
    """Every exported function's example; a function without one is refused, naming it."""
    found: list[Example] = []
    for name, obj in exported(module):
        if not inspect.isfunction(obj):
            continue
        _, code = split_example(inspect.getdoc(obj) or "")
        if code is None:
            raise MissingExample(f"{module.__name__}.{name}: its docstring has no `Example:` block of code at its end")
        found.append(Example(name, code, bool(SLOW_MARK.search(code))))
    return found


def signature(name: str, obj: Any) -> str:
    """`name(params) -> ret` as the source writes it, one parameter per line when it is long."""
    sig = inspect.signature(obj)

    def raw(a: Any) -> Any:
        return _Raw(a) if isinstance(a, str) else a

    def default(d: Any) -> Any:  # a function's repr carries its address, which changes every run
        return _Raw(d.__name__) if inspect.isfunction(d) else d

    params = [p.replace(annotation=raw(p.annotation), default=default(p.default)) for p in sig.parameters.values()]
    sig = sig.replace(parameters=params, return_annotation=raw(sig.return_annotation))
    one_line = f"{name}{sig}"
    if len(one_line) <= _WIDTH:
        return one_line
    inner = str(sig.replace(return_annotation=inspect.Signature.empty))[1:-1]
    parts = _split_params(inner)
    ret = "" if sig.return_annotation is inspect.Signature.empty else f" -> {sig.return_annotation!r}"
    return f"{name}(\n" + "".join(f"    {p},\n" for p in parts) + f"){ret}"


def _split_params(inner: str) -> list[str]:
    """Split a parameter list at its top-level commas (defaults and annotations may hold some)."""
    parts, depth, cur = [], 0, ""
    for ch in inner:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [*parts, cur.strip()] if cur.strip() else parts


def prose(doc: str) -> str:
    """A docstring as Markdown: paragraphs stay, a block indented under a blank line becomes Python code."""
    out: list[str] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("    ") and (not out or not out[-1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            block = textwrap.dedent("\n".join(lines[i:j])).strip("\n")
            out += ["```python", block, "```", ""]
            i = j
            continue
        out.append(escape(line))
        i += 1
    return "\n".join(out).strip() + "\n"


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "", name.lower())


def entry(name: str, obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    text, code = split_example(doc) if inspect.isfunction(obj) else (doc, None)
    kind = "class " if inspect.isclass(obj) else ""
    parts = [f"## `{name}`", "", "```python", kind + signature(name, obj), "```", ""]
    if text.strip():
        parts += [prose(text)]
    if code is not None:
        parts += ["Example:", "", "```python", code.rstrip("\n"), "```", ""]
    return "\n".join(parts)


def render(module: ModuleType, generator: str = "scripts/api_doc.py") -> str:
    """The whole page for `module` (raydlc.api, or a module shaped like it)."""
    items = [(name, obj) for name, obj in exported(module) if inspect.isfunction(obj) or inspect.isclass(obj)]
    examples(module)  # refuses a function without an example before anything is written
    head = [
        f"# Python API: `{module.__name__}`",
        "",
        f"<!-- generated by {generator} --write from {module.__name__}; do not edit by hand -->",
        "",
        prose(inspect.getdoc(module) or ""),
        "Every example below runs as written after `import raydlc.api as api`, and each runs in the test",
        "suite (`tests/test_api_doc.py`) in a sandbox: a temporary HOME and working directory, no `RAYDLC_*`",
        "variable, a moto server as AWS, kmock as Kubernetes and the tool doubles on PATH.",
        "",
    ]
    if not items:
        return "\n".join([*head, "No use case is exported yet.", ""])
    index = [f"- [`{name}`](#{_anchor(name)}): {escape((inspect.getdoc(obj) or '').splitlines()[0] if inspect.getdoc(obj) else '')}"
             for name, obj in items]
    return "\n".join([*head, "## Contents", "", *index, "", *(entry(name, obj) for name, obj in items)]).rstrip() + "\n"


def main(argv: list[str]) -> int:
    module = importlib.import_module("raydlc.api")
    try:
        page = render(module)
    except MissingExample as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if argv == ["--write"]:
        changed = not PAGE.exists() or PAGE.read_text(encoding="utf-8") != page
        PAGE.write_text(page, encoding="utf-8")
        print(f"{PAGE}: {'updated' if changed else 'unchanged'}")
    elif not argv:
        sys.stdout.write(page)
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
