"""A blob store in one SQLite file: the embedded default, for workers on one machine."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (
    digest TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    touched REAL NOT NULL
)
"""


class SqliteBlobStore:
    """Content-addressed bytes in SQLite (WAL: several worker processes share the file)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)

    async def put_many(self, items: dict[str, bytes]) -> None:
        rows = [(digest, data, time.time()) for digest, data in items.items()]
        await asyncio.to_thread(self._write, rows)

    async def get_many(self, digests: list[str]) -> dict[str, bytes]:
        return await asyncio.to_thread(self._read, digests)

    def _write(self, rows: list[tuple[str, bytes, float]]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO blobs (digest, data, touched) VALUES (?, ?, ?)"
                " ON CONFLICT (digest) DO UPDATE SET touched = excluded.touched",
                rows,
            )
            self._db.execute("COMMIT")

    def _read(self, digests: list[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        with self._lock:
            for start in range(0, len(digests), 500):
                chunk = digests[start : start + 500]
                marks = ",".join("?" * len(chunk))
                query = f"SELECT digest, data FROM blobs WHERE digest IN ({marks})"
                found.update(dict(self._db.execute(query, chunk).fetchall()))
        return found

    def close(self) -> None:
        with self._lock:
            self._db.close()
