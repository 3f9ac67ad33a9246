"""The package's layering: no import cycle between hiveroute's parts, however it is written.

Every import in hiveroute/ counts: at the top of a module, under TYPE_CHECKING, inside a
function, and `importlib.import_module("...")` with a constant name. A part is a subpackage
(hiveroute.gateway, hiveroute.routing, ...) or a top-level module (hiveroute.config,
hiveroute.assembly, ...). docs/architecture.md draws the layers this test enforces.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import hiveroute

PACKAGE = Path(hiveroute.__file__).parent

# The layers of docs/architecture.md, lowest first: a part imports only parts of lower layers
# (and, within a layer, never in a circle).
LAYERS: list[set[str]] = [
    {"errors", "lifecycle", "runtime"},
    {"config", "metadata", "extras"},
    {"engines"},
    {"kvindex"},
    {"protocols"},
    {"routing"},
    {"observability"},
    {"state"},
    {"gateway"},
    {"workflows"},
    {"assembly"},
    {
        "server",
        "serve_command",
        "workers",
        "sim",
        "bench",
        "integrations",
        "client",
        "cli",
        "__main__",
    },
]


def module_name(path: Path) -> str:
    names = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if names[-1] == "__init__":
        names.pop()
    return ".".join(names)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """The modules a module's source imports, wherever the statement is; `from X import y`
    counts as X (y may be a name, not a module)."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            else:
                found.add(node.module or "")
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(str(node.args[0].value))
    return {m for m in found if m == "hiveroute" or m.startswith("hiveroute.")}


def part_of(module: str) -> str | None:
    names = module.split(".")
    return names[1] if len(names) > 1 else None


def all_imports() -> dict[str, set[str]]:
    """Module -> the hiveroute modules it imports, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        found[name] = imported_modules(path.read_text(), name, path.name == "__init__.py")
    return found


def part_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, imports in all_imports().items():
        source = part_of(module)
        if source is None:
            continue
        targets = graph.setdefault(source, set())
        targets.update(t for m in imports if (t := part_of(m)) is not None and t != source)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        visiting.append(node)
        for target in sorted(graph.get(node, ())):
            if target in visiting:
                return [*visiting[visiting.index(target) :], target]
            if target not in done and (found := visit(target)) is not None:
                return found
        visiting.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done and (found := visit(node)) is not None:
            return found
    return None


def test_every_import_names_a_module_that_exists() -> None:
    """An import left behind by a move (even inside a function) is caught here, not in use."""
    missing = sorted(
        f"{module} imports {target}"
        for module, imports in all_imports().items()
        for target in imports
        if importlib.util.find_spec(target) is None
    )
    assert not missing, missing


def test_no_import_cycle_between_parts() -> None:
    cycle = find_cycle(part_graph())
    assert cycle is None, "import cycle between parts of hiveroute: " + " -> ".join(cycle or [])


def test_every_part_imports_only_lower_layers() -> None:
    layer_of = {part: i for i, layer in enumerate(LAYERS) for part in layer}
    graph = part_graph()
    unplaced = sorted(set(graph) - set(layer_of))
    assert not unplaced, f"parts in no layer (add them to LAYERS and the doc): {unplaced}"
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if layer_of[target] >= layer_of[source] and layer_of[source] != len(LAYERS) - 1
    )
    assert not upward, f"imports of a part's own layer or a higher one: {upward}"


def test_the_walk_sees_every_kind_of_import() -> None:
    source = (
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "import hiveroute.config\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n    from hiveroute.gateway import app\n"
        "def f():\n    from hiveroute.workflows.service import WorkflowService\n"
        "    importlib.import_module('hiveroute.state.redis')\n"
    )
    assert imported_modules(source, "hiveroute.routing.x") == {
        "hiveroute.config",
        "hiveroute.routing",
        "hiveroute.gateway",
        "hiveroute.workflows.service",
        "hiveroute.state.redis",
    }


def test_a_cycle_is_found() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
