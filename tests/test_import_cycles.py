"""Structure of the ``ppdlx`` package: no import cycles, no file over the size limit.

The import graph is read statically (``ast``, nothing is imported), so it sees imports that only
run later: those inside functions and methods as well as module-level ones. Edges:

* ``import a.b.c`` -> the module ``a.b.c``;
* ``from p import n`` (absolute or relative) -> ``p`` itself, because ``n`` is looked up in
  ``p``'s namespace: for a package that is its ``__init__`` and whatever it re-exports, so a
  submodule reading a name from its own package's ``__init__`` closes a cycle through the
  re-export; and -> ``p.n`` as well when ``n`` is a submodule;
* imports under ``if TYPE_CHECKING:`` never run and are not edges.

Importing ``a.b.c`` also runs ``a/b/__init__.py`` first; that implied edge is not counted (a package
that re-exports its submodules would otherwise always be a cycle).

Both checks are parametrised by sub-package (``ppdlx.data``, ``ppdlx.engine``, ... and ``ppdlx``
for the top-level modules), so ``-k data`` checks one area; a cycle is reported under every
sub-package it passes through.
"""
from __future__ import annotations

import ast
import os
from collections import deque

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "ppdlx"
MAX_LINES = 400


def _module_files() -> dict:
    """``{module name: file path}`` of every module under ``ppdlx/``."""
    out = {}
    for directory, dirs, files in os.walk(os.path.join(ROOT, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _module_files()


def _is_package(module: str) -> bool:
    return MODULES[module].endswith("__init__.py")


def _known_prefix(dotted: str):
    """The longest prefix of ``dotted`` that is a ppdlx module (``a.b.c`` may name ``a.b``'s attribute)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _type_checking_blocks(tree) -> set:
    """ids of the statements under ``if TYPE_CHECKING:`` (never executed)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                for stmt in node.body:
                    skipped.update(id(n) for n in ast.walk(stmt))
    return skipped


def _from_base(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _edges_of(module: str) -> list:
    """``[(imported module, line)]`` of one module, function-level imports included."""
    with open(MODULES[module], encoding="utf-8") as f:
        tree = ast.parse(f.read(), MODULES[module])
    skipped = _type_checking_blocks(tree)
    edges = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [_known_prefix(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(module, node)
            targets = [_known_prefix(base)]
            targets += [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
        else:
            continue
        edges += [(target, node.lineno) for target in targets if target and target != module]
    return edges


def import_graph() -> dict:
    """``{module: {imported module: first line}}`` over ``ppdlx/``."""
    graph = {}
    for module in MODULES:
        graph[module] = {}
        for target, line in _edges_of(module):
            graph[module].setdefault(target, line)
    return graph


def _strongly_connected(graph: dict) -> list:
    """Tarjan's components with more than one module (iterative: no recursion limit)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _shortest_cycle(graph: dict, component: list) -> list:
    """One shortest cycle inside a strongly connected component, as a module list ending at its start."""
    members = set(component)
    best = None
    for start in component:
        previous = {start: None}
        queue = deque([start])
        found = None
        while queue and found is None:
            node = queue.popleft()
            for child in graph[node]:
                if child == start:
                    found = node
                    break
                if child in members and child not in previous:
                    previous[child] = node
                    queue.append(child)
        if found is None:
            continue
        path = [start]
        node = found
        while node != start:
            path.insert(1, node)
            node = previous[node]
        path.append(start)
        if best is None or len(path) < len(best):
            best = path
    return best


def describe_cycle(graph: dict, cycle: list) -> str:
    steps = [f"{a} ({os.path.relpath(MODULES[a], ROOT)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps + [cycle[-1]])


def _area(module: str) -> str:
    """The sub-package a module belongs to (``ppdlx`` for the top-level modules)."""
    parts = module.split(".")
    if len(parts) >= 2 and f"{PACKAGE}.{parts[1]}" in MODULES and _is_package(f"{PACKAGE}.{parts[1]}"):
        return f"{PACKAGE}.{parts[1]}"
    return PACKAGE


AREAS = sorted({_area(m) for m in MODULES})


def test_areas_cover_the_package():
    assert {"ppdlx", "ppdlx.data", "ppdlx.engine", "ppdlx.export", "ppdlx.optim"} <= set(AREAS)
    assert len(MODULES) > 50


def test_cycle_finder_names_a_cycle_through_a_package_reexport():
    """The rules themselves, on a small graph: a re-export read back by the submodule is a cycle."""
    graph = {"p": {"p.impl": 3}, "p.impl": {"p": 7, "p.base": 2}, "p.base": {}}
    components = _strongly_connected(graph)
    assert components == [["p", "p.impl"]]
    assert _shortest_cycle(graph, components[0]) in (["p", "p.impl", "p"], ["p.impl", "p", "p.impl"])
    assert _strongly_connected({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) == []


@pytest.mark.parametrize("area", AREAS)
def test_no_import_cycle_through(area):
    graph = import_graph()
    cycles = [f"{describe_cycle(graph, _shortest_cycle(graph, component))}  [all modules on it: {', '.join(component)}]"
              for component in _strongly_connected(graph) if any(_area(m) == area for m in component)]
    assert not cycles, f"import cycles through {area}:\n" + "\n".join(cycles)


@pytest.mark.parametrize("area", AREAS)
def test_no_file_over_the_size_limit(area):
    too_long = []
    for module, path in MODULES.items():
        if _area(module) != area:
            continue
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            too_long.append(f"{os.path.relpath(path, ROOT)}: {lines} lines")
    assert not too_long, f"files over {MAX_LINES} lines (split by concern):\n" + "\n".join(too_long)
