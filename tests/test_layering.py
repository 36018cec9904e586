"""The layout's rules, checked statically: the import graph of `pytest_distperf` read from source.

Every import counts, at module level, inside functions and under `TYPE_CHECKING`; relative
imports are resolved. Rules (DESIGN.md, issue 22): no import cycle between two packages or two
sibling modules; `perfmodel` imports nothing from `strategies`; the pure and pytest-side parts
import nothing from `ranks`; `ranks` imports no pytest-side module and never pytest; and what a
part pulls in at import (module-level imports, followed through the package and the reference
model) never reaches torch where it must not. One fresh interpreter per side checks the
import for real, since a static graph cannot see `importlib` calls.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "pytest_distperf"
# Source roots: import name -> folder (the reference model installs as `distperf_model`).
SOURCES = {PACKAGE: ROOT / "pytest_distperf", "distperf_model": ROOT / "model"}

# part -> what importing any of its modules must never load (the module-level closure)
FORBIDDEN_AT_IMPORT = {
    "ranks": ("pytest", "_pytest", "lightning", "lightning_fabric"),
    "perfmodel": ("torch",),
    "judge": ("torch",),
    "store": ("torch",),
    "topology": ("torch",),
    "output": ("torch",),
    "strategies": ("torch", "lightning", "lightning_fabric"),
    "spec": ("torch", "pytest"),
    "platform": ("torch", "pytest"),
    "measured": ("torch", "pytest"),
    "calibrations": ("torch",),
    "options": ("torch",),
    "plugin": ("torch",),
    "fixture": ("torch",),
    "markers": ("torch",),
    "models": ("torch",),
    "launch": ("torch",),
    "jsonfields": ("torch",),
    "gitinfo": ("torch",),
    "header": ("torch",),
    "progress": ("torch",),
    "xdist": ("torch", "xdist"),
    "cli": ("torch",),
    "cli_predict": ("torch",),
    "cli_baselines": ("torch",),
    "work": ("torch", "pytest", "_pytest"),
}
PYTEST_SIDE = (
    "plugin",
    "fixture",
    "options",
    "markers",
    "xdist",
    "judge",
    "output",
    "store",
    "launch",
    "header",
    "progress",
    "cli",
    "cli_predict",
    "cli_baselines",
)
# part -> parts (of pytest_distperf) or top-level packages it must not import, even in a function
NEVER_IMPORTS = {
    "perfmodel": ("strategies", "ranks"),
    "judge": ("ranks",),
    "output": ("ranks",),
    "store": ("ranks",),
    "topology": ("ranks",),
    "models": ("ranks",),
    "ranks": (*PYTEST_SIDE, "pytest", "_pytest"),
    # the pure halves: not even a lazy import of torch, Lightning or the rank side
    "strategies": ("ranks", "torch", "lightning", "lightning_fabric", "distperf_model"),
    # the device kinds' records: read by both sides, the pure halves of the strategies too
    "platform": ("ranks", "strategies", "perfmodel", "torch", "pytest", "_pytest"),
    # the counted work: values both sides share (the rank side fills them in)
    "work": ("ranks", "torch", "pytest", "_pytest"),
}


# --------------------------------------------------------------------------- the graph


@dataclass(frozen=True)
class Import:
    target: str  # absolute module name; for `from m import name`, m.name when that is a module
    line: int
    at_import: bool  # runs when the importing module is imported (not in a function or
    # under TYPE_CHECKING)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of `from <level dots><name> import ...` written in `module`."""
    if not level:
        return name or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports_of(source: str, module: str, is_package: bool, known: Iterable[str]) -> list[Import]:
    """Every import statement in `source`, resolved to absolute module names."""
    known = set(known)
    found: list[Import] = []

    def visit(node: ast.AST, at_import: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, at_import)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            at_import = False
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno, at_import) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(sub if sub in known else base, node.lineno, at_import))
        for child in ast.iter_child_nodes(node):
            visit(child, at_import)

    visit(ast.parse(source), True)
    return found


@dataclass(frozen=True)
class Graph:
    imports: Mapping[str, tuple[Import, ...]]  # module -> its imports, in source order
    packages: frozenset[str]  # modules that are packages (an __init__.py)

    @property
    def modules(self) -> frozenset[str]:
        return frozenset(self.imports)


def build_graph(sources: Mapping[str, Path] = SOURCES) -> Graph:
    files: dict[str, tuple[Path, bool]] = {}
    for name, folder in sources.items():
        for path in folder.rglob("*.py"):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    imports = {
        module: tuple(imports_of(path.read_text(), module, is_package, files))
        for module, (path, is_package) in files.items()
    }
    return Graph(imports, frozenset(m for m, (_, pkg) in files.items() if pkg))


