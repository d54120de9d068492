"""What the agent does next: a pure function of the folded state, the task and the run.

AgentWorkflow asks `next_move` at the top of every turn of its loop and carries the move
out (an activity, a wait, events); it never re-scans its log to decide. Everything here
is unit-tested without Temporal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from waystation.vocabulary import FailureKind
from waystation.workflows import request_kinds, requests
from waystation.workflows.conversation import compaction_range, context_limit
from waystation.workflows.events import AgentState
from waystation.workflows.messages import QueuedMessage
from waystation.workflows.models import AgentTask, ToolCall

# A run continues as new once its history passes this (as the workflow sees it, which
# runs about 0.6x of what describe reports), well before Temporal's own suggestion, so no
# run's history reaches 2 MB.
HISTORY_BYTES_PER_RUN = 1_000_000
# A step still open when a run hands over travels in the next run's input; a bigger one
# waits in this run instead (waiting adds next to nothing to its history).
OPEN_STEP_CARRY_BYTES = 16_000


@dataclass(frozen=True)
class RunProgress:
    """The run as the workflow last sampled it, at a point every replay samples alike."""

    first_step: int
    history_bytes: int = 0
    suggested: bool = False


@dataclass(frozen=True)
class Announce:
    """Append an action event for each of these calls of the open step."""

    step: int
    calls: list[ToolCall]


@dataclass(frozen=True)
class AskPeople:
    """Make requests of one kind (workflows/request_kinds.py) for these calls of the open
    step: approvals for calls that need one, the questions the calls put."""

    kind: str
    step: int
    calls: list[ToolCall]


@dataclass(frozen=True)
class AwaitPeople:
    """Wait for people: the request ids still waiting, by kind, until the earliest of
    their deadlines."""

    step: int
    waiting: dict[str, list[str]]
    deadline: datetime


@dataclass(frozen=True)
class RunCalls:
    step: int
    calls: list[ToolCall]


@dataclass(frozen=True)
class AddMessage:
    """Take the first waiting message into the conversation."""

    queued: QueuedMessage


@dataclass(frozen=True)
class Answered:
    """The turn has its answer and no message waits: the run ends with it."""


@dataclass(frozen=True)
class Compact:
    step: int
    start: int
    end: int


@dataclass(frozen=True)
class ListTools:
    """List the tools of these MCP servers (recorded in history) before the next call."""

    servers: list[str]


@dataclass(frozen=True)
class CallModel:
    step: int


@dataclass(frozen=True)
class Fail:
    kind: FailureKind
    reason: str


@dataclass(frozen=True)
class HandOver:
    """Continue as new: the next run starts from the state, with a bounded carry."""


Move = (
    Announce
    | AskPeople
    | AwaitPeople
    | RunCalls
    | AddMessage
    | Answered
    | Compact
    | ListTools
    | CallModel
    | Fail
    | HandOver
)


def context_budget(state: AgentState, task: AgentTask) -> int:
    """The tokens the conversation may take: the task's limit (or the model's window less
    room for the answer), lowered to what the endpoint took after a context-length error."""
    limit = context_limit(task.context_limit_tokens, task.model)
    cap = state.context_limit_cap
    return min(limit, cap) if cap else limit


def next_move(
    state: AgentState,
    task: AgentTask,
    *,
    limit: int,
    progress: RunProgress,
    messages: list[QueuedMessage] | None = None,
    unlisted: list[str] | None = None,
) -> Move:
    """The one thing to do next. `messages` wait to be taken into the conversation (a
    person's, a fork's or a resume's), in arrival order; `limit` the tokens the conversation
    may take; `unlisted` the MCP servers this run has yet to list (or list again: their tools
    changed)."""
    if state.status == "done" and not messages:
        return Answered()
    step = state.open_step
    if step is not None:
        if state.repeated_steps > task.max_repeated_calls:
            return Fail(FailureKind.REPEATED_CALLS, repeated_calls_reason(state, task))
        if todo := step.unannounced():
            return Announce(step.step, todo)
        for kind in request_kinds.KINDS:
            if ask := kind.to_ask(step, state):
                return AskPeople(kind.name, step.step, ask)
        waiting = {k.name: ids for k in request_kinds.KINDS if (ids := k.unresolved(step, state))}
        if waiting:
            first = min(
                requests.deadline(kind, state, waiting[kind.name], kind.settings(task))
                for kind in request_kinds.KINDS
                if kind.name in waiting
            )
            return AwaitPeople(step.step, waiting, first)
        if step.timed_out and task.approval.on_timeout == "fail":
            return Fail(
                FailureKind.APPROVAL_TIMEOUT,
                f"no approval decision within {task.approval.timeout_seconds:g} s; resume to "
                "go on without the calls nobody approved",
            )
        return RunCalls(step.step, step.unobserved())
    if messages:
        return AddMessage(messages[0])
    if due_for_hand_over(state, task, progress):
        return HandOver()
    if state.step - state.turn_first_step >= task.max_steps:
        turn = f" in turn {state.turn}" if state.turn else ""
        return Fail(
            FailureKind.MAX_STEPS,
            f"reached max_steps={task.max_steps}{turn} without a final answer; every thought "
            "and observation so far is kept, resume with a higher max_steps to go on",
        )
    if task.output_schema is not None and state.output_rejections > task.output_retries:
        return Fail(
            FailureKind.INVALID_OUTPUT,
            f"the model gave {state.output_rejections} final answers that do not fit the "
            f"output schema (output_retries={task.output_retries}); every event is kept: "
            "resume with a message that tells it what to fix",
        )
    used = state.usage.total
    if task.token_budget is not None and used >= task.token_budget:
        return Fail(
            FailureKind.TOKEN_BUDGET,
            f"used {used} tokens of the token_budget of {task.token_budget}; resume with a "
            "higher budget to go on",
        )
    spent = state.usage.cost_usd
    if task.cost_budget is not None and spent is not None and spent >= task.cost_budget:
        return Fail(
            FailureKind.COST_BUDGET,
            f"spent ${spent:.4f} of the cost_budget of ${task.cost_budget:g}; every thought and "
            "observation so far is kept, resume with a higher budget to go on",
        )
    if (span := compaction_range(state.conversation, limit)) is not None:
        return Compact(state.step + 1, *span)
    if unlisted:
        return ListTools(unlisted)
    return CallModel(state.step + 1)


def repeated_calls_reason(state: AgentState, task: AgentTask) -> str:
    return (
        f"the model repeated an identical tool call in {state.repeated_steps} consecutive "
        f"steps (max_repeated_calls={task.max_repeated_calls}); every event is kept: resume "
        "with a message that tells it what to do differently"
    )


def due_for_hand_over(state: AgentState, task: AgentTask, progress: RunProgress) -> bool:
    """Whether this run should continue as new now (never before it made progress)."""
    if state.step == progress.first_step:
        return False
    if state.open_step is not None and open_step_size(state) > OPEN_STEP_CARRY_BYTES:
        return False
    if progress.suggested or progress.history_bytes > HISTORY_BYTES_PER_RUN:
        return True
    every = task.continue_as_new_after_steps
    return every is not None and state.step - progress.first_step >= every


def open_step_size(state: AgentState) -> int:
    # Without the digest, which runs recorded before it did not count: the same size, the
    # same decision to hand over, in a replay of those runs.
    pending = sum(
        len(p.model_dump_json(exclude={"digest"})) for p in state.pending_approvals.values()
    )
    step = state.open_step
    return pending + (len(step.model_dump_json()) if step is not None else 0)
