"""The Temporal side of MCP tools: the `list_tools` activity, the `run_tool` dispatcher,
and the check of a model's call against the catalog a task recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporalio import activity

from waystation.activities.heartbeat import keep_heartbeating
from waystation.activities.mcp.calls import argument_problem
from waystation.activities.redaction import Redactor
from waystation.activities.spans import span
from waystation.activities.tools import approval_needed, json_object_arguments
from waystation.vocabulary import ApprovalRule
from waystation.workflows.models import ChatMessage, ToolCall, ToolRequest, ToolResult
from waystation.workflows.tool_catalog import ListToolsRequest, ToolCatalog, is_mcp_tool_name

if TYPE_CHECKING:  # the manager imports `mcp`: only a worker needs it
    from waystation.activities.mcp.manager import McpClientManager


class McpActivities:
    """MCP tools over one worker's `McpClientManager` (built and closed in worker.py)."""

    def __init__(self, manager: McpClientManager, redactor: Redactor | None = None) -> None:
        self.manager = manager
        self._redactor = redactor or Redactor()

    @activity.defn(name="list_tools")
    async def list_tools(self, request: ListToolsRequest) -> ToolCatalog:
        """The tools of the named servers (all configured ones for None), recorded in history.

        A server that cannot be started, reached or listed gets an `error` entry instead
        of failing the activity: the task goes on with the other servers' tools.
        """
        async with keep_heartbeating():
            catalog = await self.manager.list_tools(request.servers)
        # A server's error may quote its stderr, which may print a secret of its environment.
        for listing in catalog.servers:
            if listing.error is not None:
                listing.error = self._redactor.redact(listing.error)
        return catalog

    @staticmethod
    def handles(tool: str) -> bool:
        """Whether `run_tool` should hand this call to `run` (names `<server>__<tool>`)."""
        return is_mcp_tool_name(tool)

    async def run(self, request: ToolRequest) -> ToolResult:
        """One MCP tool call inside `run_tool`: heartbeats while it waits; cancelling the
        activity cancels the request (MCP's notifications/cancelled reaches the server)."""
        with span("mcp tool call", tool=request.tool, idempotency_key=request.idempotency_key):
            async with keep_heartbeating():
                return await self.manager.call_tool(
                    request.tool, request.arguments, request.idempotency_key
                )

    def stale_servers(self, catalog: ToolCatalog) -> list[str]:
        """Servers of `catalog` to list again before the next step (see the manager)."""
        return self.manager.stale_servers(catalog)


def with_unavailable_servers(
    messages: list[ChatMessage], catalog: ToolCatalog
) -> list[ChatMessage]:
    """The messages a model call sends: after the system prompt, which of the task's MCP
    servers it cannot use and why. Made from the catalog the run recorded, so nothing new
    enters history and the conversation (and its digest) stays what the workflow holds."""
    note = catalog.unavailable_note()
    if note is None:
        return messages
    if messages and messages[0].role == "system":
        prompt = messages[0].content
        first = messages[0].model_copy(
            update={"content": f"{prompt}\n\n{note}" if prompt else note}
        )
        return [first, *messages[1:]]
    return [ChatMessage(role="system", content=note), *messages]


def check_call(
    catalog: ToolCatalog,
    call_id: str,
    name: str,
    raw_arguments: str,
    allowed: list[str] | None,
    policy: dict[str, ApprovalRule],
) -> ToolCall:
    """A model's call of an MCP tool, checked like `ToolRegistry.check_call` checks built-ins:
    known tool, JSON object arguments valid for the tool's schema, approval from the task's
    policy or else the tool's default, retry safety from its annotations."""
    call = ToolCall(call_id=call_id, tool=name, raw_arguments=raw_arguments)
    spec = catalog.get(name)
    if spec is None or (allowed is not None and name not in allowed):
        offered = ", ".join(t.name for t in catalog.tools() if allowed is None or t.name in allowed)
        down = catalog.unavailable(name)
        why = f"{name!r} cannot be called: {down.error}" if down else f"unknown tool {name!r}"
        call.problem = f"{why}; the MCP tools you can call are: {offered or 'none'}"
        return call
    parsed = json_object_arguments(name, raw_arguments)
    if isinstance(parsed, str):
        call.problem = parsed
        return call
    problem = argument_problem(spec, parsed)
    if problem is not None:
        call.problem = problem
        return call
    call.arguments = parsed
    call.retry_safe = spec.retry_safe
    reason = approval_needed(policy.get(name, spec.approval), parsed)
    call.needs_approval = reason is not None
    call.approval_reason = reason
    return call
