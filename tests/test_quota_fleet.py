"""Real worker processes share one endpoint's quota through their storage (the SQLite file
of one machine, or PostgreSQL): calls never overlap past `concurrent_requests`, a worker
killed while its call waits loses nothing and leaks no slot (a dead worker's slot comes back
within the heartbeat timeout), and one 429 with retry-after pauses the endpoint for every
worker."""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from waystation.activities.storage.storage import SQLITE_FILE
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.settings.model_endpoints import parse_endpoints
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, text
from waystation.testing.postgres import PostgresServer
from waystation.testing.settings import isolated_settings
from waystation.testing.workers import WorkerProcess
from waystation.workflows.models import AgentTask, ModelSettings

HEARTBEAT_SECONDS = 3.0
# A heartbeat timeout that a starved machine (both cores busy, Temporal answering in
# seconds) does not miss, for the tests whose point is not the lease.
PATIENT_HEARTBEAT_SECONDS = 20.0
QUEUED_CALLS = 12
# Calls of this long, one at a time: the last waits longer than its heartbeat timeout.
QUEUED_CALL_SECONDS = 2.0


class Arrivals:
    """The fake endpoint's requests, each with the moment it arrived (time.time())."""

    def __init__(self, reply: Callable[[int], Reply]) -> None:
        self.times: list[float] = []
        self._reply = reply
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.times.append(time.time())
            number = len(self.times)
        return self._reply(number)

    async def until(self, count: int, within: float = 120.0) -> None:
        async with asyncio.timeout(within):
            while len(self.times) < count:
                await asyncio.sleep(0.05)


def limited(
    fake: FakeOpenAI, tmp_path: Path, limits: dict[str, Any], **fields: Any
) -> tuple[Settings, str]:
    """Settings whose endpoint `limited` is the fake with these limits, and its JSON."""
    declared = json.dumps({"limited": {"protocol": "chat", "base_url": fake.url, "limits": limits}})
    settings = isolated_settings(
        tmp_path, fake.url, model_endpoints=parse_endpoints(declared), **fields
    )
    return settings, declared


