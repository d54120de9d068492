"""The web console: one page and its static files, under a strict Content-Security-Policy.

The page is plain HTML, CSS and JavaScript modules from `waystation/servers/console/` (no build
step). It calls the same API with the same bearer token, which it keeps in the tab's
sessionStorage and sends as a header: no cookie, so no request can ride on an ambient
credential and there is nothing for CSRF to abuse.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable

from fastapi import APIRouter
from fastapi.responses import Response

from waystation.servers.api import inbox, overview
from waystation.servers.api.errors import ApiError

# Scripts and styles from this origin only, no inline code, no eval; `require-trusted-types`
# makes any string assigned to innerHTML (or another script sink) throw in the browser.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # The files change with the installed version; a revalidation is cheap on localhost.
    "Cache-Control": "no-cache",
}
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
ASSET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*\.(html|js|css|svg)$")

router = APIRouter()
router.include_router(inbox.router)
router.include_router(overview.router)


def console_files() -> Traversable:
    """The console's files as installed with the package (`waystation/servers/console/`)."""
    return resources.files("waystation.servers") / "console"


def _file_response(name: str) -> Response:
    if not ASSET_NAME.match(name):
        raise ApiError(404, "not_found", f"the console has no file {name!r}")
    path = console_files() / name
    if not path.is_file():
        raise ApiError(404, "not_found", f"the console has no file {name!r}")
    media_type = MEDIA_TYPES["." + name.rsplit(".", 1)[1]]
    return Response(path.read_bytes(), media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/", include_in_schema=False)
async def page() -> Response:
    """The console's page; everything else it needs comes from /console/ and the API."""
    return _file_response("index.html")


@router.get("/console/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    """A static file of the console (scripts, styles, icons): names are checked, no paths."""
    return _file_response(name)
