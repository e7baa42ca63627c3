"""The code's shape, read from the source: short functions, and a training loop with no test-only path.

Lengths count from a function's `def` line to its last line (nested functions and methods are
functions too). The loop's fault injection arrives as step hooks (train.faults); the loop module
itself names no crash, hang or injection and never ends its own process.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "raydlc"
LOOP = PACKAGE / "train" / "loop.py"
MAX_LINES = 80
MAX_TRAIN_LINES = 60
TEST_ONLY = ("crash", "hang", "inject", "fault")  # word starts: `faults`, `injected_hang`, not `default_sync`


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def length(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    assert fn.end_lineno is not None
    return fn.end_lineno - fn.lineno + 1


def docstrings(node: ast.AST) -> set[int]:
    return {
        id(n.body[0].value) for n in ast.walk(node)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and ast.get_docstring(n, clean=False) is not None
    }


def names(node: ast.AST, skip: set[int]) -> Iterator[str]:
    """Every identifier a piece of code reads, binds or defines, and its string constants but those in `skip`."""
    for n in ast.walk(node):
        if id(n) in skip:
            continue
        match n:
            case ast.Name(id=s) | ast.Attribute(attr=s) | ast.arg(arg=s) | ast.keyword(arg=str(s)):
                yield s
            case ast.FunctionDef(name=s) | ast.AsyncFunctionDef(name=s) | ast.ClassDef(name=s):
                yield s
            case ast.alias(name=s, asname=a):
                yield from (s, a or "")
            case ast.Constant(value=str(s)):
                yield s


def is_test_only(text: str) -> bool:
    words = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", text)
    return any(w.lower().startswith(TEST_ONLY) for w in words)


def loop_tree() -> ast.Module:
    return ast.parse(LOOP.read_text())


def loop_function(name: str) -> ast.FunctionDef:
    (fn,) = [f for f in loop_tree().body if isinstance(f, ast.FunctionDef) and f.name == name]
    return fn


def test_no_function_in_the_package_is_over_80_lines() -> None:
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{fn.lineno} {fn.name} ({length(fn)} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for fn in functions(ast.parse(path.read_text()))
        if length(fn) > MAX_LINES
    ]
    assert not long, "functions over 80 lines:\n" + "\n".join(long)


def test_the_measure_counts_what_it_should() -> None:
    tree = ast.parse("class A:\n    def m(self) -> None:\n        def inner() -> None:\n            pass\n\n        inner()\n")
    assert {f.name: length(f) for f in functions(tree)} == {"m": 5, "inner": 2}
    assert length(loop_function("_train")) > 20  # the real loop, not a stub that hides it


def test_the_training_loop_is_at_most_60_lines() -> None:
    assert length(loop_function("_train")) <= MAX_TRAIN_LINES


def test_the_loop_module_has_no_test_only_path() -> None:
    """Fault injection is the hooks' business (train.faults): the loop names none, only Ray's entry
    point hands the RunSpec's faults over as the hooks, and the loop calls them once per step."""
    tree = loop_tree()
    skip = docstrings(tree)
    (entry,) = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "train_func"]
    found = sorted({s for node in tree.body if node is not entry for s in names(node, skip) if is_test_only(s)})
    assert not found, f"test-only names in train/loop.py: {found}"
    assert {s for s in names(entry, skip) if is_test_only(s)} == {"faults"}  # `run.faults`, passed on as the hooks
    assert is_test_only("injected_hang") and is_test_only("print(f'[raydlc] injected failure')") and is_test_only("runFaults")
    assert not is_test_only("default_sync") and not is_test_only("exchange")
    calls = [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert "os._exit" not in calls and "time.sleep" not in calls
    in_train = [ast.unparse(n.func) for n in ast.walk(loop_function("_train")) if isinstance(n, ast.Call)]
    assert in_train.count("hooks.before_step") == 1
