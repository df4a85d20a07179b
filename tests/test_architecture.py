"""The package's layers: every import, those inside functions included, points down the floors of
docs/architecture.md, and no modules import one another in a circle."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "celerity_jax")
FLOORS_DOC = os.path.join(ROOT, "docs", "architecture.md")


def _floors() -> list[list[str]]:
    """The units of each floor, in order: `name.py` for a module at the top of the package, `name/` for a
    subpackage, as the floors table of docs/architecture.md lists them."""
    with open(FLOORS_DOC, encoding="utf-8") as f:
        rows = [line.split("|") for line in f if re.match(r"\|\s*\d+\.", line)]
    return [re.findall(r"`([\w.]+/?)`", row[2]) for row in rows]


def _modules() -> dict[str, str]:
    """Dotted module name -> path of every Python module of the package."""
    out = {}
    for directory, _, names in os.walk(PACKAGE):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[dotted.removesuffix(".__init__")] = path
    return out


def _unit(module: str) -> str:
    """The floor unit of a dotted module name: its subpackage (`model/`) or its own file (`run.py`)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return f"{parts[1]}/" if len(parts) > 2 or os.path.isdir(os.path.join(PACKAGE, parts[1])) else f"{parts[1]}.py"


def _imports(module: str, path: str, modules: dict[str, str]) -> set[str]:
    """The package's modules that `module` imports anywhere in its file (relative imports resolved; `from a import
    b` names the module a.b where there is one)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return {m for m in out if m in modules and m != module}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, path, modules) for m, path in modules.items()}


def test_every_package_is_on_exactly_one_floor(graph):
    listed = [unit for floor in _floors() for unit in floor]
    assert len(listed) == len(set(listed)), "a unit is on two floors"
    assert set(listed) == {_unit(m) for m in graph}, "docs/architecture.md must list each package and top module"


def test_imports_point_down(graph):
    position = {unit: (i, j) for i, floor in enumerate(_floors()) for j, unit in enumerate(floor)}
    up = [f"{m} imports {d} ({_unit(d)}, floor {position[_unit(d)][0] + 1}, is not below {_unit(m)})"
          for m, deps in sorted(graph.items()) for d in sorted(deps)
          if _unit(d) != _unit(m) and position[_unit(d)] > position[_unit(m)]]
    assert not up, "imports that point up:\n" + "\n".join(up)


def test_no_modules_import_one_another_in_a_circle(graph):
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"modules that import one another: {cycles}"
