"""The embedded storage: one SQLite file in the data directory, for the workers of one
machine (they share it through SQLite's file locks). Calls run on one thread of their own."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

from waystation.activities.storage import memory_sql, migrations
from waystation.activities.storage.backend import (
    BLOB_USE_RESOLUTION_SECONDS,
    Deployment,
    LedgerEntry,
)
from waystation.activities.storage.quota_state import (
    WINDOW_SECONDS,
    AdmittedCall,
    QuotaDecision,
    QuotaRequest,
    QuotaView,
    Waiter,
    decide,
)
from waystation.activities.storage.retry import retrying
from waystation.workflows.memory import MemoryItem

T = TypeVar("T")
_BATCH = 500  # SQLite's limit on parameters in one statement is higher; this stays far below


class _Busy(Exception):
    """Another process holds the file's lock longer than the busy timeout: try again."""


class SqliteBackend:
    kind: Literal["sqlite"] = "sqlite"

    def __init__(
        self, path: Path, schema: Sequence[migrations.Migration] = migrations.SQLITE
    ) -> None:
        self.path = path
        self.location = f"SQLite at {path}"
        self._schema = schema
        self._db: sqlite3.Connection | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="waystation-sqlite")

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()

        def in_thread() -> T:
            if self._db is None:
                raise RuntimeError("the storage is not open")
            try:
                return work(self._db)
            except sqlite3.OperationalError as err:
                if "locked" in str(err) or "busy" in str(err):
                    raise _Busy(str(err)) from err
                raise

        async def once() -> T:
            return await loop.run_in_executor(self._executor, in_thread)

        return await retrying(once, transient=(_Busy,), where=self.location)

    async def open(self) -> None:
        def connect() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            self._db = db

        await asyncio.get_running_loop().run_in_executor(self._executor, connect)
        await self._call(self._prepare)

    def _prepare(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # a recorded effect must survive a crash
        db.execute("BEGIN IMMEDIATE")  # one writer at a time: concurrent starts migrate once
        try:
            db.execute(migrations.SQLITE_VERSION_TABLE)
            applied = db.execute("SELECT coalesce(max(version), 0) FROM schema_version")
            for migration in migrations.pending(int(applied.fetchone()[0]), self._schema):
                for statement in migration.statements:
                    db.execute(statement)
                db.execute(
                    "INSERT INTO schema_version VALUES (?, ?, ?)",
                    (migration.version, migration.description, time.time()),
                )
            db.execute(
                "INSERT INTO deployment (singleton, id, created_at) VALUES (1, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (uuid.uuid4().hex, time.time()),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        def close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        self._executor.shutdown(wait=False)

    async def deployment(self) -> Deployment:
        row = await self._call(
            lambda db: db.execute("SELECT id, workspace_id FROM deployment").fetchone()
        )
        return Deployment(row[0], row[1])

    async def register_workspace(self, workspace_id: str) -> str:
        def register(db: sqlite3.Connection) -> str:
            db.execute(
                "UPDATE deployment SET workspace_id = ? WHERE workspace_id IS NULL",
                (workspace_id,),
            )
            return str(db.execute("SELECT workspace_id FROM deployment").fetchone()[0])

        return await self._call(register)

    async def forget_workspace(self) -> None:
        await self._call(lambda db: db.execute("UPDATE deployment SET workspace_id = NULL"))

    async def stats(self) -> dict[str, int]:
        def count(db: sqlite3.Connection) -> dict[str, int]:
            version = db.execute("SELECT max(version) FROM schema_version").fetchone()[0]
            started, done = db.execute(
                "SELECT count(*) FILTER (WHERE state = 'started'),"
                " count(*) FILTER (WHERE state = 'done') FROM ledger"
            ).fetchone()
            blobs = db.execute("SELECT count(*) FROM blobs").fetchone()[0]
            return {
                "schema_version": version,
                "ledger_started": started,
                "ledger_done": done,
                "blobs": blobs,
            }

        return await self._call(count)

    async def ledger_get(self, key: str) -> LedgerEntry | None:
        row = await self._call(
            lambda db: db.execute(
                "SELECT key, tool, state, detail, result, is_error, owner, host, lease_until > ?"
                " FROM ledger WHERE key = ?",
                (time.time(), key),
            ).fetchone()
        )
        if row is None:
            return None
        return LedgerEntry(
            key=row[0],
            tool=row[1],
            state=row[2],
            detail=json.loads(row[3]),
            result=row[4],
            is_error=bool(row[5]),
            owner=row[6],
            host=row[7],
            lease_live=bool(row[8]),
        )

    async def ledger_insert(self, key: str, tool: str, owner: str, host: str, lease: float) -> bool:
        def insert(db: sqlite3.Connection) -> bool:
            now = time.time()
            cursor = db.execute(
                "INSERT INTO ledger (key, tool, state, owner, host, lease_until, updated_at)"
                " VALUES (?, ?, 'started', ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (key, tool, owner, host, now + lease, now),
            )
            return cursor.rowcount == 1

        return await self._call(insert)

    async def ledger_take_over(
        self, key: str, previous_owner: str, owner: str, host: str, lease: float
    ) -> bool:
        def take_over(db: sqlite3.Connection) -> bool:
            now = time.time()
            cursor = db.execute(
                "UPDATE ledger SET owner = ?, host = ?, lease_until = ?, updated_at = ?"
                " WHERE key = ? AND state = 'started' AND owner = ? AND lease_until <= ?",
                (owner, host, now + lease, now, key, previous_owner, now),
            )
            return cursor.rowcount == 1

        return await self._call(take_over)

    async def ledger_record_start(
        self, key: str, owner: str, detail: Mapping[str, Any], lease: float
    ) -> bool:
        def record(db: sqlite3.Connection) -> bool:
            now = time.time()
            cursor = db.execute(
                "UPDATE ledger SET detail = ?, lease_until = ?, updated_at = ?"
                " WHERE key = ? AND owner = ? AND state = 'started'",
                (json.dumps(dict(detail)), now + lease, now, key, owner),
            )
            return cursor.rowcount == 1

        return await self._call(record)

    async def ledger_finish(self, key: str, result: str, is_error: bool) -> None:
        await self._call(
            lambda db: db.execute(
                "UPDATE ledger SET state = 'done', result = ?, is_error = ?, updated_at = ?"
                " WHERE key = ? AND state = 'started'",
                (result, int(is_error), time.time(), key),
            )
        )

    async def ledger_put(
        self, key: str, tool: str, detail: Mapping[str, Any], owner: str, host: str
    ) -> None:
        await self._call(
            lambda db: db.execute(
                "INSERT INTO ledger (key, tool, state, detail, owner, host, lease_until,"
                " updated_at) VALUES (?, ?, 'done', ?, ?, ?, 0, ?) ON CONFLICT (key) DO UPDATE"
                " SET tool = excluded.tool, state = 'done', detail = excluded.detail,"
                " result = NULL, is_error = 0, owner = excluded.owner, host = excluded.host,"
                " lease_until = 0, updated_at = excluded.updated_at",
                (key, tool, json.dumps(dict(detail)), owner, host, time.time()),
            )
        )

    async def ledger_renew(self, owner: str, lease: float) -> None:
        await self._call(
            lambda db: db.execute(
                "UPDATE ledger SET lease_until = ? WHERE owner = ? AND state = 'started'",
                (time.time() + lease, owner),
            )
        )

    async def ledger_release(self, owner: str) -> None:
        await self._call(
            lambda db: db.execute(
                "UPDATE ledger SET lease_until = 0 WHERE owner = ? AND state = 'started'",
                (owner,),
            )
        )

    async def ledger_prune(self, older_than: float) -> int:
        return await self._call(
            lambda db: (
                db.execute(
                    "DELETE FROM ledger WHERE state = 'done' AND updated_at < ?",
                    (time.time() - older_than,),
                ).rowcount
            )
        )

    async def blobs_put(self, items: Mapping[str, bytes]) -> None:
        def put(db: sqlite3.Connection) -> None:
            now = time.time()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT INTO blobs (digest, content, used_at) VALUES (?, ?, ?)"
                    " ON CONFLICT (digest) DO UPDATE SET used_at = excluded.used_at"
                    " WHERE blobs.used_at < ?",
                    [(d, c, now, now - BLOB_USE_RESOLUTION_SECONDS) for d, c in items.items()],
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        if items:
            await self._call(put)

    async def blobs_get(self, digests: list[str]) -> dict[str, bytes]:
        def get(db: sqlite3.Connection) -> dict[str, bytes]:
            now = time.time()
            found: dict[str, bytes] = {}
            for start in range(0, len(digests), _BATCH):
                batch = digests[start : start + _BATCH]
                marks = ",".join("?" * len(batch))
                rows = db.execute(
                    f"SELECT digest, content FROM blobs WHERE digest IN ({marks})", batch
                )
                found.update((digest, bytes(content)) for digest, content in rows)
                db.execute(
                    f"UPDATE blobs SET used_at = ? WHERE digest IN ({marks}) AND used_at < ?",
                    [now, *batch, now - BLOB_USE_RESOLUTION_SECONDS],
                )
            return found

        return await self._call(get) if digests else {}

    async def blobs_prune(self, older_than: float) -> int:
        return await self._call(
            lambda db: (
                db.execute(
                    "DELETE FROM blobs WHERE used_at < ?", (time.time() - older_than,)
                ).rowcount
            )
        )

    async def quota_admit(self, owner: str, requests: list[QuotaRequest]) -> list[QuotaDecision]:
        def admit(db: sqlite3.Connection) -> list[QuotaDecision]:
            keys = sorted({key for r in requests for key, _ in r.quotas})
            marks = ",".join("?" * len(keys))
            db.execute("BEGIN IMMEDIATE")  # the whole file: every quota of the batch
            try:
                now = time.time()
                db.execute(
                    f"DELETE FROM quota_waiters WHERE quota IN ({marks}) AND lease_until <= ?",
                    [*keys, now],
                )
                db.execute(
                    f"DELETE FROM quota_calls WHERE quota IN ({marks})"
                    " AND admitted_at <= ? AND lease_until <= ?",
                    [*keys, now - WINDOW_SECONDS, now],
                )
                views = {key: QuotaView() for key in keys}
                for key, paused in db.execute(
                    f"SELECT quota, paused_until FROM quota_state WHERE quota IN ({marks})", keys
                ):
                    views[key].paused_until = paused
                for call_id, key, tenant, at, given, got, live in db.execute(
                    "SELECT call_id, quota, tenant, admitted_at, input_tokens, output_tokens,"
                    f" lease_until > ? FROM quota_calls WHERE quota IN ({marks})",
                    [now, *keys],
                ):
                    views[key].calls.append(AdmittedCall(call_id, tenant, at, given, got, live))
                for call_id, key, tenant, since, blocked_on, asked, head in db.execute(
                    "SELECT call_id, quota, tenant, since, blocked_on, input_tokens, waits_for"
                    f" FROM quota_waiters WHERE quota IN ({marks})",
                    keys,
                ):
                    waiter = Waiter(call_id, tenant, since, blocked_on, asked, head)
                    views[key].waiters.append(waiter)
                outcome = decide(now, views, requests)
                db.executemany(
                    "INSERT INTO quota_waiters (call_id, quota, tenant, owner, since, lease_until,"
                    " blocked_on, input_tokens, waits_for) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (call_id, quota) DO UPDATE"
                    " SET lease_until = excluded.lease_until, blocked_on = excluded.blocked_on,"
                    " waits_for = excluded.waits_for",
                    outcome.waiter_rows(owner, now),
                )
                db.executemany(
                    "DELETE FROM quota_waiters WHERE call_id = ?",
                    [(r.call_id,) for r in outcome.admitted],
                )
                db.executemany(
                    # A batch asked again after a lost answer: the slot it took stands.
                    "INSERT OR IGNORE INTO quota_calls (call_id, quota, tenant, owner, admitted_at,"
                    " input_tokens, lease_until, lease_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    outcome.call_rows(owner, now),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return outcome.decisions

        return await self._call(admit) if requests else []

    async def quota_renew(self, owner: str, call_ids: list[str]) -> None:
        def renew(db: sqlite3.Connection) -> None:
            now = time.time()
            marks = ",".join("?" * len(call_ids))
            db.execute(
                "UPDATE quota_calls SET lease_until = ? + lease_seconds"
                f" WHERE owner = ? AND lease_until > ? AND call_id IN ({marks})",
                (now, owner, now, *call_ids),
            )

        if not call_ids:
            return

        await self._call(renew)

    async def quota_release(
        self, call_id: str, input_tokens: int | None, output_tokens: int
    ) -> None:
        await self._call(
            lambda db: db.execute(
                "UPDATE quota_calls SET lease_until = 0,"
                " input_tokens = coalesce(?, input_tokens), output_tokens = ? WHERE call_id = ?",
                (input_tokens, output_tokens, call_id),
            )
        )

    async def quota_leave(self, call_ids: list[str]) -> None:
        await self._call(
            lambda db: db.executemany(
                "DELETE FROM quota_waiters WHERE call_id = ?", [(c,) for c in call_ids]
            )
        )

    async def quota_pause(self, quotas: list[str], seconds: float) -> None:
        def pause(db: sqlite3.Connection) -> None:
            until = time.time() + seconds
            db.executemany(
                "INSERT INTO quota_state (quota, paused_until) VALUES (?, ?)"
                " ON CONFLICT (quota) DO UPDATE SET paused_until ="
                " max(paused_until, excluded.paused_until)",
                [(key, until) for key in quotas],
            )

        await self._call(pause)

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
        meta = json.dumps(dict(metadata)) if metadata is not None else None
        params = memory_sql.upsert_params(namespace, key, value, meta, now, expires_at, written_by)
        row = await self._call(lambda db: db.execute(memory_sql.upsert("?"), params).fetchone())
        return memory_sql.item(row)

    async def memory_get(self, namespace: str, key: str, now: float) -> MemoryItem | None:
        row = await self._call(
            lambda db: db.execute(
                f"SELECT {memory_sql.COLUMNS} FROM memory_items WHERE namespace = ? AND key = ?"
                f" AND {memory_sql.LIVE.format(now='?')}",
                (namespace, key, now),
            ).fetchone()
        )
        return memory_sql.item(row) if row is not None else None

    async def memory_written_by(self, namespace: str, key: str) -> str | None:
        row = await self._call(
            lambda db: db.execute(
                "SELECT written_by FROM memory_items WHERE namespace = ? AND key = ?",
                (namespace, key),
            ).fetchone()
        )
        return row[0] if row is not None else None

    async def memory_delete(self, namespace: str, key: str) -> bool:
        return await self._call(
            lambda db: (
                db.execute(
                    "DELETE FROM memory_items WHERE namespace = ? AND key = ?", (namespace, key)
                ).rowcount
                == 1
            )
        )

    async def memory_list(
        self, namespace: str, now: float, limit: int, after: str | None
    ) -> list[MemoryItem]:
        rows = await self._call(
            lambda db: db.execute(
                f"SELECT {memory_sql.COLUMNS} FROM memory_items WHERE namespace = ?"
                f" AND key > ? AND {memory_sql.LIVE.format(now='?')} ORDER BY key LIMIT ?",
                (namespace, after or "", now, limit),
            ).fetchall()
        )
        return [memory_sql.item(row) for row in rows]

    async def memory_search(
        self, namespace: str, words: list[str], now: float, limit: int
    ) -> list[MemoryItem]:
        if not words:
            query = (
                f"SELECT {memory_sql.COLUMNS} FROM memory_items WHERE namespace = ?"
                f" AND {memory_sql.LIVE.format(now='?')} ORDER BY updated_at DESC LIMIT ?"
            )
            params: tuple[Any, ...] = (namespace, now, limit)
        else:
            # Each word quoted (FTS5's syntax never sees the user's), any of them matching.
            match = " OR ".join('"' + word.replace('"', '""') + '"' for word in words)
            columns = ", ".join(f"m.{c.strip()}" for c in memory_sql.COLUMNS.split(","))
            query = (
                f"SELECT {columns} FROM memory_search s JOIN memory_items m ON m.id = s.rowid"
                " WHERE memory_search MATCH ? AND m.namespace = ?"
                " AND (m.expires_at IS NULL OR m.expires_at > ?)"
                " ORDER BY bm25(memory_search), m.updated_at DESC LIMIT ?"
            )
            params = (match, namespace, now, limit)
        rows = await self._call(lambda db: db.execute(query, params).fetchall())
        return [memory_sql.item(row) for row in rows]

    async def memory_namespaces(self, prefix: str | None, now: float) -> list[tuple[str, int]]:
        rows = await self._call(
            lambda db: db.execute(
                "SELECT namespace, count(*) FROM memory_items WHERE substr(namespace, 1, ?) = ?"
                f" AND {memory_sql.LIVE.format(now='?')} GROUP BY namespace ORDER BY namespace",
                (len(prefix or ""), prefix or "", now),
            ).fetchall()
        )
        return [(name, count) for name, count in rows]

    async def memory_purge(self, now: float) -> int:
        return await self._call(
            lambda db: (
                db.execute(
                    "DELETE FROM memory_items WHERE expires_at IS NOT NULL AND expires_at <= ?",
                    (now,),
                ).rowcount
            )
        )
