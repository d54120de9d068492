"""One live connection to one MCP server, owned by a task of its own.

The MCP SDK's client is built of anyio task groups that must be entered and left by the
same task, while tool calls come from whichever activity needs them; so each connection
lives in an owner task that opens the client, reports it ready, and closes it when asked
or when the server goes away (stdout closed: the process died).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
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
from mcp.client.streamable_http import MCP_SESSION_ID, streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from waystation.activities.mcp.errors import McpServerUnavailable
from waystation.settings.mcp_servers import McpServerConfig, expand, expand_mapping

logger = logging.getLogger(__name__)

CLIENT_INFO = mcp_types.Implementation(name="waystation", version="0.1.0")
STDERR_TAIL_CHARS = 2_000
CLOSE_WITHIN_SECONDS = 10.0  # the SDK's own stdio shutdown gives a server 2 s + 2 s
TOOLS_LIST_CHANGED = "notifications/tools/list_changed"
LINE_SHOWN_CHARS = 200
RESUBSCRIBE_FIRST_SECONDS = 0.5  # then doubled, up to the max, while the server is away
RESUBSCRIBE_MAX_SECONDS = 30.0
NOT_ABOUT_THE_SESSION = (mcp_types.METHOD_NOT_FOUND, mcp_types.INVALID_PARAMS)
STDIO_PARSE_FAILURE = "Failed to parse JSONRPC message from server"


class _OneLinePerServer(logging.Filter):
    """Drops the SDK's traceback for each stdout line that is not JSON-RPC: the connection
    says it once, in a line (a chatty server made dozens a minute)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != STDIO_PARSE_FAILURE


logging.getLogger("mcp.client.stdio").addFilter(_OneLinePerServer())


class _WatchedReadStream:
    """The transport's read stream, noticing its end (the server closed stdout or died),
    what the server wrote that is not MCP, and tool list changes as they arrive.

    A change is noticed here, in the order the server sent it, so a call whose server
    announced a change before answering returns knowing it (the SDK hands notifications
    to a task of their own, which may run after the answer is back).
    """

    def __init__(
        self,
        inner: Any,
        ended: asyncio.Event,
        on_unreadable: Callable[[str], None],
        on_tools_changed: Callable[[], None],
    ) -> None:
        self._inner = inner
        self._ended = ended
        self._on_unreadable = on_unreadable
        self._on_tools_changed = on_tools_changed

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            try:
                item: SessionMessage | Exception = await self._inner.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._ended.set()
                raise
            if isinstance(item, ValidationError):
                self._on_unreadable(unreadable_line(item))
                continue  # said once by the connection; the session has nothing to act on
            if isinstance(item, SessionMessage) and (
                getattr(item.message, "method", None) == TOOLS_LIST_CHANGED
            ):
                self._on_tools_changed()
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


def unreadable_line(err: ValidationError) -> str:
    """What the server wrote, as far as the parse error tells: the line itself when it is
    not JSON, else the JSON value that is not a JSON-RPC message (the outermost one)."""
    errors = err.errors(include_url=False)
    if not errors:
        return str(err)
    value = min(errors, key=lambda e: len(e["loc"])).get("input")
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= LINE_SHOWN_CHARS else text[: LINE_SHOWN_CHARS - 1] + "…"


class _SessionWatchingHttp(httpx2.AsyncClient):
    """An HTTP client that notices the server forgetting its MCP session (it restarted, or
    dropped an idle session): a 404, or a 400 that names the session (the reference server
    answers so), to a request that carried the session's Mcp-Session-Id.

    The spec then asks the client for a new session; the SDK's transport would keep sending
    the old id, so the connection ends and the next use opens a new one. Ending it sends no
    DELETE for a session the server no longer has.
    """

    def __init__(self, on_session_lost: Callable[[], None], **options: Any) -> None:
        super().__init__(**options)
        self._on_session_lost = on_session_lost
        self.lost_session: str | None = None

    async def send(self, request: httpx2.Request, **options: Any) -> httpx2.Response:
        session = request.headers.get(MCP_SESSION_ID)
        if session is not None and session == self.lost_session and request.method == "DELETE":
            return httpx2.Response(204, request=request)
        response = await super().send(request, **options)
        if session is not None and self.lost_session is None and await forgot_session(response):
            self.lost_session = session
            self._on_session_lost()
        return response


