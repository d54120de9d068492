"""Workers for tests and benchmarks: in this process, or `python worker.py` as a real
subprocess that a test may SIGKILL like a crashed machine."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.client import Client

from waystation.settings import BUILTIN_TOOLS_MODULE, Settings
from waystation.testing.settings import USER_ENV_PREFIXES
from waystation.worker import AgentWorker, build_worker

# The checkout this kit runs from, when it runs from one (its tests start its worker.py); an
# installed kit starts `python -m waystation.worker` instead.
REPO = Path(__file__).resolve().parents[2]
CHECKOUT_WORKER = REPO / "worker.py"
# A worker process imports everything and connects; with both cores busy that can take a while.
READY_WITHIN_SECONDS = 120.0


@asynccontextmanager
async def running_worker(
    client: Client, settings: Settings, **options: Any
) -> AsyncIterator[AgentWorker]:
    """An agent worker in this process for the duration of the block."""
    worker = build_worker(client, settings, **options)
    async with worker:
        yield worker


def worker_environment(
    address: str, settings: Settings, extra_env: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of a worker process that serves `settings` against `address`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(USER_ENV_PREFIXES)}
    env.update(
        TEMPORAL_ADDRESS=address,
        WAYSTATION_TASK_QUEUE=settings.task_queue,
        WAYSTATION_WORKSPACE=str(settings.workspace_dir),
        WAYSTATION_DATA_DIR=str(settings.data_dir),
        WAYSTATION_EMBEDDED_SERVER="false",
    )
    if settings.database_url is not None:
        env["WAYSTATION_DATABASE_URL"] = settings.database_url.get_secret_value()
    if settings.tools != [BUILTIN_TOOLS_MODULE]:
        env["WAYSTATION_TOOLS"] = ",".join(settings.tools)
    if settings.agents is not None:
        env["WAYSTATION_AGENTS"] = settings.agents
    if settings.openai_base_url:
        env["OPENAI_BASE_URL"] = settings.openai_base_url
    if settings.api_key:
        env["OPENAI_API_KEY"] = settings.api_key
    env.update(extra_env or {})
    return env


class WorkerProcess:
    """`python worker.py` of the checkout (installed: `python -m waystation.worker`) as a
    real subprocess on the settings' task queue (or `python -m module`, a test's own build
    of the worker). `root` and `python`: another checkout of waystation and its own
    interpreter (a benchmark's baseline), instead of this one. `cwd`: where it runs (default
    the checkout, installed the current folder), where WAYSTATION_TOOLS' modules are found."""

    def __init__(
        self,
        address: str,
        settings: Settings,
        extra_env: dict[str, str] | None = None,
        *,
        module: str | None = None,
        root: Path | None = None,
        python: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.log = settings.data_dir / f"worker-{uuid.uuid4().hex[:6]}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if root is None and CHECKOUT_WORKER.is_file():
            root = REPO
        if module:
            program = ["-m", module]
        elif root is not None:
            program = [str(root / "worker.py")]
        else:
            program = ["-m", "waystation.worker"]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [str(python or sys.executable), *program],
                cwd=cwd or root or Path.cwd(),
                env=worker_environment(address, settings, extra_env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    async def ready(self) -> WorkerProcess:
        """Wait until the worker says it polls (bounded: a worker that dies or hangs fails)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_WITHIN_SECONDS
        while "worker polling" not in self.log.read_text(errors="replace"):
            if self.process.poll() is not None or loop.time() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.log.read_text()}")
            await asyncio.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, exactly like a crashed machine."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
