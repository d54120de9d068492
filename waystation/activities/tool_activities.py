"""The `run_tool` activity: one tool call, from the registry or an MCP server, its output
capped and redacted. Tool errors never crash a task: they come back as an error observation
the model can act on.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from waystation.activities.conversation_cache import ConversationCache
from waystation.activities.heartbeat import keep_heartbeating
from waystation.activities.mcp.activities import McpActivities
from waystation.activities.redaction import Redactor
from waystation.activities.spans import span
from waystation.activities.storage import Ledger, StorageError
from waystation.activities.storage.memory import MemoryStore
from waystation.activities.tools import (
    MAX_OBSERVATION_CHARS,
    OUTPUTS_DIR,
    SCRATCH_DIR,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
)
from waystation.settings.validation import validation_sentence
from waystation.workflows import errors
from waystation.workflows.models import ToolRequest, ToolResult


class ToolActivities:
    """The `run_tool` activity over a registry and a workspace directory."""

    def __init__(
        self,
        registry: ToolRegistry,
        workspace: Path,
        ledger: Ledger,
        conversations: ConversationCache | None = None,
        mcp: McpActivities | None = None,
        *,
        redactor: Redactor | None = None,
        environment: Mapping[str, str] | None = None,
        memory: MemoryStore | None = None,
    ) -> None:
        self._registry = registry
        self._workspace = workspace
        self._ledger = ledger
        self._conversations = conversations
        self._mcp = mcp
        self._redactor = redactor or Redactor()
        self._environment = environment
        self._memory = memory
        # Tasks and their approval policy expect scratch/ ("echo hi > scratch/x.txt").
        (workspace / SCRATCH_DIR).mkdir(parents=True, exist_ok=True)

    @activity.defn(name="run_tool")
    async def run_tool(self, request: ToolRequest) -> ToolResult:
        """Run one tool call. Errors the model can act on come back as `is_error` results."""
        with span("tool call", tool=request.tool, idempotency_key=request.idempotency_key) as s:
            result = await self._run(request)
            s.set_attribute("tool.is_error", result.is_error)
        # Every tool's output and error text (built-in, function and MCP tools alike).
        result = result.model_copy(update={"output": self._redactor.redact(result.output)})
        if self._conversations is not None:  # the next LLM call on this worker reuses it
            self._conversations.remember_tool_output(request.idempotency_key, result.output)
        return result

    async def _run(self, request: ToolRequest) -> ToolResult:
        if self._mcp is not None and self._mcp.handles(request.tool):
            called = await self._mcp.run(request)
            return called.model_copy(
                update={"output": self._fit(called.output, request.idempotency_key)}
            )
        tool = self._registry.get(request.tool)
        if tool is None:
            # The model was offered it by a worker that has it (the model call checks the
            # names it calls): this one lacks it, and leaves the call to one that has it.
            raise ApplicationError(
                f"this worker lacks {request.tool}: one that has it takes the call",
                [request.tool],
                type=errors.WORKER_LACKS,
                non_retryable=True,
                category=ApplicationErrorCategory.BENIGN,
            )
        try:
            arguments = tool.arguments.model_validate(request.arguments)
        except ValidationError as err:
            problems = validation_sentence(err, "arguments")
            return ToolResult(
                output=f"invalid arguments for {tool.name}: {problems}", is_error=True
            )
        try:
            output = await self._call(tool, arguments, request)
        except ToolError as err:
            return ToolResult(output=str(err), is_error=True)
        except TimeoutError:
            return ToolResult(
                output=f"{tool.name} did not finish within {tool.timeout_seconds:g} s",
                is_error=True,
            )
        except (asyncio.CancelledError, StorageError):
            raise  # the storage stayed unreachable: the activity fails and Temporal retries it
        except Exception as err:  # a tool's bug is reported to the model, not a crashed task
            activity.logger.warning("tool %s raised", tool.name, exc_info=True)
            return ToolResult(
                output=f"{tool.name} failed: {type(err).__name__}: {err}", is_error=True
            )
        return ToolResult(output=self._fit(output, request.idempotency_key))

    async def _call(self, tool: Tool[Any], arguments: BaseModel, request: ToolRequest) -> str:
        attempt = self._ledger.attempt()
        key, memory = request.idempotency_key, (self._memory, request.memory_namespace)
        if tool.local:  # pure: it claims no key, and its workflow task watches it
            context = ToolContext(self._workspace, key, attempt, self._environment, *memory)
            return await asyncio.wait_for(tool.call(arguments, context), tool.timeout_seconds)
        async with keep_heartbeating(), attempt.held() as ledger:
            context = ToolContext(self._workspace, key, ledger, self._environment, *memory)
            return await asyncio.wait_for(tool.call(arguments, context), tool.timeout_seconds)

    def _fit(self, output: str, key: str) -> str:
        """Send at most MAX_OBSERVATION_CHARS; keep the whole output in the workspace."""
        output = self._redactor.redact(output)  # the whole output is kept redacted too
        if len(output) <= MAX_OBSERVATION_CHARS:
            return output
        name = hashlib.sha256(key.encode()).hexdigest()[:16] + ".txt"
        stored = self._workspace / OUTPUTS_DIR / name
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_text(output, encoding="utf-8")
        rest = len(output) - MAX_OBSERVATION_CHARS
        return (
            output[:MAX_OBSERVATION_CHARS]
            + f"\n[output truncated: {rest} more characters; the whole output is in the "
            f"workspace at {OUTPUTS_DIR}/{name}]"
        )
