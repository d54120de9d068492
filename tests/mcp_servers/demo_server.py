"""A real MCP server for the tests, written with the `mcp` SDK: stdio or streamable HTTP.

    python tests/mcp_servers/demo_server.py                 # stdio
    python tests/mcp_servers/demo_server.py --http PORT     # streamable HTTP at /mcp

Tools cover what the client must handle: each annotation, a slow tool that waits for a
gate, a crashing tool, an `isError` result, non-text content, and a tool that adds a tool
and announces `tools/list_changed`. The server's start and every call of the recording
tools append a JSON line (`tool`, `event`, `key` = the idempotency key from `_meta`,
`label`, `pid`) to the file named by DEMO_CALL_LOG, so a test can see what ran, how often
and what was cancelled.

DEMO_FAIL_ON_START=1 exits at once with a message on stderr (ending with DEMO_STDERR_SAYS);
DEMO_HANG_ON_START=1 never answers the handshake; DEMO_HANG_ON_LIST=1 never answers
tools/list; DEMO_BANNER=1 writes a line that is not MCP to stdout before it serves.
DEMO_TASK_TOOL=1 offers `background_job`, a tool that runs only as an MCP task
(`execution.taskSupport: required`). A request header `Authorization` is recorded as
`authorization` on the calls it carries (HTTP only).

Over HTTP, DEMO_UNKNOWN_SESSION=400 answers a request for a session the server does not know
(it restarted) as the reference server does, 400 "Bad Request: No valid session ID
provided", instead of the SDK's 404; DEMO_NO_GET_STREAM=1 answers a GET (the stream a
client opens for what the server sends unasked) with 405; DEMO_HTTP_LOG=1 records every
request (`tool` "http", `event` its method, `label` its Mcp-Session-Id, `status` the
answer's).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ImageContent, TextContent, ToolAnnotations
from starlette.types import ASGIApp, Message, Receive, Scope, Send

IDEMPOTENCY_META_KEY = "waystation/idempotency_key"
GATE_POLL_SECONDS = 0.02
BANNER = "demo server: listening on stdio (this line is not MCP)"
TASK_TOOL = "background_job"
# What @modelcontextprotocol/server-everything answers for a session it does not know.
UNKNOWN_SESSION_BODY = json.dumps(
    {
        "jsonrpc": "2.0",
        "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"},
        "id": None,
    }
).encode()

server = MCPServer("demo", version="1.0", log_level="WARNING")


def record(ctx: Context | None, tool: str, event: str, label: str = "", **extra: Any) -> None:
    log = os.environ.get("DEMO_CALL_LOG")
    if not log:
        return
    meta = (ctx.request_context.meta if ctx is not None else None) or {}
    entry: dict[str, Any] = {
        "tool": tool,
        "event": event,
        "key": meta.get(IDEMPOTENCY_META_KEY),
        "label": label,
        "pid": os.getpid(),
        **extra,
    }
    request = ctx.request_context.request if ctx is not None else None
    headers = getattr(request, "headers", None)
    if headers is not None and "authorization" in headers:
        entry["authorization"] = headers["authorization"]
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


async def wait_for_gate(gate: str, seconds: float) -> bool:
    """Wait until the file `gate` exists (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while not Path(gate).exists():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(GATE_POLL_SECONDS)
    return True


@server.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
def lookup(key: str, ctx: Context) -> str:
    """Read a value (read-only)."""
    record(ctx, "lookup", "done", key)
    return f"value of {key}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def delete_note(name: str, ctx: Context) -> str:
    """Delete a note (destructive)."""
    record(ctx, "delete_note", "done", name)
    return f"deleted {name}"


@server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True))
def set_flag(name: str, value: bool, ctx: Context) -> str:
    """Set a flag (idempotent: setting it twice is setting it once)."""
    record(ctx, "set_flag", "done", name)
    return f"{name} = {value}"


@server.tool(annotations=ToolAnnotations(destructive_hint=False))
def add_note(text: str, ctx: Context) -> str:
    """Add a note (not destructive, not idempotent)."""
    record(ctx, "add_note", "done", text)
    return f"added {text!r}"


@server.tool()
def append_line(text: str, count: int = 1, ctx: Context | None = None) -> str:
    """Append a line (no annotations at all)."""
    assert ctx is not None
    record(ctx, "append_line", "done", text)
    return f"appended {text!r} x{count}"


async def _gated(ctx: Context, tool: str, gate: str, label: str, seconds: float) -> str:
    record(ctx, tool, "start", label)
    try:
        released = await wait_for_gate(gate, seconds)
    except asyncio.CancelledError:
        record(ctx, tool, "cancelled", label)
        raise
    record(ctx, tool, "done" if released else "gave_up", label)
    return f"{label}: {'released' if released else 'gave up waiting'}"


@server.tool()
async def slow(gate: str, label: str, ctx: Context, seconds: float = 600) -> str:
    """Wait until the file `gate` exists (no annotations: runs at most once)."""
    return await _gated(ctx, "slow", gate, label, seconds)


