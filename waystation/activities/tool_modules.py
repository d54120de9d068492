"""The deployment's tools, from the modules WAYSTATION_TOOLS names: one definition that
workers, the command line and the API all load, so a client refuses a task naming a tool
no worker offers without a second list to keep in step.

Each entry is `module` (every Tool defined at its top level, e.g. by `@tool`) or
`module:attribute` (a Tool, a ToolRegistry, an iterable of Tools, or a function without
arguments returning one of these). The default is the built-in tools' module
(waystation/settings/__init__.py).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from waystation.activities.agent_tools import agent_tool, agent_tools, agents_setting
from waystation.activities.tools import Tool, ToolDefinitionError, ToolRegistry
from waystation.workflows.models import AgentSpec


def load_tools(entries: Sequence[str], agents: str | None = None) -> ToolRegistry:
    """A registry of the tools `entries` name, in order, then the sub-agents they define and
    `agents` (WAYSTATION_AGENTS) holds, as agent__<name> tools (ToolDefinitionError, one
    sentence, for an entry that names no tools or a name two tools share)."""
    return ToolRegistry([*_tools_of(tuple(entries)), *agent_tools(agents_setting(agents))])


@functools.cache
def _tools_of(entries: tuple[str, ...]) -> tuple[Tool[Any], ...]:
    found: list[Tool[Any]] = []
    for entry in entries:
        found += [t for t in _entry_tools(entry) if not any(t is f for f in found)]
    return tuple(found)


def _entry_tools(entry: str) -> list[Tool[Any]]:
    module_name, _, attribute = entry.strip().partition(":")
    module = _import(module_name, entry)
    if not attribute:
        defined = vars(module).values()
        tools = [value for value in defined if isinstance(value, Tool)]
        tools += agent_tools(value for value in defined if isinstance(value, AgentSpec))
        if not tools:
            raise ToolDefinitionError(
                f"WAYSTATION_TOOLS names {entry!r}, which defines no tools at its top level "
                "(decorate functions with @tool, or name an attribute: module:attribute)"
            )
        return tools
    if not hasattr(module, attribute):
        raise ToolDefinitionError(
            f"WAYSTATION_TOOLS names {entry!r}, but {module_name} has no {attribute!r}"
        )
    value = getattr(module, attribute)
    if callable(value) and not isinstance(value, Tool | ToolRegistry):
        value = value()
    named = _as_tools(value)
    if named is None:
        raise ToolDefinitionError(
            f"WAYSTATION_TOOLS names {entry!r}, which is a {type(value).__name__}, not a Tool, "
            "a ToolRegistry or a list of Tools"
        )
    return named


def _as_tools(value: object) -> list[Tool[Any]] | None:
    if isinstance(value, Tool):
        return [value]
    if isinstance(value, AgentSpec):
        return [agent_tool(value)]
    if isinstance(value, ToolRegistry):
        return value.allowed(None)
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        items = [agent_tool(i) if isinstance(i, AgentSpec) else i for i in value]
        return items if all(isinstance(item, Tool) for item in items) else None
    return None


def _import(module_name: str, entry: str) -> ModuleType:
    """The module, found where Python looks or else in the working directory (as uvicorn
    finds an app): a console script such as `ws` does not look there by itself."""
    module = _found(module_name, entry)
    # A checkout's root links workflows/ and activities/ into the package: importing through
    # them would load a second copy of waystation's modules under other names.
    if not module_name.startswith("waystation.") and _inside_waystation(module):
        raise _moved(entry)
    return module


def _inside_waystation(module: ModuleType) -> bool:
    here = Path(__file__).resolve().parents[1]  # the waystation package
    where = getattr(module, "__file__", None)
    return where is not None and Path(where).resolve().is_relative_to(here)


def _moved(entry: str) -> ToolDefinitionError:
    return ToolDefinitionError(
        f"WAYSTATION_TOOLS names {entry!r}, which cannot be imported: waystation's own "
        f"modules are in the package waystation now (waystation.{entry})"
    )


def _found(module_name: str, entry: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        missing = err.name or ""
        missing_itself = module_name == missing or module_name.startswith(missing + ".")
        if not missing_itself or here in sys.path:
            raise _unimportable(entry, err) from err
        sys.path.insert(0, here)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as again:
            sys.path.remove(here)
            raise _unimportable(entry, again) from again


# Where waystation's own modules stood before it was one package (issue 38): a setting
# written then names them so.
_MOVED_TOP_LEVEL = ("activities", "workflows", "runtime", "testing")


def _unimportable(entry: str, err: ModuleNotFoundError) -> ToolDefinitionError:
    if (
        entry.split(".")[0] in _MOVED_TOP_LEVEL
        and (err.name or "").split(".")[0] == (entry.split(".")[0])
    ):
        return _moved(entry)
    return ToolDefinitionError(
        f"WAYSTATION_TOOLS names {entry!r}, which cannot be imported: {err} (run from the "
        "folder that holds it, or put it on PYTHONPATH)"
    )
