"""The worker's MCP connections: started on demand, restarted when dead, closed on shutdown.

One manager per worker process (built in worker.py). It lists servers' tools into a
`ToolCatalog`, calls tools with their arguments checked against the tool's schema and the
idempotency key in the request's `_meta`, and turns every failure into text the model can
read. It remembers which servers said their tools changed, so the next step re-lists.

The `mcp` package (a second of start-up and ~28 MB) is imported when a configured server
is first used, so a worker without MCP servers never loads it.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import ValidationError

from waystation.activities.mcp.calls import argument_problem
from waystation.activities.mcp.errors import McpServerUnavailable
from waystation.settings.mcp_servers import McpConfigError, McpServerConfig, worker_environment
from waystation.workflows.models import ToolResult
from waystation.workflows.tool_catalog import McpServerTools, McpToolSpec, ToolCatalog, split_name

if TYPE_CHECKING:
    import mcp_types

    from waystation.activities.mcp.connection import McpConnection

logger = logging.getLogger(__name__)

IDEMPOTENCY_META_KEY = "waystation/idempotency_key"
"""The `_meta` entry of every tools/call: `workflow_id/step/call_id`, the same on retries."""
MAX_LIST_PAGES = 100  # a server whose cursor never ends cannot hang a listing
UNCERTAIN = "it may or may not have taken effect"

ToolsChanged = Callable[[str], None]


class McpClientManager:
    """Connections to the configured MCP servers, for the activities of one worker."""

    def __init__(
        self,
        servers: Mapping[str, McpServerConfig],
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._configs = dict(servers)
        self._environ = environ if environ is not None else worker_environment()
        self._connections: dict[str, McpConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._listings: dict[str, McpServerTools] = {}
        self._stale: set[str] = set()
        # Servers whose connection ended without our asking: back, they may offer other tools.
        self._went_away: set[str] = set()
        self._listeners: list[ToolsChanged] = []
        self._stderr_dir: Path | None = None
        self._closed = False

    @property
    def servers(self) -> list[str]:
        return list(self._configs)

    def connected(self, server: str) -> bool:
        """Whether this worker holds a live connection to `server` now."""
        connection = self._connections.get(server)
        return connection is not None and connection.usable

    def add_tools_changed_listener(self, listener: ToolsChanged) -> None:
        """`listener(server)` runs when a server says its tool list changed."""
        self._listeners.append(listener)

    def stale_servers(self, catalog: ToolCatalog) -> list[str]:
        """Servers of `catalog` whose tools changed since it was listed, as this worker knows.

        A server is stale when it notified `tools/list_changed` since this worker last
        listed it, or when this worker's latest listing differs from the catalog's (which
        includes a server the catalog could not list and this worker since could).
        """
        stale = []
        for entry in catalog.servers:
            mine = self._listings.get(entry.server)
            if entry.server in self._stale or (
                mine is not None and mine.fingerprint != entry.fingerprint
            ):
                stale.append(entry.server)
        return stale

    async def list_tools(self, servers: list[str] | None = None) -> ToolCatalog:
        """Each server's tools (or the reason it has none), listed concurrently."""
        names = self.servers if servers is None else list(dict.fromkeys(servers))
        listed = await asyncio.gather(*(self.list_server(name) for name in names))
        return ToolCatalog(servers=list(listed))

    async def list_server(self, server: str) -> McpServerTools:
        """One server's tools; a server that cannot be listed gets an `error` instead."""
        config = self._configs.get(server)
        if config is None:
            return McpServerTools(server=server, error=self._not_configured(server))
        from waystation.activities.mcp.connection import describe_error
        from waystation.activities.mcp.convert import server_tools

        for attempt in (1, 2):
            try:
                connection = await self._connection(server)
            except (McpServerUnavailable, McpConfigError) as err:
                return self._unlisted(server, str(err))
            self._stale.discard(server)  # a change notified from here on marks it again
            try:
                async with asyncio.timeout(config.list_timeout_seconds):
                    tools = await _list_all(connection)
            except TimeoutError:
                await self._discard(server, connection)  # a hung server is restarted
                return self._unlisted(
                    server,
                    f"MCP server {server!r} did not list its tools within "
                    f"{config.list_timeout_seconds:g} s",
                )
            except Exception as err:
                if connection.lost.is_set() and attempt == 1:
                    continue  # it died between uses: listing is safe to repeat once
                await self._discard(server, connection)
                reason = f"MCP server {server!r} could not list its tools: {describe_error(err)}"
                return self._unlisted(server, reason)
            listing = server_tools(server, config, tools)
            self._listings[server] = listing
            return listing
        return self._unlisted(server, f"MCP server {server!r} keeps going away")

    def _unlisted(self, server: str, error: str) -> McpServerTools:
        self._listings.pop(server, None)  # what this worker knew of its tools is void
        return McpServerTools(server=server, error=error)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], idempotency_key: str
    ) -> ToolResult:
        """Call `<server>__<tool>`; every failure comes back as an `is_error` result."""
        spec_or_error = await self._spec(name)
        if isinstance(spec_or_error, ToolResult):
            return spec_or_error
        spec = spec_or_error
        problem = argument_problem(spec, arguments)
        if problem is not None:
            return ToolResult(output=problem, is_error=True)
        result, lost = await self._call_once(spec, arguments, idempotency_key)
        if lost and spec.retry_safe:  # once more, on a new connection (a new session)
            result, _ = await self._call_once(spec, arguments, idempotency_key)
        return result

    async def _call_once(
        self, spec: McpToolSpec, arguments: dict[str, Any], idempotency_key: str
    ) -> tuple[ToolResult, bool]:
        """The call's result, and whether it failed because its connection was lost."""
        import mcp_types
        from mcp.shared.exceptions import MCPError

        from waystation.activities.mcp.connection import describe_error
        from waystation.activities.mcp.convert import result_text

        name, config = spec.name, self._configs[spec.server]
        try:
            connection = await self._connection(spec.server)
        except (McpServerUnavailable, McpConfigError) as err:
            return ToolResult(output=str(err), is_error=True), False
        meta = cast(mcp_types.RequestParamsMeta, {IDEMPOTENCY_META_KEY: idempotency_key})
        try:
            async with asyncio.timeout(config.call_timeout_seconds):
                result = await connection.client.call_tool(spec.tool, arguments, meta=meta)
        except TimeoutError:
            # The SDK sent notifications/cancelled as the timeout cancelled the request.
            output = (
                f"{name} did not finish within {config.call_timeout_seconds:g} s and was "
                f"cancelled; {UNCERTAIN}"
            )
            return ToolResult(output=output, is_error=True), False
        except MCPError as err:
            if connection.lost.is_set() or err.error.code == mcp_types.CONNECTION_CLOSED:
                return await self._lost(name, spec.server, connection), True
            return ToolResult(output=f"{name} failed: {err.error.message}", is_error=True), False
        except ValidationError as err:
            output = f"{name} answered outside the MCP protocol: {err.error_count()} problems"
            return ToolResult(output=output, is_error=True), False
        except Exception as err:
            await self._discard(spec.server, connection)
            output = (
                f"{name}: the call to MCP server {spec.server!r} failed "
                f"({describe_error(err)}); {UNCERTAIN}"
            )
            return ToolResult(output=output, is_error=True), False
        stale = [spec.server] if spec.server in self._stale else []
        # A server announces a change before it answers: the task lists it again next step.
        output, is_error = result_text(result), bool(result.is_error)
        return ToolResult(output=output, is_error=is_error, stale_servers=stale), False

    async def close(self) -> None:
        """Close every connection (stdio servers are stopped). Called on worker shutdown."""
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
        if self._stderr_dir is not None:
            shutil.rmtree(self._stderr_dir, ignore_errors=True)

    async def _spec(self, name: str) -> McpToolSpec | ToolResult:
        parts = split_name(name)
        server = parts[0] if parts else ""
        if server not in self._configs:
            return ToolResult(output=self._not_configured(server or name), is_error=True)
        listing = self._listings.get(server)
        if listing is None or server in self._stale:
            listing = await self.list_server(server)
        if listing.error is not None:
            return ToolResult(output=listing.error, is_error=True)
        spec = next((t for t in listing.tools if t.name == name), None)
        if spec is None:
            offered = ", ".join(t.name for t in listing.tools) or "none"
            return ToolResult(
                output=f"unknown tool {name!r}; MCP server {server!r} offers: {offered}",
                is_error=True,
            )
        return spec

    async def _connection(self, server: str) -> McpConnection:
        """The server's live connection, started (or restarted, if it died) on demand."""
        if self._closed:
            raise McpServerUnavailable("the worker is shutting down")
        lock = self._locks.setdefault(server, asyncio.Lock())
        async with lock:
            current = self._connections.get(server)
            if current is not None and current.usable:
                return current
            if current is not None:
                del self._connections[server]
                self._went_away.add(server)
                await current.close()
            from waystation.activities.mcp.connection import McpConnection

            connection = McpConnection(
                server, self._configs[server], self._environ, self._tools_changed, self._stderr()
            )
            try:
                await connection.start()
            except BaseException:
                await connection.close()
                raise
            self._connections[server] = connection
            if server in self._went_away:
                self._went_away.discard(server)
                self._tools_changed(server)  # a server that came back is listed again
            return connection

    async def _discard(self, server: str, connection: McpConnection) -> None:
        if self._connections.get(server) is connection:
            del self._connections[server]
            self._went_away.add(server)
        await connection.close()

    async def _lost(self, name: str, server: str, connection: McpConnection) -> ToolResult:
        """What the model reads of a call whose connection was lost under it."""
        tail = connection.stderr_tail()
        await self._discard(server, connection)
        if connection.session_lost:
            message = (
                f"MCP server {server!r} no longer knew this worker's session when {name} was "
                f"sent (it restarted?); {UNCERTAIN}; the next call opens a new session"
            )
        else:
            message = f"MCP server {server!r} went away during {name}; {UNCERTAIN}"
        return ToolResult(
            output=f"{message}; its stderr ends with:\n{tail}" if tail else message,
            is_error=True,
        )

    def _tools_changed(self, server: str) -> None:
        self._stale.add(server)
        for listener in self._listeners:
            try:
                listener(server)
            except Exception:
                logger.exception("tools-changed listener failed")

    def _not_configured(self, server: str) -> str:
        known = ", ".join(self._configs) or "none"
        return f"no MCP server named {server!r} is configured on this worker (configured: {known})"

    def _stderr(self) -> Path:
        if self._stderr_dir is None:
            self._stderr_dir = Path(tempfile.mkdtemp(prefix="waystation-mcp-"))
        return self._stderr_dir


async def _list_all(connection: McpConnection) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await connection.client.list_tools(cursor=cursor, cache_mode="bypass")
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools
