"""A request's body is read only for a known caller, and only up to a limit.

FastAPI reads a route's body before it resolves the route's dependencies (the token check
among them), so without this guard anyone could make the API hold a body of any size before
hearing 401. In front of every route and /mcp: a request that carries a body must name a
known token first (401), must not declare more than WAYSTATION_API_MAX_BODY_BYTES (413 at
once), and is read at most that far (413 as soon as a chunked body passes it).
"""

from __future__ import annotations

from collections import deque

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from waystation.servers.api.auth import identify
from waystation.servers.api.errors import ApiError, send_error
from waystation.settings import Settings


def _carries_body(headers: Headers) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0") != "0"


class BodyLimit:
    """Authenticates a request with a body before reading it, and caps what it reads."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self._app = app
        self._settings = settings
        self._limit = settings.api_max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not _carries_body(headers):
            await self._app(scope, receive, send)
            return
        try:
            identify(self._settings.api_tokens, headers.get("authorization"))
        except ApiError as err:
            await send_error(send, err.status, err.error, err.detail)
            return
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._limit:
            await self._too_large(send)
            return
        # Read up to the limit here, so that a chunked body (no Content-Length) is refused
        # as soon as it passes it; the route then reads the body from memory.
        body = bytearray()
        rest: deque[Message] = deque()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                rest.append(message)  # the client left: the route hears it
                break
            body += message.get("body", b"")
            if len(body) > self._limit:
                await self._too_large(send)
                return
            if not message.get("more_body", False):
                break
        rest.appendleft({"type": "http.request", "body": bytes(body), "more_body": False})

        async def replay() -> Message:
            return rest.popleft() if rest else await receive()

        await self._app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        await send_error(
            send,
            413,
            "body_too_large",
            f"the request body is larger than {self._limit} bytes, the most this API reads "
            "(WAYSTATION_API_MAX_BODY_BYTES)",
        )
