"""The memory tools of waystation's MCP server: the deployment's memory outside a task,
under the same rules as the HTTP API's /memory routes (MemoryAccess: a token bound to a
tenant reaches only its tenant's namespaces; a reader reads, an approver writes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel

from waystation.activities.storage import StorageError
from waystation.activities.storage.memory import MemoryRequestError
from waystation.client.agent_runtime import AgentRuntime
from waystation.servers.api.auth import Caller
from waystation.workflows.memory import RECALL_LIMIT, MemoryItem

T = TypeVar("T")


class NamespaceCounts(BaseModel):
    namespaces: dict[str, int]


class MemoryItems(BaseModel):
    items: list[MemoryItem]


class MemoryTools:
    """memory_namespaces, memory_list, memory_search, memory_get, memory_put, memory_delete."""

    def __init__(
        self, runtime_of: Callable[[], AgentRuntime], caller_of: Callable[[Context], Caller]
    ) -> None:
        self._runtime_of = runtime_of
        self._caller_of = caller_of

    async def memory_namespaces(self, ctx: Context) -> NamespaceCounts:
        """The memory namespaces holding items (a token bound to a tenant: its own), with
        how many each holds."""
        who = self._caller_of(ctx)
        found = await _refused(self._runtime_of().memory.namespaces(who.tenant))
        return NamespaceCounts(namespaces=dict(found))

    async def memory_list(
        self, namespace: str, ctx: Context, after: str | None = None
    ) -> MemoryItems:
        """A namespace's items in key order (100 at a time: pass the last key as `after`)."""
        who = self._caller_of(ctx)
        memory = self._runtime_of().memory
        return MemoryItems(
            items=await _refused(memory.items(namespace, tenant=who.tenant, after=after))
        )

    async def memory_search(
        self, namespace: str, query: str, ctx: Context, limit: int = RECALL_LIMIT
    ) -> MemoryItems:
        """Full-text search of a namespace's items, best matches first."""
        who = self._caller_of(ctx)
        memory = self._runtime_of().memory
        found = memory.search(namespace, query, tenant=who.tenant, limit=limit)
        return MemoryItems(items=await _refused(found))

    async def memory_get(self, namespace: str, key: str, ctx: Context) -> MemoryItem:
        """One item of a namespace, by key."""
        who = self._caller_of(ctx)
        return await _refused(self._runtime_of().memory.get(namespace, key, tenant=who.tenant))

    async def memory_put(
        self,
        namespace: str,
        key: str,
        value: str,
        ctx: Context,
        metadata: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
    ) -> MemoryItem:
        """Write an item (an approver): it replaces what the key held."""
        who = self._caller_of(ctx)
        written = self._runtime_of().memory.put(
            namespace,
            key,
            value,
            metadata=metadata,
            ttl_seconds=ttl_seconds,
            tenant=who.tenant,
            role=who.role,
        )
        return await _refused(written)

    async def memory_delete(self, namespace: str, key: str, ctx: Context) -> str:
        """Delete an item (an approver)."""
        who = self._caller_of(ctx)
        memory = self._runtime_of().memory
        await _refused(memory.delete(namespace, key, tenant=who.tenant, role=who.role))
        return f"deleted {key!r} from {namespace}"


def add_memory_tools(
    server: MCPServer,
    runtime_of: Callable[[], AgentRuntime],
    caller_of: Callable[[Context], Caller],
) -> None:
    tools = MemoryTools(runtime_of, caller_of)
    read = ToolAnnotations(read_only_hint=True)
    server.add_tool(tools.memory_namespaces, annotations=read)
    server.add_tool(tools.memory_list, annotations=read)
    server.add_tool(tools.memory_search, annotations=read)
    server.add_tool(tools.memory_get, annotations=read)
    server.add_tool(
        tools.memory_put, annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True)
    )
    server.add_tool(
        tools.memory_delete,
        annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True),
    )


async def _refused(work: Awaitable[T]) -> T:
    """The store's refusals as tool errors the client reads (never a protocol error)."""
    try:
        return await work
    except (MemoryRequestError, StorageError) as err:
        raise ToolError(str(err)) from None
