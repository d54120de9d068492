"""The memory store on both backends: items, full-text search, TTL with an injected clock,
namespaces by tenant, and the refusals that change nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from waystation.activities.storage import Storage
from waystation.activities.storage.memory import (
    FORBIDDEN_NAMESPACE,
    INVALID_NAMESPACE,
    UNKNOWN_NAMESPACE,
    VALUE_TOO_LARGE,
    MemoryRequestError,
    MemoryStore,
    check_reach,
)
from waystation.activities.storage.postgres import PostgresBackend
from waystation.activities.storage.sqlite import SqliteBackend
from waystation.testing.postgres import PostgresServer


class Clock:
    """The store's clock, moved by the test: expiry without sleeping."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgresql"])
async def storage(
    request: pytest.FixtureRequest, tmp_path: Path, postgres: PostgresServer
) -> AsyncIterator[Storage]:
    if request.param == "sqlite":
        backend: SqliteBackend | PostgresBackend = SqliteBackend(tmp_path / "storage.sqlite3")
    else:
        backend = PostgresBackend(postgres.create_database())
    async with Storage(backend) as opened:
        yield opened


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def memory(storage: Storage, clock: Clock) -> MemoryStore:
    return MemoryStore(storage.backend, max_value_chars=100, clock=clock)


async def test_an_item_is_written_read_replaced_and_deleted(
    memory: MemoryStore, clock: Clock
) -> None:
    first = await memory.put("acme:main", "colour", "blue", metadata={"source": "chat"})
    assert (first.value, first.metadata, first.revision) == ("blue", {"source": "chat"}, 1)
    assert first.created_at == first.updated_at == clock.now and first.expires_at is None
    clock.now += 10
    second = await memory.put("acme:main", "colour", "green")
    assert (second.value, second.revision, second.metadata) == ("green", 2, None)
    assert second.created_at == first.created_at and second.updated_at == clock.now
    got = await memory.get("acme:main", "colour")
    assert got is not None and got.value == "green"
    assert await memory.get("acme:other", "colour") is None  # namespaces are apart
    assert await memory.delete("acme:main", "colour")
    assert not await memory.delete("acme:main", "colour")
    assert await memory.get("acme:main", "colour") is None


async def test_search_finds_any_word_best_first_within_the_namespace(
    memory: MemoryStore, clock: Clock
) -> None:
    await memory.put("acme:main", "colour", "The user's favourite colour is blue")
    clock.now += 1
    await memory.put("acme:main", "deploy", "Deploys go out on Tuesdays from the main branch")
    clock.now += 1
    await memory.put("globex:main", "colour", "The favourite colour here is red")
    found = await memory.search("acme:main", "what is the user's favourite colour?", 5)
    assert [item.key for item in found] == ["colour"]
    stemmed = await memory.search("acme:main", "deploying", 5)  # stems match
    assert [item.key for item in stemmed] == ["deploy"]
    assert await memory.search("acme:main", "'\"(*) OR NOT", 5) == []  # no syntax to break
    recent = await memory.search("acme:main", "", 5)  # no words: the latest written first
    assert [item.key for item in recent] == ["deploy", "colour"]


async def test_an_expired_item_is_never_returned_then_purged(
    memory: MemoryStore, clock: Clock
) -> None:
    await memory.put("acme:main", "short", "a fleeting fact", ttl_seconds=60)
    await memory.put("acme:main", "long", "a fact that stays")
    clock.now += 59
    assert (await memory.get("acme:main", "short")) is not None
    clock.now += 1
    assert await memory.get("acme:main", "short") is None
    assert [i.key for i in await memory.items("acme:main")] == ["long"]
    assert [i.key for i in await memory.search("acme:main", "fleeting fact", 5)] == ["long"]
    assert await memory.namespaces("acme") == [("acme:main", 1)]
    assert await memory.purge() == 1
    again = await memory.put("acme:main", "short", "back again")  # a new item, not a revision
    assert again.revision == 1 and again.created_at == clock.now


async def test_namespaces_list_by_tenant_and_pages_follow_keys(memory: MemoryStore) -> None:
    for key in ("b", "a", "c"):
        await memory.put("acme:main", key, key.upper())
    await memory.put("acme:helper", "x", "X")
    await memory.put("main", "y", "no tenant")
    await memory.put("acmeco:main", "z", "another tenant whose name starts the same")
    assert await memory.namespaces("acme") == [("acme:helper", 1), ("acme:main", 3)]
    assert len(await memory.namespaces()) == 4
    first = await memory.items("acme:main", limit=2)
    rest = await memory.items("acme:main", limit=2, after=first[-1].key)
    assert [i.key for i in first + rest] == ["a", "b", "c"]


async def test_bad_input_is_refused_and_nothing_is_lost(memory: MemoryStore) -> None:
    await memory.put("acme:main", "notes", "kept")
    with pytest.raises(MemoryRequestError) as too_large:
        await memory.put("acme:main", "notes", "x" * 101)
    assert too_large.value.kind == VALUE_TOO_LARGE and too_large.value.status == 413
    assert "WAYSTATION_MEMORY_MAX_VALUE_CHARS" in str(too_large.value)
    kept = await memory.get("acme:main", "notes")
    assert kept is not None and kept.value == "kept"
    with pytest.raises(MemoryRequestError) as invalid:
        await memory.put("acme/main", "notes", "x")
    assert invalid.value.kind == INVALID_NAMESPACE
    with pytest.raises(MemoryRequestError) as unknown:
        await memory.known("acme:nobody")
    assert unknown.value.kind == UNKNOWN_NAMESPACE and unknown.value.status == 404
    with pytest.raises(MemoryRequestError) as forbidden:
        check_reach("acme:main", "globex")
    assert forbidden.value.kind == FORBIDDEN_NAMESPACE and forbidden.value.status == 403
    with pytest.raises(MemoryRequestError):
        check_reach("main", "globex")  # a namespace without a tenant is no tenant's
    assert check_reach("acme:main", None) == "acme:main"
