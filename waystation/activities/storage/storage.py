"""The storage a worker opens once: the idempotency ledger, the blob store and the
deployment's identity, on SQLite (one machine) or PostgreSQL (several)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Literal

from waystation.activities.storage.backend import Backend
from waystation.activities.storage.blobs import BlobStore
from waystation.activities.storage.ledger import Ledger
from waystation.activities.storage.memory import DEFAULT_MAX_VALUE_CHARS, MemoryStore
from waystation.activities.storage.sqlite import SqliteBackend
from waystation.settings import Settings

SQLITE_FILE = "storage.sqlite3"


@dataclass(frozen=True)
class PruneReport:
    ledger_entries: int
    blobs: int
    memory_items: int = 0
    """Memory items past their TTL (never returned, deleted here)."""


class Storage:
    """Built without I/O; `open()` connects and migrates (once, however often called)."""

    def __init__(
        self, backend: Backend, *, memory_max_value_chars: int = DEFAULT_MAX_VALUE_CHARS
    ) -> None:
        self.backend = backend
        self.ledger = Ledger(backend)
        self.blobs = BlobStore(backend)
        self.memory = MemoryStore(backend, max_value_chars=memory_max_value_chars)
        self._deployment_id: str | None = None
        self._opening = asyncio.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> Storage:
        """PostgreSQL when WAYSTATION_DATABASE_URL is set, else SQLite in the data directory."""
        if settings.database_url is not None:
            from waystation.activities.storage.postgres import (
                PostgresBackend,  # psycopg only when used
            )

            return cls(
                PostgresBackend(settings.database_url.get_secret_value()),
                memory_max_value_chars=settings.memory_max_value_chars,
            )
        return cls(
            SqliteBackend(settings.data_dir.absolute() / SQLITE_FILE),
            memory_max_value_chars=settings.memory_max_value_chars,
        )

    @property
    def kind(self) -> Literal["sqlite", "postgresql"]:
        return self.backend.kind

    @property
    def location(self) -> str:
        """Where the data is (never a password)."""
        return self.backend.location

    @property
    def is_open(self) -> bool:
        return self._deployment_id is not None

    @property
    def deployment_id(self) -> str:
        """The deployment's random id, created with the schema; the same for every worker."""
        if self._deployment_id is None:
            raise RuntimeError("the storage is not open")
        return self._deployment_id

    async def open(self) -> Storage:
        async with self._opening:
            if self._deployment_id is None:
                try:
                    await self.backend.open()
                    self._deployment_id = (await self.backend.deployment()).id
                except BaseException:
                    await self.backend.close()
                    raise
        return self

    async def prune(
        self, older_than: timedelta, blobs_older_than: timedelta | None = None
    ) -> PruneReport:
        """Delete finished ledger entries older than `older_than`, blobs unused for
        `blobs_older_than` (default: the same), and expired memory items."""
        return PruneReport(
            ledger_entries=await self.ledger.prune(older_than),
            blobs=await self.blobs.prune(blobs_older_than or older_than),
            memory_items=await self.memory.purge(),
        )

    async def close(self) -> None:
        async with self._opening:
            if self._deployment_id is not None:
                self._deployment_id = None
                await self.backend.close()

    async def __aenter__(self) -> Storage:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


async def open_storage(settings: Settings) -> Storage:
    """The configured storage, open and migrated."""
    return await Storage.from_settings(settings).open()
