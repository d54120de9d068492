"""A person's messages to a task: how they are recorded, counted once, and taken in.

Pure functions over the folded state. Messages reach the workflow through the
`send_message` Update and the `message` Signal; their handlers only record them (each
under an id, so a repeated send counts once), and the loop takes them into the
conversation, in the order they arrived, when no step is open: after a step's tool calls,
before the next model call (see workflows/plan.py). A message taken once the task has
answered begins a new turn.
"""

from __future__ import annotations

from workflows import errors
from workflows.events import AgentState, MessageVia, UserMessage, draft
from workflows.models import Contract, Message, MessageReceipt

# Messages waiting for the loop, carried from run to run; a flood cannot grow the task.
QUEUED_MESSAGES_KEPT = 100


class QueuedMessage(Contract):
    """A message as a handler recorded it (or a fork or a resume gave it), not yet taken."""

    message: Message
    via: MessageVia


def queued_ids(queue: list[QueuedMessage]) -> set[str]:
    return {q.message.message_id for q in queue if q.message.message_id is not None}


def known(state: AgentState, queue: list[QueuedMessage], message_id: str) -> bool:
    """Whether a message with this id was already received (taken, or waiting)."""
    return message_id in state.message_ids or message_id in queued_ids(queue)


def refusal(state: AgentState, queue: list[QueuedMessage]) -> tuple[str, str] | None:
    """(error type, sentence) when the task cannot take a message now, else None."""
    if state.status == "failed":
        return (
            errors.TASK_NOT_TAKING_MESSAGES,
            f"task {state.task_id} failed ({state.failure_kind}): {state.failure}; a message "
            "cannot continue it: resume it (with --message to tell it something)",
        )
    if state.status == "cancelled":
        return (
            errors.TASK_NOT_TAKING_MESSAGES,
            f"task {state.task_id} was cancelled: a message cannot continue it; fork it to go on",
        )
    if len(queue) >= QUEUED_MESSAGES_KEPT:
        return (
            errors.TOO_MANY_MESSAGES,
            f"task {state.task_id} already has {len(queue)} messages waiting for its next "
            "model call; send this one once it has taken them",
        )
    return None


def record(
    queue: list[QueuedMessage],
    state: AgentState,
    message: Message,
    via: MessageVia,
    fallback_id: str,
) -> MessageReceipt:
    """Add `message` to the queue unless a message with its id was received before; the
    receipt says which. `fallback_id` names a message sent without an id."""
    message_id = message.message_id or fallback_id
    if known(state, queue, message_id):
        return MessageReceipt(message_id=message_id, duplicate=True)
    queue.append(
        QueuedMessage(message=message.model_copy(update={"message_id": message_id}), via=via)
    )
    return MessageReceipt(message_id=message_id)


def taken(state: AgentState, queued: QueuedMessage, *, interrupted: bool = False) -> UserMessage:
    """The event of a message the loop takes now; after an answer it begins a new turn."""
    message = queued.message
    turn = state.turn + 1 if state.status == "done" else state.turn
    return draft(
        UserMessage,
        state.step,
        content=message.content,
        message_id=message.message_id,
        sender=message.sender,
        via=queued.via,
        turn=turn,
        max_steps=message.max_steps,
        interrupted=interrupted,
    )


def interrupting(queue: list[QueuedMessage]) -> bool:
    """Whether a waiting message asks to cancel the model call in flight."""
    return any(q.message.interrupt for q in queue)
