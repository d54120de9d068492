"""Resetting a task with Temporal's workflow reset: to resume a failed task, or repair a
stuck one. The Python client has no high-level reset call, so this uses the service API.

Resume. A task that fails logs `failed` and waits a moment (RESUME_GRACE) for a
`resume_after_failure` signal before its run closes. Resetting it to the workflow task that
started that wait re-runs the moment of failure in a new run, which waits again; the
signal sent right after the reset lands there, raises the limits, and the log shows a
`resumed` event after the `failed` one. Repair: the last workflow task that completed before
the failure, with the signals and Updates sent since re-applied; a `repaired` signal follows
and the log shows a `repaired` event.
"""

from __future__ import annotations

import hashlib
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, ResetReapplyType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from waystation.activities.payload_codec import failure_detail, failure_message
from waystation.client.busy import sending
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import RepairNote, Resumption
from waystation.workflows.run import AgentOutcome


def resume_point(events: list[HistoryEvent]) -> int:
    """The workflow task that logged the failure and started the wait for a resumption."""
    for event in reversed(events):
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            return event.timer_started_event_attributes.workflow_task_completed_event_id
    completed = [
        e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]
    if not completed:
        raise ValueError("the task has no completed workflow task to reset to")
    return completed[-1]


async def failure_of(client: Client, events: list[HistoryEvent]) -> tuple[str | None, str | None]:
    """(message, kind) of the run's failure, its details decoded through the converter (and
    its codec: with encryption on they are ciphertext in history)."""
    for event in reversed(events):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            failure = event.workflow_execution_failed_event_attributes.failure
            detail = await failure_detail(client.data_converter, failure)
            kind = detail.kind if detail else None
            return await failure_message(client.data_converter, failure), kind
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            return event.workflow_execution_terminated_event_attributes.reason, "terminated"
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
            return "the workflow timed out", "timed_out"
    return None, None


async def _reset(
    client: Client, task_id: str, run_id: str, point: int, reason: str, *, reapply: bool
) -> str:
    # The same reset asked twice (two repairers, a retried command) is one reset.
    request_id = hashlib.sha256(f"{task_id}/{run_id}/{point}/{reason}".encode()).hexdigest()
    response = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=task_id, run_id=run_id),
            reason=reason,
            workflow_task_finish_event_id=point,
            request_id=request_id[:36],
            # Resume: stream publishes after the point belong to the abandoned run. Repair:
            # decisions sent since must not be lost.
            reset_reapply_type=ResetReapplyType.RESET_REAPPLY_TYPE_ALL_ELIGIBLE
            if reapply
            else ResetReapplyType.RESET_REAPPLY_TYPE_NONE,
        )
    )
    return response.run_id


async def reset_failed_task(
    client: Client, task_id: str, run_id: str, resumption: Resumption
) -> str:
    """Reset the failed run and deliver `resumption`; returns the new run id."""
    handle = client.get_workflow_handle(task_id, run_id=run_id)
    events = list((await handle.fetch_history()).events)
    failure, kind = await failure_of(client, events)
    note = resumption.model_copy(update={"failure": failure, "failure_kind": kind})
    reason = f"resume after failure: {failure}"
    new_run = await _reset(client, task_id, run_id, resume_point(events), reason, reapply=False)
    workflow: WorkflowHandle[AgentWorkflow, AgentOutcome] = client.get_workflow_handle_for(
        AgentWorkflow.run, task_id, run_id=new_run
    )
    await sending(lambda: workflow.signal(AgentWorkflow.resume_after_failure, note))
    return new_run


async def reset_stuck_task(client: Client, task_id: str, run_id: str, note: RepairNote) -> str:
    """Reset a stuck run to `note.reset_to_event`, re-applying signals and Updates sent
    since, and say so in its log; returns the new run id."""
    reason = f"repair: {note.problem[:200]}"
    new_run = await _reset(client, task_id, run_id, note.reset_to_event, reason, reapply=True)
    workflow: WorkflowHandle[AgentWorkflow, AgentOutcome] = client.get_workflow_handle_for(
        AgentWorkflow.run, task_id, run_id=new_run
    )
    try:
        await sending(lambda: workflow.signal(AgentWorkflow.repaired, note))
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:  # it finished before the note: fine
            raise
    return new_run


async def repaired_points(client: Client, events: Any) -> set[int]:
    """The events a task was repaired at before, from the `repaired` signals in its history."""
    points: set[int] = set()
    for event in events:
        attrs = event.workflow_execution_signaled_event_attributes
        if event.HasField("workflow_execution_signaled_event_attributes") and (
            attrs.signal_name == "repaired"
        ):
            [note] = await client.data_converter.decode(attrs.input.payloads, [RepairNote])
            points.add(note.reset_to_event)
    return points
