"""What the console's browser tests run against: the real API as a subprocess (a test can
SIGKILL and restart it on the same port), a real worker process, the Temporal dev server,
payload encryption on, and one browser shared by the whole session."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from temporalio.client import Client

from waystation.activities.payload_codec import data_converter, payload_codec
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.testing.proc import free_port
from waystation.testing.workers import REPO, WorkerProcess, worker_environment

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags chromium keeps calling home, which floods a
# closed network with retries.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READY_WITHIN_SECONDS = 60.0

ALICE = "alice-token"  # approver
BOB = "bob-token"  # approver
RITA = "rita-token"  # reader
TINA = "tina-token"  # approver bound to the tenant globex
TOKENS = {
    ALICE: {"role": "approver", "name": "alice"},
    BOB: {"role": "approver", "name": "bob"},
    RITA: {"role": "reader", "name": "rita"},
    TINA: {"role": "approver", "name": "tina", "tenant": "globex"},
}


class ApiProcess:
    """`python starter.py api` as a real subprocess on a fixed port."""

    def __init__(self, env: dict[str, str], port: int, log: Path) -> None:
        self.env = {**env, "WAYSTATION_API_PORT": str(port)}
        self.port = port
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(REPO / "starter.py"), "api"],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self.process

    async def start(self) -> ApiProcess:
        """Start it and wait until it answers (bounded: a server that dies or hangs fails)."""
        process = self.launch()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_WITHIN_SECONDS
        headers = {"Authorization": f"Bearer {ALICE}"}
        async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=5) as http:
            while True:
                if process.poll() is not None or loop.time() > deadline:
                    raise RuntimeError(f"the API did not start:\n{self.log.read_text()}")
                try:
                    if (await http.get("/console/api/session")).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: open streams are cut as by a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


@dataclass
class ConsoleStack:
    """The parts one browser test module shares."""

    settings: Settings
    runtime: AgentRuntime  # the test's own client, with the same encryption key
    address: str
    api: ApiProcess
    worker: WorkerProcess

    @property
    def url(self) -> str:
        return self.api.url


def stack_environment(address: str, settings: Settings) -> dict[str, str]:
    """What the API and worker processes are started with: the stack's queue, tokens, key."""
    env = worker_environment(address, settings)
    env.update(WAYSTATION_API_TOKENS=json.dumps(TOKENS), PYTHONUNBUFFERED="1")
    if settings.encryption_keys:
        keys = {k: v.get_secret_value() for k, v in settings.encryption_keys.items()}
        env["WAYSTATION_ENCRYPTION_KEYS"] = json.dumps(keys)
    return env


@asynccontextmanager
async def running_stack(address: str, settings: Settings) -> AsyncIterator[ConsoleStack]:
    """A worker and the API as processes for `settings`, with the test's own client."""
    env = stack_environment(address, settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    worker = WorkerProcess(address, settings, extra_env=env)
    api = ApiProcess(env, free_port(), settings.data_dir / "api.log")
    try:
        await asyncio.gather(worker.ready(), api.start())
        codec = payload_codec(settings)
        client = await Client.connect(address, data_converter=data_converter(codec))
        yield ConsoleStack(settings, AgentRuntime(client, settings), address, api, worker)
    finally:
        api.kill()
        worker.kill()
