"""Is anyone working on a task? Workers polling its task queue, and tasks that are stuck.

A task is stuck when its workflow task keeps failing (a nondeterminism error, or a bug
shipped in a new version): Temporal retries it forever and nothing moves, queries fail,
and without a look at the task's pending workflow task nobody would notice. Both checks
need no worker: they read Temporal's own view.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import (
    DescribeWorkflowExecutionRequest,
    GetWorkflowExecutionHistoryReverseRequest,
)
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.converter import DataConverter
from temporalio.service import RPCError

from waystation.activities.payload_codec import failure_message
from waystation.client.busy import reading
from waystation.client.pollers import polling_workers
from waystation.client.task_errors import NoWorkerError, UnreadableTaskError, undecryptable
from waystation.settings.commands import command

# A workflow task that failed this many times in a row is a task that will not move by
# itself (one failure can be a worker that died mid-task; Temporal retries it at once).
STUCK_AFTER_ATTEMPTS = 3
_EVENT_ID = re.compile(r"HistoryEvent\(id: (\d+)")


@dataclass(frozen=True)
class TaskOverview:
    """Temporal's view of a task's latest run, read without decoding its search attributes
    (the time-skipping server keeps an unset datetime attribute as a null the SDK rejects)."""

    run_id: str
    status: WorkflowExecutionStatus | None
    memo: dict[str, Any]


async def overview(client: Client, task_id: str) -> TaskOverview:
    request = DescribeWorkflowExecutionRequest(
        namespace=client.namespace, execution=WorkflowExecution(workflow_id=task_id)
    )
    raw = await reading(lambda: client.workflow_service.describe_workflow_execution(request))
    info = raw.workflow_execution_info
    fields = dict(info.memo.fields)
    values = await client.data_converter.decode(list(fields.values())) if fields else []
    status = WorkflowExecutionStatus(info.status) if info.status else None
    return TaskOverview(info.execution.run_id, status, dict(zip(fields, values, strict=True)))


async def worker_hint(client: Client, task_queue: str) -> str | None:
    """A sentence saying no worker serves the task queue and how to start one, or None.
    A worker this process hosts counts; one a finished command hosted does not."""
    serving = await reading(
        lambda: polling_workers(client, task_queue, "workflow", this_process=True)
    )
    if serving:
        return None
    return (
        f"no worker polls task queue {task_queue!r}: the task waits until one does; start one "
        f"with `{command('worker')}`"
    )


def unanswered(
    task_id: str, what: str, limit: timedelta, task_queue: str, hint: str | None
) -> NoWorkerError:
    """The error for `what` unanswered within `limit`, with `worker_hint`'s sentence, or
    saying that workers poll but did not answer."""
    seconds = f"{limit.total_seconds():g} s"
    if hint is not None:
        return NoWorkerError(task_id, f"no worker answered {what} within {seconds}: {hint}")
    return NoWorkerError(
        task_id,
        f"no worker answered {what} within {seconds}, though workers poll task queue "
        f"{task_queue!r}: they may be busy or the task stuck ({command('status', task_id)})",
    )


@dataclass(frozen=True)
class Stuck:
    """A task whose workflow task keeps failing, and where a repair should reset it to."""

    attempts: int
    problem: str
    reset_to_event: int | None
    """None when no workflow task completed before the failure: nothing to reset to."""


async def with_failures_readable(
    converter: DataConverter, history: list[HistoryEvent]
) -> list[HistoryEvent]:
    """`history` with the messages of failed workflow tasks decrypted (with encryption on,
    the worker encrypts them), as `stuck` reads them."""
    readable = []
    for event in history:
        failure = event.workflow_task_failed_event_attributes.failure
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED and failure.HasField(
            "encoded_attributes"
        ):
            message = await failure_message(converter, failure)
            event = HistoryEvent.FromString(event.SerializeToString())
            event.workflow_task_failed_event_attributes.failure.message = message
        readable.append(event)
    return readable


def stuck(description: WorkflowExecutionDescription, history: list[HistoryEvent]) -> Stuck | None:
    """Whether the task is stuck, judged from Temporal's description and its history."""
    if description.status != WorkflowExecutionStatus.RUNNING:
        return None
    raw = description.raw_description
    if not raw.HasField("pending_workflow_task"):
        return None
    attempts = raw.pending_workflow_task.attempt
    if attempts < STUCK_AFTER_ATTEMPTS:
        return None
    failed = next(
        (e for e in reversed(history) if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED),
        None,
    )
    problem = (
        failed.workflow_task_failed_event_attributes.failure.message
        if failed is not None
        else "its workflow task keeps failing"
    )
    return Stuck(attempts, problem, repair_point(history, problem))


def repair_point(history: list[HistoryEvent], problem: str) -> int | None:
    """The workflow task to reset a stuck task to: the last one that completed before the
    event the replay trips on (a nondeterminism error names it), else before the failure."""
    bound = len(history) + 1
    if (match := _EVENT_ID.search(problem)) is not None:
        bound = int(match.group(1))
    else:
        first_failure = next(
            (
                e.event_id
                for e in history
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
            ),
            None,
        )
        bound = first_failure or bound
    completed = [
        e.event_id
        for e in history
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and e.event_id < bound
    ]
    return completed[-1] if completed else None


# Temporal's answer to a query while the task's first workflow task keeps failing.
_REFUSED_WHILE_FAILING = "Workflow Task in failed state"
_RECENT_EVENTS = 20


async def cannot_run(client: Client, task_id: str, err: RPCError) -> UnreadableTaskError | None:
    """When `err` is Temporal refusing a query because the task's workflow task keeps
    failing on a payload the worker cannot decrypt, the error with the worker's sentence."""
    if _REFUSED_WHILE_FAILING not in err.message:
        return None
    # A failed workflow task's retries are not recorded: the last failure is near the end.
    request = GetWorkflowExecutionHistoryReverseRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=task_id),
        maximum_page_size=_RECENT_EVENTS,
    )
    response = await reading(
        lambda: client.workflow_service.get_workflow_execution_history_reverse(request)
    )
    for event in response.history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failure = event.workflow_task_failed_event_attributes.failure
            return undecryptable(task_id, await failure_message(client.data_converter, failure))
    return None
