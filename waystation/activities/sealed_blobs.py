"""Blobs written and read through the payload codec: encrypted at rest when encryption is
on, like history. The conversation store and the event archive keep their bytes here."""

from __future__ import annotations

from typing import Protocol

from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

_ENCODING = b"json/plain"


class Blobs(Protocol):
    """Bytes by the key their writer chose; writes are idempotent."""

    async def put_many(self, items: dict[str, bytes]) -> None: ...

    async def get_many(self, digests: list[str]) -> dict[str, bytes]: ...


class SealedBlobs:
    """JSON documents by key, over a blob store, through the payload codec if there is one."""

    def __init__(self, blobs: Blobs, codec: PayloadCodec | None = None) -> None:
        self._blobs = blobs
        self._codec = codec

    async def put(self, documents: dict[str, bytes]) -> None:
        if not documents:
            return
        payloads = [
            Payload(metadata={"encoding": _ENCODING}, data=data) for data in documents.values()
        ]
        if self._codec is not None:
            payloads = list(await self._codec.encode(payloads))
        await self._blobs.put_many(
            {k: p.SerializeToString() for k, p in zip(documents, payloads, strict=True)}
        )

    async def get(self, keys: list[str]) -> dict[str, bytes]:
        """The documents found (missing keys are absent), decoded."""
        if not keys:
            return {}
        found = await self._blobs.get_many(keys)
        present = list(found)
        payloads = [Payload.FromString(found[k]) for k in present]
        if self._codec is not None:
            payloads = list(await self._codec.decode(payloads))
        return {k: p.data for k, p in zip(present, payloads, strict=True)}
