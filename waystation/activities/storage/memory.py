"""The memory store: items in namespaces that outlive a task, in the ledger's database.

Every read leaves out expired items (a TTL is a promise that the item is gone), and
`purge` deletes them. A write a tool call makes names its idempotency key
(`written_by`), so a retry of the call can tell whether its lost attempt wrote.
The clock is the store's own, injectable: tests expire items without waiting."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from waystation.activities.storage.backend import Backend
from waystation.workflows.memory import (
    KEY_PATTERN,
    MOST_RECALLED,
    MemoryItem,
    is_namespace,
    tenant_of,
)

DEFAULT_MAX_VALUE_CHARS = 16_000
LISTED = 100
_WORD = re.compile(r"\w+")
_QUERY_WORDS = 32
# Left out of a search on both backends (PostgreSQL's english configuration drops these and
# more; SQLite's FTS5 drops none): "what is the ..." must not match every item with "the".
_STOP_WORDS = frozenset(
    "a an and are as at be by do does for from had has have how i in is it its me my of on "
    "or s so that the their them there they this to was we were what when where which who "
    "why will with you your".split()
)

# What is wrong with a request to the store: its `kind`, one per case.
INVALID_NAMESPACE = "invalid_namespace"
INVALID_KEY = "invalid_key"
VALUE_TOO_LARGE = "value_too_large"
UNKNOWN_NAMESPACE = "unknown_namespace"
UNKNOWN_ITEM = "unknown_item"
FORBIDDEN_NAMESPACE = "forbidden_namespace"


class MemoryRequestError(ValueError):
    """A request the store refuses, with nothing changed: `kind` says which case, `status`
    the HTTP answer; the message is one sentence saying what to do."""

    def __init__(self, kind: str, status: int, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


def check_namespace(namespace: str) -> str:
    if not is_namespace(namespace):
        raise MemoryRequestError(
            INVALID_NAMESPACE,
            400,
            f"{namespace[:80]!r} is not a memory namespace: TENANT:AGENT, or AGENT for tasks "
            "without a tenant (each 1 to 64 letters, digits, '_', '.', '@' or '-')",
        )
    return namespace


def check_reach(namespace: str, tenant: str | None) -> str:
    """`namespace`, if a caller bound to `tenant` (None: bound to none) may reach it."""
    check_namespace(namespace)
    if tenant is not None and tenant_of(namespace) != tenant:
        raise MemoryRequestError(
            FORBIDDEN_NAMESPACE,
            403,
            f"this token is bound to tenant {tenant!r} and reaches only its namespaces "
            f"({tenant}:AGENT), not {namespace!r}",
        )
    return namespace


def query_words(query: str) -> list[str]:
    """The words of a search (punctuation is no operator: what a model writes never fails)."""
    words = [w for w in _WORD.findall(query.lower()) if w not in _STOP_WORDS]
    return list(dict.fromkeys(words))[:_QUERY_WORDS]


class MemoryStore:
    """Items by namespace and key, over the deployment's storage backend."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_value_chars: int = DEFAULT_MAX_VALUE_CHARS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._backend = backend
        self.max_value_chars = max_value_chars
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    def check_item(self, namespace: str, key: str, value: str) -> None:
        """Refuse what `put` would refuse, before anything is written."""
        check_namespace(namespace)
        if re.fullmatch(KEY_PATTERN, key) is None:
            raise MemoryRequestError(
                INVALID_KEY, 400, "a memory key is 1 to 200 characters, none of them a control"
            )
        if len(value) > self.max_value_chars:
            raise MemoryRequestError(
                VALUE_TOO_LARGE,
                413,
                f"the value has {len(value)} characters, more than the {self.max_value_chars} "
                "an item may hold (WAYSTATION_MEMORY_MAX_VALUE_CHARS): store less, or split it "
                "under several keys",
            )

    async def put(
        self,
        namespace: str,
        key: str,
        value: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        ttl_seconds: float | None = None,
        written_by: str | None = None,
    ) -> MemoryItem:
        self.check_item(namespace, key, value)
        now = self.now()
        expires = now + ttl_seconds if ttl_seconds is not None else None
        return await self._backend.memory_put(
            namespace, key, value, metadata, now, expires, written_by
        )

    async def get(self, namespace: str, key: str) -> MemoryItem | None:
        return await self._backend.memory_get(check_namespace(namespace), key, self.now())

    async def written_by(self, namespace: str, key: str) -> str | None:
        return await self._backend.memory_written_by(namespace, key)

    async def delete(self, namespace: str, key: str) -> bool:
        return await self._backend.memory_delete(check_namespace(namespace), key)

    async def items(
        self, namespace: str, *, limit: int = LISTED, after: str | None = None
    ) -> list[MemoryItem]:
        return await self._backend.memory_list(check_namespace(namespace), self.now(), limit, after)

    async def search(self, namespace: str, query: str, limit: int) -> list[MemoryItem]:
        """The items that best match `query` (any of its words), at most `limit`; an empty
        query gives the most recently written."""
        limit = max(1, min(limit, MOST_RECALLED))
        words = query_words(query)
        return await self._backend.memory_search(
            check_namespace(namespace), words, self.now(), limit
        )

    async def namespaces(self, tenant: str | None = None) -> list[tuple[str, int]]:
        """Namespaces with live items, and how many; with `tenant`, that tenant's only."""
        prefix = f"{tenant}:" if tenant is not None else None
        return await self._backend.memory_namespaces(prefix, self.now())

    async def known(self, namespace: str) -> None:
        """Raise UNKNOWN_NAMESPACE unless the namespace holds a live item."""
        if not await self._backend.memory_list(check_namespace(namespace), self.now(), 1, None):
            raise MemoryRequestError(
                UNKNOWN_NAMESPACE,
                404,
                f"no memory namespace {namespace!r} (none of its items is live): `ws memory "
                "namespaces` lists those that hold items",
            )

    async def purge(self) -> int:
        """Delete the expired items; how many."""
        return await self._backend.memory_purge(self.now())
