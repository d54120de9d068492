"""The `child_outcome` activity: how a sub-agent's task stands, read from Temporal.

A parent normally learns its child's end from Temporal itself (the child workflow's
completion). A parent that meets a child already running or closed under its derived id
(after a repair or a reset re-ran the step that starts it) is no longer that child's
parent in Temporal's eyes, so it asks now and then instead (workflows/agents.py). Such an
id is predictable, so the task under it is the asking task's child only if Temporal
recorded the asking task as the parent that started it; any other is `foreign`.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflow.v1 import WorkflowExecutionInfo
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.converter import DataConverter

from waystation.activities.payload_codec import failure_detail, failure_message
from waystation.activities.turns import close_event
from waystation.client.health import overview
from waystation.workflows.models import Usage
from waystation.workflows.run import AgentOutcome, ChildOutcome


async def failure_usage(convert: DataConverter, close: HistoryEvent) -> Usage | None:
    """The tokens a failed task used, from its failure's detail (None before failures
    carried them, or for any other end)."""
    if close.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        return None
    detail = await failure_detail(convert, close.workflow_execution_failed_event_attributes.failure)
    return detail.usage if detail else None


async def started_by(client: Client, task_id: str) -> str:
    """The id of the workflow that started the task's first run as its child ("" for a
    task a client started): Temporal records it, no client can set it."""

    async def described(run_id: str = "") -> WorkflowExecutionInfo:
        request = DescribeWorkflowExecutionRequest(
            namespace=client.namespace,
            execution=WorkflowExecution(workflow_id=task_id, run_id=run_id),
        )
        return (
            await client.workflow_service.describe_workflow_execution(request)
        ).workflow_execution_info

    info = await described()
    if info.first_run_id and info.first_run_id != info.execution.run_id:
        info = await described(info.first_run_id)
    return str(info.parent_execution.workflow_id)


class ChildActivities:
    """`child_outcome`, over the worker's Temporal client."""

    @activity.defn(name="child_outcome")
    async def child_outcome(self, child_id: str) -> ChildOutcome:
        """Whether the child task has ended, and how (its answer, or why it did not)."""
        client = activity.client()
        if await started_by(client, child_id) != activity.info().workflow_id:
            return ChildOutcome(closed=True, foreign=True)
        seen = await overview(client, child_id)
        if seen.status in (None, WorkflowExecutionStatus.RUNNING):
            return ChildOutcome(closed=False)
        close = await close_event(client, child_id, seen.run_id)
        convert = client.data_converter
        if close.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            payloads = close.workflow_execution_completed_event_attributes.result.payloads
            [outcome] = await convert.decode(payloads, [AgentOutcome])
            return ChildOutcome(closed=True, outcome=outcome)
        usage = await failure_usage(convert, close)
        if close.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            failure = close.workflow_execution_failed_event_attributes.failure
            reason = await failure_message(convert, failure)
            return ChildOutcome(closed=True, ended="failed", reason=reason, usage=usage)
        ended = EventType.Name(close.event_type).removeprefix("EVENT_TYPE_WORKFLOW_EXECUTION_")
        return ChildOutcome(closed=True, ended="cancelled", reason=ended.lower(), usage=usage)
