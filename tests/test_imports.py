"""Rooms that say what they are: the planner never loads training, data never imports training, and
no module imports itself back.

The import graph is read from the source (every `import`, at module level or inside a function,
outside `if TYPE_CHECKING:`), so a cycle hidden in a lazy import counts as one. A second graph also
counts the imports under `if TYPE_CHECKING:`: inside one package (a room) even a cycle of types is
refused, and data reaches nothing of training by any import at all.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    return skip


def import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the raydlc modules it imports; with `type_checking`, those under `if TYPE_CHECKING:` too."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = set() if type_checking else _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t.startswith("raydlc") and t != name and t != "raydlc":
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                found.append([*stack[stack.index(n) :], n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def test_the_graph_sees_lazy_imports() -> None:
    g = import_graph()
    assert "raydlc.train.loop" in g["raydlc.train.launch"]  # imported inside _fit
    assert "raydlc.facts.models" in g["raydlc.planner.model"] and "raydlc.train.model" not in g["raydlc.planner.model"]


def test_no_import_cycle_inside_the_package() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_plan_and_preflight_load_nothing_of_training() -> None:
    code = "import raydlc.planner, raydlc.checks.preflight, sys; assert not any(m.startswith('raydlc.train') for m in sys.modules), sorted(sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


def room(module: str) -> str:
    """The package a module belongs to at the top: raydlc.train.loop -> raydlc.train; raydlc.errors -> raydlc."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and (SRC / parts[0] / parts[1]).is_dir() else parts[0]


def cycles_inside_rooms(graph: dict[str, set[str]]) -> dict[str, list[list[str]]]:
    """Each room's cycles over its own imports only."""
    members: dict[str, set[str]] = {}
    for m in graph:
        members.setdefault(room(m), set()).add(m)
    found = {r: cycles({m: graph[m] & ms for m in ms}) for r, ms in members.items()}
    return {r: c for r, c in found.items() if c}


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for n in graph[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return seen


def test_the_full_graph_sees_type_checking_imports() -> None:
    assert "raydlc.data.dataset" not in import_graph()["raydlc.train.runspec"]  # TrainData, a type only: under TYPE_CHECKING
    assert "raydlc.data.dataset" in import_graph(type_checking=True)["raydlc.train.runspec"]


def test_no_cycle_inside_a_package_counting_type_checking_imports() -> None:
    assert cycles_inside_rooms(import_graph(type_checking=True)) == {}


def test_the_room_cycle_finder_finds_a_type_cycle_and_ignores_one_across_rooms() -> None:
    g = {"raydlc.train.launch": {"raydlc.train.prepare"}, "raydlc.train.prepare": {"raydlc.train.launch"},
         "raydlc.errors": {"raydlc.config.schema"}, "raydlc.config.schema": {"raydlc.errors"}}
    assert cycles_inside_rooms(g) == {"raydlc.train": [["raydlc.train.launch", "raydlc.train.prepare", "raydlc.train.launch"]]}


def test_data_reaches_nothing_of_training_by_any_import() -> None:
    g = import_graph(type_checking=True)
    reach = {m: sorted(n for n in reached(g, m) if room(n) == "raydlc.train") for m in g if room(m) == "raydlc.data"}
    assert reach and {m: r for m, r in reach.items() if r} == {}


# The house's layers, top first. A room (a package under raydlc, or "raydlc" for the top-level
# modules) may import only rooms listed after it: the command line over the use cases and views,
# over the domain rooms (in this order), over the one edge per outside system, over what is known
# offline. Entry points that a person or a job runs may import anything.
LAYERS: list[tuple[str, list[str]]] = [
    ("command line", ["raydlc.cli"]),
    ("use cases and views", ["raydlc.api", "raydlc.views"]),
    ("domain", ["raydlc.train", "raydlc.evaluate", "raydlc.checks", "raydlc.jobs", "raydlc.lifecycle", "raydlc.render", "raydlc.discovery", "raydlc.capacity",
                "raydlc.data", "raydlc.planner", "raydlc.nccl"]),
    ("edges", ["raydlc.edges"]),
    ("knowledge", ["raydlc.config", "raydlc.facts", "raydlc.schemas", "raydlc"]),
]
ENTRY_POINTS = {"raydlc.__main__", "raydlc.train.__main__"}


def order() -> dict[str, int]:
    return {r: i for i, r in enumerate(r for _, rooms in LAYERS for r in rooms)}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    rank = order()
    return sorted(f"{m} -> {t}" for m, ts in graph.items() if m not in ENTRY_POINTS
                  for t in ts if room(m) != room(t) and rank[room(t)] <= rank[room(m)])


def test_every_room_has_its_place_in_the_layers() -> None:
    rooms = {room(m) for m in import_graph()}
    listed = [r for _, rs in LAYERS for r in rs]
    assert sorted(listed) == sorted(rooms) and len(set(listed)) == len(listed)


def test_dependencies_point_down_the_layers_only() -> None:
    assert upward_imports(import_graph(type_checking=True)) == []


def test_the_layer_check_finds_an_upward_import() -> None:
    g = {"raydlc.edges.kube": {"raydlc.render.auth"}, "raydlc.render.auth": {"raydlc.errors"}, "raydlc.errors": set(),
         "raydlc.data.order": {"raydlc.train.loop"}, "raydlc.train.loop": {"raydlc.data.order"}}
    assert upward_imports(g) == ["raydlc.data.order -> raydlc.train.loop", "raydlc.edges.kube -> raydlc.render.auth"]


def test_no_submodule_shadows_a_name_its_package_exports() -> None:
    """`import raydlc.lifecycle.status` once replaced `lifecycle.status`, the order, by the module: the second
    `raydlc status` in a process called a module. Every submodule imported, each exported name is still no module."""
    code = ("import importlib, pkgutil, types, raydlc\n"
            "pkgs = [m.name for m in pkgutil.walk_packages(raydlc.__path__, 'raydlc.') if m.ispkg]\n"
            "for m in pkgutil.walk_packages(raydlc.__path__, 'raydlc.'):\n"
            "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
            "bad = [f'{p}.{n}' for p in pkgs for n in getattr(importlib.import_module(p), '__all__', [])\n"
            "       if isinstance(getattr(importlib.import_module(p), n), types.ModuleType)]\n"
            "assert pkgs and not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
