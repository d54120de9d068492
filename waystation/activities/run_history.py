"""Reading a run of a task from Temporal: the input it started with, and what a follow-up
continues from once it has answered. The client (a message to an answered task) and the
`claim_turn` activity (a follow-up run's first step) read them alike."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client

from waystation.workflows.run import CONTINUATION_QUERY, AgentRun, RunCarry


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
    client: Client, task_id: str, run_id: str, *, within: timedelta | None = None
) -> AgentRun | None:
    """What a follow-up of closed run `run_id` continues from: the run's state at its end,
    asked of the run itself (a worker replays it; a task nobody follows up never pays for
    it; `within` bounds the query), and its task, from its input. None for a run that
    started without a task (it followed an earlier one: the caller walks to that)."""
    started = await read_run_input(client, task_id, run_id)
    if started is None or started.task is None:
        return None
    closed = client.get_workflow_handle(task_id, run_id=run_id)
    carry = await closed.query(CONTINUATION_QUERY, result_type=RunCarry, rpc_timeout=within)
    return AgentRun(task=started.task, carry=carry)
