"""What a person answers: approvals and questions are two kinds of one request.

A kind (approval.APPROVALS, questions.QUESTIONS) supplies only what is its own: where the
state keeps its pending requests and outcomes, its own check of a response to a pending
request, and its events. Everything else is one rule for every kind, here:

- `problem`: why a response cannot take effect now, or None (the Update's validator, the
  client's check after a task has closed);
- `accept`: what the Update records and answers (a repeat gets the first outcome back);
- `absorb`: the event a recorded response makes when the loop takes it, KEEP to hold it
  until its request is made (a response may outrun the step that asks), or DROP for a
  waiting client's repeat;
- `timeout_events`: the requests nobody answered in time;
- `Inbox`: the responses handlers recorded, of every kind, and the early ones kept.

Handlers only record; the loop turns what they recorded into events at one fixed point of
each turn, kind after kind, each in arrival order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel

from waystation.workflows import errors
from waystation.workflows.events import AgentEvent, AgentState, ErrorEvent, OpenStep
from waystation.workflows.models import AgentTask, ToolCall

Via = Literal["update", "signal"]
KEEP: Final = "keep"  # absorb: hold the response until its request is made
DROP: Final = "drop"  # absorb: a client's repeat of the response that took effect


@dataclass(frozen=True)
class Problem:
    """Why a response cannot take effect: an error type of workflows/errors.py and a sentence."""

    kind: str
    message: str


class Response(Protocol):
    """What a person sends: a decision, an answer."""

    @property
    def request_id(self) -> str: ...


class Pending(Protocol):
    @property
    def requested_at(self) -> datetime: ...


class Timed(Protocol):
    @property
    def timeout_seconds(self) -> float: ...


R = TypeVar("R", bound=Response)  # the response
E = TypeVar("E")  # the response as a handler recorded it (carried from run to run)
Out = TypeVar("Out", bound=BaseModel)  # the outcome that took effect
P = TypeVar("P", bound=Pending)  # a pending request


class RequestKind(ABC, Generic[R, E, Out, P]):
    """One kind of request: what is its own. The rule for every kind is this module's."""

    name: str
    """The kind's name: the inbox keys on it (a replayer may load a module twice, so the
    kind's object is not the same in every run)."""
    early_kept: int
    """Responses recorded before their request is made that are kept (and carried)."""
    awaiting: str
    """What a task waits for, in a sentence: "approval", "an answer"."""
    noun: str
    """What one request is called: "request", "question"."""
    unknown_noun: str

    @abstractmethod
    def pending(self, state: AgentState) -> Mapping[str, P]: ...

    @abstractmethod
    def to_ask(self, step: OpenStep, state: AgentState) -> list[ToolCall]:
        """Calls of the open step that need a request of this kind not made yet."""

    @abstractmethod
    def unresolved(self, step: OpenStep, state: AgentState) -> list[str]:
        """Request ids of this kind in the open step still waiting for a person."""

    @abstractmethod
    def settings(self, task: AgentTask) -> Timed: ...

    @abstractmethod
    def response(self, entry: E) -> R: ...

    @abstractmethod
    def recorded(self, response: R, via: Via) -> E: ...

    @abstractmethod
    def outcome_of(self, state: AgentState, request_id: str, recorded: list[E]) -> Out | None:
        """The outcome that took effect: in the state, or recorded and not yet an event."""

    @abstractmethod
    def repeat_problem(self, response: R, existing: Out) -> Problem | None:
        """Why a response to a request already resolved is refused (None: it gets the first
        outcome back)."""

    @abstractmethod
    def check(self, response: R, pending: P) -> Problem | None:
        """The kind's own rule: why this response cannot resolve this pending request."""

    @abstractmethod
    def accepted(self, state: AgentState, response: R) -> Out:
        """What the Update answers for a response it just recorded."""

    @abstractmethod
    def on_resolved(self, state: AgentState, response: R, existing: Out) -> AgentEvent | None:
        """A recorded response for a request already resolved: an `error` event, or None for
        a waiting client's repeat (dropped)."""

    @abstractmethod
    def refused(self, state: AgentState, response: R, problem: Problem) -> ErrorEvent:
        """The `error` event of a recorded response that cannot take effect."""

    @abstractmethod
    def unknown(self, state: AgentState, response: R) -> ErrorEvent:
        """The `error` event of a recorded response whose request never came, past the
        early ones kept."""

    @abstractmethod
    def resolved(self, state: AgentState, entry: E, pending: P) -> AgentEvent: ...

    @abstractmethod
    def timed_out(self, state: AgentState, request_id: str, task: AgentTask) -> AgentEvent: ...

    @abstractmethod
    def request_events(
        self, step: int, calls: list[ToolCall], state: AgentState
    ) -> list[AgentEvent]: ...


AnyKind = RequestKind[Any, Any, Any, Any]


def problem(
    kind: RequestKind[R, E, Out, P], state: AgentState, response: R, recorded: list[E]
) -> Problem | None:
    """Why `response` cannot take effect now, or None (a response to a request already
    resolved may get the first outcome back: the kind says)."""
    request_id = response.request_id
    if (existing := kind.outcome_of(state, request_id, recorded)) is not None:
        return kind.repeat_problem(response, existing)
    pending = kind.pending(state)
    if (waiting := pending.get(request_id)) is not None:
        return kind.check(response, waiting)
    if state.finished or not pending:
        return not_waiting(kind, state, request_id)
    return Problem(
        errors.UNKNOWN_REQUEST,
        f"unknown {kind.unknown_noun} {request_id}; pending: " + ", ".join(pending),
    )


