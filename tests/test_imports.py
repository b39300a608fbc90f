"""The modules of `worker/` import one another without a circle, not even one a type checker sees.

A circle makes the order of imports matter (a module half-initialised when the next one asks it for a name) and
makes mypy check its modules as one unit. The graph is read from the source: every `import` and `from ... import`
anywhere in a module, those under `if TYPE_CHECKING:` and inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "worker"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, level: int, importer: str, is_package: bool) -> str:
    """The absolute name of `from <level dots><module> import ...` written in `importer`."""
    if level == 0:
        return module
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module or "", node.level, name, is_package)
                # `from . import library` names a module; `from .keys import IndexKeys` a name in one
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names]
            else:
                continue
            edges.update(target for target in targets if target in paths and target != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_the_imports_it_must_see() -> None:
    graph = import_graph()
    assert "worker.connection" in graph["worker.replies"]  # under `if TYPE_CHECKING:`
    assert "worker.library" in graph["worker.index"]  # `from . import library`
    assert "worker.keytypes" in graph["worker.commands.check"]  # inside a function
    assert "worker.commands._shared" in graph["worker.commands.check"]


def test_find_cycle_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])
