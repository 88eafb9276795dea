"""The structure docs/DESIGN.md describes, held against the code of ``ppdlx/`` and ``deploy/``: the layers (each
imports only from below itself), no import cycle, imports at the top of a module (inside a function only for an
optional third-party package, with the reason beside it), no task, family or dataset name compared as a string
outside the task plug-ins, and no file over the size limit.

The import graph is read statically (``ast``, nothing is imported), so it sees imports that only run later:
those inside functions and methods as well as module-level ones. Edges:

* ``import a.b.c`` -> the module ``a.b.c``;
* ``from p import n`` (absolute or relative) -> ``p`` itself, because ``n`` is looked up in ``p``'s namespace:
  for a package that is its ``__init__`` and whatever it re-exports, so a submodule reading a name from its own
  package's ``__init__`` closes a cycle through the re-export; and -> ``p.n`` as well when ``n`` is a submodule;
* imports under ``if TYPE_CHECKING:`` never run and are not edges.

Importing ``a.b.c`` also runs ``a/b/__init__.py`` first; that implied edge is not counted (a package that
re-exports its submodules would otherwise always be a cycle).

Every check of ``ppdlx`` is parametrised by area (``ppdlx.data``, ``ppdlx.engine``, ... ``ppdlx`` for the package's
own ``__init__``), so ``-k data`` checks one area; a cycle is reported under every area it passes through.
``deploy/`` (``ppdlx_deploy``) is checked as one package.
"""
from __future__ import annotations

import ast
import os
import re
from collections import deque

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 400
# Where each package's code lives (deploy/python/ppdlx_deploy is deployed without ppdlx).
SOURCES = {"ppdlx": os.path.join(ROOT, "ppdlx"), "ppdlx_deploy": os.path.join(ROOT, "deploy", "python", "ppdlx_deploy"),
           "ppdlx_triton": os.path.join(ROOT, "deploy", "triton", "ppdlx_triton")}

# The layers of ppdlx, bottom up: a module imports from its own area and from the layers below its area's, never
# from an area beside it in the same layer nor above it. docs/DESIGN.md draws the same order.
LAYERS = (
    ("ppdlx.errors", "ppdlx.cpu_features"),                                 # what everything may raise and read
    ("ppdlx", "ppdlx.registry", "ppdlx.config"),                             # the package, registries, the config
    ("ppdlx.cpu_env", "ppdlx.dist", "ppdlx.processes", "ppdlx.ops"),         # processes; the compiled CPU ops
    ("ppdlx.layers",),                                                       # building blocks, their CPU kernels
    ("ppdlx.models", "ppdlx.data", "ppdlx.optim", "ppdlx.losses"),
    ("ppdlx.weights", "ppdlx.evaluation", "ppdlx.analysis"),
    ("ppdlx.checkpoint",),
    ("ppdlx.sparsity",),
    ("ppdlx.tasks",),                                                        # the task plug-ins
    ("ppdlx.engine",),                                                       # the loop, steps, hooks, run assembly
    ("ppdlx.export",),
    ("ppdlx.quantization",),
)
LAYER_OF = {area: level for level, areas in enumerate(LAYERS) for area in areas}

# Third-party packages a module may import inside a function: optional ones (an extra of setup.py, a runtime
# deploy/ serves with when installed), and scikit-learn / SciPy, which only the per-class analysis reads and
# which take seconds to import (a missing one skips the analysis, never a run).
OPTIONAL_PACKAGES = {"matplotlib", "visualdl", "onnx", "onnxruntime", "onnxoptimizer", "paddle2onnx", "torch",
                     "torchvision", "timm", "effdet", "nvidia", "pycocotools", "safetensors", "openvino", "tensorrt",
                     "sklearn", "scipy"}
# deploy/ imports paddle on use, never at the top (ppdlx_deploy's docstring: MKL's switch comes first, and an
# onnxruntime or OpenVINO deployment loads no Paddle), so there paddle is one of the optional packages.
OPTIONAL_PACKAGES_IN = {"ppdlx": OPTIONAL_PACKAGES, "ppdlx_deploy": OPTIONAL_PACKAGES | {"paddle"},
                        "ppdlx_triton": OPTIONAL_PACKAGES | {"paddle", "tritonclient"}}
