"""benchmarks/lora_fall.py's other text: the standard library's code, its docstrings gone, still Python."""

from __future__ import annotations

import ast

from benchmarks.lora_fall import stdlib_code


def test_the_code_text_is_python_without_docstrings() -> None:
    text = stdlib_code(max_chars=60_000)
    assert len(text) >= 60_000 and "def " in text and "import " in text
    tree = ast.parse(text)  # unparsed modules joined: still one valid module
    documented = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and ast.get_docstring(n) is not None]
    assert not documented, [getattr(n, "name", "module") for n in documented[:5]]
