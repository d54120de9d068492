"""Reading a run of a task from Temporal: the input it started with, and what a follow-up
continues from once it has answered. The client (a message to an answered task) and the
`claim_turn` activity (a follow-up run's first step) read them alike."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistoryEventFilterType

from waystation.workflows.models import FailureDetail
from waystation.workflows.run import (
    CONTINUATION_QUERY,
    AgentOutcome,
    AgentRun,
    RunCarry,
    SealedRun,
)

# What a closed run sealed as it closed: (task id, run id) -> None if it left nothing.
SealedReader = Callable[[str, str], Awaitable[SealedRun | None]]


async def read_run_input(
    client: Client, task_id: str, run_id: str | None = None
) -> AgentRun | None:
    """The AgentRun run `run_id` (default: the latest) started with, from its first history
    event; None for a run with no history or an input that is not one."""
    handle = client.get_workflow_handle(task_id, run_id=run_id)
    async for start in handle.fetch_history_events(page_size=1):
        payloads = start.workflow_execution_started_event_attributes.input.payloads
        if not payloads:
            return None
        [run] = await client.data_converter.decode([payloads[0]], [AgentRun])
        return run if isinstance(run, AgentRun) else None
    return None


async def read_continuation(
    client: Client,
    task_id: str,
    run_id: str,
    *,
    sealed: SealedRun | None = None,
    within: timedelta | None = None,
) -> AgentRun | None:
    """What a follow-up of closed run `run_id` continues from: the run's state at its end,
    from what it sealed as it closed (`sealed`: see sealed_run), else asked of the run
    itself (a worker of its version replays it; `within` bounds the query), and its task,
    from its input. None for a run that started without a task (it followed an earlier
    one: the caller walks to that)."""
    started = await read_run_input(client, task_id, run_id)
    if started is None or started.task is None:
        return None
    if sealed is not None:
        return AgentRun(task=started.task, carry=sealed.continuation)
    closed = client.get_workflow_handle(task_id, run_id=run_id)
    carry = await closed.query(CONTINUATION_QUERY, result_type=RunCarry, rpc_timeout=within)
    return AgentRun(task=started.task, carry=carry)


async def sealed_run(
    client: Client,
    task_id: str,
    run_id: str,
    sealed: SealedReader,
    close: HistoryEvent | None = None,
) -> SealedRun | None:
    """What closed run `run_id` sealed as it closed, when that is its very end. A run that
    sealed, then took a message that landed while it closed and closed again without a
    seal, left one out of date: its last event is not the one the run's close names."""
    found = await sealed(task_id, run_id)
    if found is None:
        return None
    close = close or await close_event_of(client, task_id, run_id)
    if close is None:
        return None
    if close.HasField("workflow_execution_canceled_event_attributes"):
        return found if found.state().status == "cancelled" else None
    ended = await _last_seq_of(client, close)
    return found if ended is not None and ended == found.continuation.state.last_seq else None


async def _last_seq_of(client: Client, close: HistoryEvent) -> int | None:
    """The last event of a closed run, as its close says (an answer's outcome, a failure's
    detail); None when it does not say (runs closed before it was said)."""
    converter = client.data_converter
    if close.HasField("workflow_execution_completed_event_attributes"):
        payloads = close.workflow_execution_completed_event_attributes.result.payloads
        if not payloads:
            return None
        [outcome] = await converter.decode([payloads[0]], [AgentOutcome])
        return outcome.last_seq if isinstance(outcome, AgentOutcome) else None
    if close.HasField("workflow_execution_failed_event_attributes"):
        failure = close.workflow_execution_failed_event_attributes.failure
        if failure.HasField("application_failure_info"):
            details = failure.application_failure_info.details.payloads
            detail = FailureDetail.of(await converter.decode(list(details)))
            return detail.last_seq if detail is not None else None
    return None


async def close_event_of(client: Client, task_id: str, run_id: str) -> HistoryEvent | None:
    """The run's close event; None while it runs."""
    handle = client.get_workflow_handle(task_id, run_id=run_id)
    events = handle.fetch_history_events(
        event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT
    )
    async for event in events:
        return event
    return None
