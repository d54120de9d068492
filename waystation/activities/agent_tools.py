"""Sub-agents as the model sees them: each definition becomes the tool `agent__<name>`.

A definition (`Agent`, i.e. waystation.workflows.models.AgentSpec) comes from Python, at the top
level of a module WAYSTATION_TOOLS names (beside its tools), or from WAYSTATION_AGENTS (a
JSON list, or a file holding one). Workers and clients load the same definitions, so a
client refuses a task naming an agent no worker offers. The tool carries the definition
into the call the LLM activity checks, so the child's task is recorded in history with
the call; no worker ever runs it (the workflow starts the child).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from waystation.activities.tools import (
    Tool,
    ToolContext,
    ToolDefinitionError,
    ToolError,
    ToolRegistry,
)
from waystation.settings.model_endpoints import ModelEndpoint
from waystation.settings.model_facts import fact_updates
from waystation.settings.validation import validation_sentence
from waystation.workflows.agents import AgentArgs
from waystation.workflows.models import AgentSpec

_SPECS: TypeAdapter[list[AgentSpec]] = TypeAdapter(list[AgentSpec])


def agent_tool(spec: AgentSpec) -> Tool[AgentArgs]:
    """The tool that offers `spec` to the model (arguments: its `task`)."""

    def started_by_the_workflow(args: AgentArgs, context: ToolContext) -> str:
        raise ToolError(f"{spec.tool_name} is a sub-agent: its task runs it, not a worker")

    return Tool(
        name=spec.tool_name,
        description=f"A sub-agent: {spec.description} Give it a self-contained task; its "
        "answer comes back as the result.",
        arguments=AgentArgs,
        function=started_by_the_workflow,
        retry_safe=True,  # no worker runs it: the child task is started once, by its id
        agent=spec,
    )


def agents_setting(value: str | None) -> list[AgentSpec]:
    """The definitions WAYSTATION_AGENTS holds: a JSON list (or one object), or the path
    of a file that holds one; ToolDefinitionError with a sentence otherwise."""
    if value is None or not value.strip():
        return []
    text = value
    if not value.lstrip().startswith(("[", "{")):
        try:
            text = Path(value).read_text(encoding="utf-8")
        except OSError as err:
            raise ToolDefinitionError(
                f"WAYSTATION_AGENTS is neither JSON nor a file that can be read ({err.strerror}: "
                f"{value})"
            ) from err
    try:
        loaded: Any = json.loads(text)
    except json.JSONDecodeError as err:
        raise ToolDefinitionError(f"WAYSTATION_AGENTS is not JSON: {err.msg}") from err
    try:
        return _SPECS.validate_python(loaded if isinstance(loaded, list) else [loaded])
    except ValidationError as err:
        problems = validation_sentence(err)
        raise ToolDefinitionError(f"WAYSTATION_AGENTS has a bad definition: {problems}") from err


def agent_tools(specs: Iterable[AgentSpec]) -> list[Tool[AgentArgs]]:
    return [agent_tool(spec) for spec in specs]


def with_model_facts(
    registry: ToolRegistry, endpoints: Mapping[str, ModelEndpoint]
) -> ToolRegistry:
    """The registry with each sub-agent's own model resolved as a task's is when it is
    created (settings/model_facts.py): the child task, started from the call this worker
    checks, then holds its window and way of structured output."""
    tools: list[Tool[Any]] = []
    changed = False
    for tool in registry.allowed(None):
        spec = tool.agent
        facts = fact_updates(spec.model, endpoints) if spec and spec.model else {}
        if spec is not None and spec.model is not None and facts:
            model = spec.model.model_copy(update=facts)
            tool = agent_tool(spec.model_copy(update={"model": model}))
            changed = True
        tools.append(tool)
    return ToolRegistry(tools) if changed else registry
