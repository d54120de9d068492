"""Whether any worker serves a task queue, from Temporal's own view of its pollers.

A task started while no worker polls its queue sits at `running`, step 0, saying nothing;
the command line asks Temporal (DescribeTaskQueue) so it can say why, and what to start.

Temporal lists a poller for a minute or more after its process has gone. A worker that a
command hosts (`ws status`, `ws run`) lives only as long as that command, so it names
itself as such (`cli_worker_identity`), and counts as serving only while its process runs.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta
from typing import Literal

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from waystation.activities.storage.deployment import OFFER_TAG, STORAGE_TAG
from waystation.settings.commands import command

# A live worker's long poll lasts up to ~70 s before it polls again: a poller seen longer
# ago than this is gone.
RECENT_POLL = timedelta(seconds=90)
# Before the `pid@host` of Temporal's default identity, so the host still reads as the host.
CLI_WORKER_PREFIX = "ws-cli-"

_TYPES = {
    "workflow": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    "activity": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
}


def cli_worker_identity() -> str:
    """The identity of a worker this command hosts for as long as it runs."""
    return f"{CLI_WORKER_PREFIX}{os.getpid()}@{socket.gethostname()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def serving(identity: str, *, this_process: bool) -> bool:
    """Whether a poller named `identity` may still serve its queue. A command's worker does
    while its process runs on this host; one on another host is taken as gone, since it
    lives a command's while. With `this_process` false, this process's own worker does not
    count (it stops when the command ends)."""
    if not identity.startswith(CLI_WORKER_PREFIX):
        return True
    base = identity.partition(STORAGE_TAG)[0].partition(OFFER_TAG)[0]  # tags of a worker's
    if base == cli_worker_identity():
        return this_process
    pid, at, host = base.removeprefix(CLI_WORKER_PREFIX).partition("@")
    return bool(at) and host == socket.gethostname() and pid.isdigit() and _alive(int(pid))


async def polling_workers(
    client: Client,
    task_queue: str,
    kind: Literal["workflow", "activity"],
    *,
    this_process: bool = False,
) -> list[str]:
    """Identities of the workers that polled `task_queue` for `kind` tasks lately and may
    still serve it (see `serving`); this process's own count only with `this_process`."""
    try:
        response = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=_TYPES[kind],
            )
        )
    except RPCError as err:
        if err.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        return []  # Temporal's time-skipping test server cannot tell (waystation.testing)
    now = datetime.now(UTC)
    return [
        poller.identity
        for poller in response.pollers
        if (this_process or poller.identity != client.identity)
        and serving(poller.identity, this_process=this_process)
        and (
            not poller.HasField("last_access_time")  # a server that does not say: recent
            or now - poller.last_access_time.ToDatetime(tzinfo=UTC) < RECENT_POLL
        )
    ]


async def no_worker_note(client: Client, task_queue: str) -> str | None:
    """A sentence saying that no worker serves `task_queue` and how to start one, or None
    when one does. A worker must take both workflow and activity tasks to move a task."""
    for kind in ("workflow", "activity"):
        if not await polling_workers(client, task_queue, kind):
            return (
                f"no worker polls task queue {task_queue!r} for {kind} tasks on "
                f"{client.service_client.config.target_host}: the task waits until one does; "
                f"start one with: {command('worker')}"
            )
    return None
