"""The embedded Temporal dev server as commands start and stop it: starter.py subprocesses
with the embedded server on, a fresh data dir and free ports each, so each test starts its
own `temporal server start-dev` on SQLite."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from waystation.settings.commands import command
from waystation.testing.proc import free_port, pid_with_local_port, pids_with_argument
from waystation.testing.settings import USER_ENV_PREFIXES
from waystation.testing.workers import REPO


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Embedded:
    """The environment of commands that share one data dir and its embedded server."""

    def __init__(self, base: Path) -> None:
        self.data_dir = base / "data"
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(USER_ENV_PREFIXES)}
        self.env.update(
            WAYSTATION_DATA_DIR=str(self.data_dir),
            WAYSTATION_WORKSPACE=str(base / "workspace"),
            WAYSTATION_TASK_QUEUE=f"embedded-{self.port}",
            WAYSTATION_DEV_SERVER_PORT=str(self.port),
            WAYSTATION_DEV_SERVER_UI_PORT=str(free_port()),
        )

    @property
    def database(self) -> str:
        return str(self.data_dir.absolute() / "temporal.db")

    async def ws(self, *args: str) -> tuple[int, str, str]:
        """`python starter.py ARGS`: exit code, stdout, stderr."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(REPO / "starter.py"),
            *args,
            cwd=REPO,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    def servers(self) -> list[int]:
        """The dev server processes on this data dir's database."""
        return pids_with_argument(self.database)


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Embedded]:
    commands = Embedded(tmp_path)
    yield commands
    for pid in commands.servers():  # whatever a failed test left running
        os.kill(pid, signal.SIGKILL)


@pytest.mark.long(minutes=0.4)
async def test_commands_started_at_once_share_one_server_which_stop_stops(
    embedded: Embedded,
) -> None:
    # Three `make demo`s at once on a fresh data dir: one server starts, all three use it.
    runs = [embedded.ws("run", "--no-wait", "--id", f"at-once-{i}", "hi") for i in range(3)]
    for code, out, err in await asyncio.gather(*runs):
        assert code == 0, err
        assert out.strip().startswith("at-once-")
    [server] = embedded.servers()
    pid = int((embedded.data_dir / "temporal.pid").read_text())
    assert pid == server and pid_with_local_port(embedded.port, [pid]) == pid

    code, _, err = await embedded.ws("server", "stop")
    assert (code, err.strip()) == (0, "stopped the embedded Temporal dev server")
    assert embedded.servers() == [] and not _listening(embedded.port)
    assert not (embedded.data_dir / "temporal.pid").exists()
    code, _, err = await embedded.ws("server", "stop")
    assert (code, err.strip()) == (0, "no server to stop")


@pytest.mark.long(minutes=0.4)
async def test_a_command_that_only_reads_leaves_a_stopped_server_stopped(
    embedded: Embedded,
) -> None:
    code, _, err = await embedded.ws("server", "start")
    assert code == 0 and err.startswith("embedded Temporal dev server on"), err
    code, _, err = await embedded.ws("server", "stop")
    assert code == 0, err

    stopped = (
        f"error: the embedded Temporal dev server is not running (127.0.0.1:{embedded.port}), "
        "and this command only reads, so it leaves it stopped: start it with "
        f"`{command('server', 'start')}` (`run` starts it too)"
    )
    for reading in (["list"], ["status", "any-task"], ["events", "any-task"]):
        code, out, err = await embedded.ws(*reading)
        assert (code, out, err.strip()) == (1, "", stopped), reading
    assert embedded.servers() == [] and not _listening(embedded.port)

    code, out, err = await embedded.ws("run", "--no-wait", "--id", "after-stop", "hi")
    assert code == 0 and "starting the embedded Temporal dev server" in err, err
    code, out, err = await embedded.ws("list")
    assert code == 0 and out.startswith("after-stop "), out + err
