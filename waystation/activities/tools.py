"""The tool registry: what a tool is, its arguments, its approval rule.

A tool is a typed function (sync or async) with a pydantic argument model (its JSON schema
is what the model sees) and metadata: approval rule, idempotency, timeout. `@tool`
(activities/function_tools.py) builds one from a plain function. Tool errors never crash a
task: they come back as an error observation the model can act on.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import posixpath
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError
from typing_extensions import TypeIs

from waystation.activities import bounded_json
from waystation.activities.storage import LedgerAttempt
from waystation.activities.storage.memory import MemoryStore
from waystation.settings.validation import validation_sentence
from waystation.vocabulary import ApprovalRule
from waystation.workflows.models import AgentSpec, ToolCall

MAX_OBSERVATION_CHARS = 16_000
SCRATCH_DIR = "scratch"
OUTPUTS_DIR = ".tool-outputs"  # whole outputs too long to send, readable with read_file


class ToolError(Exception):
    """An expected failure a tool reports to the model (bad path, file missing, ...)."""


class ToolDefinitionError(ValueError):
    """A tool defined so that it cannot be offered (the message is one sentence saying why)."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool gets besides its arguments."""

    workspace: Path
    idempotency_key: str
    """`workflow_id/step/call_id`: the same on every retry of the same call."""
    ledger: LedgerAttempt
    """Where a side-effecting tool claims its idempotency key and records what it did (the
    ledger every worker of the deployment shares, as this attempt of the call sees it)."""
    environment: Mapping[str, str] | None = None
    """The environment of programs the tool starts (activities/program_environment.py);
    None: the minimal one, with no variable passed on."""
    memory: MemoryStore | None = None
    """The deployment's memory store (the memory tools', activities/memory_tools.py)."""
    memory_namespace: str | None = None
    """The task's memory namespace, for the memory tools only."""


ArgumentsT = TypeVar("ArgumentsT", bound=BaseModel)
AsyncToolFunction = Callable[[ArgumentsT, ToolContext], Awaitable[str]]
SyncToolFunction = Callable[[ArgumentsT, ToolContext], str]
ToolFunction = AsyncToolFunction[ArgumentsT] | SyncToolFunction[ArgumentsT]
# What OpenAI accepts as a function name; MCP tools are the ones named server__tool.
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _is_async(function: ToolFunction[ArgumentsT]) -> TypeIs[AsyncToolFunction[ArgumentsT]]:
    return inspect.iscoroutinefunction(function)


def json_object_arguments(tool: str, raw_arguments: str) -> dict[str, Any] | str:
    """A call's arguments as the JSON object they must be, or the problem with them."""
    try:
        parsed = bounded_json.loads(raw_arguments or "{}")
    except json.JSONDecodeError as err:
        return f"the arguments of {tool} are not valid JSON ({err.msg} at {err.pos})"
    except bounded_json.TooDeepError as err:
        return f"the arguments of {tool} are {err}; send them flatter"
    if not isinstance(parsed, dict):
        return f"the arguments of {tool} must be a JSON object"
    return parsed


