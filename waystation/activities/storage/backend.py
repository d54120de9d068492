"""What the ledger and the blob store need from a database, implemented for SQLite (one
machine) and PostgreSQL (several). Time is the database's own: leases are compared with
one clock however far apart the workers' clocks are."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from waystation.activities.storage.quota_state import QuotaDecision, QuotaRequest
from waystation.workflows.memory import MemoryItem

# A blob read or written is marked as used at most this often (a read stays a read).
BLOB_USE_RESOLUTION_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class LedgerEntry:
    """What the ledger holds for one idempotency key."""

    key: str
    tool: str
    state: Literal["started", "done"]
    detail: dict[str, Any]
    """What the attempt recorded before acting, to tell later whether its effect happened
    (empty: it claimed the key but had not started)."""
    result: str | None
    is_error: bool
    owner: str
    """The attempt that holds (or held) the key: `<host>/<pid>/<random>`."""
    host: str
    lease_live: bool
    """The owner's lease has not expired: it is alive and working on the key."""


@dataclass(frozen=True)
class Deployment:
    id: str
    workspace_id: str | None


class Backend(Protocol):
    @property
    def kind(self) -> Literal["sqlite", "postgresql"]: ...

    @property
    def location(self) -> str:
        """Where the data is, for messages: never a password."""

    async def open(self) -> None:
        """Connect and bring the schema up to date."""

    async def close(self) -> None: ...

    async def deployment(self) -> Deployment: ...

    async def register_workspace(self, workspace_id: str) -> str:
        """Record `workspace_id` as the deployment's workspace unless one is; return it."""

    async def forget_workspace(self) -> None: ...

    async def stats(self) -> dict[str, int]: ...

    async def ledger_get(self, key: str) -> LedgerEntry | None: ...

    async def ledger_insert(self, key: str, tool: str, owner: str, host: str, lease: float) -> bool:
        """Claim a key nobody has claimed; False if it exists."""

    async def ledger_take_over(
        self, key: str, previous_owner: str, owner: str, host: str, lease: float
    ) -> bool:
        """Claim a started key whose owner's lease expired (compare-and-set on the owner)."""

    async def ledger_record_start(
        self, key: str, owner: str, detail: Mapping[str, Any], lease: float
    ) -> bool:
        """Record what the owner is about to do; False if it no longer holds the key."""

    async def ledger_finish(self, key: str, result: str, is_error: bool) -> None: ...

    async def ledger_put(
        self, key: str, tool: str, detail: Mapping[str, Any], owner: str, host: str
    ) -> None:
        """Record a finished entry under `key`, replacing whatever entry was there."""

    async def ledger_renew(self, owner: str, lease: float) -> None:
        """Extend the lease of every key `owner` holds."""

    async def ledger_release(self, owner: str) -> None:
        """End the lease of every key `owner` still holds, so a retry inspects it at once."""

    async def ledger_prune(self, older_than: float) -> int: ...

    async def blobs_put(self, items: Mapping[str, bytes]) -> None: ...

    async def blobs_get(self, digests: list[str]) -> dict[str, bytes]: ...

    async def blobs_prune(self, older_than: float) -> int: ...

    async def quota_admit(self, owner: str, requests: list[QuotaRequest]) -> list[QuotaDecision]:
        """In one transaction that holds every quota involved: admit, in order, the
        requests their quotas let through now (each counted against each of its quotas,
        its slot a lease of `owner`); the others wait, as waiters whose lease this renews."""

    async def quota_renew(self, owner: str, call_ids: list[str]) -> None:
        """Extend the leases of these call slots `owner` holds (a slot its process no longer
        tracks, its release lost, lapses)."""

    async def quota_release(
        self, call_id: str, input_tokens: int | None, output_tokens: int
    ) -> None:
        """End a call's slot; its tokens, as the provider reported them, count in the window."""

    async def quota_leave(self, call_ids: list[str]) -> None:
        """Remove waiters that stopped waiting (cancelled)."""

    async def quota_pause(self, quotas: list[str], seconds: float) -> None:
        """Send nothing under these quotas for `seconds` from now (a pause never shortens)."""

    async def memory_put(
        self,
        namespace: str,
        key: str,
        value: str,
        metadata: Mapping[str, Any] | None,
        now: float,
        expires_at: float | None,
        written_by: str | None,
    ) -> MemoryItem:
        """Insert or replace an item (an expired one is replaced as new); the item as stored.
        `written_by` names the write (a tool call's idempotency key), for a retry to find."""

    async def memory_get(self, namespace: str, key: str, now: float) -> MemoryItem | None: ...

    async def memory_written_by(self, namespace: str, key: str) -> str | None:
        """Which write last wrote the item (expired or not)."""

    async def memory_delete(self, namespace: str, key: str) -> bool: ...

    async def memory_list(
        self, namespace: str, now: float, limit: int, after: str | None
    ) -> list[MemoryItem]:
        """The live items in key order, from the first key after `after`."""

    async def memory_search(
        self, namespace: str, words: list[str], now: float, limit: int
    ) -> list[MemoryItem]:
        """The live items matching any of `words` (full-text), best first; with no words,
        the most recently written."""

    async def memory_namespaces(self, prefix: str | None, now: float) -> list[tuple[str, int]]:
        """The namespaces holding live items (those starting with `prefix`), and how many."""

    async def memory_purge(self, now: float) -> int:
        """Delete the items expired at `now`; how many."""