# The modules that may compare a task, family or dataset name: the task plug-ins (deploy/: its post-processing,
# which turns each family's outputs into results; deploy/triton: serving, the same for a served model).
TASK_NAMES = {"classification", "detection", "image_folder", "coco"}
TASK_PLUGINS = {"ppdlx": ("ppdlx.tasks",), "ppdlx_deploy": ("ppdlx_deploy.postprocess",),
                "ppdlx_triton": ("ppdlx_triton.serving",)}


def _module_files() -> dict:
    """``{module name: file path}`` of every module of ``ppdlx`` and ``ppdlx_deploy``."""
    out = {}
    for package, top in SOURCES.items():
        for directory, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(directory, name)
                parts = [package] + os.path.relpath(path, top)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                out[".".join(parts)] = path
    return out


MODULES = _module_files()
TREES = {module: ast.parse(open(path, encoding="utf-8").read(), path) for module, path in MODULES.items()}


def _is_package(module: str) -> bool:
    return MODULES[module].endswith("__init__.py")


def _known_prefix(dotted: str):
    """The longest prefix of ``dotted`` that is a module here (``a.b.c`` may name ``a.b``'s attribute)."""
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


def _imports(module: str) -> list:
    """``[(node, in a function, imported names)]`` of one module; a name is the dotted module an ``import``
    names, or ``base.name`` for each name of a ``from base import name``."""
    skipped = _type_checking_blocks(TREES[module])
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if id(child) in skipped:
                continue
            if isinstance(child, ast.Import):
                out.append((child, in_function, [alias.name for alias in child.names]))
            elif isinstance(child, ast.ImportFrom):
                base = _from_base(module, child)
                out.append((child, in_function, [base] + [f"{base}.{alias.name}" for alias in child.names]))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    visit(TREES[module], False)
    return out


def _edges_of(module: str) -> list:
    """``[(imported module, line, in a function)]`` of one module, function-level imports included."""
    edges = []
    for node, in_function, names in _imports(module):
        if isinstance(node, ast.Import):
            targets = [_known_prefix(name) for name in names]
        else:
            base, members = names[0], names[1:]
            targets = [_known_prefix(base)] + [name for name in members if name in MODULES]
        edges += [(target, node.lineno, in_function) for target in targets if target and target != module]
    return edges


