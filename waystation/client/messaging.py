"""Delivering a person's message to a task, wherever the task is in its conversation.

A task that works (or waits for a person) gets the message as the `message` Signal: kept
durably the moment Temporal accepts it, whether or not a worker runs, and taken at the
task's next model call. A task whose run answered and closed is continued: the message
starts the next run of the same workflow id with signal-with-start, so the id, the event
log and the stream's offsets go on. That run starts from what the closed run's
`continuation` query gives (its state, the stream's latest items, the run it follows), when
a worker answers it in time; else it starts naming only the run it follows, and its first
activity reads the same once a worker runs (then it continues as new, which Temporal holds
back up to a second: a run may not continue as new within a second of its start). A failed
or cancelled task takes no message: resume or fork it.

Signals, not the `send_message` Update: a Signal is safe whatever moment it lands in
(docs/never-stuck.md), and two senders at once are both kept, in the order Temporal took
them. The Update is for Temporal CLI users who want an answer. A Signal cannot be refused,
so before it goes out the sender asks the task how much waits (`message_room`) and applies
the workflow's own rule (workflows/messages.py): a message that does not fit is refused
here (TOO_MANY_MESSAGES). Without a worker to ask it goes out, and the task logs a
`message_refused` error for it if it still does not fit when the task reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from waystation.activities.run_history import (
    SealedReader,
    read_continuation,
    read_run_input,
    sealed_run,
)
from waystation.client.busy import sending
from waystation.client.health import overview
from waystation.client.pollers import polling_workers
from waystation.client.starting import start_agent
from waystation.client.task_errors import MessageRefusedError, not_found
from waystation.client.task_list import task_origin
from waystation.settings.commands import command
from waystation.workflows import errors, messages, search
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import AgentTask, Message
from waystation.workflows.run import AgentOutcome, AgentRun

# Delivery looks again when the task's run changes under it (it closed as the Signal
# went out); more changes than this in a row mean something keeps closing it.
MOST_LOOKS = 10
# How long a follow-up waits for a worker to give the closed run's continuation (a replay of
# that run) before it leaves the reading to the next run's first activity.
CONTINUATION_WAIT = timedelta(seconds=5)
# How long a sender waits for a worker to say how much waits in the task's queue.
ROOM_WAIT = timedelta(seconds=5)


@dataclass(frozen=True)
class Delivery:
    """Where a message went: the run chain that holds it (its result is the answer, unless
    a later message took the conversation further in the same chain)."""

    workflow: WorkflowHandle[AgentWorkflow, AgentOutcome]
    started: bool
    """A new run was started for it: the task had answered and its run had closed."""
    stream_from: int | None = None
    """With `started`: the stream offset the new turn's items start at."""


async def deliver(
    client: Client,
    task_id: str,
    message: Message,
    *,
    task_queue: str,
    sealed: SealedReader | None = None,
) -> Delivery:
    """Deliver `message` to the task (see the module's docstring), or raise
    MessageRefusedError / TaskNotFoundError with a sentence. `sealed` reads what closed
    runs sealed, where this client has the workers' storage."""
    refuse(messages.MessageView(task_id, "running"), message)  # too large for any queue
    for _ in range(MOST_LOOKS):
        try:
            seen = await overview(client, task_id)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise not_found(task_id) from err
            raise
        if seen.status == WorkflowExecutionStatus.RUNNING:
            status = str(seen.memo.get(search.MEMO_STATUS) or "running")
            refuse(messages.MessageView(task_id, status), message)
            handle: WorkflowHandle[AgentWorkflow, AgentOutcome] = client.get_workflow_handle_for(
                AgentWorkflow.run, task_id, run_id=seen.run_id
            )
            await _check_room(client, handle, task_id, message, task_queue)
            try:
                await _signal(handle, message)
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    continue  # the run closed as the Signal went out: look again
                raise
            return Delivery(handle, started=False)
        if seen.status == WorkflowExecutionStatus.COMPLETED:
            outcome, task = await _answer(client, task_id, seen.run_id)
            if message.message_id in outcome.message_ids:
                # A repeat of a message the answer already took (a retried send).
                closed: WorkflowHandle[AgentWorkflow, AgentOutcome] = (
                    client.get_workflow_handle_for(AgentWorkflow.run, task_id, run_id=seen.run_id)
                )
                return Delivery(closed, started=False)
            # Its first activity claims the turn (activities/turns.py), so two senders never
            # both follow one answer. The run carries the task's text, first start and
            # tenant, which the task list shows (waystation/client/task_list.py), not the
            # message's.
            origin = await task_origin(client, task_id, seen.run_id)
            started = await start_agent(
                client,
                task_id,
                await _next_run(client, task_id, seen.run_id, task, task_queue, sealed),
                task_queue=task_queue,
                text=origin.text or message.content,
                started_at=origin.started_at,
                message=message,
                reuse=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                tenant=origin.tenant,
            )
            return Delivery(started, started=True, stream_from=outcome.next_offset)
        status = seen.status.name.lower() if seen.status else "unknown"
        ended = "cancelled" if status == "canceled" else "failed"
        refuse(messages.MessageView(task_id, ended), message)
    raise MessageRefusedError(
        task_id,
        f"task {task_id} kept changing its run while the message was sent: send it again",
        None,
    )