def not_waiting(kind: AnyKind, state: AgentState, request_id: str) -> Problem:
    """A response for a task that waits for no request of its kind (the rule's and a
    client's after the task closed)."""
    return Problem(
        errors.TASK_NOT_WAITING,
        f"task is {state.status}, not waiting for {kind.awaiting} ({kind.noun} {request_id})",
    )


def accept(
    kind: RequestKind[R, E, Out, P], state: AgentState, response: R, recorded: list[E]
) -> Out:
    """What the Update does once its validator let `response` through: record it, unless
    an outcome took effect already (then that one comes back, marked a duplicate)."""
    existing = kind.outcome_of(state, response.request_id, recorded)
    if existing is not None:
        return existing.model_copy(update={"duplicate": True})
    recorded.append(kind.recorded(response, "update"))
    return kind.accepted(state, response)


def absorb(
    kind: RequestKind[R, E, Out, P], state: AgentState, entry: E, early: int
) -> AgentEvent | Literal["keep", "drop"]:
    """The event a recorded response makes now; KEEP to hold it until its request comes
    (`early` responses already wait; past the kind's `early_kept` a new one is refused);
    DROP for a waiting client's repeat of the response that took effect."""
    response = kind.response(entry)
    request_id = response.request_id
    if (existing := kind.outcome_of(state, request_id, [])) is not None:
        made = kind.on_resolved(state, response, existing)
        return DROP if made is None else made
    pending = kind.pending(state).get(request_id)
    if pending is None:
        return KEEP if early < kind.early_kept else kind.unknown(state, response)
    if (refusal := kind.check(response, pending)) is not None:
        return kind.refused(state, response, refusal)
    return kind.resolved(state, entry, pending)


def deadline(
    kind: RequestKind[R, E, Out, P], state: AgentState, request_ids: list[str], settings: Timed
) -> datetime:
    """When the oldest of these requests stops waiting (a carried request keeps its time)."""
    first = min(kind.pending(state)[r].requested_at for r in request_ids)
    return first + timedelta(seconds=settings.timeout_seconds)


def timeout_events(
    kind: RequestKind[R, E, Out, P],
    state: AgentState,
    request_ids: list[str],
    now: datetime,
    task: AgentTask,
) -> list[AgentEvent]:
    """The requests among `request_ids` nobody answered within their time."""
    settings = kind.settings(task)
    return [
        kind.timed_out(state, request_id, task)
        for request_id in request_ids
        if request_id in kind.pending(state)
        and deadline(kind, state, [request_id], settings) <= now
    ]


class Inbox:
    """The responses handlers recorded, of every kind, not yet turned into events, and the
    early ones kept until their request is made. Carried from run to run, kind by kind."""

    def __init__(self, carried: Mapping[AnyKind, list[Any]]) -> None:
        self._kinds = list(carried)
        self._recorded: dict[str, list[Any]] = {k.name: list(v) for k, v in carried.items()}
        self._early: dict[str, list[Any]] = {k.name: [] for k in carried}

    def recorded(self, kind: RequestKind[R, E, Out, P]) -> list[E]:
        """The kind's recorded responses: handlers append to it."""
        return self._recorded[kind.name]

    def __bool__(self) -> bool:
        return any(self._recorded.values())

    def absorb(
        self, state_now: Callable[[], AgentState], append: Callable[[AgentEvent], None]
    ) -> None:
        """Turn what was recorded into events, kind after kind, in arrival order (each
        response reads the state its predecessors' events made)."""
        for kind in self._kinds:
            early = self._early[kind.name]
            taken, self._recorded[kind.name] = self._recorded[kind.name], []
            for entry in taken:
                made = absorb(kind, state_now(), entry, len(early))
                if made == KEEP:
                    early.append(entry)
                elif made != DROP and not isinstance(made, str):
                    append(made)

    def ask(
        self, kind: AnyKind, events: list[AgentEvent], append: Callable[[AgentEvent], None]
    ) -> None:
        """Make the kind's requests (`events`, made from the state before them); the
        responses that came before them are taken next."""
        for event in events:
            append(event)
        self._recorded[kind.name] = self._early[kind.name] + self._recorded[kind.name]
        self._early[kind.name] = []

    def time_out(
        self,
        waiting: Mapping[str, list[str]],
        state_now: Callable[[], AgentState],
        now: datetime,
        task: AgentTask,
        append: Callable[[AgentEvent], None],
    ) -> None:
        """The one timeout path: every kind's requests among `waiting` (by kind name) past
        their time."""
        for kind in self._kinds:
            requested = waiting.get(kind.name, [])
            for event in timeout_events(kind, state_now(), requested, now, task):
                append(event)

    def carried(self, kind: RequestKind[R, E, Out, P]) -> list[E]:
        """What the next run takes over: early responses first, then the rest recorded."""
        return self._early[kind.name] + self._recorded[kind.name]
