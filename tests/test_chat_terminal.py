"""`ws chat` as a person uses it: a real pseudo-terminal, the real CLI process against the
dev server and the offline model; two turns, an approval answered inline, Ctrl-D leaves."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import subprocess
import sys
import time

from temporalio.testing import WorkflowEnvironment

from waystation.settings import Settings
from waystation.settings.commands import command
from waystation.testing.settings import USER_ENV_PREFIXES
from waystation.testing.workers import REPO

WAIT_SECONDS = 90.0


class Terminal:
    """A process on a pseudo-terminal: what it printed so far, and keys to type."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            args, cwd=REPO, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True
        )
        os.close(slave)
        self.seen = ""

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def expect(self, text: str, after: int = 0) -> int:
        """Wait until `text` shows after position `after`; where it ends (bounded)."""
        deadline = time.monotonic() + WAIT_SECONDS
        while (at := self.seen.find(text, after)) < 0:
            left = deadline - time.monotonic()
            if left <= 0 or (self.process.poll() is not None and not self._ready(0)):
                raise AssertionError(f"{text!r} never showed; the terminal shows:\n{self.seen}")
            if self._ready(min(left, 0.5)):
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                self.seen += chunk.decode(errors="replace")
        return at + len(text)

    def _ready(self, timeout: float) -> bool:
        return bool(select.select([self.master], [], [], timeout)[0])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        os.close(self.master)


def chat_env(dev_env: WorkflowEnvironment, settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(USER_ENV_PREFIXES)}
    env.update(
        TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
        WAYSTATION_TASK_QUEUE=settings.task_queue,
        WAYSTATION_WORKSPACE=str(settings.workspace_dir),
        WAYSTATION_DATA_DIR=str(settings.data_dir),
        WAYSTATION_EMBEDDED_SERVER="false",
        TERM="dumb",
    )
    return env


async def test_chat_takes_two_turns_with_an_approval_inline_and_ctrl_d_leaves(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    terminal = Terminal(
        [sys.executable, str(REPO / "starter.py"), "chat"], chat_env(dev_env, settings)
    )
    try:
        at = await asyncio.to_thread(terminal.expect, "you> ")
        terminal.type("What is 6 * 7?\n")
        at = await asyncio.to_thread(terminal.expect, "6 * 7 = 42", at)
        at = await asyncio.to_thread(terminal.expect, "you> ", at)
        # The second turn: a command, which waits for an approval asked right here.
        terminal.type("Please run `echo chatted-inline`\n")
        at = await asyncio.to_thread(terminal.expect, "approve run_shell?", at)
        terminal.type("y\n")
        at = await asyncio.to_thread(terminal.expect, "chatted-inline", at)
        at = await asyncio.to_thread(terminal.expect, "you> ", at)
        terminal.type("\x04")  # Ctrl-D
        await asyncio.to_thread(terminal.expect, "left the conversation; the task stays", at)
        code = await asyncio.to_thread(terminal.process.wait, WAIT_SECONDS)
    finally:
        terminal.close()
    assert code == 0, terminal.seen
    [task_id] = re.findall(r"task (task-[0-9a-f]+) started", terminal.seen)
    assert f"continue with  {command('chat', task_id)}" in terminal.seen
    assert "(it had answered: a new turn)" in terminal.seen