async def _check_room(
    client: Client,
    handle: WorkflowHandle[AgentWorkflow, AgentOutcome],
    task_id: str,
    message: Message,
    task_queue: str,
) -> None:
    """Refuse a message the task's queue has no room for, by the workflow's own rule."""
    if not await polling_workers(client, task_queue, "workflow", this_process=True):
        return  # nobody to ask: the task's log says so if it cannot take the message
    try:
        waiting = await handle.query(AgentWorkflow.message_room, rpc_timeout=ROOM_WAIT)
    except (WorkflowQueryFailedError, RPCError):
        return
    refuse(messages.MessageView(task_id, "running", waiting=waiting), message)


async def _signal(handle: WorkflowHandle[AgentWorkflow, AgentOutcome], message: Message) -> None:
    await sending(lambda: handle.signal(AgentWorkflow.message, message))


def refuse(view: messages.MessageView, message: Message) -> None:
    """Raise MessageRefusedError if the task cannot take `message`, by the workflow's own
    rule (messages.message_refusal), with the command that goes on where there is one."""
    refused = messages.message_refusal(view, message)
    if refused is None:
        return
    sentence = refused.sentence
    if refused.kind == errors.TASK_NOT_TAKING_MESSAGES and view.status == "failed":
        sentence += f" ({command('resume', view.task_id, '--message')} '...')"
    elif refused.kind == errors.TASK_NOT_TAKING_MESSAGES:
        sentence += f" ({command('fork', view.task_id, '--at')} SEQ --message '...')"
    raise MessageRefusedError(view.task_id, sentence, refused.kind)


async def _next_run(
    client: Client,
    task_id: str,
    run_id: str,
    task: AgentTask | None,
    task_queue: str,
    sealed: SealedReader | None,
) -> AgentRun:
    """The input of the run that follows closed run `run_id`: from its continuation, as the
    run sealed it or as a worker gives it within CONTINUATION_WAIT, else naming only the
    run it follows (its claim reads the continuation)."""
    if task is None:
        return AgentRun(follows=run_id)
    if sealed is not None and (found := await sealed_run(client, task_id, run_id, sealed)):
        return AgentRun(task=task, carry=found.continuation)
    if not await polling_workers(client, task_queue, "workflow", this_process=True):
        return AgentRun(follows=run_id)
    try:
        following = await read_continuation(client, task_id, run_id, within=CONTINUATION_WAIT)
    except (WorkflowQueryFailedError, RPCError):
        following = None  # no worker now: the run's claim reads it later
    return following or AgentRun(follows=run_id)


async def _answer(
    client: Client, task_id: str, run_id: str
) -> tuple[AgentOutcome, AgentTask | None]:
    """The answer of closed run `run_id` and its task, once it is known that a message may
    follow it (a sub-agent's answered its caller: not this one)."""
    started = await read_run_input(client, task_id, run_id)
    task = started.task if started is not None else None
    if task is not None and task.parent is not None:
        raise MessageRefusedError(
            task_id,
            f"task {task_id} is a sub-agent of {task.parent.task_id}: it answered its caller; "
            f"send your message to {task.parent.task_id}",
            errors.TASK_NOT_TAKING_MESSAGES,
        )
    closed: WorkflowHandle[AgentWorkflow, AgentOutcome] = client.get_workflow_handle_for(
        AgentWorkflow.run, task_id, run_id=run_id
    )
    return await closed.result(follow_runs=False), task
