"""Memory outside a task: what the CLI, the HTTP API, MCP, the console and Python code read
and write, held to one set of rules.

- A caller bound to a tenant reaches only that tenant's namespaces (`TENANT:AGENT`); one
  bound to none reaches every namespace.
- A reader may read; writing and deleting need an approver (the role that decides what a
  task may do: waystation/client/task_rights.py).
- Every refusal is a MemoryRequestError with a kind, an HTTP status and one sentence;
  nothing is written when one is raised.

The storage is the deployment's (WAYSTATION_DATABASE_URL, else SQLite in the data
directory), opened on first use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from waystation.activities.storage import Storage
from waystation.activities.storage.memory import (
    LISTED,
    UNKNOWN_ITEM,
    MemoryRequestError,
    MemoryStore,
    check_reach,
)
from waystation.settings import Role, Settings
from waystation.workflows.memory import RECALL_LIMIT, MemoryItem

FORBIDDEN_ROLE = "forbidden"


class MemoryAccess:
    """The deployment's memory as one caller may reach it (`tenant`, `role` per call)."""

    def __init__(self, settings: Settings, storage: Storage | None = None) -> None:
        self._settings = settings
        self._storage = storage
        self._opening = asyncio.Lock()

    async def store(self) -> MemoryStore:
        async with self._opening:
            if self._storage is None:
                self._storage = Storage.from_settings(self._settings)
            if not self._storage.is_open:
                await self._storage.open()
        return self._storage.memory

    async def close(self) -> None:
        if self._storage is not None:
            await self._storage.close()

    async def namespaces(self, tenant: str | None = None) -> list[tuple[str, int]]:
        """The namespaces holding items, and how many (a bound caller's tenant's only)."""
        return await (await self.store()).namespaces(tenant)

    async def items(
        self,
        namespace: str,
        *,
        tenant: str | None = None,
        limit: int = LISTED,
        after: str | None = None,
    ) -> list[MemoryItem]:
        check_reach(namespace, tenant)
        memory = await self.store()
        await memory.known(namespace)
        return await memory.items(namespace, limit=limit, after=after)

    async def search(
        self, namespace: str, query: str, *, tenant: str | None = None, limit: int = RECALL_LIMIT
    ) -> list[MemoryItem]:
        check_reach(namespace, tenant)
        memory = await self.store()
        await memory.known(namespace)
        return await memory.search(namespace, query, limit)

    async def get(self, namespace: str, key: str, *, tenant: str | None = None) -> MemoryItem:
        check_reach(namespace, tenant)
        memory = await self.store()
        found = await memory.get(namespace, key)
        if found is None:
            await memory.known(namespace)  # which of the two is unknown
            raise MemoryRequestError(
                UNKNOWN_ITEM, 404, f"namespace {namespace!r} holds no item {key!r}"
            )
        return found

    async def put(
        self,
        namespace: str,
        key: str,
        value: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        ttl_seconds: float | None = None,
        tenant: str | None = None,
        role: Role = "approver",
    ) -> MemoryItem:
        check_reach(namespace, tenant)
        _may_write(role)
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise MemoryRequestError("invalid_ttl", 400, "ttl_seconds must be above 0")
        memory = await self.store()
        return await memory.put(namespace, key, value, metadata=metadata, ttl_seconds=ttl_seconds)

    async def delete(
        self, namespace: str, key: str, *, tenant: str | None = None, role: Role = "approver"
    ) -> None:
        check_reach(namespace, tenant)
        _may_write(role)
        memory = await self.store()
        if not await memory.delete(namespace, key):
            await memory.known(namespace)
            raise MemoryRequestError(
                UNKNOWN_ITEM, 404, f"namespace {namespace!r} holds no item {key!r}"
            )


def _may_write(role: Role) -> None:
    if role != "approver":
        raise MemoryRequestError(
            FORBIDDEN_ROLE,
            403,
            f"a {role} may read memory, not write or delete it: that needs an approver",
        )
