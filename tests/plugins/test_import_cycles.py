"""No import circles between the source files of the six distributions, and no function-local
imports that hide one.

Every import counts: at a module's top, inside a function (a deferred import breaks a circle
at run time but keeps it in the design), under ``if``/``try``. ``import a.b`` and
``from a import b`` (a submodule) count as an import of ``a/b.py``, not of ``a/__init__.py``
(which Python runs first for every submodule of ``a``: counting it would make every package a
circle with its own ``__init__``). ``from a import name`` (not a submodule) counts as ``a``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = ("everyo_core", "everyo_layers", "everyo_amp", "everyo_onnx", "everyo_dist",
                 "everyo_numba")

# The one deferral the architecture keeps (docs/architecture.md): Tensor.backward calls the
# engine, which builds Tensors. Listed by (importer, imported, function).
DOCUMENTED_DEFERRALS = {("everyo.tensor", "everyo.engine", "backward")}

# Known debt: import edges inside a circle, listed so that it cannot grow unseen. The test
# fails when an entry is no longer part of a circle, so this list only shrinks. (Empty: the
# last circles, everyo-layers' gradient ops and second_order.py, are gone.)
KNOWN_CIRCLE_EDGES: set = set()


def source_modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (path, is a package) for every source file."""
    found = {}
    for dist in DISTRIBUTIONS:
        src = ROOT / dist / "src"
        for path in src.rglob("*.py"):
            parts = list(path.relative_to(src).with_suffix("").parts)
            package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULES = source_modules()


def imports_of(module: str) -> list[tuple[str, ast.AST, str | None]]:
    """``(imported source module, import node, enclosing function or None)`` for every import
    in ``module`` that names another source file."""
    path, package = MODULES[module]
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, package, child):
                    if target in MODULES and target != module:
                        found.append((target, child, function))
            visit(child, function)

    visit(ast.parse(path.read_text()), None)
    return found


def _targets(module: str, package: bool, node) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if package else module.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    submodules = [f"{base}.{alias.name}" for alias in node.names
                  if f"{base}.{alias.name}" in MODULES]
    return submodules if len(submodules) == len(node.names) else submodules + [base]


def import_graph() -> dict[str, set[str]]:
    """module -> the source modules it imports, without the documented deferrals."""
    exempt = {(a, b) for a, b, _ in DOCUMENTED_DEFERRALS}
    return {module: {target for target, _, _ in imports_of(module)
                     if (module, target) not in exempt} for module in MODULES}


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The circles: components of more than one module, each reachable from each (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def circle_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    edges = set()
    for component in strongly_connected(graph):
        edges |= {(a, b) for a in component for b in graph[a] if b in component}
    return edges


def test_the_cycle_finder_finds_a_deferred_circle_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [{"a", "b", "c"}]
    assert circle_edges(graph) == {("a", "b"), ("b", "c"), ("c", "a")}


def test_the_import_finder_sees_deferred_relative_and_submodule_imports():
    found = {(target, function) for target, _, function in imports_of("everyo.tensor")}
    assert ("everyo.engine", "backward") in found  # deferred, inside Tensor.backward
    assert ("everyo.dispatch", None) in found
    # `from everyo import hooks` is an import of everyo/hooks.py, not of the package
    engine = {target for target, _, _ in imports_of("everyo.engine")}
    assert "everyo.hooks" in engine and "everyo" not in engine


def test_no_import_circles_between_source_files():
    edges = circle_edges(import_graph())
    new = edges - KNOWN_CIRCLE_EDGES
    assert not new, f"import circles (importer, imported): {sorted(new)}"
    gone = KNOWN_CIRCLE_EDGES - edges
    assert not gone, f"no longer part of a circle, remove from KNOWN_CIRCLE_EDGES: {sorted(gone)}"


@pytest.mark.parametrize("importer, imported, function", sorted(DOCUMENTED_DEFERRALS))
def test_a_documented_deferral_stays_inside_its_function(importer, imported, function):
    places = {(fn, isinstance(node, ast.ImportFrom)) for target, node, fn in imports_of(importer)
              if target == imported}
    assert places, f"{importer} no longer imports {imported}: remove the deferral from the list"
    assert {fn for fn, _ in places} == {function}, (
        f"{importer} imports {imported} outside {function}(): {sorted(places, key=str)}")


def function_local_imports(path: Path) -> list[tuple[str, int]]:
    """``(imported module, line)`` for each import inside a function or class of ``path``."""
    found = []

    def visit(node, nested):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.ClassDef))
            if nested and isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno) for alias in child.names)
            elif nested and isinstance(child, ast.ImportFrom):
                found.append(("." * child.level + (child.module or ""), child.lineno))
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return found


def ruff_settings() -> dict:
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+; ruff's settings are read only)
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]


def test_function_local_imports_are_known_debt_or_optional_dependencies():
    settings = ruff_settings()
    optional = settings["flake8-tidy-imports"]["banned-module-level-imports"]
    debt = {path for path, rules in settings["per-file-ignores"].items()
            if "PLC0415" in rules and "*" not in path}
    deferrals = {(MODULES[importer][0].relative_to(ROOT).as_posix(), imported)
                 for importer, imported, _ in DOCUMENTED_DEFERRALS}

    def hidden(path: Path) -> list:
        relative = path.relative_to(ROOT).as_posix()
        return [(module, line) for module, line in function_local_imports(path)
                if not any(module == o or module.startswith(o + ".") for o in optional)
                and (relative, module) not in deferrals]

    sources = [path for path, _ in MODULES.values()]
    undeclared = {f"{path.relative_to(ROOT)}:{line}: {module}" for path in sources
                  if path.relative_to(ROOT).as_posix() not in debt
                  for module, line in hidden(path)}
    # (ruff's PLC0415 refuses these too; this test also runs where ruff is not installed)
    assert not undeclared, sorted(undeclared)
    settled = sorted(path for path in debt if not hidden(ROOT / path))
    assert not settled, (f"no function-local import left to excuse, remove from pyproject.toml's "
                         f"per-file-ignores (a documented deferral then takes `# noqa: "
                         f"PLC0415`): {settled}")
