"""Where a task's conversation lives once the run that wrote it has handed over.

Content-addressed: a message is stored under the digest the workflow holds for it
(`workflows.conversation.message_digest`), so a write is idempotent and a read proves
itself. Over the worker's blob store (SQLite in the data directory, or the shared
database); encrypted with the payload codec when encryption is on, like history.
"""

from __future__ import annotations

from typing import Protocol

from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from workflows.conversation import message_digest
from workflows.models import ChatMessage

_ENCODING = b"json/plain"


class BlobStore(Protocol):
    """Bytes by the hex sha256-style key their writer chose; writes are idempotent."""

    async def put_many(self, items: dict[str, bytes]) -> None: ...

    async def get_many(self, digests: list[str]) -> dict[str, bytes]: ...


class ConversationStore:
    """Messages by digest, over a blob store, through the payload codec if there is one."""

    def __init__(self, blobs: BlobStore, codec: PayloadCodec | None = None) -> None:
        self._blobs = blobs
        self._codec = codec

    async def put(self, messages: dict[str, ChatMessage]) -> None:
        if not messages:
            return
        payloads = [
            Payload(metadata={"encoding": _ENCODING}, data=m.model_dump_json().encode())
            for m in messages.values()
        ]
        if self._codec is not None:
            payloads = list(await self._codec.encode(payloads))
        await self._blobs.put_many(
            {d: p.SerializeToString() for d, p in zip(messages, payloads, strict=True)}
        )

    async def get(self, digests: list[str]) -> dict[str, ChatMessage]:
        """The messages found; each is checked against its digest (a mismatch is dropped)."""
        if not digests:
            return {}
        found = await self._blobs.get_many(digests)
        keys = list(found)
        payloads = [Payload.FromString(found[k]) for k in keys]
        if self._codec is not None:
            payloads = list(await self._codec.decode(payloads))
        messages: dict[str, ChatMessage] = {}
        for key, payload in zip(keys, payloads, strict=True):
            message = ChatMessage.model_validate_json(payload.data)
            if message_digest(message) == key:
                messages[key] = message
        return messages
