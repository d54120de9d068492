"""The schema, as ordered migrations per dialect. A database records the versions it has
(`schema_version`); a worker applies the missing ones at start, under a lock, so workers
that start together migrate once. Append migrations; never edit one that has shipped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from waystation.activities.storage.errors import SchemaTooNewError


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


SQLITE_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version"
    " (version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at REAL NOT NULL)"
)
POSTGRES_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY,"
    " description TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
)

SQLITE: tuple[Migration, ...] = (
    Migration(
        1,
        "deployment, idempotency ledger with leases, blobs",
        (
            "CREATE TABLE deployment (singleton INTEGER PRIMARY KEY CHECK (singleton = 1),"
            " id TEXT NOT NULL, workspace_id TEXT, created_at REAL NOT NULL)",
            "CREATE TABLE ledger (key TEXT PRIMARY KEY, tool TEXT NOT NULL,"
            " state TEXT NOT NULL CHECK (state IN ('started', 'done')),"
            " detail TEXT NOT NULL DEFAULT '{}', result TEXT,"
            " is_error INTEGER NOT NULL DEFAULT 0, owner TEXT NOT NULL, host TEXT NOT NULL,"
            " lease_until REAL NOT NULL, updated_at REAL NOT NULL)",
            "CREATE INDEX ledger_done_by_age ON ledger (updated_at) WHERE state = 'done'",
            "CREATE INDEX ledger_by_owner ON ledger (owner) WHERE state = 'started'",
            "CREATE TABLE blobs (digest TEXT PRIMARY KEY, content BLOB NOT NULL,"
            " used_at REAL NOT NULL)",
            "CREATE INDEX blobs_by_use ON blobs (used_at)",
        ),
    ),
    Migration(
        2,
        "model quotas: admitted calls, waiters with leases, pauses",
        (
            "CREATE TABLE quota_state (quota TEXT PRIMARY KEY,"
            " paused_until REAL NOT NULL DEFAULT 0)",
            "CREATE TABLE quota_calls (call_id TEXT NOT NULL, quota TEXT NOT NULL,"
            " tenant TEXT NOT NULL, owner TEXT NOT NULL, admitted_at REAL NOT NULL,"
            " input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL DEFAULT 0,"
            " lease_until REAL NOT NULL, lease_seconds REAL NOT NULL,"
            " PRIMARY KEY (call_id, quota))",
            "CREATE INDEX quota_calls_by_time ON quota_calls (quota, admitted_at)",
            "CREATE INDEX quota_calls_by_owner ON quota_calls (owner, lease_until)",
            "CREATE TABLE quota_waiters (call_id TEXT NOT NULL, quota TEXT NOT NULL,"
            " tenant TEXT NOT NULL, owner TEXT NOT NULL, since REAL NOT NULL,"
            " lease_until REAL NOT NULL, blocked_on TEXT, PRIMARY KEY (call_id, quota))",
            "CREATE INDEX quota_waiters_by_quota ON quota_waiters (quota, since)",
        ),
    ),
    Migration(
        3,
        "memory across tasks: namespaced items with full-text search (FTS5) and TTLs",
        (
            "CREATE TABLE memory_items (id INTEGER PRIMARY KEY, namespace TEXT NOT NULL,"
            " key TEXT NOT NULL, value TEXT NOT NULL, metadata TEXT,"
            " created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL,"
            " revision INTEGER NOT NULL DEFAULT 1, written_by TEXT,"
            " UNIQUE (namespace, key))",
            "CREATE INDEX memory_items_by_expiry ON memory_items (expires_at)"
            " WHERE expires_at IS NOT NULL",
            # External content: the index holds the words, the table the text.
            "CREATE VIRTUAL TABLE memory_search USING fts5(key, value,"
            " content='memory_items', content_rowid='id', tokenize='porter unicode61')",
            "CREATE TRIGGER memory_items_indexed AFTER INSERT ON memory_items BEGIN"
            " INSERT INTO memory_search (rowid, key, value) VALUES (new.id, new.key, new.value);"
            " END",
            "CREATE TRIGGER memory_items_unindexed AFTER DELETE ON memory_items BEGIN"
            " INSERT INTO memory_search (memory_search, rowid, key, value)"
            " VALUES ('delete', old.id, old.key, old.value); END",
            "CREATE TRIGGER memory_items_reindexed AFTER UPDATE ON memory_items BEGIN"
            " INSERT INTO memory_search (memory_search, rowid, key, value)"
            " VALUES ('delete', old.id, old.key, old.value);"
            " INSERT INTO memory_search (rowid, key, value) VALUES (new.id, new.key, new.value);"
            " END",
        ),
    ),
    Migration(
        4,
        "model quotas: the input tokens a waiter asks for (its tenant's share of the quota)"
        " and the waiter whose turn it waits for",
        # NULL: a waiter of a build that keeps none, still running beside this one.
        (
            "ALTER TABLE quota_waiters ADD COLUMN input_tokens INTEGER",
            "ALTER TABLE quota_waiters ADD COLUMN waits_for TEXT",
        ),
    ),
)

POSTGRES: tuple[Migration, ...] = (
    Migration(
        1,
        "deployment, idempotency ledger with leases, blobs",
        (
            "CREATE TABLE deployment (singleton BOOLEAN PRIMARY KEY DEFAULT TRUE"
            " CHECK (singleton), id TEXT NOT NULL, workspace_id TEXT,"
            " created_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            "CREATE TABLE ledger (key TEXT PRIMARY KEY, tool TEXT NOT NULL,"
            " state TEXT NOT NULL CHECK (state IN ('started', 'done')),"
            " detail JSONB NOT NULL DEFAULT '{}', result TEXT,"
            " is_error BOOLEAN NOT NULL DEFAULT FALSE, owner TEXT NOT NULL, host TEXT NOT NULL,"
            " lease_until TIMESTAMPTZ NOT NULL, updated_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            "CREATE INDEX ledger_done_by_age ON ledger (updated_at) WHERE state = 'done'",
            "CREATE INDEX ledger_by_owner ON ledger (owner) WHERE state = 'started'",
            "CREATE TABLE blobs (digest TEXT PRIMARY KEY, content BYTEA NOT NULL,"
            " used_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            "CREATE INDEX blobs_by_use ON blobs (used_at)",
        ),
    ),
    Migration(
        2,
        "model quotas: admitted calls, waiters with leases, pauses",
        (
            "CREATE TABLE quota_state (quota TEXT PRIMARY KEY,"
            " paused_until DOUBLE PRECISION NOT NULL DEFAULT 0)",
            "CREATE TABLE quota_calls (call_id TEXT NOT NULL, quota TEXT NOT NULL,"
            " tenant TEXT NOT NULL, owner TEXT NOT NULL, admitted_at DOUBLE PRECISION NOT NULL,"
            " input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL DEFAULT 0,"
            " lease_until DOUBLE PRECISION NOT NULL, lease_seconds DOUBLE PRECISION NOT NULL,"
            " PRIMARY KEY (call_id, quota))",
            "CREATE INDEX quota_calls_by_time ON quota_calls (quota, admitted_at)",
            "CREATE INDEX quota_calls_by_owner ON quota_calls (owner, lease_until)",
            "CREATE TABLE quota_waiters (call_id TEXT NOT NULL, quota TEXT NOT NULL,"
            " tenant TEXT NOT NULL, owner TEXT NOT NULL, since DOUBLE PRECISION NOT NULL,"
            " lease_until DOUBLE PRECISION NOT NULL, blocked_on TEXT,"
            " PRIMARY KEY (call_id, quota))",
            "CREATE INDEX quota_waiters_by_quota ON quota_waiters (quota, since)",
        ),
    ),
    Migration(
        3,
        "memory across tasks: namespaced items with full-text search (tsvector) and TTLs",
        (
            "CREATE TABLE memory_items (namespace TEXT NOT NULL, key TEXT NOT NULL,"
            " value TEXT NOT NULL, metadata JSONB, created_at DOUBLE PRECISION NOT NULL,"
            " updated_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION,"
            " revision INTEGER NOT NULL DEFAULT 1, written_by TEXT,"
            " search tsvector GENERATED ALWAYS AS"
            " (to_tsvector('english', key || ' ' || value)) STORED,"
            " PRIMARY KEY (namespace, key))",
            "CREATE INDEX memory_items_by_expiry ON memory_items (expires_at)"
            " WHERE expires_at IS NOT NULL",
            "CREATE INDEX memory_items_search ON memory_items USING GIN (search)",
        ),
    ),
    Migration(
        4,
        "model quotas: the input tokens a waiter asks for (its tenant's share of the quota)"
        " and the waiter whose turn it waits for",
        # NULL: a waiter of a build that keeps none, still running beside this one.
        (
            "ALTER TABLE quota_waiters ADD COLUMN input_tokens INTEGER",
            "ALTER TABLE quota_waiters ADD COLUMN waits_for TEXT",
        ),
    ),
)


def pending(applied: int, migrations: Sequence[Migration]) -> list[Migration]:
    """The migrations a database at version `applied` still needs, in order."""
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations must be numbered 1, 2, 3, ...: {versions}")
    if applied > len(migrations):
        raise SchemaTooNewError(
            f"the database's schema is at version {applied}, newer than this waystation knows "
            f"({len(migrations)}): upgrade waystation on this machine"
        )
    return list(migrations[applied:])
