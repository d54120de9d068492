"""Page tokens of task lists (waystation/client/task_list.py's), with a checksum so forged ones fail
fast."""

from __future__ import annotations

import base64
import binascii
import hashlib

from waystation.client.task_list import is_page_token
from waystation.servers.api.errors import ApiError

PAGE_TOKEN_CHECK_BYTES = 8


def _check(token: bytes) -> bytes:
    return hashlib.blake2b(token, digest_size=PAGE_TOKEN_CHECK_BYTES).digest()


def encode_page_token(token: bytes) -> str:
    """A task list's page token with a checksum: the API refuses a token it did not make
    before anything reads it."""
    return base64.urlsafe_b64encode(_check(token) + token).decode()


def decode_page_token(encoded: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(encoded.encode())
    except (binascii.Error, ValueError):
        raw = b""
    check, token = raw[:PAGE_TOKEN_CHECK_BYTES], raw[PAGE_TOKEN_CHECK_BYTES:]
    if not token or check != _check(token) or not is_page_token(token):
        raise ApiError(400, "invalid_page_token", "page_token is not one this API gave out")
    return token
