"""The idempotency ledger: what a side-effecting tool did, keyed by its idempotency key.

A retry after "request sent, response lost" finds the first attempt's result here and
returns it instead of acting again. A tool records `started` (with whatever it needs to
tell later whether its effect happened) before acting, and `done` with its result after.
SQLite in the data directory: shared by every worker process on one machine.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('started', 'done')),
    detail TEXT NOT NULL DEFAULT '{}',
    result TEXT,
    is_error INTEGER NOT NULL DEFAULT 0,
    updated REAL NOT NULL
)
"""


@dataclass(frozen=True)
class LedgerEntry:
    key: str
    tool: str
    state: Literal["started", "done"]
    detail: dict[str, Any]
    result: str | None
    is_error: bool = False


class IdempotencyLedger:
    """A small durable map from idempotency key to what happened."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a recorded effect must survive a crash
        self._db.execute(_SCHEMA)

    def lookup(self, key: str) -> LedgerEntry | None:
        with self._lock:
            row = self._db.execute(
                "SELECT key, tool, state, detail, result, is_error FROM ledger WHERE key = ?",
                (key,),
            ).fetchone()
        if row is None:
            return None
        return LedgerEntry(row[0], row[1], row[2], json.loads(row[3]), row[4], bool(row[5]))

    def start(self, key: str, tool: str, detail: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO ledger (key, tool, state, detail, updated)"
                " VALUES (?, ?, 'started', ?, ?)"
                " ON CONFLICT (key) DO UPDATE"
                " SET detail = excluded.detail, updated = excluded.updated"
                " WHERE state = 'started'",
                (key, tool, json.dumps(detail or {}), time.time()),
            )

    def finish(self, key: str, result: str, *, is_error: bool = False) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE ledger SET state = 'done', result = ?, is_error = ?, updated = ?"
                " WHERE key = ?",
                (result, int(is_error), time.time(), key),
            )

    def count(self, tool: str | None = None) -> int:
        with self._lock:
            if tool is None:
                return int(self._db.execute("SELECT count(*) FROM ledger").fetchone()[0])
            return int(
                self._db.execute("SELECT count(*) FROM ledger WHERE tool = ?", (tool,)).fetchone()[
                    0
                ]
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()
