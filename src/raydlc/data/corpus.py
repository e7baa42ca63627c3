"""The bundled corpus: what a run trains on when `--data` names nothing, present on every install.

It is real English: the docstrings of the Python standard library, parsed (never imported)
from the running interpreter's source files, in a fixed order. `Document` is one training
example as the in-process readers (`sources.read_local`) return it too.
"""

from __future__ import annotations

import ast
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from raydlc.errors import InputError

BUNDLED = "bundled"
_SKIP_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__", "turtledemo"})
_MIN_DOC_CHARS = 40


@dataclass(frozen=True)
class Document:
    """One training example. `prompt` is context the loss ignores; `text` is learned."""

    text: str
    prompt: str = ""


def bundled_corpus(max_chars: int = 2_000_000) -> list[Document]:
    """Docstrings of the standard library: real prose and code, present on every Python install."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts))
    docs: list[Document] = []
    seen: set[str] = set()
    total = 0
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < _MIN_DOC_CHARS or doc in seen:
                continue
            seen.add(doc)
            docs.append(Document(doc))
            total += len(doc)
            if total >= max_chars:
                return docs
    if not docs:  # pragma: no cover - a Python without its sources
        raise InputError(
            f"no standard-library sources under {root} to build the bundled corpus from",
            hint="pass --data with a .txt or .jsonl file",
        )
    return docs
