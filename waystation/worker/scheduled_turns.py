"""The `deliver_scheduled_turn` activity: a conversation schedule's firing, delivered.

The first firing starts the conversation's task (its id is the schedule's, the same at
every firing); each later one delivers the schedule's text to it as a message, through
client/messaging.py like any person's message, with an id derived from the firing's: the
task takes a message id once, so a retried attempt or a firing Temporal starts again
delivers once. A firing that finds the task started looks at the first run of the task's
current run chain for its own firing before it sends a message: the first firing, retried
or started again, finds its own start there as long as no follow-up has closed that chain
(under the default overlap policy, skip, no other firing runs while it is retried).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from datetime import timedelta

from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from waystation.activities.run_history import read_run_input
from waystation.client.health import overview
from waystation.client.messaging import deliver
from waystation.client.starting import start_agent
from waystation.client.task_errors import MessageRefusedError
from waystation.client.task_list import task_tenant
from waystation.workflows import errors
from waystation.workflows.models import SCHEDULED_ID_PREFIX, Message, ScheduleLink
from waystation.workflows.run import AgentRun
from waystation.workflows.scheduled import TURN_WATCH, TurnDelivered, TurnDelivery

MESSAGE_ID_CHARS = 100  # Message.message_id's bound
# How often a firing's watch asks Temporal whether its turn has ended.
TURN_WATCH_INTERVAL = timedelta(seconds=1)


def turn_message_id(firing: str) -> str:
    """The message id of a firing's turn: its workflow id, or a digest of a long one."""
    if len(firing) <= MESSAGE_ID_CHARS:
        return firing
    return "schedule-" + hashlib.sha256(firing.encode()).hexdigest()[:40]


async def first_run_firing(client: Client, task_id: str) -> str | None:
    """The firing that started the first run of the task's current chain, if one did."""
    request = DescribeWorkflowExecutionRequest(
        namespace=client.namespace, execution=WorkflowExecution(workflow_id=task_id)
    )
    described = await client.workflow_service.describe_workflow_execution(request)
    first = described.workflow_execution_info.first_run_id or None
    started = await read_run_input(client, task_id, first)
    task = started.task if started is not None else None
    return task.schedule.firing if task is not None and task.schedule is not None else None


class ScheduledTurnActivities:
    """`deliver_scheduled_turn`, over the worker's Temporal client and task queue."""

    @activity.defn(name="deliver_scheduled_turn")
    async def deliver_scheduled_turn(self, delivery: TurnDelivery) -> TurnDelivered:
        """Start the conversation's task, or deliver the firing's turn to it."""
        client = activity.client()
        turn = delivery.turn
        if not turn.task_id.startswith(SCHEDULED_ID_PREFIX):
            raise ApplicationError(
                f"task {turn.task_id!r} is not a schedule's: a schedule reaches only the tasks "
                f"it starts, whose ids start with {SCHEDULED_ID_PREFIX!r}",
                type=errors.SCHEDULED_TURN_REFUSED,
                non_retryable=True,
            )
        queue = activity.info().task_queue
        link = ScheduleLink(name=turn.schedule, firing=delivery.firing)
        task = turn.task.model_copy(update={"schedule": link})
        try:
            await start_agent(
                client,
                turn.task_id,
                AgentRun(task=task),
                task_queue=queue,
                text=task.task,
                on_conflict=WorkflowIDConflictPolicy.FAIL,
            )
            return TurnDelivered(task_id=turn.task_id, started=True)
        except WorkflowAlreadyStartedError:
            pass  # the conversation goes on: this firing is its next turn
        if await first_run_firing(client, turn.task_id) == delivery.firing:
            # This firing started it: a retried attempt, or the firing started again.
            return TurnDelivered(task_id=turn.task_id, started=True, duplicate=True)
        if await task_tenant(client, turn.task_id) != task.tenant:
            # A schedule deleted, and one of the same name made for another tenant: the task
            # its name leads to is not this schedule's.
            raise ApplicationError(
                f"task {turn.task_id} is another tenant's: a schedule of that name made it",
                type=errors.SCHEDULED_TURN_REFUSED,
                non_retryable=True,
            )
        message = Message(
            content=task.task,
            message_id=turn_message_id(delivery.firing),
            sender=f"schedule {turn.schedule}",
        )
        try:
            await deliver(client, turn.task_id, message, task_queue=queue)
        except MessageRefusedError as err:
            raise ApplicationError(
                str(err), type=errors.SCHEDULED_TURN_REFUSED, non_retryable=True
            ) from err
        return TurnDelivered(task_id=turn.task_id, message_id=message.message_id)

    @activity.defn(name="watch_scheduled_turn")
    async def watch_scheduled_turn(self, delivered: TurnDelivered) -> bool:
        """Whether the task's turn has ended (its run closed: answered, failed or
        cancelled), watched for up to TURN_WATCH (heartbeating)."""
        client = activity.client()
        deadline = time.monotonic() + TURN_WATCH.total_seconds()
        while True:
            seen = await overview(client, delivered.task_id)
            if seen.status != WorkflowExecutionStatus.RUNNING:
                return True
            if time.monotonic() >= deadline:
                return False
            activity.heartbeat()
            await asyncio.sleep(TURN_WATCH_INTERVAL.total_seconds())
