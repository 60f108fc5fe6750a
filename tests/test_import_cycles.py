"""The package's imports form no cycle: the core never imports what is built on it.

Read from the source with ``ast``, so a deferred import inside a function counts too (it only
hides a cycle until the function runs). Imports under ``if TYPE_CHECKING:`` are annotations,
never executed, and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "clearformer"


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["clearformer", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST):
    """Every import statement, at any depth, except those only for type checkers."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that importing ``name`` runs (its own ancestors excluded: they are
    already running when it is imported)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            bases = [alias.name for alias in node.names]
            candidates = bases
        else:
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in candidates:
            if target not in modules:
                continue
            # Importing a.b.c runs a, a.b and a.b.c.
            parts = target.split(".")
            for i in range(2, len(parts) + 1):
                targets.add(".".join(parts[:i]))
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return targets - ancestors - {name, "clearformer"}


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize(
    "core",
    [
        "clearformer.options",
        "clearformer.checks",
        "clearformer.config",
        "clearformer.masks",
        "clearformer.padding",
        "clearformer.plan",
        "clearformer.kernels",
        "clearformer.attention.mha",
        "clearformer.blocks",
        "clearformer.encoder",
        "clearformer.model",
    ],
)
def test_the_core_never_imports_converters_or_applications(core):
    graph = import_graph()
    reached, todo = set(), [core]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    above = ("interop", "pretrained", "text", "explainer", "bench", "commands", "cli", "train")
    bad = sorted(m for m in reached if m.split(".")[1] in above)
    assert not bad, f"{core} imports {bad}"


def test_options_import_nothing_from_the_package():
    assert import_graph()["clearformer.options"] == set()


def test_the_checker_sees_a_cycle_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
