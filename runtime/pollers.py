"""Whether any worker serves a task queue, from Temporal's own view of its pollers.

A task started while no worker polls its queue sits at `running`, step 0, saying nothing;
the command line asks Temporal (DescribeTaskQueue) so it can say why, and what to start.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from runtime.commands import command

# Temporal lists a poller for minutes after its last poll, and a live worker's long poll
# lasts up to ~70 s before it polls again: a poller seen longer ago than this is gone.
RECENT_POLL = timedelta(seconds=90)

_TYPES = {
    "workflow": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    "activity": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
}


async def polling_workers(
    client: Client, task_queue: str, kind: Literal["workflow", "activity"]
) -> list[str]:
    """Identities of the workers that polled `task_queue` for `kind` tasks lately, other
    than this process's own (a worker a command hosts for a moment does not count)."""
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=_TYPES[kind],
        )
    )
    now = datetime.now(UTC)
    return [
        poller.identity
        for poller in response.pollers
        if poller.identity != client.identity
        and now - poller.last_access_time.ToDatetime(tzinfo=UTC) < RECENT_POLL
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