@dataclass(frozen=True)
class Tool(Generic[ArgumentsT]):
    """A tool the model may call: `function(arguments, context)` with `arguments` validated
    by the `arguments` model. A definition that cannot be offered raises
    ToolDefinitionError here, with a sentence."""

    name: str
    description: str
    arguments: type[ArgumentsT]
    function: ToolFunction[ArgumentsT]
    approval: ApprovalRule = "never"
    retry_safe: bool = False
    """A retry of the same call (same idempotency key) cannot do its effect twice, by nature
    or through the ledger. False (the default): the call runs at most once, and an attempt
    lost with its worker is reported to the model as maybe done, never run again."""
    timeout_seconds: float = 60.0
    local: bool = False
    """Fast (milliseconds) and pure: run as a local activity, in the worker that runs the
    workflow task, instead of a round trip through the server. Only for retry-safe tools
    that finish well within the workflow's LOCAL_TOOL_TIMEOUT (10 s)."""
    agent: AgentSpec | None = None
    """A sub-agent offered as this tool (`agent__<name>`): the workflow runs it as a child
    task, never a worker (activities/agent_tools.py)."""

    def __post_init__(self) -> None:
        if not TOOL_NAME.fullmatch(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r} must be 1 to 64 letters, digits, '_' or '-'"
            )
        if "__" in self.name and not (self.agent and self.name == self.agent.tool_name):
            raise ToolDefinitionError(
                f"tool {self.name!r}: names with '__' are MCP tools (server__tool)"
            )
        if not self.description.strip():
            raise ToolDefinitionError(
                f"tool {self.name!r} has no description: it is what the model reads to "
                "choose the tool"
            )
        if self.local and not self.retry_safe:
            raise ToolDefinitionError(
                f"tool {self.name!r} is local but not retry-safe: a local call runs again "
                "with its workflow task, so declare it retry_safe=True (or not local)"
            )
        if self.timeout_seconds <= 0:
            raise ToolDefinitionError(f"tool {self.name!r}: its timeout must be above 0 s")
        try:
            self.arguments.model_json_schema()
        except Exception as err:  # pydantic's several schema errors, each a sentence
            raise ToolDefinitionError(
                f"tool {self.name!r}: its arguments have no JSON schema ({err})"
            ) from err

    async def call(self, arguments: ArgumentsT, context: ToolContext) -> str:
        if _is_async(self.function):
            return await self.function(arguments, context)
        # Plain functions run in a thread so the activity's heartbeat keeps beating.
        return await asyncio.to_thread(self.function, arguments, context)

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools` entry for this tool."""
        parameters = self.arguments.model_json_schema()
        parameters.pop("title", None)
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }


def names_scratch(path: str) -> bool:
    """Whether `path`, as written, lies in the workspace's scratch/ folder. Decided on the
    text alone (no I/O, the same on every worker); the file tools refuse a path named so
    that a link leads out of scratch/ (activities/workspace_files.py)."""
    normalized = posixpath.normpath(path.replace("\\", "/"))
    inside = normalized == SCRATCH_DIR or normalized.startswith(SCRATCH_DIR + "/")
    return inside and not posixpath.isabs(normalized)


def _path_outside_scratch(arguments: dict[str, Any]) -> bool:
    return not names_scratch(str(arguments.get("path", "")))


def approval_needed(rule: ApprovalRule, arguments: dict[str, Any]) -> str | None:
    """Why a call with these arguments needs approval under `rule`, or None if it does not."""
    if rule == "always":
        return "this tool always needs approval"
    if rule == "outside_scratch" and _path_outside_scratch(arguments):
        return f"writes outside the workspace's {SCRATCH_DIR}/ folder"
    return None


class ToolRegistry:
    """Tools by name. Built once in worker.py and shared by the LLM and tool activities."""

    def __init__(self, tools: Iterable[Tool[Any]] = ()) -> None:
        self._tools: dict[str, Tool[Any]] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool[Any]) -> None:
        """Add `tool`; ToolDefinitionError if another tool has its name."""
        if tool.name in self._tools:
            raise ToolDefinitionError(
                f"two tools are named {tool.name!r}: a name offers the model one tool"
            )
        self._tools[tool.name] = tool
        # Built once: generating a JSON schema on every model call is a measurable cost.
        self._schemas[tool.name] = tool.schema()

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool[Any] | None:
        return self._tools.get(name)

    def allowed(self, names: list[str] | None) -> list[Tool[Any]]:
        if names is None:
            return list(self._tools.values())
        return [self._tools[n] for n in names if n in self._tools]

    def schemas(self, names: list[str] | None) -> list[dict[str, Any]]:
        """The `tools` entries the model is offered (shared: callers must not change them)."""
        return [self._schemas[tool.name] for tool in self.allowed(names)]

    def check_call(
        self,
        call_id: str,
        name: str,
        raw_arguments: str,
        allowed: list[str] | None,
        policy: dict[str, ApprovalRule],
    ) -> ToolCall:
        """Parse and validate a model's tool call; decide whether it needs approval."""
        call = ToolCall(call_id=call_id, tool=name, raw_arguments=raw_arguments)
        tool = self.get(name)
        if tool is None or (allowed is not None and name not in allowed):
            offered = ", ".join(t.name for t in self.allowed(allowed)) or "none"
            call.problem = f"unknown tool {name!r}; the tools you can call are: {offered}"
            return call
        parsed = json_object_arguments(name, raw_arguments)
        if isinstance(parsed, str):
            call.problem = parsed
            return call
        try:
            validated = tool.arguments.model_validate(parsed)
        except ValidationError as err:
            call.problem = f"invalid arguments for {name}: {validation_sentence(err, 'arguments')}"
            return call
        call.arguments = validated.model_dump(mode="json")
        call.retry_safe = tool.retry_safe
        call.local = tool.local and tool.retry_safe
        call.agent = tool.agent
        reason = approval_needed(policy.get(name, tool.approval), call.arguments)
        call.needs_approval = reason is not None
        call.approval_reason = reason
        return call


def cap_output(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[output truncated: {len(text) - limit} more characters]"