@server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True))
async def slow_idempotent(gate: str, label: str, ctx: Context, seconds: float = 600) -> str:
    """Wait until the file `gate` exists (idempotent: a lost attempt may be retried)."""
    return await _gated(ctx, "slow_idempotent", gate, label, seconds)


@server.tool()
def crash(ctx: Context) -> str:
    """Exit the server process in the middle of the call."""
    record(ctx, "crash", "start")
    print("demo server: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def fail(reason: str) -> str:
    """Answer with an error result (isError)."""
    raise ToolError(f"failed as asked: {reason}")


@server.tool()
def picture() -> list[TextContent | ImageContent]:
    """A caption and 67 bytes of PNG."""
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(59)).decode()
    return [
        TextContent(type="text", text="a one-pixel picture"),
        ImageContent(type="image", data=png, mime_type="image/png"),
    ]


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Add a tool named `name` and tell the client its tool list changed."""

    def added() -> str:
        return f"{name} ran"

    server.add_tool(added, name=name, description=f"added at run time: {name}")
    await ctx.notify_tools_changed()  # 2026-07-28 clients: their subscriptions/listen stream
    await ctx.request_context.session.send_tool_list_changed()  # earlier revisions
    return f"added {name}"


@server.tool()
def background_job(name: str) -> str:
    """Start a long job (offered as task-only under DEMO_TASK_TOOL)."""
    return f"{name} started"


async def hang_on_list(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    if ctx.method == "tools/list":
        await asyncio.Event().wait()
    return await call_next(ctx)


async def task_only(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Declares `background_job` as runnable only as an MCP task (2025-11-25)."""
    result = await call_next(ctx)
    if ctx.method == "tools/list" and isinstance(result, dict):  # the result as it is sent
        for tool in result.get("tools", []):
            if tool.get("name") == TASK_TOOL:
                tool["execution"] = {"taskSupport": "required"}
    return result


def unknown_session_as_400(app: ASGIApp) -> ASGIApp:
    """The SDK answers a session it does not know with 404; this answers as the reference
    server does (400, its body), for the requests that carried a session id."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        carried = scope["type"] == "http" and any(
            name == b"mcp-session-id" for name, _ in scope["headers"]
        )
        rewriting = False

        async def answer(message: Message) -> None:
            nonlocal rewriting
            if carried and message["type"] == "http.response.start" and message["status"] == 404:
                rewriting = True
                length = str(len(UNKNOWN_SESSION_BODY)).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", length)]
                await send({"type": "http.response.start", "status": 400, "headers": headers})
            elif rewriting and message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": UNKNOWN_SESSION_BODY})
            else:
                await send(message)

        await app(scope, receive, answer)

    return wrapped


def no_get_stream(app: ASGIApp) -> ASGIApp:
    """Offers no stream of its own (405 to a GET, as the protocol lets a server answer), so
    the one request that can meet a forgotten session is the client's next call."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            headers = [(b"allow", b"POST, DELETE"), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 405, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return wrapped


def logging_requests(app: ASGIApp) -> ASGIApp:
    """Records each HTTP request: its method, its Mcp-Session-Id and the answer's status."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        session = headers.get(b"mcp-session-id", b"").decode()

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start":
                record(None, "http", scope["method"], session, status=message["status"])
            await send(message)

        await app(scope, receive, answer)

    return wrapped


def serve_http(port: int) -> None:
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app: ASGIApp = server.streamable_http_app(host="127.0.0.1", transport_security=security)
    if os.environ.get("DEMO_UNKNOWN_SESSION") == "400":
        app = unknown_session_as_400(app)
    if os.environ.get("DEMO_NO_GET_STREAM"):
        app = no_get_stream(app)
    if os.environ.get("DEMO_HTTP_LOG"):
        app = logging_requests(app)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    asyncio.run(uvicorn.Server(config).serve())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, help="serve streamable HTTP on this port")
    args = parser.parse_args()
    if os.environ.get("DEMO_FAIL_ON_START"):
        said = os.environ.get("DEMO_STDERR_SAYS", "")  # what a server might print of its env
        print(f"demo server: refusing to start (DEMO_FAIL_ON_START){said}", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("DEMO_HANG_ON_START"):
        print("demo server: hanging before the handshake", file=sys.stderr, flush=True)
        time.sleep(3600)
    if os.environ.get("DEMO_HANG_ON_LIST"):
        server.middleware.append(hang_on_list)
    if os.environ.get("DEMO_TASK_TOOL"):
        server.middleware.append(task_only)
    else:
        server.remove_tool(TASK_TOOL)
    if os.environ.get("DEMO_BANNER"):
        print(BANNER, flush=True)  # as servers that log to stdout do
    record(None, "server", "started")
    if args.http is None:
        asyncio.run(server.run_stdio_async())
        return
    serve_http(args.http)


if __name__ == "__main__":
    main()
