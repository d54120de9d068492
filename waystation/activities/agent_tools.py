"""Sub-agents as the model sees them: each definition becomes the tool `agent__<name>`.

A definition (`Agent`, i.e. waystation.workflows.models.AgentSpec) comes from Python, at the top
level of a module WAYSTATION_TOOLS names (beside its tools), or from WAYSTATION_AGENTS (a
JSON list, or a file holding one). A client resolves the ones a task may call into the
task when it starts (`AgentTask.agents`), and the LLM activity offers the task's (`TaskTools`;
a task created before tasks held them: its worker's). The tool carries the definition into
the call the LLM activity checks, so the child's task is recorded in history with the
call; no worker ever runs it (the workflow starts the child).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
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

# Tool registries a worker keeps for tasks' sets of sub-agent definitions (TaskTools).
REGISTRIES_KEPT = 32

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


def spec_with_facts(spec: AgentSpec, endpoints: Mapping[str, ModelEndpoint]) -> AgentSpec:
    """`spec` with its own model resolved as a task's is when it is created (settings/
    model_facts.py): its child task then holds its window and way of structured output."""
    facts = fact_updates(spec.model, endpoints) if spec.model is not None else {}
    if spec.model is None or not facts:
        return spec
    return spec.model_copy(update={"model": spec.model.model_copy(update=facts)})


def with_model_facts(
    registry: ToolRegistry, endpoints: Mapping[str, ModelEndpoint]
) -> ToolRegistry:
    """The registry with each sub-agent's own model resolved (`spec_with_facts`): a task
    that holds no definitions starts its child from the call this worker checks."""
    tools: list[Tool[Any]] = []
    changed = False
    for tool in registry.allowed(None):
        spec = tool.agent
        if spec is not None and (resolved := spec_with_facts(spec, endpoints)) is not spec:
            tool = agent_tool(resolved)
            changed = True
        tools.append(tool)
    return ToolRegistry(tools) if changed else registry


class TaskTools:
    """The tools a model call offers and checks: the worker's, with the sub-agents the task
    holds in place of the worker's own (a task that holds none: the worker's). Registries
    are kept for the last few sets of definitions (tasks of one deployment share one)."""

    def __init__(self, registry: ToolRegistry, kept: int = REGISTRIES_KEPT) -> None:
        self._registry = registry
        self._own = [tool for tool in registry.allowed(None) if tool.agent is None]
        self._kept = kept
        self._registries: OrderedDict[str, ToolRegistry] = OrderedDict()

    def of(self, agents: Sequence[AgentSpec] | None) -> ToolRegistry:
        if agents is None:
            return self._registry
        key = json.dumps([spec.model_dump(mode="json") for spec in agents], sort_keys=True)
        registry = self._registries.get(key)
        if registry is None:
            registry = ToolRegistry([*self._own, *agent_tools(agents)])
            self._registries[key] = registry
            while len(self._registries) > self._kept:
                self._registries.popitem(last=False)
        self._registries.move_to_end(key)
        return registry
