"""MCP servers for tests and the chaos suite: the demo server (tests/mcp_servers/), stdio
or streamable HTTP, and the log of the calls it served."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from waystation.settings.mcp_servers import McpServerConfig

REPO = Path(__file__).resolve().parents[2]  # the checkout this kit runs from
DEMO_SERVER = REPO / "tests" / "mcp_servers" / "demo_server.py"
NOT_MCP = REPO / "tests" / "mcp_servers" / "not_mcp.py"
NOT_MCP_LINE = "demo server: listening on stdio (this line is not MCP)"  # and DEMO_BANNER
STARTS_WITHIN_SECONDS = 60.0
WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class CallLog:
    """The JSON lines the demo server appends per call: tool, event, key, label, pid."""

    path: Path

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def events(self, tool: str | None = None, key: str | None = None) -> list[str]:
        return [
            e["event"]
            for e in self.entries()
            if (tool is None or e["tool"] == tool) and (key is None or e["key"] == key)
        ]

    async def wait_for(self, event: str, *, key: str | None = None) -> None:
        """Until an entry with `event` (for `key`) is logged (bounded: 30 s)."""
        async with asyncio.timeout(WAIT_SECONDS):
            # Another process appends to the file: there is nothing to await but the file.
            while event not in self.events(key=key):  # noqa: ASYNC110
                await asyncio.sleep(0.02)


def demo_stdio(
    log: CallLog, protocol: Literal["auto", "legacy"] = "auto", **fields: Any
) -> McpServerConfig:
    """The demo server as a stdio server (`env` entries in fields are added)."""
    env = {"DEMO_CALL_LOG": str(log.path), **fields.pop("env", {})}
    return McpServerConfig(
        command=sys.executable,
        args=[str(DEMO_SERVER)],
        env=env,
        protocol=protocol,
        **fields,
    )


def not_mcp_stdio(*, exits: bool = False, **fields: Any) -> McpServerConfig:
    """A command that writes lines that are not MCP to its stdout (tests/mcp_servers/)."""
    args = [str(NOT_MCP), *(["--exit"] if exits else [])]
    return McpServerConfig(command=sys.executable, args=args, **fields)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DemoHttpServer:
    """The demo server over streamable HTTP as a subprocess, on one port across restarts
    (a restarted server has forgotten every session)."""

    def __init__(self, log: CallLog, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._env = {"DEMO_CALL_LOG": str(log.path), **(env or {})}
        self._process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self._process = _spawn_http(self.port, self._env)
        await _accepting(self.port, self._process)

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    async def restart(self) -> None:
        self.stop()
        await self.start()


@asynccontextmanager
async def running_http_server(
    log: CallLog, env: dict[str, str] | None = None
) -> AsyncIterator[DemoHttpServer]:
    """The demo HTTP server for the block, stopped after it."""
    server = DemoHttpServer(log, env)
    try:
        await server.start()
        yield server
    finally:
        server.stop()


@asynccontextmanager
async def demo_http_server(log: CallLog, env: dict[str, str] | None = None) -> AsyncIterator[str]:
    """The demo server over streamable HTTP as a subprocess; yields its URL."""
    async with running_http_server(log, env) as server:
        yield server.url


def _spawn_http(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(DEMO_SERVER), "--http", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _accepting(port: int, process: subprocess.Popen[bytes]) -> None:
    async with asyncio.timeout(STARTS_WITHIN_SECONDS):
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the demo MCP server exited with {process.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            return