@asynccontextmanager
async def workers(
    env: WorkflowEnvironment,
    settings: Settings,
    declared: str,
    count: int,
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[list[WorkerProcess]]:
    address = env.client.service_client.config.target_host
    started = [
        WorkerProcess(
            address, settings, {"WAYSTATION_MODEL_ENDPOINTS": declared, **(extra_env or {})}
        )
        for _ in range(count)
    ]
    try:
        for worker in started:
            await worker.ready()
        yield started
    finally:
        for worker in started:
            worker.kill()


def task(model: str, heartbeat: float = HEARTBEAT_SECONDS) -> AgentTask:
    return AgentTask(
        task="hello",
        model=ModelSettings(name=f"limited:{model}"),
        heartbeat_timeout_seconds=heartbeat,
    )


def quota_rows(settings: Settings, statement: str) -> list[Any]:
    with sqlite3.connect(settings.data_dir.absolute() / SQLITE_FILE) as db:
        return db.execute(statement).fetchall()


@pytest.mark.parametrize("storage", ["sqlite", "postgresql"])
async def test_calls_of_every_worker_never_overlap_past_the_concurrent_limit(
    dev_env: WorkflowEnvironment,
    fake_openai: FakeOpenAI,
    tmp_path: Path,
    postgres: PostgresServer,
    storage: str,
) -> None:
    shared = {"database_url": postgres.create_database()} if storage == "postgresql" else {}
    settings, declared = limited(fake_openai, tmp_path, {"concurrent_requests": 1}, **shared)
    arrivals = Arrivals(lambda _: text("ok", delay_seconds=QUEUED_CALL_SECONDS))
    model = fake_openai.script(arrivals)
    runtime = AgentRuntime(dev_env.client, settings)
    async with workers(dev_env, settings, declared, 2):
        patient = task(model, PATIENT_HEARTBEAT_SECONDS)
        handles = [await runtime.run(patient) for _ in range(QUEUED_CALLS)]
        outcomes = [await h.result() for h in handles]
    assert [o.result for o in outcomes] == ["ok"] * QUEUED_CALLS
    # A wait is progress: no call waiting longer than its heartbeat timeout missed its
    # heartbeat and was sent again.
    assert QUEUED_CALLS * QUEUED_CALL_SECONDS > PATIENT_HEARTBEAT_SECONDS + QUEUED_CALL_SECONDS
    assert len(arrivals.times) == QUEUED_CALLS
    starts = sorted(arrivals.times)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Each request is answered QUEUED_CALL_SECONDS after it arrives: the next may not come sooner.
    assert min(gaps) >= QUEUED_CALL_SECONDS, gaps


async def test_a_worker_killed_while_its_call_waits_loses_nothing_and_leaks_no_slot(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    settings, declared = limited(fake_openai, tmp_path, {"concurrent_requests": 1})
    never = threading.Event()  # the first call holds the slot until its worker dies
    arrivals = Arrivals(
        lambda n: text("held", hold_after_chunks=1, gate=never) if n == 1 else text("ok")
    )
    model = fake_openai.script(arrivals)
    runtime = AgentRuntime(dev_env.client, settings)
    async with workers(dev_env, settings, declared, 1) as [doomed]:
        holding = await runtime.run(task(model))
        await fake_openai.until_streaming(model, 1)
        waiting = await runtime.run(task(model))
        async with asyncio.timeout(60):
            while not quota_rows(settings, "SELECT call_id FROM quota_waiters"):
                await asyncio.sleep(0.05)
        async with workers(dev_env, settings, declared, 1):
            doomed.kill()
            killed = time.monotonic()
            # The dead worker's slot lapses with its lease, renewed no more: within the
            # heartbeat timeout (the lease), whoever takes the call over.
            held_by_the_dead = (
                f"SELECT call_id FROM quota_calls WHERE owner LIKE '%/{doomed.pid}/%'"
                " AND lease_until > {now}"
            )
            while quota_rows(settings, held_by_the_dead.format(now=time.time())):
                assert time.monotonic() - killed < HEARTBEAT_SECONDS + 1
                await asyncio.sleep(0.05)
            outcomes = [await holding.result(), await waiting.result()]
    assert [o.result for o in outcomes] == ["ok", "ok"]
    assert quota_rows(settings, "SELECT count(*) FROM quota_waiters") == [(0,)]
    live = f"SELECT count(*) FROM quota_calls WHERE lease_until > {time.time()}"
    assert quota_rows(settings, live) == [(0,)]
    never.set()


async def test_one_429_pauses_the_endpoint_for_every_worker_until_retry_after(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    settings, declared = limited(fake_openai, tmp_path, {"requests_per_minute": 1000})
    retry_after = 3.0
    arrivals = Arrivals(
        lambda n: (
            error(429, "slow down", {"retry-after": f"{retry_after:g}"}) if n == 1 else text("ok")
        )
    )
    model = fake_openai.script(arrivals)
    runtime = AgentRuntime(dev_env.client, settings)
    async with workers(dev_env, settings, declared, 2):
        first = await runtime.run(task(model, PATIENT_HEARTBEAT_SECONDS))
        await arrivals.until(1)
        async with asyncio.timeout(30):
            while not quota_rows(settings, "SELECT quota FROM quota_state WHERE paused_until > 0"):
                await asyncio.sleep(0.02)
        others = [await runtime.run(task(model, PATIENT_HEARTBEAT_SECONDS)) for _ in range(4)]
        outcomes = [await h.result() for h in [first, *others]]
    assert [o.result for o in outcomes] == ["ok"] * 5
    refused, *sent = arrivals.times
    assert len(sent) == 5
    assert min(sent) - refused >= retry_after - 0.05, [t - refused for t in sent]
