"""The HTTP API: the REST face of AgentRuntime. Every endpoint is a thin layer over it.

    ws api                           # or: uvicorn waystation.servers.http_api:app

Bearer tokens come from settings (`WAYSTATION_API_TOKENS`); with none configured the server
binds to localhost only, answers to loopback names only (waystation/servers/api/hosts.py) and
lets every local caller in as an approver named "local". A body is read only for a known
caller, and only up to a limit (waystation/servers/api/body_limit.py). The routes live in
`waystation/servers/api/`, one router per concern; MCP clients are served at /mcp
(waystation/servers/mcp_server.py) behind the same tokens.
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

from waystation.client.agent_runtime import AgentRuntime
from waystation.client.temporal import connect
from waystation.servers.api import codec, console, memory, schedules, tasks
from waystation.servers.api.body_limit import BodyLimit
from waystation.servers.api.errors import ERROR_RESPONSES, install_error_handlers
from waystation.servers.api.hosts import HostCheck, is_loopback
from waystation.servers.mcp_server import mount_http
from waystation.settings import Settings
from waystation.settings.commands import command
from waystation.settings.errors import load_settings


def create_app(
    settings: Settings | None = None,
    runtime: AgentRuntime | None = None,
    *,
    sse_ping_seconds: float = tasks.SSE_PING_SECONDS,
) -> FastAPI:
    """The API over `runtime` (or one connected from `settings` at start-up); without
    settings, those of the environment (SettingsProblem, quoting no secret, if they are bad)."""
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runtime is None:
            app.state.runtime = AgentRuntime(await connect(settings), settings)
        else:
            app.state.runtime = runtime
        async with mcp_sessions.run():
            yield
        await app.state.runtime.memory.close()

    app = FastAPI(
        title="waystation",
        version="0.1.0",
        description="Durable AI-agent tasks on Temporal: start, follow, approve, resume.",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        # Swagger UI and ReDoc load their scripts from a CDN: the schema is /openapi.json.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.sse_ping_seconds = sse_ping_seconds
    # A repeated approval with the same Idempotency-Key gets the first answer back.
    app.state.answered = OrderedDict()
    # Outermost last: the Host check, then CORS (the codec's routes only), then the body's.
    app.add_middleware(BodyLimit, settings=settings)
    app.add_middleware(codec.CodecCors, origins=settings.codec_cors_origins)
    app.add_middleware(HostCheck, settings=settings)
    install_error_handlers(app)
    app.include_router(codec.router)
    app.include_router(tasks.router)
    app.include_router(memory.router)
    app.include_router(schedules.router)
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


def main(settings: Settings) -> int:
    """Serve until interrupted. Exit code 1 when the API cannot start (a taken port says so
    in one sentence; a start-up that fails, e.g. Temporal unreachable, in uvicorn's log),
    not uvicorn's 3, which the command line uses for a task waiting for approval."""
    import uvicorn

    host, port = settings.api_host, settings.api_port
    if not settings.api_tokens and not is_loopback(host):
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
        f"waystation API and console on http://{host}:{port}/ (OpenAPI: /openapi.json)",
        file=sys.stderr,
    )
    app = create_app(settings.model_copy(update={"api_host": host}))
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port))
    server.run(sockets=[sock])
    return 0 if server.started else 1


def __getattr__(name: str) -> Any:
    # `uvicorn waystation.servers.http_api:app` gets an app built from the environment on first use.
    if name == "app":
        return create_app()
    raise AttributeError(name)
