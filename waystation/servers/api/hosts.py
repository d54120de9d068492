"""The names the API answers to: its guard against DNS rebinding, for every route and /mcp.

A web page on another site can make a browser send requests to 127.0.0.1 under the site's
own name (it re-points that name at 127.0.0.1), so a tokenless API on the loopback address
would take them as a local caller's. A request whose Host is not one of the API's names is
refused (421), and so is one sent by a page of another origin (403): the console is served
from the API's own origin, the Temporal Web UI calls the codec from its configured one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from waystation.servers.api.codec import CODEC_PREFIX
from waystation.servers.api.errors import send_error
from waystation.settings import Settings

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
ANY_HOST = "*"


def is_loopback(host: str) -> bool:
    """Whether a bind address is the loopback interface only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(settings: Settings) -> tuple[str, ...] | None:
    """The Host names the API answers to, None for any. Without tokens every caller is let
    in, so a tokenless API (or one bound to loopback) answers to loopback names only; with
    tokens on a public address the token authenticates and the names are the deployment's."""
    if settings.api_allowed_hosts is not None:
        names = tuple(name.lower() for name in settings.api_allowed_hosts)
        return None if ANY_HOST in names else names
    if not settings.api_tokens or is_loopback(settings.api_host):
        return LOOPBACK_NAMES
    return None


def _split(netloc: str) -> tuple[str, str | None]:
    """`name[:port]` → (name, port); an IPv6 name keeps its brackets."""
    if netloc.startswith("["):
        name, _, rest = netloc.partition("]")
        return name + "]", rest[1:] if rest.startswith(":") else None
    name, colon, port = netloc.rpartition(":")
    return (name, port) if colon else (netloc, None)


def host_allowed(netloc: str, allowed: Sequence[str]) -> bool:
    """Whether `name[:port]` is one of `allowed` (each `name`, any port, or `name:port`)."""
    name, port = _split(netloc.lower().strip())
    name = name.rstrip(".")
    for entry in allowed:
        entry_name, entry_port = _split(entry)
        if entry_name == name and entry_port in (None, port):
            return True
    return False


class HostCheck:
    """Refuses a request whose Host is not one of the API's names (421), or whose Origin is
    a page elsewhere (403), before any route sees it."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self._app = app
        self._allowed = allowed_hosts(settings)
        self._codec_origins = {origin.rstrip("/") for origin in settings.codec_cors_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._allowed is None:
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not host_allowed(host, self._allowed):
            await send_error(
                send,
                421,
                "misdirected_request",
                f"this API answers to {', '.join(self._allowed)}, not to the host "
                f"{host[:100]!r}; to serve it under another name (behind a proxy), list the "
                "name in WAYSTATION_API_ALLOWED_HOSTS",
            )
            return
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, scope["path"]):
            await send_error(
                send,
                403,
                "forbidden_origin",
                f"requests from pages of {origin[:100]!r} are refused: the console is served "
                "by this API, and the codec takes WAYSTATION_CODEC_CORS_ORIGINS",
            )
            return
        await self._app(scope, receive, send)

    def _origin_allowed(self, origin: str, path: str) -> bool:
        if path.startswith(CODEC_PREFIX) and origin.rstrip("/") in self._codec_origins:
            return True
        parts = urlsplit(origin)
        allowed = self._allowed or ()
        return parts.scheme in ("http", "https") and host_allowed(parts.netloc, allowed)
