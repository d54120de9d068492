"""The event log and its fold: every step appends events, state is reduce(apply, events).

Pure functions and models only: no I/O, no clock (events carry `at` from workflow.now()).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from functools import reduce
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from workflows.context import SUMMARY_PREFIX
from workflows.models import (
    AgentTask,
    ChatMessage,
    Contract,
    DecisionOutcome,
    ToolCall,
    ToolCallRequest,
    Usage,
)

Status = Literal["pending", "running", "waiting_approval", "done", "failed", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"done", "failed", "cancelled"})
STEP_USAGE_KEPT = 100  # per-step usage of the latest steps; the total covers all of them


class EventBase(Contract):
    seq: int = Field(ge=0, description="Position in the task's log: 0, 1, 2, ... without gaps.")
    step: int = Field(ge=0, description="The LLM step this event belongs to (0 before the first).")
    at: datetime
    history_length: int = Field(
        default=0, description="Temporal history length when the event was appended (reset point)."
    )


class TaskStarted(EventBase):
    type: Literal["task_started"] = "task_started"
    task_id: str
    task: AgentTask


class Thought(EventBase):
    """The model's message for a step: the authoritative text, whatever tokens streamed."""

    type: Literal["thought"] = "thought"
    content: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    model: str = ""
    attempt: int = 1


class Action(EventBase):
    type: Literal["action"] = "action"
    call_id: str
    tool: str
    arguments: dict[str, Any] | None = None
    raw_arguments: str = ""
    needs_approval: bool = False


class Observation(EventBase):
    type: Literal["observation"] = "observation"
    call_id: str
    tool: str
    output: str
    is_error: bool = False


class ApprovalRequested(EventBase):
    type: Literal["approval_requested"] = "approval_requested"
    request_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    reason: str | None = Field(default=None, description="Why the policy asks for approval.")
    model_reason: str | None = Field(default=None, description="What the model said with the call.")


class ApprovalResolved(EventBase):
    type: Literal["approval_resolved"] = "approval_resolved"
    request_id: str
    decision: Literal["approve", "reject", "timeout"]
    approver: str | None = None
    message: str | None = None
    arguments: dict[str, Any] | None = None
    via: Literal["update", "signal", "timeout"] = "update"


class ErrorEvent(EventBase):
    """Something went wrong that the task survived (a note, not an ending)."""

    type: Literal["error"] = "error"
    kind: str
    message: str


class Resumed(EventBase):
    """A failed task was reset to its last good point and goes on (limits maybe raised)."""

    type: Literal["resumed"] = "resumed"
    failure: str | None = None
    failure_kind: str | None = None
    max_steps: int | None = None
    token_budget: int | None = None


class UserMessage(EventBase):
    """A message from the user added to the conversation (a fork's edited message)."""

    type: Literal["user_message"] = "user_message"
    content: str


class ContextCompacted(EventBase):
    """Messages [start, end) of the conversation were replaced by a summary."""

    type: Literal["context_compacted"] = "context_compacted"
    summary: str
    start: int
    end: int
    usage: Usage = Field(default_factory=Usage)


class Done(EventBase):
    type: Literal["done"] = "done"
    result: str


class Failed(EventBase):
    type: Literal["failed"] = "failed"
    kind: str
    reason: str


class Cancelled(EventBase):
    type: Literal["cancelled"] = "cancelled"
    reason: str = "cancelled by request"


AgentEvent = Annotated[
    TaskStarted
    | Thought
    | Action
    | Observation
    | ApprovalRequested
    | ApprovalResolved
    | ErrorEvent
    | Resumed
    | UserMessage
    | ContextCompacted
    | Done
    | Failed
    | Cancelled,
    Field(discriminator="type"),
]
agent_event_adapter: TypeAdapter[AgentEvent] = TypeAdapter(AgentEvent)
TERMINAL_EVENT_TYPES: frozenset[str] = frozenset({"done", "failed", "cancelled"})


class PendingApproval(Contract):
    request_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    reason: str | None = None
    model_reason: str | None = None
    requested_at: datetime
    step: int


