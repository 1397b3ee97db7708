"""Imports point down only (ARCHITECTURE.md): the package-level import graph of sqlsdc has no
cycles, and the pure algorithms of ``tabular/`` use no database, catalog, guard or job.

The graph is read from the source with ``ast`` (every ``import``/``from … import`` anywhere in
a module, function-level imports included; ``if TYPE_CHECKING:`` blocks excluded, as they never
run). A node is a subpackage of sqlsdc (``guard``, ``tabular``, …), a top-level module
(``release``, ``admin``) or ``cli``.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"sqlsdc": ROOT / "sqlsdc", "cli": ROOT / "cli"}

PURE = ("tabular", "microdata")
"""Packages of pure algorithms: arrays and DataFrames in, arrays and DataFrames out."""

ABOVE_PURE = ("admin", "catalog", "engines", "guard", "jobs", "rewrite", "release", "cli")
"""What a pure package must not import."""

KNOWN_CYCLES: set[frozenset[str]] = set()
"""Cycles between packages still open. The list may only shrink: a new cycle fails the test,
and so does a listed one that is gone."""


def _node(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "cli":
        return "cli"
    if parts[0] != "sqlsdc" or len(parts) < 2:
        return None
    if parts[1] == "cli":
        return "cli"
    return parts[1]


def _module_name(path: Path) -> str:
    for top, folder in SOURCES.items():
        if path.is_relative_to(folder):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            return ".".join(["sqlsdc" if top == "sqlsdc" else "sqlsdc.cli", *parts])
    raise AssertionError(path)


def _is_module(name: str) -> bool:
    parts = name.split(".")
    top = SOURCES["cli"] if parts[:2] == ["sqlsdc", "cli"] else SOURCES["sqlsdc"]
    rest = parts[2:] if parts[:2] == ["sqlsdc", "cli"] else parts[1:]
    path = top.joinpath(*rest)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str) -> set[str]:
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)  # `from sqlsdc import x`: x is a module or a name
                found.update(f"{node.module}.{a.name}" for a in node.names
                             if _is_module(f"{node.module}.{a.name}"))  # fmt: skip
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@cache
def import_graph() -> dict[str, set[str]]:
    """Package-level graph: node -> nodes it imports (self-imports left out). Read once per test
    process (0.7 s of parsing every source file); the tests only read it."""
    graph: dict[str, set[str]] = {}
    for folder in SOURCES.values():
        for path in folder.rglob("*.py"):
            module = _module_name(path)
            source = _node(module) or "sqlsdc"
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            targets = {_node(m) for m in _imports(ast.parse(path.read_text()), package)}
            graph.setdefault(source, set()).update(t for t in targets if t and t != source)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Pairs of nodes that reach each other (every cycle shows up as such pairs)."""

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reachable = {node: reach(node) for node in graph}
    return {
        frozenset({a, b})
        for a in graph
        for b in reachable[a]
        if a != b and a in reachable.get(b, set())
    }


def test_the_graph_is_read():
    graph = import_graph()
    assert {"guard", "rewrite", "catalog", "tabular", "jobs", "engines", "cli"} <= set(graph)
    assert "catalog" in graph["jobs"] and "tabular" in graph["jobs"]


def test_pure_algorithms_import_no_database_layer():
    graph = import_graph()
    for package in PURE:
        assert not graph[package] & set(ABOVE_PURE), (
            f"{package}/ imports {sorted(graph[package] & set(ABOVE_PURE))}; move the code that "
            "reads or stores data to sqlsdc/jobs/"
        )


def test_no_import_cycles_between_packages():
    found = cycles(import_graph())
    new = found - KNOWN_CYCLES
    assert not new, f"import cycles between packages: {sorted(sorted(c) for c in new)}"
    gone = KNOWN_CYCLES - found
    assert not gone, f"remove the fixed cycles from KNOWN_CYCLES: {sorted(sorted(c) for c in gone)}"


def test_the_engines_do_not_import_the_guard_or_the_jobs():
    graph = import_graph()
    assert not graph["engines"] & {"guard", "jobs", "rewrite", "catalog"}


