"""A content-addressed blob store: bytes under the hex SHA-256 digest of themselves.

Generic: what goes in is the caller's business (conversation snapshots, for one). Writing
a blob that exists leaves it alone; blobs neither read nor written for the retention age
are pruned, so a caller must be able to do without a blob it has not touched that long.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import timedelta

from activities.storage.backend import Backend


def digest_of(content: bytes) -> str:
    """The key a blob is stored under."""
    return hashlib.sha256(content).hexdigest()


class BlobStore:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def put_many(self, items: Mapping[str, bytes]) -> None:
        """Store blobs keyed by their digest; existing ones are kept (and marked as used)."""
        for key, content in items.items():
            if digest_of(content) != key:
                raise ValueError(f"blob key {key[:16]}... is not the SHA-256 of its bytes")
        await self._backend.blobs_put(dict(items))

    async def get_many(self, digests: list[str]) -> dict[str, bytes]:
        """The blobs found among `digests` (missing ones are absent), marked as used."""
        return await self._backend.blobs_get(list(dict.fromkeys(digests)))

    async def prune(self, older_than: timedelta) -> int:
        """Delete blobs neither read nor written for `older_than`; how many."""
        return await self._backend.blobs_prune(older_than.total_seconds())
