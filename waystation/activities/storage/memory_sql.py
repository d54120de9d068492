"""The memory store's statements, for SQLite and PostgreSQL: one place for the columns
both read, so the two dialects differ only where their full-text search does.

Times are the store's clock (seconds since the epoch), passed in: TTLs are minutes to
days, and a clock injected by tests expires items without waiting."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from waystation.workflows.memory import MemoryItem

COLUMNS = "namespace, key, value, metadata, created_at, updated_at, expires_at, revision"
LIVE = "(expires_at IS NULL OR expires_at > {now})"


def upsert(mark: str) -> str:
    """Insert an item, or replace the value of one (an expired one counts as new)."""
    m = mark
    expired = f"(memory_items.expires_at IS NOT NULL AND memory_items.expires_at <= {m})"
    return (
        "INSERT INTO memory_items (namespace, key, value, metadata, created_at, updated_at,"
        f" expires_at, written_by) VALUES ({m}, {m}, {m}, {m}, {m}, {m}, {m}, {m})"
        " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
        " metadata = excluded.metadata, updated_at = excluded.updated_at,"
        " expires_at = excluded.expires_at, written_by = excluded.written_by,"
        f" created_at = CASE WHEN {expired} THEN excluded.created_at"
        " ELSE memory_items.created_at END,"
        f" revision = CASE WHEN {expired} THEN 1 ELSE memory_items.revision + 1 END"
        f" RETURNING {COLUMNS}"
    )


def upsert_params(
    namespace: str,
    key: str,
    value: str,
    metadata: Any,
    now: float,
    expires_at: float | None,
    written_by: str | None,
) -> tuple[Any, ...]:
    return (namespace, key, value, metadata, now, now, expires_at, written_by, now, now)


def item(row: Sequence[Any]) -> MemoryItem:
    namespace, key, value, metadata, created, updated, expires, revision = row
    if isinstance(metadata, str):  # SQLite keeps JSON as text
        metadata = json.loads(metadata)
    return MemoryItem(
        namespace=namespace,
        key=key,
        value=value,
        metadata=metadata,
        created_at=created,
        updated_at=updated,
        expires_at=expires,
        revision=revision,
    )