def _top(name: str) -> str:
    return name.split(".")[0]


def part_of(module: str) -> str:
    """`pytest_distperf.ranks.worker` -> "ranks"; a module outside the package: its top name."""
    parts = module.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 else parts[0]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


# --------------------------------------------------------------------------- cycles


def _edges(graph: Graph, node_of: dict[str, str]) -> dict[str, dict[str, tuple[str, int]]]:
    """node -> node it imports -> (importing module, line) of one such import."""
    edges: dict[str, dict[str, tuple[str, int]]] = {}
    for module, found in graph.imports.items():
        if module not in node_of:
            continue
        for imp in found:
            target = node_of.get(imp.target)
            if target is None or target == node_of[module]:
                continue
            # A package's __init__ re-exporting its own modules is no cycle worth breaking.
            if module in graph.packages and _within(imp.target, module):
                continue
            edges.setdefault(node_of[module], {}).setdefault(target, (module, imp.line))
    return edges


def find_cycles(edges: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """One cycle [a, b, ..., a] per strongly connected group of nodes (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: set[str] = set()
            while node not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return sorted(_cycle_in(edges, group) for group in groups)


def _cycle_in(edges: Mapping[str, Mapping[str, object]], group: set[str]) -> list[str]:
    """The shortest cycle through the group's first node, by breadth first search."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(edges.get(node, {})):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt in group and nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in {group}")


def cycles(graph: Graph) -> list[str]:
    """Cycles between the package's parts (top-level modules and subpackages), then between
    sibling modules inside each part, each as a path with the import that makes every step."""
    ours = [m for m in graph.modules if _top(m) == PACKAGE and m != PACKAGE]
    levels = [{m: part_of(m) for m in ours}]
    for part in sorted({part_of(m) for m in ours}):
        levels.append({m: m for m in ours if part_of(m) == part})
    found = []
    for node_of in levels:
        edges = _edges(graph, node_of)
        for cycle in find_cycles(edges):
            steps = [f"{a} -> {b} ({edges[a][b][0]}:{edges[a][b][1]})" for a, b in pairwise(cycle)]
            found.append("import cycle: " + "; ".join(steps))
    return found


# --------------------------------------------------------------------------- rules


def never_imports(graph: Graph, rules: Mapping[str, Iterable[str]] = NEVER_IMPORTS) -> list[str]:
    """Imports anywhere in a part (functions and TYPE_CHECKING too) of what it must not use."""
    found = []
    for module, imports in sorted(graph.imports.items()):
        if _top(module) != PACKAGE:
            continue
        banned = tuple(rules.get(part_of(module), ()))
        for imp in imports:
            if _top(imp.target) == PACKAGE:
                hit = part_of(imp.target) in banned and imp.target != PACKAGE
            else:
                hit = _top(imp.target) in banned
            if hit:
                found.append(f"{module}:{imp.line} imports {imp.target}")
    return list(dict.fromkeys(found))


def loaded_at_import(graph: Graph, module: str) -> dict[str, list[str]]:
    """What importing `module` loads, each with the chain of module-level imports that does:
    parent packages first, as Python runs them. Modules outside the sources end a chain."""
    chains: dict[str, list[str]] = {}
    todo = [(module, [module])]
    while todo:
        name, chain = todo.pop()
        if name in chains:
            continue
        chains[name] = chain
        parts = name.split(".")
        nexts = [".".join(parts[:i]) for i in range(1, len(parts))]
        nexts += [imp.target for imp in graph.imports.get(name, ()) if imp.at_import]
        todo.extend((n, [*chain, n]) for n in nexts if n not in chains)
    return chains


def forbidden_at_import(
    graph: Graph, rules: Mapping[str, Iterable[str]] = FORBIDDEN_AT_IMPORT
) -> list[str]:
    found = []
    for module in sorted(graph.modules):
        if _top(module) != PACKAGE or module == PACKAGE:
            continue
        banned = tuple(rules.get(part_of(module), ()))
        for name, chain in loaded_at_import(graph, module).items():
            if _top(name) in banned:
                found.append(f"importing {module} loads {name}: {' -> '.join(chain)}")
                break
    return found


# --------------------------------------------------------------------------- the checks


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph()


def test_the_graph_sees_the_package(graph: Graph) -> None:
    assert f"{PACKAGE}.plugin" in graph.modules and "distperf_model.model" in graph.modules
    worker = {imp.target for imp in graph.imports[f"{PACKAGE}.ranks.models"]}
    assert "torch" in worker and f"{PACKAGE}.perfmodel.shape" in worker


def test_no_import_cycles(graph: Graph) -> None:
    found = cycles(graph)
    assert not found, "\n".join(found)


def test_no_part_imports_what_it_must_not(graph: Graph) -> None:
    found = never_imports(graph)
    assert not found, "\n".join(found)


def test_no_part_loads_what_it_must_not_at_import(graph: Graph) -> None:
    found = forbidden_at_import(graph)
    assert not found, "\n".join(found)


def test_every_part_has_its_rule(graph: Graph) -> None:
    """A new top-level module or subpackage must be given its rule above."""
    parts = {part_of(m) for m in graph.modules if _top(m) == PACKAGE and m != PACKAGE}
    assert not parts - set(FORBIDDEN_AT_IMPORT), (
        f"no import rule for {parts - set(FORBIDDEN_AT_IMPORT)}"
    )


def test_no_module_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for folder in SOURCES.values()
        for p in folder.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert not long, f"modules over 500 lines (DESIGN.md: one role, at most ~500): {long}"


# --------------------------------------------------------------------------- each rule can fail


def _fake(tmp_path: Path, files: Mapping[str, str]) -> Graph:
    for name, text in files.items():
        path = tmp_path / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [tmp_path / PACKAGE, *(p for p in (tmp_path / PACKAGE).rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return build_graph({PACKAGE: tmp_path / PACKAGE})


def test_a_cycle_between_packages_is_found_with_its_path(tmp_path: Path) -> None:
    graph = _fake(
        tmp_path,
        {
            "perfmodel/predict.py": "def f():\n    from ..strategies import fsdp\n",
            "strategies/fsdp.py": "from pytest_distperf.perfmodel.predict import f\n",
        },
    )
    assert cycles(graph) == [
        "import cycle: perfmodel -> strategies (pytest_distperf.perfmodel.predict:2); "
        "strategies -> perfmodel (pytest_distperf.strategies.fsdp:1)"
    ]


def test_a_cycle_between_siblings_is_found_and_a_reexport_is_not_one(tmp_path: Path) -> None:
    siblings = {
        "perfmodel/__init__.py": "from .links import Links\nfrom .terms import GB\n",
        "perfmodel/links.py": "from pytest_distperf.perfmodel.terms import GB\n",
        "perfmodel/terms.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from .links import Links\n",
    }
    found = cycles(_fake(tmp_path, siblings))
    assert (
        len(found) == 1
        and "pytest_distperf.perfmodel.links -> pytest_distperf.perfmodel.terms" in found[0]
    )
    siblings["perfmodel/terms.py"] = "GB = 1e9\n"
    assert cycles(_fake(tmp_path, siblings)) == []


def test_a_forbidden_import_is_found_even_in_a_function(tmp_path: Path) -> None:
    graph = _fake(
        tmp_path,
        {
            "judge/gate.py": "def f():\n    from pytest_distperf.ranks import models\n",
            "ranks/models.py": "import torch\n",
            "ranks/worker.py": "from .. import plugin\n",
            "strategies/tp.py": "def build():\n    import torch.distributed\n",
            "plugin.py": "",
        },
    )
    assert never_imports(graph) == [
        "pytest_distperf.judge.gate:2 imports pytest_distperf.ranks.models",
        "pytest_distperf.ranks.worker:1 imports pytest_distperf.plugin",
        "pytest_distperf.strategies.tp:2 imports torch.distributed",
    ]


def test_torch_loaded_at_import_is_found_with_its_chain(tmp_path: Path) -> None:
    graph = _fake(
        tmp_path,
        {
            "models.py": "from pytest_distperf.perfmodel import shape\n"
            "def f():\n    import litgpt\n",
            "perfmodel/__init__.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    import torch\n",
            "perfmodel/shape.py": "from pytest_distperf.topology.cuda import probe\n",
            "topology/cuda.py": "try:\n    import torch\nexcept ImportError:\n    torch = None\n",
        },
    )
    rules = {"models": ("torch", "litgpt"), "perfmodel": ("torch",), "topology": ()}
    assert forbidden_at_import(graph, rules) == [
        "importing pytest_distperf.models loads torch: pytest_distperf.models -> "
        "pytest_distperf.perfmodel.shape -> pytest_distperf.topology.cuda -> torch",
        "importing pytest_distperf.perfmodel.shape loads torch: pytest_distperf.perfmodel.shape "
        "-> pytest_distperf.topology.cuda -> torch",
    ]


# --------------------------------------------------------------------------- for real


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_importing_the_plugin_and_the_pure_parts_loads_no_torch() -> None:
    """What a static graph cannot see (importlib, a plugin's entry points) shows here."""
    loaded = _loaded_after(
        "import pytest_distperf.plugin, pytest_distperf.cli, pytest_distperf.strategies\n"
        "import pytest_distperf.perfmodel, pytest_distperf.output.charts, pytest_distperf.models"
    )
    assert not {"torch", "lightning", "lightning_fabric", "litgpt"} & loaded
