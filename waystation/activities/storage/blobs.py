"""A content-addressed blob store: bytes under a key that names their content.

Generic: what goes in is the caller's business, and so is the address (the conversation
store keys a message by the digest of its plain text, whatever its encrypted bytes are) and
checking what it reads back. Writing a blob that exists leaves it alone; blobs neither
read nor written for the retention age are pruned.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import timedelta

from waystation.activities.storage.backend import Backend


def digest_of(content: bytes) -> str:
    """The plain content address of some bytes (a caller may use another)."""
    return hashlib.sha256(content).hexdigest()


class BlobStore:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def put_many(self, items: Mapping[str, bytes]) -> None:
        """Store blobs by their content address; existing ones are kept (marked as used)."""
        await self._backend.blobs_put(dict(items))

    async def get_many(self, digests: list[str]) -> dict[str, bytes]:
        """The blobs found among `digests` (missing ones are absent), marked as used."""
        return await self._backend.blobs_get(list(dict.fromkeys(digests)))

    async def prune(self, older_than: timedelta) -> int:
        """Delete blobs neither read nor written for `older_than`; how many."""
        return await self._backend.blobs_prune(older_than.total_seconds())
