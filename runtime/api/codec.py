"""The codec server: the Temporal Web UI and CLI decrypt payloads through it."""

from __future__ import annotations

from typing import Any

from cryptography.exceptions import InvalidTag
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from runtime.api.auth import Reader, settings_of
from runtime.api.errors import ApiError

router = APIRouter(tags=["codec"])


async def _run_codec(request: Request, encode: bool) -> JSONResponse:
    codec = settings_of(request).payload_codec()
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
    return await _run_codec(request, encode=False)


@router.post("/codec/encode", response_model=dict[str, Any])
async def codec_encode(request: Request, who: Reader) -> JSONResponse:
    """Codec server: encrypt payloads (for `temporal workflow signal` with a codec)."""
    return await _run_codec(request, encode=True)
