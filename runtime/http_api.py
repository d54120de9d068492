"""The HTTP API: the REST face of AgentRuntime. Every endpoint is a thin layer over it.

    ws api                           # or: uvicorn runtime.http_api:app

Bearer tokens come from settings (`WAYSTATION_API_TOKENS`); with none configured the server
binds to localhost only and lets every local caller in as an approver named "local".
The routes live in `runtime/api/`, one router per concern; MCP clients are served at /mcp
(runtime/mcp_server.py) behind the same tokens.
"""

from __future__ import annotations

import errno
import socket
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from runtime.agent_runtime import AgentRuntime
from runtime.api import codec, console, tasks
from runtime.api.errors import ERROR_RESPONSES, install_error_handlers
from runtime.commands import command
from runtime.mcp_server import mount_http
from runtime.settings import Settings
from runtime.temporal import connect


def create_app(
    settings: Settings | None = None,
    runtime: AgentRuntime | None = None,
    *,
    sse_ping_seconds: float = tasks.SSE_PING_SECONDS,
) -> FastAPI:
    """The API over `runtime` (or one connected from `settings` at start-up)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runtime is None:
            app.state.runtime = AgentRuntime(await connect(settings), settings)
        else:
            app.state.runtime = runtime
        async with mcp_sessions.run():
            yield

    app = FastAPI(
        title="waystation",
        version="0.1.0",
        description="Durable AI-agent tasks on Temporal: start, follow, approve, resume.",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
    )
    app.state.settings = settings
    app.state.sse_ping_seconds = sse_ping_seconds
    # A repeated approval with the same Idempotency-Key gets the first answer back.
    app.state.answered = OrderedDict()
    app.add_middleware(
        CORSMiddleware,
        allow_origins=settings.codec_cors_origins,
        allow_methods=["POST", "GET", "OPTIONS"],
        allow_headers=["Authorization", "Content-Type", "X-Namespace"],
    )
    install_error_handlers(app)
    app.include_router(codec.router)
    app.include_router(tasks.router)
    app.include_router(console.router)
    mcp_sessions = mount_http(app, settings)  # MCP clients: streamable HTTP at /mcp
    return app


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port for the server to listen on (OSError if it cannot be)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def main() -> int:
    """Serve until interrupted. Exit code 1 when the API cannot start (a taken port says so
    in one sentence; a start-up that fails, e.g. Temporal unreachable, in uvicorn's log),
    not uvicorn's 3, which the command line uses for a task waiting for approval."""
    import uvicorn

    settings = Settings()
    host, port = settings.api_host, settings.api_port
    if not settings.api_tokens and host not in ("127.0.0.1", "localhost", "::1"):
        host = "127.0.0.1"
    # Bound before anything else starts, so a taken port is one sentence, not a traceback.
    try:
        sock = listen(host, port)
    except OSError as err:
        why = (
            f"the port is in use (another `{command('api')}`?): stop that, or set "
            "WAYSTATION_API_PORT to a free port"
            if err.errno == errno.EADDRINUSE
            else err.strerror or str(err)
        )
        print(f"error: cannot serve the API on {host}:{port}: {why}", file=sys.stderr)
        return 1
    if not settings.api_tokens:
        print(
            "no API tokens configured (WAYSTATION_API_TOKENS): binding to localhost only, "
            "every local caller may start tasks and decide approvals",
            file=sys.stderr,
        )
    print(
        f"waystation API and console on http://{host}:{port}/ (API docs: /docs)",
        file=sys.stderr,
    )
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host=host, port=port))
    server.run(sockets=[sock])
    return 0 if server.started else 1


def __getattr__(name: str) -> Any:
    # `uvicorn runtime.http_api:app` gets an app built from the environment on first use.
    if name == "app":
        return create_app()
    raise AttributeError(name)
