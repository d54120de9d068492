"""How a notice is signed, and how a receiver checks it (the README's receiver does this).

    signed  = timestamp + "." + body          (the exact bytes of the request body)
    header  = "sha256=" + hex(HMAC-SHA256(secret, signed))

The timestamp is the `X-Waystation-Timestamp` header (Unix seconds, of this attempt): a
receiver refuses one too far from its clock (the README's receiver: 5 minutes), so a
captured request cannot be replayed later; waystation/testing/webhook_receiver.py checks it so.
"""

from __future__ import annotations

import hashlib
import hmac

IDEMPOTENCY_HEADER = "Idempotency-Key"
TIMESTAMP_HEADER = "X-Waystation-Timestamp"
SIGNATURE_HEADER = "X-Waystation-Signature"
EVENT_HEADER = "X-Waystation-Event"
ATTEMPT_HEADER = "X-Waystation-Attempt"
SIGNATURE_PREFIX = "sha256="


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Waystation-Signature` value of `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return SIGNATURE_PREFIX + mac.hexdigest()
