"""A person's messages to a task: how they are recorded, counted once, and taken in.

Pure functions over the folded state. Messages reach the workflow through the
`send_message` Update and the `message` Signal; their handlers only record them (each
under an id, so a repeated send counts once), and the loop takes them into the
conversation, in the order they arrived, when no step is open: after a step's tool calls,
before the next model call (see workflows/plan.py). A message taken once the task has
answered begins a new turn.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import NamedTuple

from waystation.workflows import errors
from waystation.workflows.events import AgentState, ErrorEvent, MessageVia, UserMessage, draft
from waystation.workflows.models import MESSAGE_BYTES, Contract, Message, MessageReceipt

# Messages waiting for the loop, carried from run to run (and answered by queries) are
# bounded in number and in bytes, so a flood cannot grow the task: past either bound a
# message is refused. One message (at most MESSAGE_BYTES) always fits an empty queue, so
# what waits, beside the task's text, stays below Temporal's 2 MB per payload.
QUEUED_MESSAGES_KEPT = 100
QUEUED_MESSAGE_BYTES = MESSAGE_BYTES
# Refusals of signalled messages (a Signal cannot be refused) logged by id; more are counted.
REFUSALS_NAMED = 20


class QueuedMessage(Contract):
    """A message as a handler recorded it (or a fork or a resume gave it), not yet taken."""

    message: Message
    via: MessageVia


def queued_ids(queue: list[QueuedMessage]) -> set[str]:
    return {q.message.message_id for q in queue if q.message.message_id is not None}


def known(state: AgentState, queue: list[QueuedMessage], message_id: str) -> bool:
    """Whether a message with this id was already received (taken, or waiting)."""
    return message_id in state.message_ids or message_id in queued_ids(queue)


class QueueVolume(Contract):
    """What waits to be taken (the `message_room` query): clients check it before they
    signal, with the same rule the workflow applies."""

    messages: int = 0
    bytes: int = 0
    message_ids: list[str] = []
    """The waiting messages' ids: a repeated send of one of them fits whatever waits."""


def size_of(message: Message) -> int:
    """The bytes a message takes in a payload (its JSON, as Temporal carries it)."""
    return len(message.model_dump_json().encode())


def volume(queue: list[QueuedMessage]) -> QueueVolume:
    return QueueVolume(
        messages=len(queue),
        bytes=sum(size_of(q.message) for q in queue),
        message_ids=sorted(queued_ids(queue)),
    )


class Refusal(NamedTuple):
    """Why a task cannot take a message now: an error type of workflows/errors.py and a
    sentence for the sender."""

    kind: str
    sentence: str


@dataclass(frozen=True)
class MessageView:
    """What the refusal rule reads of a task. The workflow builds it from its state and its
    queue (`view_of`); a client from the task's status and its `message_room` answer."""

    task_id: str
    status: str
    waiting: QueueVolume = field(default_factory=QueueVolume)
    taken: Collection[str] = ()
    """Ids of the messages already taken into the conversation (a repeat counts once)."""
    failure_kind: str | None = None
    failure: str | None = None


def view_of(state: AgentState, queue: list[QueuedMessage]) -> MessageView:
    return MessageView(
        task_id=state.task_id,
        status=state.status,
        waiting=volume(queue),
        taken=state.message_ids,
        failure_kind=state.failure_kind,
        failure=state.failure,
    )


def message_refusal(view: MessageView, message: Message) -> Refusal | None:
    """Why the task cannot take `message` now, or None (a repeat of a message it has is no
    problem: it counts once). The one rule of the `send_message` Update's validator, the
    `message` Signal's handler and the clients."""
    task_id = view.task_id
    if view.status == "failed":
        why = f" ({view.failure_kind}): {view.failure};" if view.failure_kind else ":"
        return Refusal(
            errors.TASK_NOT_TAKING_MESSAGES,
            f"task {task_id} failed{why} a message cannot continue it; resume it, with a "
            "message if you like",
        )
    if view.status == "cancelled":
        return Refusal(
            errors.TASK_NOT_TAKING_MESSAGES,
            f"task {task_id} was cancelled: a message cannot continue it; fork it to go on",
        )
    received = message.message_id is not None and (
        message.message_id in view.taken or message.message_id in view.waiting.message_ids
    )
    if received:
        return None
    return room_refusal(task_id, view.waiting, size_of(message))


def room_refusal(task_id: str, waiting: QueueVolume, size: int) -> Refusal | None:
    """Why a message of `size` bytes does not fit beside what waits, else None (the part of
    `message_refusal` a sender can apply knowing only the queue's volume)."""
    if size > MESSAGE_BYTES:
        return Refusal(
            errors.MESSAGE_TOO_LARGE,
            f"the message takes {size} bytes as JSON and one may take {MESSAGE_BYTES} (a "
            "character takes up to 6); send it in parts",
        )
    if waiting.messages >= QUEUED_MESSAGES_KEPT:
        return Refusal(
            errors.TOO_MANY_MESSAGES,
            f"task {task_id} already has {waiting.messages} messages waiting for its next "
            "model call; send this one once it has taken them",
        )
    if waiting.messages and waiting.bytes + size > QUEUED_MESSAGE_BYTES:
        return Refusal(
            errors.TOO_MANY_MESSAGES,
            f"task {task_id} already has {waiting.bytes} bytes of messages waiting for its "
            f"next model call and takes at most {QUEUED_MESSAGE_BYTES} at once; send this one "
            "once it has taken them",
        )
    return None


class Refusals:
    """Signalled messages beyond the bounds: a Signal cannot be refused, so its handler
    notes the refusal and the loop logs it as an `error` event (kind `message_refused`),
    which the sender sees in the task's log and stream. Bounded: the first REFUSALS_NAMED
    are named, the rest counted."""

    def __init__(self) -> None:
        self._named: list[str] = []
        self._more = 0

    def note(self, message_id: str, sentence: str) -> None:
        if len(self._named) < REFUSALS_NAMED:
            self._named.append(f"message {message_id} was not taken: {sentence}")
        else:
            self._more += 1

    def events(self, step: int) -> list[ErrorEvent]:
        """The `error` events of the refusals noted since the last call."""
        made = [draft(ErrorEvent, step, kind="message_refused", message=m) for m in self._named]
        if self._more:
            more = f"{self._more} more messages were not taken: too many were waiting"
            made.append(draft(ErrorEvent, step, kind="message_refused", message=more))
        self._named, self._more = [], 0
        return made

    def __bool__(self) -> bool:
        return bool(self._named or self._more)


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
