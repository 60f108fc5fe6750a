"""The package's imports form no cycle: the core never imports what is built on it.

Read from the source with ``ast``, so a deferred import inside a function counts too (it only
hides a cycle until the function runs), and so does an import under ``if TYPE_CHECKING:``: a
cycle of annotations is still two modules that each need the other to be read.

The readable core (the reference, attention, blocks, feed-forward, encoder, decoder) never
imports the fast paths (:mod:`clearformer.fast`); only the two seams that name implementations
do: :mod:`clearformer.routes` (the route choices) and :mod:`clearformer.kernels` (the table of
attention kernels a plan names).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "clearformer"
LAZY: dict[str, str] = {}  # the root's lazily imported names, read by import_graph()


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
    """Every import statement, at any depth, those only for type checkers included."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def lazy_exports() -> dict[str, str]:
    """The package root's lazily imported names (PEP 562 ``_EXPORTS``): name -> module."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets
        ):
            exports = ast.literal_eval(node.value)
            return {name: "clearformer" + module for name, module in exports.items()}
    return {}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that importing ``name`` runs.

    An import names its target explicitly (``from . import masks``: ``clearformer.masks``;
    ``from clearformer import explain``: the package root, whose ``__init__`` runs everything)
    and implies its parent packages (``clearformer.fast.varlen`` runs ``clearformer.fast``
    first). Explicit targets always count; implied parents that are ``name``'s own ancestors do
    not (they are already running when ``name`` is imported).
    """
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    explicit: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            explicit.update(alias.name for alias in node.names)
            continue
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in modules:
                explicit.add(submodule)
                continue
            explicit.add(base)
            if base == "clearformer" and alias.name in LAZY:
                # The root imports it on first use: importing the name runs that module.
                explicit.add(LAZY[alias.name])
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    targets: set[str] = set()
    for target in explicit:
        if target not in modules:
            continue  # outside the package
        targets.add(target)
        parts = target.split(".")
        targets.update(
            parent
            for parent in (".".join(parts[:i]) for i in range(1, len(parts)))
            if parent not in ancestors
        )
    return targets - {name}


def import_graph() -> dict[str, set[str]]:
    global LAZY
    LAZY = lazy_exports()
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


CORE = [
    "clearformer.reference",
    "clearformer.attention",
    "clearformer.attention.mha",
    "clearformer.blocks",
    "clearformer.feedforward",
    "clearformer.encoder",
    "clearformer.decoder_block",
    "clearformer.decoder",
]
SEAMS = ("clearformer.routes", "clearformer.kernels")  # where the plan names fast routes


@pytest.mark.parametrize("core", CORE)
def test_the_core_never_imports_the_fast_package(core):
    graph = import_graph()
    direct = sorted(m for m in graph[core] if m.split(".")[:2] == ["clearformer", "fast"])
    assert not direct, f"{core} imports {direct}"
    # Nor through any module but the two seams that name fast implementations.
    reached, todo = set(), [core]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in reached and nxt not in SEAMS:
                reached.add(nxt)
                todo.append(nxt)
    bad = sorted(m for m in reached if m.split(".")[:2] == ["clearformer", "fast"])
    assert not bad, f"{core} reaches {bad} other than through {SEAMS}"


def test_the_reference_imports_nothing_but_the_recorder():
    assert import_graph()["clearformer.reference"] == {"clearformer.tracing"}


def test_the_fast_paths_never_import_the_core_modules_they_serve():
    graph = import_graph()
    layers = {*CORE, *SEAMS, "clearformer.plan", "clearformer.forward_plan", "clearformer.model"}
    for name in graph:
        if name.split(".")[:2] == ["clearformer", "fast"]:
            bad = sorted((graph[name] & layers) - {"clearformer.reference"})
            assert not bad, f"{name} imports {bad}"


def test_options_import_nothing_from_the_package():
    assert import_graph()["clearformer.options"] == set()


def test_the_checker_sees_a_cycle_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def with_line_added(module: str, line: str, tmp_path: Path, monkeypatch) -> None:
    """Point the checker at a copy of the package whose ``module`` ends with ``line`` (inside
    a function when the line is indented)."""
    import shutil

    copy = tmp_path / "clearformer"
    shutil.copytree(PACKAGE, copy)
    path = copy / module
    text = path.read_text()
    if line.startswith(" "):
        text += f"\n\ndef _probe():\n{line}\n"
    else:
        text += f"\n{line}\n"
    path.write_text(text)
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", copy)


@pytest.mark.parametrize(
    "module,line",
    [
        ("options.py", "from . import TextEncoder"),  # through the package root
        ("encoder.py", "from clearformer import explain"),
        ("blocks.py", "from .interop.torch_nn import from_torch"),
        ("plan.py", "    from .encoder import Encoder"),  # deferred, inside a function
    ],
)
def test_the_checker_sees_an_import_back_into_the_package(module, line, tmp_path, monkeypatch):
    with_line_added(module, line, tmp_path, monkeypatch)
    assert cycles(import_graph())


@pytest.mark.parametrize(
    "module,line",
    [
        ("blocks.py", "from .fast import fused_blocks"),
        ("attention/mha.py", "    from ..fast.fused_linear import linear"),  # deferred
        ("reference.py", "if TYPE_CHECKING:\n    from .fast.varlen import attend"),
    ],
)
def test_the_checker_sees_the_core_importing_the_fast_package(module, line, tmp_path, monkeypatch):
    with_line_added(module, line, tmp_path, monkeypatch)
    core = "clearformer." + module.removesuffix(".py").replace("/", ".")
    with pytest.raises(AssertionError, match="imports"):
        test_the_core_never_imports_the_fast_package(core)
