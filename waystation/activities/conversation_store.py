"""Where a task's conversation lives once the run that wrote it has handed over.

Content-addressed: a message is stored under the digest the workflow holds for it
(`waystation.workflows.conversation.message_digest`), so a write is idempotent and a read proves
itself. Over the worker's blob store (SQLite in the data directory, or the shared
database); encrypted with the payload codec when encryption is on, like history.
"""

from __future__ import annotations

from waystation.activities.sealed_blobs import SealedBlobs
from waystation.workflows.conversation import message_digest
from waystation.workflows.models import ChatMessage


class ConversationStore:
    """Messages by digest, over sealed blobs."""

    def __init__(self, blobs: SealedBlobs) -> None:
        self._blobs = blobs

    async def put(self, messages: dict[str, ChatMessage]) -> None:
        await self._blobs.put({d: m.model_dump_json().encode() for d, m in messages.items()})

    async def get(self, digests: list[str]) -> dict[str, ChatMessage]:
        """The messages found; each is checked against its digest (a mismatch is dropped)."""
        found = await self._blobs.get(digests)
        messages: dict[str, ChatMessage] = {}
        for key, data in found.items():
            message = ChatMessage.model_validate_json(data)
            if message_digest(message) == key:
                messages[key] = message
        return messages
