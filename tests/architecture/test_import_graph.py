"""The import graph of `agent/`: no cycle, and no arrow from a lower layer back up.

The graph is read from the source with `ast`, not from `sys.modules`, so that
every import counts: module-level ones, the ones inside functions (deferred
for start-up time, which still tie the two modules together) and the ones
under `if TYPE_CHECKING:`. `from agent.x import y` counts as importing
`agent.x.y` when `y` is a submodule, else as importing `agent.x`. Importing
`agent.x.y` is not counted as importing its parent packages: every package's
`__init__` would otherwise be in a cycle with the modules it re-exports.
Imports of names built at run time (`importlib.import_module(name)`) are not
seen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PACKAGE = "agent"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE


@dataclass(frozen=True)
class Arrow:
    """One import: `source` imports `target` at `line` of `source`'s file."""

    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line})"


def module_name(path: Path) -> str:
    """`agent/context/tokens.py` -> `agent.context.tokens`; `agent/context/__init__.py` -> `agent.context`."""
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _known(name: str) -> str | None:
    """`name` if it is a module of the package, else its nearest ancestor that is one; None outside it."""
    while name:
        if name in modules():
            return name
        name = name.rpartition(".")[0]
    return None


def _absolute(source: str, node: ast.ImportFrom) -> str:
    """The module an `ImportFrom` names, with a relative import (`from . import x`) resolved against `source`."""
    if not node.level:
        return node.module or ""
    is_package = modules()[source].name == "__init__.py"
    base = source.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(source: str) -> Iterator[Arrow]:
    """Every import in `source`'s file of another module of the package, wherever in the file it stands."""
    tree = ast.parse(modules()[source].read_text(), filename=str(modules()[source]))
    for node in ast.walk(tree):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_known(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            named = _absolute(source, node)
            for alias in node.names:
                submodule = f"{named}.{alias.name}"
                targets.append(submodule if submodule in modules() else _known(named))
        for target in targets:
            if target is not None and target != source:
                yield Arrow(source, target, node.lineno)


@cache
def graph() -> dict[str, dict[str, Arrow]]:
    """For each module, the modules it imports, each with its first import line."""
    arrows: dict[str, dict[str, Arrow]] = {}
    for source in modules():
        arrows[source] = {}
        for arrow in sorted(imports_of(source), key=lambda a: a.line):
            arrows[source].setdefault(arrow.target, arrow)
    return arrows


def strongly_connected(edges: dict[str, dict[str, Arrow]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def shortest_cycle(component: list[str], edges: dict[str, dict[str, Arrow]]) -> list[Arrow]:
    """One shortest cycle through the component's first module, as the arrows that make it."""
    start, members = component[0], set(component)
    came_from: dict[str, Arrow] = {}
    frontier, seen = [start], {start}
    while frontier:
        following = []
        for node in frontier:
            for target, arrow in edges[node].items():
                if target == start:
                    path = [arrow]
                    while path[0].source != start:
                        path.insert(0, came_from[path[0].source])
                    return path
                if target in members and target not in seen:
                    seen.add(target)
                    came_from[target] = arrow
                    following.append(target)
        frontier = following
    raise AssertionError(f"{start} is in no cycle")  # pragma: no cover - a component always has one


def describe(component: list[str]) -> str:
    cycle = shortest_cycle(component, graph())
    route = " -> ".join([cycle[0].source, *(arrow.target for arrow in cycle)])
    lines = "; ".join(str(arrow) for arrow in cycle)
    return f"{route}  [{lines}]  (component: {', '.join(component)})"


def inside(module: str, *layers: str) -> bool:
    """Whether `module` is one of `layers` (dotted names) or inside one of them."""
    return any(module == layer or module.startswith(layer + ".") for layer in layers)


def test_the_graph_sees_every_kind_of_import():
    # A check of the reader itself, on imports the package is known to hold.
    assert modules()["agent"].name == "__init__.py" and "agent.context.tokens" in modules()
    assert "agent.errors" in graph()["agent"]  # module level
    assert "agent.responses" in graph()["agent.factory"]  # inside a function and under TYPE_CHECKING
    assert "agent.storage" in graph()["agent.factory"]  # `from agent.storage import open_storage`: the package


def test_the_agent_package_has_no_import_cycle():
    cycles = [describe(component) for component in strongly_connected(graph())]
    assert not cycles, "import cycles in agent/:\n" + "\n".join(cycles)


#: (lower layer, layers it must never import): each arrow would run back up.
NO_ARROW_BACK_UP = [
    ("agent.storage", ("agent.operations", "agent.responses", "agent.serving", "agent.cli")),
    ("agent.types", ("agent.messages",)),
    ("agent.views", ("agent.storage",)),
    ("agent.models", ("agent.context",)),
    ("agent.responses", ("agent.serving",)),
]


@pytest.mark.parametrize(("lower", "upper"), NO_ARROW_BACK_UP, ids=[f"{low} -/-> {'|'.join(up)}" for low, up in NO_ARROW_BACK_UP])
def test_no_arrow_runs_back_up(lower, upper):
    back_up = [
        str(arrow)
        for source, targets in graph().items()
        if inside(source, lower)
        for target, arrow in targets.items()
        if inside(target, *upper)
    ]
    assert not back_up, f"{lower} must not import {', '.join(upper)}:\n" + "\n".join(back_up)