class AgentState(Contract):
    """The fold of a task's events: what a query, the CLI and the API show."""

    task_id: str = ""
    status: Status = "pending"
    step: int = 0
    messages: list[ChatMessage] = Field(default_factory=list)
    pending_approvals: dict[str, PendingApproval] = Field(default_factory=dict)
    decisions: dict[str, DecisionOutcome] = Field(default_factory=dict)
    result: str | None = None
    failure: str | None = None
    failure_kind: str | None = None
    errors: list[str] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    step_usage: dict[int, Usage] = Field(
        default_factory=dict, description="Usage of each of the latest 100 steps."
    )
    last_seq: int = -1

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


def apply(state: AgentState, event: AgentEvent) -> AgentState:
    """Return the state after `event`. Pure: `state` is not modified."""
    if event.seq != state.last_seq + 1:
        raise ValueError(
            f"event seq {event.seq} does not follow {state.last_seq}: the log has a gap"
        )
    changes: dict[str, Any] = {"last_seq": event.seq, "step": max(state.step, event.step)}
    match event:
        case TaskStarted():
            changes.update(
                task_id=event.task_id,
                status="running",
                messages=[
                    ChatMessage(role="system", content=event.task.system_prompt),
                    ChatMessage(role="user", content=event.task.task),
                ],
            )
        case Thought():
            message = ChatMessage(
                role="assistant",
                content=event.content or None,
                tool_calls=[
                    ToolCallRequest(id=c.call_id, name=c.tool, arguments=c.raw_arguments)
                    for c in event.tool_calls
                ],
            )
            recent = {k: v for k, v in state.step_usage.items() if k > event.step - STEP_USAGE_KEPT}
            changes.update(
                messages=[*state.messages, message],
                usage=state.usage + event.usage,
                step_usage={**recent, event.step: event.usage},
            )
        case Observation():
            message = ChatMessage(role="tool", content=event.output, tool_call_id=event.call_id)
            changes["messages"] = [*state.messages, message]
        case ApprovalRequested():
            pending = PendingApproval(
                request_id=event.request_id,
                call_id=event.call_id,
                tool=event.tool,
                arguments=event.arguments,
                reason=event.reason,
                model_reason=event.model_reason,
                requested_at=event.at,
                step=event.step,
            )
            changes.update(
                pending_approvals={**state.pending_approvals, event.request_id: pending},
                status="waiting_approval",
            )
        case ApprovalResolved():
            remaining = {k: v for k, v in state.pending_approvals.items() if k != event.request_id}
            outcome = DecisionOutcome(
                request_id=event.request_id,
                decision=event.decision,
                approver=event.approver,
                message=event.message,
                arguments=event.arguments,
            )
            changes.update(
                pending_approvals=remaining,
                decisions={**state.decisions, event.request_id: outcome},
                status="waiting_approval" if remaining else "running",
            )
        case ErrorEvent():
            changes["errors"] = [*state.errors, f"{event.kind}: {event.message}"]
        case Resumed():
            changes.update(status="running", failure=None, failure_kind=None, result=None)
        case ContextCompacted():
            summary = ChatMessage(role="user", content=SUMMARY_PREFIX + event.summary)
            changes.update(
                messages=[*state.messages[: event.start], summary, *state.messages[event.end :]],
                usage=state.usage + event.usage,
            )
        case UserMessage():
            message = ChatMessage(role="user", content=event.content)
            changes.update(messages=[*state.messages, message], status="running", result=None)
        case Done():
            changes.update(status="done", result=event.result)
        case Failed():
            changes.update(status="failed", failure=event.reason, failure_kind=event.kind)
        case Cancelled():
            changes.update(status="cancelled", failure=event.reason, pending_approvals={})
        case Action():
            pass
    return state.model_copy(update=changes)


def fold(events: Iterable[AgentEvent], initial: AgentState | None = None) -> AgentState:
    """The state a log describes: `reduce(apply, events)`."""
    return reduce(apply, events, initial if initial is not None else AgentState())
