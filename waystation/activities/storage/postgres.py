"""The shared storage: PostgreSQL through psycopg 3 and an async connection pool, for
workers on several machines. Leases are timed by the server's clock."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from waystation.activities.storage import memory_sql, migrations
from waystation.activities.storage.backend import (
    BLOB_USE_RESOLUTION_SECONDS,
    Deployment,
    LedgerEntry,
)
from waystation.activities.storage.errors import StorageError, StorageUnavailableError
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
Connection = psycopg.AsyncConnection[TupleRow]
# Held for the migration's transaction: workers that start together migrate one at a time.
MIGRATION_LOCK = 0x77617973  # "ways"
CONNECT_TIMEOUT_SECONDS = 10
POOL_SIZE = 10
_LEASE_UNTIL = "clock_timestamp() + make_interval(secs => %s)"
_NOW = "extract(epoch FROM clock_timestamp())::double precision"
_ENTRY_COLUMNS = (
    "key, tool, state, detail, result, is_error, owner, host, lease_until > clock_timestamp()"
)


# What a user must change when the URL is refused. A refusal quotes no part of the URL:
# any part of one that does not parse may be the password.
PERCENT_ENCODE = (
    "percent-encode special characters in the user name and password (@ as %40, / as %2F, "
    ": as %3A, a space as %20, % as %25)"
)
_URL_SHAPE = "postgresql://user:password@host:port/database"
_URL_SCHEMES = ("postgresql://", "postgres://")


def connection_parts(url: str) -> dict[str, str]:
    """libpq's reading of a connection URL (or key=value string), refused with a StorageError
    that quotes none of it when it does not parse, or when a piece of the password may have
    landed in the host, port or database: libpq ends the password at the first '@' and the
    host part at the first '/', so an '@' anywhere but before the host moves the password."""
    scheme = next((s for s in _URL_SCHEMES if url.startswith(s)), None)
    if scheme is not None:
        rest = url[len(scheme) :]
        at, slash = rest.find("@"), rest.find("/")
        if rest.count("@") > 1 or (at >= 0 and 0 <= slash < at):
            raise StorageError(
                "WAYSTATION_DATABASE_URL has an '@' that is not the one between the password "
                f"and the host ({_URL_SHAPE}): {PERCENT_ENCODE}"
            )
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        # libpq's message quotes the part it could not read.
        raise StorageError(
            f"WAYSTATION_DATABASE_URL does not parse as a PostgreSQL URL ({_URL_SHAPE}): "
            f"{PERCENT_ENCODE}"
        ) from None
    if any("@" in str(parts.get(key, "")) for key in ("host", "hostaddr", "port")):
        raise StorageError(
            "WAYSTATION_DATABASE_URL names a host or port with '@' in it, which is part of a "
            f"password or user name: {PERCENT_ENCODE}"
        )
    return {key: str(value) for key, value in parts.items()}


def describe_url(url: str) -> str:
    """`user@host:port/database` of a connection URL: what messages may show (no password)."""
    parts = connection_parts(url)
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"{user}{parts.get('host', 'localhost')}{port}/{parts.get('dbname', '')}"


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


class PostgresBackend:
    kind: Literal["postgresql"] = "postgresql"

    def __init__(
        self, url: str, schema: Sequence[migrations.Migration] = migrations.POSTGRES
    ) -> None:
        self.location = f"PostgreSQL at {describe_url(url)}"
        self._url = url
        self._schema = schema
        self._pool: AsyncConnectionPool[Connection] | None = None

    async def open(self) -> None:
        try:
            # A connection of its own first: its error says why (refused, password, no database).
            connection = await psycopg.AsyncConnection.connect(
                self._url, connect_timeout=CONNECT_TIMEOUT_SECONDS, autocommit=True
            )
        except psycopg.OperationalError as err:
            raise StorageUnavailableError(
                f"cannot reach {self.location} (WAYSTATION_DATABASE_URL): {_first_line(err)}"
            ) from None
        async with connection:
            await self._migrate(connection)
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self._url,
            min_size=1,
            max_size=POOL_SIZE,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_SECONDS},
            # A connection that broke while idle (a server restart) is replaced before use.
            check=AsyncConnectionPool.check_connection,
            timeout=CONNECT_TIMEOUT_SECONDS,
            name="waystation",
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS)
        except psycopg.OperationalError as err:
            await pool.close()
            raise StorageUnavailableError(
                f"cannot open connections to {self.location}: {_first_line(err)}"
            ) from None
        self._pool = pool

    async def _migrate(self, connection: Connection) -> None:
        async with connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await connection.execute(migrations.POSTGRES_VERSION_TABLE)
            cursor = await connection.execute(
                "SELECT coalesce(max(version), 0) FROM schema_version"
            )
            row = await cursor.fetchone()
            for migration in migrations.pending(int(row[0]) if row else 0, self._schema):
                for statement in migration.statements:
                    await connection.execute(statement.encode())
                await connection.execute(
                    "INSERT INTO schema_version (version, description) VALUES (%s, %s)",
                    (migration.version, migration.description),
                )
            await connection.execute(
                "INSERT INTO deployment (id) VALUES (%s) ON CONFLICT DO NOTHING",
                (uuid.uuid4().hex,),
            )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def _run(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        pool = self._pool
        if pool is None:
            raise RuntimeError("the storage is not open")

        async def once() -> T:
            async with pool.connection() as connection:
                return await work(connection)

        return await retrying(once, transient=(psycopg.OperationalError,), where=self.location)

    async def _rows(self, query: str, params: Sequence[Any] = ()) -> list[TupleRow]:
        async def fetch(connection: Connection) -> list[TupleRow]:
            cursor = await connection.execute(query.encode(), params)
            return await cursor.fetchall()

        return await self._run(fetch)

    async def _count(self, query: str, params: Sequence[Any] = ()) -> int:
        async def execute(connection: Connection) -> int:
            cursor = await connection.execute(query.encode(), params)
            return cursor.rowcount

        return await self._run(execute)

    async def deployment(self) -> Deployment:
        [(deployment_id, workspace_id)] = await self._rows(
            "SELECT id, workspace_id FROM deployment"
        )
        return Deployment(deployment_id, workspace_id)

    async def register_workspace(self, workspace_id: str) -> str:
        # Two statements, not one: a statement's snapshot predates a concurrent claim that
        # its UPDATE waited for, so a single statement could read the id as still unset.
        await self._count(
            "UPDATE deployment SET workspace_id = %s WHERE workspace_id IS NULL", (workspace_id,)
        )
        return (await self.deployment()).workspace_id or workspace_id

    async def forget_workspace(self) -> None:
        await self._count("UPDATE deployment SET workspace_id = NULL")

    async def stats(self) -> dict[str, int]:
        [(version, started, done, blobs)] = await self._rows(
            "SELECT (SELECT max(version) FROM schema_version),"
            " (SELECT count(*) FROM ledger WHERE state = 'started'),"
            " (SELECT count(*) FROM ledger WHERE state = 'done'),"
            " (SELECT count(*) FROM blobs)"
        )
        return {
            "schema_version": version,
            "ledger_started": started,
            "ledger_done": done,
            "blobs": blobs,
        }

    async def ledger_get(self, key: str) -> LedgerEntry | None:
        rows = await self._rows(f"SELECT {_ENTRY_COLUMNS} FROM ledger WHERE key = %s", (key,))
        if not rows:
            return None
        key, tool, state, detail, result, is_error, owner, host, live = rows[0]
        return LedgerEntry(key, tool, state, detail, result, is_error, owner, host, live)

    async def ledger_insert(self, key: str, tool: str, owner: str, host: str, lease: float) -> bool:
        return 1 == await self._count(
            "INSERT INTO ledger (key, tool, state, owner, host, lease_until)"
            f" VALUES (%s, %s, 'started', %s, %s, {_LEASE_UNTIL})"
            " ON CONFLICT (key) DO NOTHING",
            (key, tool, owner, host, lease),
        )

    async def ledger_take_over(
        self, key: str, previous_owner: str, owner: str, host: str, lease: float
    ) -> bool:
        return 1 == await self._count(
            f"UPDATE ledger SET owner = %s, host = %s, lease_until = {_LEASE_UNTIL},"
            " updated_at = now() WHERE key = %s AND state = 'started' AND owner = %s"
            " AND lease_until <= clock_timestamp()",
            (owner, host, lease, key, previous_owner),
        )

    async def ledger_record_start(
        self, key: str, owner: str, detail: Mapping[str, Any], lease: float
    ) -> bool:
        return 1 == await self._count(
            f"UPDATE ledger SET detail = %s, lease_until = {_LEASE_UNTIL}, updated_at = now()"
            " WHERE key = %s AND owner = %s AND state = 'started'",
            (Jsonb(dict(detail)), lease, key, owner),
        )

    async def ledger_finish(self, key: str, result: str, is_error: bool) -> None:
        await self._count(
            "UPDATE ledger SET state = 'done', result = %s, is_error = %s, updated_at = now()"
            " WHERE key = %s AND state = 'started'",
            (result, is_error, key),
        )

    async def ledger_put(
        self, key: str, tool: str, detail: Mapping[str, Any], owner: str, host: str
    ) -> None:
        await self._count(
            "INSERT INTO ledger (key, tool, state, detail, owner, host, lease_until)"
            " VALUES (%s, %s, 'done', %s, %s, %s, '-infinity') ON CONFLICT (key) DO UPDATE"
            " SET tool = excluded.tool, state = 'done', detail = excluded.detail,"
            " result = NULL, is_error = FALSE, owner = excluded.owner, host = excluded.host,"
            " lease_until = '-infinity', updated_at = now()",
            (key, tool, Jsonb(dict(detail)), owner, host),
        )

    async def ledger_renew(self, owner: str, lease: float) -> None:
        await self._count(
            f"UPDATE ledger SET lease_until = {_LEASE_UNTIL}"
            " WHERE owner = %s AND state = 'started'",
            (lease, owner),
        )

    async def ledger_release(self, owner: str) -> None:
        await self._count(
            "UPDATE ledger SET lease_until = '-infinity' WHERE owner = %s AND state = 'started'",
            (owner,),
        )

    async def ledger_prune(self, older_than: float) -> int:
        return await self._count(
            "DELETE FROM ledger WHERE state = 'done'"
            " AND updated_at < now() - make_interval(secs => %s)",
            (older_than,),
        )

    async def blobs_put(self, items: Mapping[str, bytes]) -> None:
        async def put(connection: Connection) -> None:
            async with connection.transaction(), connection.cursor() as cursor:
                await cursor.executemany(
                    "INSERT INTO blobs (digest, content) VALUES (%s, %s)"
                    " ON CONFLICT (digest) DO UPDATE SET used_at = now()"
                    " WHERE blobs.used_at < now() - make_interval(secs => %s)",
                    [(d, c, BLOB_USE_RESOLUTION_SECONDS) for d, c in items.items()],
                )

        if items:
            await self._run(put)

    async def blobs_get(self, digests: list[str]) -> dict[str, bytes]:
        async def get(connection: Connection) -> dict[str, bytes]:
            cursor = await connection.execute(
                "SELECT digest, content FROM blobs WHERE digest = ANY(%s)", (digests,)
            )
            found = {digest: bytes(content) for digest, content in await cursor.fetchall()}
            await connection.execute(
                "UPDATE blobs SET used_at = now() WHERE digest = ANY(%s)"
                " AND used_at < now() - make_interval(secs => %s)",
                (digests, BLOB_USE_RESOLUTION_SECONDS),
            )
            return found

        return await self._run(get) if digests else {}

    async def blobs_prune(self, older_than: float) -> int:
        return await self._count(
            "DELETE FROM blobs WHERE used_at < now() - make_interval(secs => %s)", (older_than,)
        )

    async def quota_admit(self, owner: str, requests: list[QuotaRequest]) -> list[QuotaDecision]:
        keys = sorted({key for r in requests for key, _ in r.quotas})

        async def admit(connection: Connection) -> list[QuotaDecision]:
            async with connection.transaction(), connection.cursor() as cursor:
                now, views = await _quota_views(cursor, keys)
                outcome = decide(now, views, requests)
                waiting = outcome.waiter_rows(owner, now)
                if waiting:
                    await cursor.executemany(
                        "INSERT INTO quota_waiters (call_id, quota, tenant, owner, since,"
                        " lease_until, blocked_on, input_tokens, waits_for)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                        " ON CONFLICT (call_id, quota) DO UPDATE"
                        " SET lease_until = excluded.lease_until, blocked_on = excluded.blocked_on,"
                        " waits_for = excluded.waits_for",
                        waiting,
                    )
                if outcome.admitted:
                    await cursor.execute(
                        "DELETE FROM quota_waiters WHERE call_id = ANY(%s)",
                        ([r.call_id for r in outcome.admitted],),
                    )
                    await cursor.executemany(
                        "INSERT INTO quota_calls (call_id, quota, tenant, owner, admitted_at,"
                        " input_tokens, lease_until, lease_seconds)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                        # A batch asked again after a lost commit answer: its slot stands.
                        " ON CONFLICT (call_id, quota) DO NOTHING",
                        outcome.call_rows(owner, now),
                    )
                return outcome.decisions

        return await self._run(admit) if requests else []

    async def quota_renew(self, owner: str, call_ids: list[str]) -> None:
        if not call_ids:
            return
        await self._count(
            f"UPDATE quota_calls SET lease_until = {_NOW} + lease_seconds"
            f" WHERE owner = %s AND lease_until > {_NOW} AND call_id = ANY(%s)",
            (owner, call_ids),
        )

    async def quota_release(
        self, call_id: str, input_tokens: int | None, output_tokens: int
    ) -> None:
        await self._count(
            "UPDATE quota_calls SET lease_until = 0,"
            " input_tokens = coalesce(%s, input_tokens), output_tokens = %s WHERE call_id = %s",
            (input_tokens, output_tokens, call_id),
        )

    async def quota_leave(self, call_ids: list[str]) -> None:
        await self._count("DELETE FROM quota_waiters WHERE call_id = ANY(%s)", (call_ids,))

    async def quota_pause(self, quotas: list[str], seconds: float) -> None:
        await self._count(
            f"INSERT INTO quota_state (quota, paused_until) SELECT unnest(%s::text[]), {_NOW} + %s"
            " ON CONFLICT (quota) DO UPDATE"
            " SET paused_until = greatest(quota_state.paused_until, excluded.paused_until)",
            (quotas, seconds),
        )

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
        meta = Jsonb(dict(metadata)) if metadata is not None else None
        params = memory_sql.upsert_params(namespace, key, value, meta, now, expires_at, written_by)
        [row] = await self._rows(memory_sql.upsert("%s"), params)
        return memory_sql.item(row)

    async def memory_get(self, namespace: str, key: str, now: float) -> MemoryItem | None:
        rows = await self._rows(
            f"SELECT {memory_sql.COLUMNS} FROM memory_items WHERE namespace = %s AND key = %s"
            f" AND {memory_sql.LIVE.format(now='%s')}",
            (namespace, key, now),
        )
        return memory_sql.item(rows[0]) if rows else None

    async def memory_written_by(self, namespace: str, key: str) -> str | None:
        rows = await self._rows(
            "SELECT written_by FROM memory_items WHERE namespace = %s AND key = %s",
            (namespace, key),
        )
        return rows[0][0] if rows else None

    async def memory_delete(self, namespace: str, key: str) -> bool:
        return 1 == await self._count(
            "DELETE FROM memory_items WHERE namespace = %s AND key = %s", (namespace, key)
        )

    async def memory_list(
        self, namespace: str, now: float, limit: int, after: str | None
    ) -> list[MemoryItem]:
        rows = await self._rows(
            f"SELECT {memory_sql.COLUMNS} FROM memory_items WHERE namespace = %s"
            f' AND key COLLATE "C" > %s AND {memory_sql.LIVE.format(now="%s")}'
            ' ORDER BY key COLLATE "C"'
            " LIMIT %s",
            (namespace, after or "", now, limit),
        )
        return [memory_sql.item(row) for row in rows]

    async def memory_search(
        self, namespace: str, words: list[str], now: float, limit: int
    ) -> list[MemoryItem]:
        live = memory_sql.LIVE.format(now="%s")
        if not words:
            rows = await self._rows(
                f"SELECT {memory_sql.COLUMNS} FROM memory_items WHERE namespace = %s"
                f" AND {live} ORDER BY updated_at DESC LIMIT %s",
                (namespace, now, limit),
            )
        else:
            # websearch_to_tsquery never fails on what a user types; `or` makes any word match.
            rows = await self._rows(
                f"SELECT {memory_sql.COLUMNS} FROM memory_items,"
                " websearch_to_tsquery('english', %s) AS query"
                f" WHERE namespace = %s AND search @@ query AND {live}"
                " ORDER BY ts_rank(search, query) DESC, updated_at DESC LIMIT %s",
                (" or ".join(words), namespace, now, limit),
            )
        return [memory_sql.item(row) for row in rows]

    async def memory_namespaces(self, prefix: str | None, now: float) -> list[tuple[str, int]]:
        rows = await self._rows(
            "SELECT namespace, count(*) FROM memory_items WHERE left(namespace, %s) = %s"
            f" AND {memory_sql.LIVE.format(now='%s')} GROUP BY namespace ORDER BY namespace",
            (len(prefix or ""), prefix or "", now),
        )
        return [(name, count) for name, count in rows]

    async def memory_purge(self, now: float) -> int:
        return await self._count(
            "DELETE FROM memory_items WHERE expires_at IS NOT NULL AND expires_at <= %s", (now,)
        )


async def _quota_views(
    cursor: psycopg.AsyncCursor[TupleRow], keys: list[str]
) -> tuple[float, dict[str, QuotaView]]:
    """The server's time and what it holds for `keys`, their rows locked until the
    transaction ends; lapsed waiters and calls past the window are deleted first."""
    # Each quota's row, locked in one order by every worker: no deadlock.
    await cursor.executemany(
        "INSERT INTO quota_state (quota) VALUES (%s) ON CONFLICT DO NOTHING",
        [(key,) for key in keys],
    )
    await cursor.execute(
        "SELECT quota, paused_until FROM quota_state WHERE quota = ANY(%s)"
        " ORDER BY quota FOR UPDATE",
        (keys,),
    )
    views = {key: QuotaView() for key in keys}
    for key, paused in await cursor.fetchall():
        views[key].paused_until = paused
    await cursor.execute(f"SELECT {_NOW}")
    row = await cursor.fetchone()
    assert row is not None
    now = float(row[0])
    await cursor.execute(
        "DELETE FROM quota_waiters WHERE quota = ANY(%s) AND lease_until <= %s",
        (keys, now),
    )
    await cursor.execute(
        "DELETE FROM quota_calls WHERE quota = ANY(%s) AND admitted_at <= %s AND lease_until <= %s",
        (keys, now - WINDOW_SECONDS, now),
    )
    await cursor.execute(
        "SELECT call_id, quota, tenant, admitted_at, input_tokens, output_tokens,"
        " lease_until > %s FROM quota_calls WHERE quota = ANY(%s)",
        (now, keys),
    )
    for call_id, key, tenant, at, given, got, live in await cursor.fetchall():
        views[key].calls.append(AdmittedCall(call_id, tenant, at, given, got, live))
    await cursor.execute(
        "SELECT call_id, quota, tenant, since, blocked_on, input_tokens, waits_for"
        " FROM quota_waiters WHERE quota = ANY(%s)",
        (keys,),
    )
    for call_id, key, tenant, since, blocked_on, asked, head in await cursor.fetchall():
        views[key].waiters.append(Waiter(call_id, tenant, since, blocked_on, asked, head))
    return now, views