def test_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {
        frozenset({"a", "b"}), frozenset({"b", "c"}), frozenset({"a", "c"})
    }  # fmt: skip
    assert cycles({"a": {"b"}, "b": set()}) == set()


ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def documented_layers() -> dict[str, int]:
    """The layers ARCHITECTURE.md draws under "Layering": node -> its line, 0 at the top."""
    text = ARCHITECTURE.read_text().split("lines below its own:", 1)[1]
    block = text.split("```text", 1)[1].split("```", 1)[0]
    lines = [line for line in block.strip().splitlines() if line.strip()]
    return {name.strip(): i for i, line in enumerate(lines) for name in line.split(",")}


def test_the_documented_layers_are_the_imports():
    """Every package and top-level module is on a line of the drawing, and imports only
    what is drawn below it (the drawing once put tabular/ under policy/, which it imports)."""
    graph, layers = import_graph(), documented_layers()
    assert set(graph) - {"sqlsdc"} <= set(layers), sorted(set(graph) - {"sqlsdc"} - set(layers))
    upward = sorted(f"{a} -> {b}" for a, targets in graph.items() if a in layers
                    for b in targets if b in layers and layers[b] <= layers[a])  # fmt: skip
    assert not upward, f"ARCHITECTURE.md's layers disagree with the imports: {upward}"


def test_the_architecture_document_names_every_module():
    """A reader finds every module of sqlsdc/ in ARCHITECTURE.md (by its file name), and every
    ``name.py`` the document names exists in the repository."""
    text = ARCHITECTURE.read_text()
    modules = [p for p in SOURCES["sqlsdc"].rglob("*.py") if p.name != "__init__.py"]
    unnamed = sorted(str(p.relative_to(ROOT)) for p in modules
                     if not re.search(rf"(?<![\w.]){re.escape(p.name)}\b", text))  # fmt: skip
    assert not unnamed, f"modules ARCHITECTURE.md does not name: {unnamed}"
    files = {p.name for p in ROOT.rglob("*.py")}
    absent = sorted(set(re.findall(r"\b\w+\.py\b", text)) - files)
    assert not absent, f"ARCHITECTURE.md names files that do not exist: {absent}"


MAPPED_ELSEWHERE = ("server", "synth")
"""Packages whose entry in the layout map points to a section of their own for their modules."""


def test_the_layout_map_names_each_module_under_its_package():
    """The map under "Layout: the pipeline" names every module of a package in that package's
    entry, so ``ckm.py`` under ``rewrite/`` is the rewrite's (a name anywhere in the document
    was enough before, and the map lacked 35 modules of guard/, planner/, rewrite/ and
    engines/, parse.py, plan.py and validate.py among them)."""
    block = ARCHITECTURE.read_text().split("## Layout: the pipeline", 1)[1]
    block = block.split("```text", 1)[1].split("```", 1)[0]
    entries: dict[str, list[str]] = {}
    package = None
    for line in block.splitlines():
        if found := re.match(r"  (\w+)/ ", line):
            package = found[1]
        elif re.match(r" {0,2}\S", line):  # a top-level entry or module: no package any more
            package = None
        if package:
            entries.setdefault(package, []).append(line)
    unnamed = []
    for directory in sorted(p for p in SOURCES["sqlsdc"].iterdir() if (p / "__init__.py").exists()):
        if directory.name in MAPPED_ELSEWHERE:
            continue
        text = "\n".join(entries.get(directory.name, []))
        unnamed += [str(p.relative_to(ROOT)) for p in sorted(directory.glob("*.py"))
                    if p.name != "__init__.py"
                    and not re.search(rf"(?<![\w.]){re.escape(p.name)}\b", text)]  # fmt: skip
    assert not unnamed, f"modules the layout map does not name under their package: {unnamed}"


def test_only_the_engines_import_duckdb_or_pyspark():
    """ARCHITECTURE.md: ``engines/`` holds the only modules that import duckdb or pyspark, so a
    second engine replaces one package (``demo/data.py`` imported duckdb for its error class)."""
    importers = []
    for path in SOURCES["sqlsdc"].rglob("*.py"):
        if path.is_relative_to(SOURCES["sqlsdc"] / "engines"):
            continue
        package = _module_name(path).rpartition(".")[0]
        found = _imports(ast.parse(path.read_text()), package)
        if any(m.split(".")[0] in ("duckdb", "pyspark") for m in found):
            importers.append(str(path.relative_to(ROOT)))
    assert not importers, f"import duckdb or pyspark outside sqlsdc/engines/: {sorted(importers)}"