async def forgot_session(response: httpx2.Response) -> bool:
    """Whether an answer says the session is gone. A JSON-RPC error the server chose to send
    with such a status (an unknown method, bad arguments) is not about the session."""
    if response.status_code not in (400, 404):
        return False
    body = await response.aread()  # a short error body; the SDK reads it again from memory
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("code") in NOT_ABOUT_THE_SESSION:
        return False
    return response.status_code == 404 or b"session" in body.lower()


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
        self.session_lost = False
        """The HTTP server forgot this connection's session (see _SessionWatchingHttp)."""
        self._unreadable: str | None = None  # the first thing the server sent that is not MCP
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
            message = f"MCP server {self.name!r} did not connect within {timeout:g} s"
            if self._unreadable is not None:
                message = f"{message}: {self._not_mcp()}"
            message = self._with_stderr(message)
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
                if self._unreadable is not None:
                    reason = self._not_mcp()
                elif isinstance(leaf_error(err), MCPError) and self._transport_ended.is_set():
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
            asyncio.ensure_future(self.lost.wait()),  # set early by a lost session
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if self._transport_ended.is_set() and not self._stop.is_set():
            logger.warning("MCP server %s went away; it restarts on next use", self.name)
        self.lost.set()  # before the SDK's shutdown, so no new call starts meanwhile

    def _session_lost(self) -> None:
        self.session_lost = True
        self.lost.set()  # at once: the call that met the lost session must see it
        logger.warning(
            "MCP server %s no longer knows this worker's session (it restarted?); a new "
            "session starts on next use",
            self.name,
        )

    def _not_mcp(self) -> str:
        said = "its stdout" if self.config.transport == "stdio" else "what it sent"
        return f"{said} is not MCP (first line: {self._unreadable})"

    def _saw_unreadable(self, line: str) -> None:
        if self._unreadable is not None:
            return
        self._unreadable = line
        logger.warning("MCP server %s: %s; such lines are ignored", self.name, self._not_mcp())

    def _changed(self) -> None:
        self._on_tools_changed(self.name)

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
            watched = _WatchedReadStream(
                read, self._transport_ended, self._saw_unreadable, self._changed
            )
            yield watched, write

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
            _SessionWatchingHttp(self._session_lost, headers=headers, timeout=timeout) as http,
            streamable_http_client(url, http_client=http) as streams,
        ):
            yield streams

    @contextlib.asynccontextmanager
    async def _listening(self, client: Client) -> AsyncIterator[None]:
        """On 2026-07-28 connections, change notifications come only to a subscription; the
        connection is ready once it is open, so no change after that goes unheard."""
        capabilities = client.server_capabilities.tools
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not (
            capabilities and capabilities.list_changed
        ):
            yield  # earlier revisions send notifications/tools/list_changed on the session
            return
        opened = asyncio.Event()
        listener = asyncio.create_task(self._listen(client, opened))
        try:
            await opened.wait()
            yield
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _listen(self, client: Client, opened: asyncio.Event) -> None:
        """Subscribed while the connection lives. A subscription lost once open (the server
        restarted: a 2026-07-28 HTTP connection has no session to lose, so nothing else
        ends; or a proxy cut the stream) is opened again, and the server counts as changed
        then, as a change may have come meanwhile."""
        pause = RESUBSCRIBE_FIRST_SECONDS
        subscribed = False
        try:
            while True:
                try:
                    async with client.listen(tools_list_changed=True) as subscription:
                        if subscribed:
                            self._changed()  # what changed while unsubscribed: listed again
                        subscribed, pause = True, RESUBSCRIBE_FIRST_SECONDS
                        opened.set()
                        async for _event in subscription:
                            pass  # each event is noticed as it arrives: _WatchedReadStream
                    return  # the server ended it
                except (ListenNotSupportedError, SubscriptionLost, MCPError, TimeoutError) as err:
                    if not subscribed or isinstance(err, ListenNotSupportedError):
                        logger.info(
                            "MCP server %s: no tool change subscription: %s", self.name, err
                        )
                        return
                    if pause == RESUBSCRIBE_FIRST_SECONDS:
                        logger.info("MCP server %s: change subscription lost: %s", self.name, err)
                await asyncio.sleep(pause)
                pause = min(pause * 2, RESUBSCRIBE_MAX_SECONDS)
        finally:
            opened.set()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):  # what is not MCP stops at _WatchedReadStream
            logger.warning("MCP server %s sent something unreadable: %s", self.name, message)

    def _forget_stderr(self) -> None:
        if self._stderr_path is not None:
            with contextlib.suppress(OSError):
                self._stderr_path.unlink()
