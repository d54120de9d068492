"""The layers of the package import one way (docs/architecture.md, "Layers").

    vocabulary, prices  <-  settings, workflows  <-  activities  <-  client
        <-  worker, servers  <-  cli

A module may import its own layer and the layers below it, never one above it nor a
sibling of the same rank (settings and workflows; worker and servers). The facade
(waystation/__init__.py) and the test kit (waystation.testing) sit on top. Imports that
only type checkers see (under `if TYPE_CHECKING:`) count too: a layer that needs an upper
layer's type is a layer in the wrong place. And no module takes part in an import cycle.
"""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio import activity

import waystation
from waystation.workflows import activity_contracts

PACKAGE = Path(waystation.__file__).parent

# The rank of each layer: a module imports only layers of lower rank, or its own.
LAYERS = {
    "waystation.vocabulary": 0,
    "waystation.prices": 0,
    "waystation.settings": 1,
    "waystation.workflows": 1,
    "waystation.activities": 2,
    "waystation.client": 3,
    "waystation.worker": 4,
    "waystation.servers": 4,
    "waystation.cli": 5,
    "waystation.testing": 6,
    "waystation": 7,  # the facade: everything a user imports from `waystation`
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    for size in range(len(parts), 0, -1):
        name = ".".join(parts[:size])
        if name in LAYERS and (size > 1 or module == "waystation"):
            return name
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS and the docs")


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, module: str) -> Iterator[tuple[str, int]]:
    """Every waystation module this file imports, anywhere in it (lazy imports too)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from waystation.x import y` may import the module waystation.x.y
                candidate = f"{base}.{alias.name}"
                yield (
                    (
                        candidate
                        if (PACKAGE.parent / candidate.replace(".", "/")).exists()
                        or (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists()
                        else base
                    ),
                    node.lineno,
                )


def package_imports() -> dict[str, list[tuple[str, int]]]:
    graph: dict[str, list[tuple[str, int]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        graph[module] = [
            (name, line)
            for name, line in imported(path, module)
            if name.split(".")[0] == "waystation"
        ]
    return graph


def test_no_module_imports_a_layer_above_its_own() -> None:
    wrong = []
    for module, names in package_imports().items():
        mine = layer_of(module)
        for name, line in names:
            theirs = layer_of(name)
            if theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                wrong.append(f"{module}:{line} imports {name} ({theirs} is not below {mine})")
    assert not wrong, "\n".join(wrong)


def test_the_layer_test_catches_an_upward_import(tmp_path: Path) -> None:
    """The check itself: a workflow module importing an activity is caught."""
    probe = tmp_path / "probe.py"  # read as if it were waystation/workflows/probe.py
    probe.write_text("from waystation.activities.llm import LlmActivities\n")
    names = list(imported(probe, "waystation.workflows.probe"))
    assert [layer_of(n) for n, _ in names] == ["waystation.activities"]
    assert LAYERS["waystation.activities"] >= LAYERS["waystation.workflows"]


def test_no_import_cycle() -> None:
    graph = {m: {n for n, _ in names if n != m} for m, names in package_imports().items()}
    # a name may be a package (its __init__) or a module; keep only the modules we have
    graph = {m: {n for n in names if n in graph} for m, names in graph.items()}
    # A package's __init__ importing its own submodules is how a package re-exports; a
    # cycle through that edge alone is not a layering problem.
    for module, names in graph.items():
        graph[module] = {n for n in names if not n.startswith(module + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _implementations() -> dict[str, typing.Callable[..., typing.Any]]:
    from waystation.activities.event_archive import ArchiveActivities
    from waystation.activities.llm import LlmActivities
    from waystation.activities.mcp.activities import McpActivities
    from waystation.activities.memory_recall import MemoryActivities
    from waystation.activities.notify.delivery import NotificationActivities
    from waystation.activities.tool_activities import ToolActivities
    from waystation.activities.turns import TurnActivities
    from waystation.worker.child_outcomes import ChildActivities
    from waystation.worker.scheduled_turns import ScheduledTurnActivities

    found: dict[str, typing.Callable[..., typing.Any]] = {}
    for cls in (
        ArchiveActivities,
        LlmActivities,
        McpActivities,
        NotificationActivities,
        ToolActivities,
        TurnActivities,
        ChildActivities,
        MemoryActivities,
        ScheduledTurnActivities,
    ):
        for _, method in inspect.getmembers(cls, inspect.isfunction):
            definition = activity._Definition.from_callable(method)
            if definition is not None:
                found[str(definition.name)] = method
    return found


@pytest.mark.parametrize("contract", activity_contracts.CONTRACTS, ids=lambda c: c.__name__)
def test_every_activity_contract_has_an_implementation_of_the_same_types(contract) -> None:
    name = str(activity._Definition.must_from_callable(contract).name)
    implementation = _implementations().get(name)
    assert implementation is not None, f"no activity implements the contract {name!r}"
    want = typing.get_type_hints(contract)
    have = typing.get_type_hints(implementation)
    assert list(have.items()) == list(want.items()), f"{name}: {have} is not {want}"


def test_the_worker_registers_every_contract(tmp_path: Path) -> None:
    """What build_worker registers is exactly the contracts the workflows schedule."""
    from waystation.activities.storage import Storage
    from waystation.activities.tools import ToolRegistry
    from waystation.settings import Settings
    from waystation.worker import served_activities

    settings = Settings(data_dir=tmp_path)
    served = served_activities(settings, ToolRegistry([]), Storage.from_settings(settings))
    registered = [str(activity._Definition.must_from_callable(f).name) for f in served.functions()]
    contracts = [
        str(activity._Definition.must_from_callable(c).name) for c in activity_contracts.CONTRACTS
    ]
    assert sorted(registered) == sorted(contracts)


OLD_TOP_LEVEL = ("workflows", "activities", "runtime", "testing", "worker", "starter")


def test_nothing_imports_the_roots_links_or_the_old_top_level_names() -> None:
    """The root's workflows/ and activities/ are links for readers and worker.py/starter.py
    scripts: importing them would load a second copy of a module under another name."""
    root = PACKAGE.parent
    wrong = []
    for folder in ("waystation", "tests", "bench", "scripts"):
        for path in sorted((root / folder).rglob("*.py")):
            for name, line in imported(path, "tests.probe"):
                if name.split(".")[0] in OLD_TOP_LEVEL:
                    wrong.append(f"{path.relative_to(root)}:{line} imports {name}")
    assert wrong == []