def import_graph() -> dict:
    """``{module: {imported module: first line}}`` over ``ppdlx/`` and ``deploy/``."""
    graph = {}
    for module in MODULES:
        graph[module] = {}
        for target, line, _ in _edges_of(module):
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
    """The sub-package or top-level module a module belongs to (``ppdlx`` for the package's own ``__init__``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else parts[0]


def _where(module: str, line: int) -> str:
    return f"{os.path.relpath(MODULES[module], ROOT)}:{line}"


AREAS = sorted({_area(m) for m in MODULES if m.startswith("ppdlx.") or m == "ppdlx"})
DEPLOY = ("ppdlx_deploy", "ppdlx_triton")  # deploy/python and deploy/triton, each checked as one package
def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _in(area: str):
    """The modules an area checks: one area of ppdlx, or a whole deploy package."""
    return (lambda module: _in_package(module, area)) if area in DEPLOY else (lambda module: _area(module) == area)


# ------------------------------------------------------------------------------------------ the rules on small cases
def test_areas_cover_the_package():
    assert {"ppdlx", "ppdlx.data", "ppdlx.engine", "ppdlx.export", "ppdlx.optim", "ppdlx.tasks"} <= set(AREAS)
    assert len(MODULES) > 80
    unplaced = sorted(area for area in AREAS if area not in LAYER_OF)
    assert not unplaced, f"modules in no layer (add them to LAYERS and docs/DESIGN.md): {unplaced}"


def test_cycle_finder_names_a_cycle_through_a_package_reexport():
    """The rules themselves, on a small graph: a re-export read back by the submodule is a cycle."""
    graph = {"p": {"p.impl": 3}, "p.impl": {"p": 7, "p.base": 2}, "p.base": {}}
    components = _strongly_connected(graph)
    assert components == [["p", "p.impl"]]
    assert _shortest_cycle(graph, components[0]) in (["p", "p.impl", "p"], ["p.impl", "p", "p.impl"])
    assert _strongly_connected({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) == []


def test_the_checks_find_what_they_look_for():
    """Each check on a module written for it: a function-level import of a required package, one of an optional
    package without a reason, and a task name compared as a string are found; what is allowed is not."""
    code = ("import os\n"
            "def f(cfg):\n"
            "    import yaml\n"
            "    import onnx\n"
            "    import onnxruntime  # optional: only ONNX exports\n"
            "    if cfg.data.dataset == 'coco' or cfg.task in ('classification', 'x'):\n"
            "        return {'detection': 1}['detection']\n")
    tree = ast.parse(code)
    found = [(line, name) for line, name, _ in _function_imports_in(tree, code.splitlines())]
    assert found == [(3, "yaml"), (4, "onnx")]
    assert [line for line, _ in _task_compares_in(tree)] == [6, 6]


# ------------------------------------------------------------------------------------------------------- the checks
def _cycles_through(in_area) -> list:
    graph = import_graph()
    return [f"{describe_cycle(graph, _shortest_cycle(graph, component))}  [all modules on it: {', '.join(component)}]"
            for component in _strongly_connected(graph) if any(in_area(m) for m in component)]


@pytest.mark.parametrize("area", AREAS + list(DEPLOY))
def test_no_import_cycle_through(area):
    cycles = _cycles_through(_in(area))
    assert not cycles, f"import cycles through {area}:\n" + "\n".join(cycles)


@pytest.mark.parametrize("area", AREAS)
def test_imports_come_from_lower_layers(area):
    """A module imports from its own area and from layers below it: never from beside it (``models`` knows nothing
    of ``data``) nor above it, inside a function or not."""
    wrong = []
    for module in MODULES:
        if _area(module) != area or not module.startswith("ppdlx"):
            continue
        for target, line, _ in _edges_of(module):
            other = _area(target)
            if other == area or not target.startswith("ppdlx") or target.startswith("ppdlx_deploy"):
                continue
            if LAYER_OF.get(other, len(LAYERS)) >= LAYER_OF[area]:
                wrong.append(f"{_where(module, line)}: {module} imports {target} ({other} is "
                             f"{'beside' if LAYER_OF.get(other) == LAYER_OF[area] else 'above'} {area})")
    assert not wrong, "imports against the layers (docs/DESIGN.md):\n" + "\n".join(wrong)


def test_deploy_imports_no_ppdlx():
    """deploy/ serves exports without ppdlx installed: it sits beside the layers, below nothing of ppdlx."""
    wrong = [f"{_where(module, line)}: {module} imports {target}" for module in MODULES
             if module.split(".")[0] in DEPLOY
             for target, line, _ in _edges_of(module) if target == "ppdlx" or target.startswith("ppdlx.")]
    assert not wrong, "\n".join(wrong)


def _optional_backend(target: str) -> bool:
    """A module of this tree whose own top-level imports need an optional package (a DALI backend)."""
    return target in MODULES and any(
        not in_function and name.split(".")[0] in OPTIONAL_PACKAGES
        for _, in_function, names in _imports(target) for name in names[:1])


def _function_imports_in(tree, lines, backend=lambda names: False, optional=OPTIONAL_PACKAGES) -> list:
    """``[(line, imported name, has a reason)]`` of the imports inside functions that the rule refuses: anything but
    an optional package (or a module of ours that needs one: ``backend(names)``), and those without a comment
    giving the reason (on the line, or the line above)."""
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.Import):
                    name, names = child.names[0].name, [alias.name for alias in child.names]
                else:
                    name = "." * child.level + (child.module or "")
                    names = [name] + [f"{name}.{alias.name}".replace("..", ".") for alias in child.names]
                allowed = name.split(".")[0] in optional or backend(names)
                reason = "#" in lines[child.lineno - 1] or lines[child.lineno - 2].strip().startswith("#")
                if not allowed or not reason:
                    found.append((child.lineno, name, allowed))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    visit(tree, False)
    return found


def _function_import_problems(in_area) -> list:
    problems = []
    for module, path in MODULES.items():
        if not in_area(module):
            continue
        lines = open(path, encoding="utf-8").read().splitlines()

        def backend(names, module=module):
            return any(_known_prefix(_from_name(module, n)) == _from_name(module, n) and
                       _optional_backend(_from_name(module, n)) for n in names)
        for line, name, allowed in _function_imports_in(TREES[module], lines, backend,
                                                         OPTIONAL_PACKAGES_IN[module.split(".")[0]]):
            why = "no comment giving the reason" if allowed else "not an optional package: import it at the top"
            problems.append(f"{_where(module, line)}: import {name} inside a function ({why})")
    return problems


def _from_name(module: str, name: str) -> str:
    """A relative name (``.x``) as the dotted module it names from ``module``."""
    level = len(name) - len(name.lstrip("."))
    if not level:
        return name
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    rest = name[level:]
    return f"{package}.{rest}" if rest else package


@pytest.mark.parametrize("area", AREAS + list(DEPLOY))
def test_imports_inside_functions_only_for_optional_packages(area):
    """Imports stand at the top of their module; inside a function only an optional third-party package (or a
    module of ours that needs one, e.g. a DALI backend), with the reason in a comment beside it."""
    problems = _function_import_problems(_in(area))
    assert not problems, "\n".join(problems)


def _task_compares_in(tree) -> list:
    """``[(line, name)]`` of comparisons (``==``, ``!=``, ``in``, ``not in``) with a task, family or dataset name."""
    def strings(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [v for element in node.elts for v in strings(element)]
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for value in [v for side in [node.left, *node.comparators] for v in strings(side)]:
                if value in TASK_NAMES:
                    found.append((node.lineno, value))
    return sorted(found)


def _tool_trees() -> dict:
    tools = os.path.join(ROOT, "tools")
    return {os.path.join("tools", name): ast.parse(open(os.path.join(tools, name), encoding="utf-8").read())
            for name in sorted(os.listdir(tools)) if name.endswith(".py")}


def _task_compares_outside_plugins(in_area) -> list:
    return [f"{_where(module, line)}: '{name}'" for module in MODULES if in_area(module)
            and not any(_in_package(module, p) for p in TASK_PLUGINS[module.split(".")[0]])
            for line, name in _task_compares_in(TREES[module])]


@pytest.mark.parametrize("area", AREAS + ["tools", *DEPLOY])
def test_no_task_name_compared_outside_the_task_plugins(area):
    """Nothing outside the task plug-ins asks which task, family or dataset a run is by its name: callers ask the
    task object (``ppdlx.tasks.task_of``), and a name read from a file selects its plug-in through a registry
    (deploy/: its post-processing is where an export's family decides)."""
    if area == "tools":
        found = [f"{path}:{line}: '{name}'" for path, tree in _tool_trees().items()
                 for line, name in _task_compares_in(tree)]
    else:
        found = _task_compares_outside_plugins(_in(area))
    assert not found, "task, family or dataset names compared as strings (ask the task object):\n" + "\n".join(found)


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


def test_the_design_document_draws_these_layers():
    """docs/DESIGN.md names every area of LAYERS in its picture, each layer on its own line, bottom up."""
    with open(os.path.join(ROOT, "docs", "DESIGN.md"), encoding="utf-8") as f:
        picture = f.read().split("```")[1]
    rows = [re.findall(r"[a-z_]+(?:/[a-z_]+)?", line) for line in picture.splitlines()]
    levels = []
    for areas in LAYERS:
        names = {a.split(".", 1)[1] if "." in a else "ppdlx" for a in areas}
        level = next((i for i, row in enumerate(rows) if names <= {w.rstrip("/") for w in row}), None)
        assert level is not None, f"docs/DESIGN.md: no line of the picture names {sorted(names)} together"
        levels.append(level)
    assert levels == sorted(levels, reverse=True), "docs/DESIGN.md: the picture's layers are not in LAYERS' order"
