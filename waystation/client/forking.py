"""What a fork starts from: the state just after one event of a task, the run that holds
that event, and the limits in force there (AgentRuntime.fork starts it)."""

from __future__ import annotations

from typing import Any

from waystation.client.task_errors import TaskError
from waystation.client.task_log import TaskLog
from waystation.workflows.events import AgentEvent, Resumed, TaskStarted, UserMessage, fold
from waystation.workflows.forks import fork_start
from waystation.workflows.models import AgentTask
from waystation.workflows.run import AgentRun, RunCarry, RunRef


async def fork_input(
    log: TaskLog,
    task_id: str,
    kept: list[AgentEvent],
    at_seq: int,
    *,
    message: str | None,
    limits: dict[str, float | None],
) -> AgentRun:
    """The input of a fork of `task_id` after event `at_seq` (`kept`: its events up to
    there): its state there, `message` to add, and `limits` over those in force."""
    if not 0 <= at_seq < len(kept) or kept[-1].seq != at_seq:
        last = kept[-1].seq if kept else -1
        raise TaskError(task_id, f"task {task_id} has events 0..{last}, not {at_seq}")
    first = kept[0]
    if not isinstance(first, TaskStarted):
        raise TaskError(task_id, f"task {task_id}'s log does not start with task_started")
    state = fold(kept)
    if state.status == "done" and message is None:
        raise TaskError(
            task_id, f"event {at_seq} ends the task with an answer: add a message to go on"
        )
    origin = await _run_holding(log, task_id, at_seq)
    # Decisions on calls not yet run stay with the original: the fork asks again.
    carry = RunCarry(state=fork_start(state), message=message, earlier=origin, forked=True)
    task = _limits_in_force(first.task, kept).model_copy(
        # A fork stands alone: no sub-agent's parent, no schedule's firing.
        update={k: v for k, v in limits.items() if v is not None}
        | {"parent": None, "schedule": None}
    )
    return AgentRun(task=task, carry=carry)


async def _run_holding(log: TaskLog, task_id: str, seq: int) -> RunRef:
    span = await log.latest(task_id)
    while span.first_seq > seq and span.earlier is not None:
        span = await log.span(span.earlier)
    return RunRef(workflow_id=span.workflow_id, run_id=span.run_id, last_seq=seq)


def _limits_in_force(task: AgentTask, events: list[AgentEvent]) -> AgentTask:
    """`task` with the limits in force after `events`: those the last `resumed` event left
    (each records both; one recorded before events carried limits has neither), and a
    later message's max_steps for its turn."""
    update: dict[str, Any] = {}
    for event in reversed(events):
        if isinstance(event, UserMessage) and event.max_steps is not None:
            update.setdefault("max_steps", event.max_steps)
        if isinstance(event, Resumed) and event.max_steps is not None:
            update.setdefault("max_steps", event.max_steps)
            update["token_budget"] = event.token_budget
            update["cost_budget"] = event.cost_budget
            break
    return task.model_copy(update=update) if update else task
