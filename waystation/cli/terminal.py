"""What every command shares: exit codes, the line for the person at the terminal, the
runtime a command works with (and the worker it hosts), who a person at this terminal is."""

from __future__ import annotations

import contextlib
import getpass
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from waystation.vocabulary import TaskStatus

# Every command imports this module: what only some use is imported where it is used.
if TYPE_CHECKING:
    from temporalio.client import Client

    from waystation.client.agent_runtime import AgentRuntime
    from waystation.settings import Settings


class UsageError(Exception):
    """A command given wrongly: one sentence, exit code 2, nothing sent."""


EXIT_FAILED = 1


EXIT_WAITING = 3
EXIT_ENDED = 4  # nothing done: the task has already ended (cancel)
EXIT_CANCELLED = 130
# `status` answers with the code a command following the task would end with.
STATUS_EXIT_CODES: dict[TaskStatus, int] = {
    "waiting_approval": EXIT_WAITING,
    "waiting_input": EXIT_WAITING,
    "failed": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
}


def say(message: str) -> None:
    """A line for the person at the terminal; what it quotes of a task is made `visible`."""
    from waystation.cli.render import visible

    print(visible(message, indent=""), file=sys.stderr, flush=True)


@contextlib.asynccontextmanager
async def hosted_worker(
    client: Client, settings: Settings, enabled: bool, *, activities: bool = True
) -> AsyncIterator[None]:
    if not enabled:
        yield
        return
    from waystation.client.pollers import cli_worker_identity
    from waystation.worker import build_worker

    identity = cli_worker_identity()  # it serves only while this command runs
    async with build_worker(client, settings, activities=activities, identity=identity):
        yield


@contextlib.asynccontextmanager
async def session(
    settings: Settings, worker: bool, *, activities: bool = True
) -> AsyncIterator[AgentRuntime]:
    """A runtime on the configured Temporal, with a worker in this process if asked."""
    from waystation.client.agent_runtime import AgentRuntime
    from waystation.client.temporal import connect

    client = await connect(settings)
    async with hosted_worker(client, settings, worker, activities=activities):
        yield AgentRuntime(client, settings)


async def exists(runtime: AgentRuntime, task_id: str) -> bool:
    from waystation.client.task_errors import TaskNotFoundError

    try:
        await runtime.find(task_id)
    except TaskNotFoundError:
        return False
    return True


def approver() -> str:
    try:
        return f"{getpass.getuser()}@cli"
    except (KeyError, OSError):
        return "cli"
