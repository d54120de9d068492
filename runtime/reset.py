"""Resuming a failed task: Temporal's workflow reset to the last good point.

The Python client has no high-level reset call, so this uses the service API directly.
The reset point depends on what failed the task:
- an activity (e.g. a non-retryable LLM error, since fixed): the workflow task that
  scheduled it, so the call is made again;
- a limit (max_steps, token budget, approval timeout): the last workflow task, re-run
  with the limits raised.
Either way a `resume_after_failure` signal follows the reset into the new run: it raises
the limits and logs a `resumed` event. After a limit the workflow keeps its run open for a
short grace before it closes as failed, so the re-run last step meets the signal there.
"""

from __future__ import annotations

import uuid

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, ResetReapplyType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client

from workflows.models import Resumption

_ACTIVITY_FAILURES = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
}
_ACTIVITY_OUTCOMES = {
    *_ACTIVITY_FAILURES,
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED,
}


def reset_point(events: list[HistoryEvent]) -> int:
    """The WorkflowTaskCompleted event id to reset to (see the module docstring)."""
    by_id = {e.event_id: e for e in events}
    last_completed = 0
    last_activity_outcome: HistoryEvent | None = None
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            last_completed = event.event_id
        elif event.event_type in _ACTIVITY_OUTCOMES:
            last_activity_outcome = event
    if last_activity_outcome is not None and last_activity_outcome.event_type in _ACTIVITY_FAILURES:
        failed = last_activity_outcome
        attrs = (
            failed.activity_task_failed_event_attributes
            if failed.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
            else failed.activity_task_timed_out_event_attributes
        )
        scheduled = by_id[attrs.scheduled_event_id].activity_task_scheduled_event_attributes
        return scheduled.workflow_task_completed_event_id
    if not last_completed:
        raise ValueError("the task has no completed workflow task to reset to")
    return last_completed


def _failure_of(events: list[HistoryEvent]) -> tuple[str | None, str | None]:
    for event in reversed(events):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            failure = event.workflow_execution_failed_event_attributes.failure
            kind = None
            details = failure.application_failure_info.details.payloads
            if details:
                kind = details[0].data.decode().strip('"')
            return failure.message, kind
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            return event.workflow_execution_terminated_event_attributes.reason, "terminated"
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
            return "the workflow timed out", "timed_out"
    return None, None


async def reset_failed_task(
    client: Client, task_id: str, run_id: str | None, resumption: Resumption
) -> str:
    """Reset the failed run and deliver `resumption`; returns the new run id."""
    handle = client.get_workflow_handle(task_id, run_id=run_id)
    events = list((await handle.fetch_history()).events)
    failure, kind = _failure_of(events)
    resumption = resumption.model_copy(update={"failure": failure, "failure_kind": kind})
    response = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=task_id, run_id=run_id or ""),
            reason=f"resume after failure: {failure}",
            workflow_task_finish_event_id=reset_point(events),
            request_id=str(uuid.uuid4()),
            # Stream publishes after the reset point belong to the abandoned run.
            reset_reapply_type=ResetReapplyType.RESET_REAPPLY_TYPE_NONE,
        )
    )
    new_run = client.get_workflow_handle(task_id, run_id=response.run_id)
    await new_run.signal("resume_after_failure", resumption)
    return response.run_id
