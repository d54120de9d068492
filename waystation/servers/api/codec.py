"""The codec server: the Temporal Web UI and CLI decrypt payloads through it.

The Web UI calls it from its own origin, so these routes, and only these, answer CORS
requests from WAYSTATION_CODEC_CORS_ORIGINS."""

from __future__ import annotations

from typing import Any

from cryptography.exceptions import InvalidTag
from fastapi import APIRouter, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from google.protobuf import json_format
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.api.common.v1 import Payloads

from waystation.activities.payload_codec import payload_codec
from waystation.servers.api.auth import Caller, Reader, settings_of
from waystation.servers.api.errors import ApiError

CODEC_PREFIX = "/codec/"

router = APIRouter(tags=["codec"])


class CodecCors:
    """CORS for the codec's routes only: another origin may never read the rest of the API."""

    def __init__(self, app: ASGIApp, origins: list[str]) -> None:
        self._app = app
        self._cors = CORSMiddleware(
            app,
            allow_origins=origins,
            allow_methods=["POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Namespace"],
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(CODEC_PREFIX):
            await self._cors(scope, receive, send)
        else:
            await self._app(scope, receive, send)


async def _run_codec(request: Request, encode: bool, who: Caller) -> JSONResponse:
    if who.tenant is not None:
        # The codec decrypts any payload, whichever tenant's task it comes from.
        raise ApiError(
            403, "forbidden", f"{who.name} is bound to a tenant: the codec serves unbound tokens"
        )
    codec = payload_codec(settings_of(request))
    if codec is None:
        raise ApiError(404, "no_codec", "payload encryption is off on this server")
    try:
        payloads = json_format.Parse(await request.body(), Payloads())
    except json_format.ParseError as err:
        raise ApiError(400, "invalid_payloads", f"not a Payloads message: {err}") from None
    try:
        done = await (codec.encode if encode else codec.decode)(list(payloads.payloads))
    except (ValueError, InvalidTag) as err:
        raise ApiError(400, "undecodable", f"cannot decode these payloads: {err}") from None
    return JSONResponse(json_format.MessageToDict(Payloads(payloads=done)))


@router.post("/codec/decode", response_model=dict[str, Any])
async def codec_decode(request: Request, who: Reader) -> JSONResponse:
    """Codec server: decrypt payloads for the Temporal Web UI and CLI (`--codec-endpoint`)."""
    return await _run_codec(request, encode=False, who=who)


@router.post("/codec/encode", response_model=dict[str, Any])
async def codec_encode(request: Request, who: Reader) -> JSONResponse:
    """Codec server: encrypt payloads (for `temporal workflow signal` with a codec)."""
    return await _run_codec(request, encode=True, who=who)
