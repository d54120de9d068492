"""One live connection to one MCP server, owned by a task of its own.

The MCP SDK's client is built of anyio task groups that must be entered and left by the
same task, while tool calls come from whichever activity needs them; so each connection
lives in an owner task that opens the client, reports it ready, and closes it when asked
or when the server goes away (stdout closed: the process died).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import anyio
import httpx2
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client import Transport
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from activities.mcp.config import McpServerConfig, expand, expand_mapping
from activities.mcp.errors import McpServerUnavailable

logger = logging.getLogger(__name__)

CLIENT_INFO = mcp_types.Implementation(name="waystation", version="0.1.0")
STDERR_TAIL_CHARS = 2_000
CLOSE_WITHIN_SECONDS = 10.0  # the SDK's own stdio shutdown gives a server 2 s + 2 s
TOOLS_LIST_CHANGED = "notifications/tools/list_changed"


class _WatchedReadStream:
    """The transport's read stream, noticing its end (the server closed stdout or died)."""

    def __init__(self, inner: Any, ended: asyncio.Event) -> None:
        self._inner = inner
        self._ended = ended

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._ended.set()
            raise
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def leaf_error(err: BaseException) -> BaseException:
    """The first real error inside anyio's exception groups."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def describe_error(err: BaseException) -> str:
    err = leaf_error(err)
    if isinstance(err, MCPError):
        return err.error.message
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class McpConnection:
    """A connection to one server: started on demand, dead once `lost` is set."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        environ: Mapping[str, str],
        on_tools_changed: Callable[[str], None],
        stderr_dir: Path,
    ) -> None:
        self.name = name
        self.config = config
        self._environ = environ
        self._on_tools_changed = on_tools_changed
        self._stderr_dir = stderr_dir
        self._stderr_path: Path | None = None
        self._ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._transport_ended = asyncio.Event()
        self.lost = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None

    @property
    def client(self) -> Client:
        return self._ready.result()

    @property
    def usable(self) -> bool:
        return self._ready.done() and not self._ready.exception() and not self.lost.is_set()

    async def start(self) -> None:
        """Connect within the configured time, or raise McpServerUnavailable."""
        self._owner = asyncio.create_task(self._own(), name=f"mcp server {self.name}")
        timeout = self.config.connect_timeout_seconds
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            message = self._with_stderr(
                f"MCP server {self.name!r} did not connect within {timeout:g} s"
            )
            await self.close()
            raise McpServerUnavailable(message) from None
        except McpServerUnavailable:
            raise
        except asyncio.CancelledError:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the connection (a stdio server's process is stopped)."""
        self._stop.set()
        owner = self._owner
        if owner is not None and not owner.done():
            if not self._ready.done():
                owner.cancel()  # still connecting: nothing to wind down gracefully
            try:
                await asyncio.wait_for(asyncio.shield(owner), CLOSE_WITHIN_SECONDS)
            except TimeoutError:
                owner.cancel()  # a server that ignores its closed stdin, SIGTERM and SIGKILL
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await owner
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # seen: a failed start was already reported by start()
        self._forget_stderr()

    def stderr_tail(self) -> str:
        """The end of a stdio server's stderr (empty for HTTP servers)."""
        if self._stderr_path is None:
            return ""
        try:
            with open(self._stderr_path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - STDERR_TAIL_CHARS))
                return f.read().decode("utf-8", errors="replace").strip()
        except OSError:
            return ""

    def _with_stderr(self, message: str) -> str:
        tail = self.stderr_tail()
        return f"{message}; its stderr ends with:\n{tail}" if tail else message

    async def _own(self) -> None:
        try:
            async with (
                self._client() as client,
                self._listening(client),
            ):
                self._ready.set_result(client)
                await self._until_stopped_or_lost()
        except BaseException as err:
            if not self._ready.done():
                reason = describe_error(err)
                if isinstance(leaf_error(err), MCPError) and self._transport_ended.is_set():
                    reason = "it exited"
                self._ready.set_exception(
                    McpServerUnavailable(
                        self._with_stderr(f"MCP server {self.name!r} could not start: {reason}")
                    )
                )
            elif not isinstance(err, asyncio.CancelledError):
                logger.warning(
                    "MCP server %s: connection ended: %s", self.name, describe_error(err)
                )
            if not isinstance(err, Exception | asyncio.CancelledError):
                raise
        finally:
            self.lost.set()

    async def _until_stopped_or_lost(self) -> None:
        waits = [
            asyncio.ensure_future(self._stop.wait()),
            asyncio.ensure_future(self._transport_ended.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if self._transport_ended.is_set() and not self._stop.is_set():
            logger.warning("MCP server %s went away; it restarts on next use", self.name)
        self.lost.set()  # before the SDK's shutdown, so no new call starts meanwhile

    def _client(self) -> Client:
        return Client(
            self._transport(),
            mode="legacy" if self.config.protocol == "legacy" else "auto",
            message_handler=self._on_message,
            client_info=CLIENT_INFO,
            cache=None,  # listings are ours to keep; a stale cache would hide changes
        )

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        async with self._raw_transport() as (read, write):
            yield _WatchedReadStream(read, self._transport_ended), write

    def _raw_transport(self) -> Transport:
        where = f"MCP server {self.name!r}"
        config = self.config
        if config.command is not None:
            parameters = StdioServerParameters(
                command=expand(config.command, self._environ, f"{where} command"),
                args=[expand(a, self._environ, f"{where} args") for a in config.args],
                env=expand_mapping(config.env, self._environ, f"{where} env") or None,
                cwd=config.cwd,
            )
            return self._stdio(parameters)
        assert config.url is not None
        url = expand(config.url, self._environ, f"{where} url")
        headers = expand_mapping(config.headers, self._environ, f"{where} headers")
        return self._http(url, headers)

    @contextlib.asynccontextmanager
    async def _stdio(self, parameters: StdioServerParameters) -> AsyncIterator[Any]:
        fd, path = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".stderr", dir=self._stderr_dir)
        self._stderr_path = Path(path)
        # The server writes its stderr straight into this file (a descriptor, not a pipe).
        with open(fd, "w", encoding="utf-8", errors="replace") as errlog:  # noqa: ASYNC230
            async with stdio_client(parameters, errlog=errlog) as streams:
                yield streams

    @contextlib.asynccontextmanager
    async def _http(self, url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
        # The call timeout is enforced around each call; the read timeout only has to
        # outlast it (a slow tool's response is one long read).
        read = max(self.config.call_timeout_seconds, 300.0) + 30.0
        timeout = httpx2.Timeout(self.config.connect_timeout_seconds, read=read)
        async with (
            httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
            streamable_http_client(url, http_client=http) as streams,
        ):
            yield streams

    @contextlib.asynccontextmanager
    async def _listening(self, client: Client) -> AsyncIterator[None]:
        """On 2026-07-28 connections, change notifications come through a subscription."""
        capabilities = client.server_capabilities.tools
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not (
            capabilities and capabilities.list_changed
        ):
            yield  # earlier revisions send notifications/tools/list_changed on the session
            return
        listener = asyncio.create_task(self._listen(client))
        try:
            yield
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _listen(self, client: Client) -> None:
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._on_tools_changed(self.name)
        except (ListenNotSupportedError, SubscriptionLost, MCPError, TimeoutError) as err:
            logger.info("MCP server %s: no tool change subscription: %s", self.name, err)

    async def _on_message(self, message: Any) -> None:
        if getattr(message, "method", None) == TOOLS_LIST_CHANGED:
            self._on_tools_changed(self.name)
        elif isinstance(message, Exception):
            logger.warning("MCP server %s sent something unreadable: %s", self.name, message)

    def _forget_stderr(self) -> None:
        if self._stderr_path is not None:
            with contextlib.suppress(OSError):
                self._stderr_path.unlink()
