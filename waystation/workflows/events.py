"""The event log and its fold: every step appends events, state is reduce(apply, events).

Pure functions and models only: no I/O, no clock (events carry `at` from the workflow's
deterministic clock). The state is what drives the loop (see workflows/plan.py) and what a
run hands the next, so everything in it is bounded whatever the task's length.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from functools import reduce
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, TypeAdapter

from waystation.prices import ModelPrice
from waystation.vocabulary import (
    TERMINAL_STATUSES,
    QuotaLimitKind,
    TaskStatus,
    TerminalStatus,
)
from waystation.workflows.conversation import (
    MessageRef,
    assistant_message,
    message_digest,
    ref_of,
    summary_message,
    task_messages,
    tool_message,
)
from waystation.workflows.memory import RecalledItem, recalled_prompt
from waystation.workflows.models import (
    FINAL_ANSWER_TOOL,
    AgentTask,
    AnswerOutcome,
    ChatMessage,
    Contract,
    DecisionOutcome,
    LlmResult,
    ReasoningItem,
    RecordedFailureKind,
    ToolCall,
    Usage,
)

STEP_USAGE_KEPT = 20  # per-step usage of the latest steps; the total covers all of them
DECISIONS_KEPT = 50  # decisions of closed steps kept to answer repeats with the first outcome
ANSWERS_KEPT = 50  # the same for answers to questions
ERRORS_KEPT = 20
REJECTED_CALLS_KEPT = 20
RESULT_EXCERPT_CHARS = 500  # of each output of the recent steps, for the repeated-call note
# A call identical to one of the latest steps is a repeat: this catches a model that
# alternates between a few calls (A, B, A, B), not only one that repeats the last.
REPEAT_WINDOW_STEPS = 3
MESSAGE_IDS_KEPT = 200
CHILDREN_KEPT = 50  # sub-agents of the latest calls, shown as the task's tree


class EventBase(Contract):
    seq: int = Field(ge=0, description="Position in the task's log: 0, 1, 2, ... without gaps.")
    step: int = Field(ge=0, description="The LLM step this event belongs to (0 before the first).")
    at: datetime
    history_length: int = Field(
        default=0, description="Temporal history length when the event was appended."
    )


class TaskStarted(EventBase):
    type: Literal["task_started"] = "task_started"
    task_id: str
    task: AgentTask


class MemoryRecalled(EventBase):
    """The items of the task's memory loaded into its system prompt at its start
    (`AgentTask.recall`), or why none could be."""

    type: Literal["memory_recalled"] = "memory_recalled"
    namespace: str
    query: str
    items: list[RecalledItem] = Field(default_factory=list)
    problem: str | None = Field(default=None, description="Why the memory could not be read.")


class Thought(EventBase):
    """The model's message for a step: the authoritative text, whatever tokens streamed."""

    type: Literal["thought"] = "thought"
    content: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    model: str = ""
    attempt: int = 1
    calls_from_text: bool = Field(
        default=False, description="The tool calls were recovered from the model's text."
    )
    reasoning: list[ReasoningItem] = Field(
        default_factory=list,
        description="The provider's reasoning items or thinking blocks, sent back with the "
        "message on the next call to the same model.",
    )


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
    usage: Usage | None = Field(
        default=None, description="A sub-agent's answer: the tokens its tree used."
    )
    agent_status: TerminalStatus | None = None


class AgentStarted(EventBase):
    """A call of a sub-agent started its child task (`child_id`, its own log and stream)."""

    type: Literal["agent_started"] = "agent_started"
    call_id: str
    agent: str
    child_id: str


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
    decision_id: str | None = None


class QuestionAsked(EventBase):
    """The model asked the person a question (the `ask_person` tool): the task waits."""

    type: Literal["question_asked"] = "question_asked"
    request_id: str
    call_id: str
    question: str
    choices: list[str] | None = None
    details: str | None = None


class QuestionAnswered(EventBase):
    """A question got its answer (the first one), or nobody answered in time."""

    type: Literal["question_answered"] = "question_answered"
    request_id: str
    answer: str | None = None
    answerer: str | None = None
    timed_out: bool = False
    via: Literal["update", "signal", "timeout"] = "update"
    answer_id: str | None = None


class ErrorEvent(EventBase):
    """Something went wrong that the task survived (a note, not an ending)."""

    type: Literal["error"] = "error"
    kind: str
    message: str
    context_limit: int | None = Field(
        default=None, description="With kind context_length_exceeded: the tokens that fit."
    )


class Resumed(EventBase):
    """A failed task was reset to its last good point and goes on (limits maybe raised)."""

    type: Literal["resumed"] = "resumed"
    failure: str | None = None
    failure_kind: RecordedFailureKind | None = None
    max_steps: int | None = None
    token_budget: int | None = None
    cost_budget: float | None = None


class Repaired(EventBase):
    """A task whose workflow task kept failing was reset to its last good workflow task."""

    type: Literal["repaired"] = "repaired"
    problem: str
    reset_to_event: int = Field(description="The history event the task was reset to.")
    by: str = Field(description="Who repaired it: a person's command or the worker.")


MessageVia = Literal["fork", "resume", "update", "signal"]


class UserMessage(EventBase):
    """A person's message taken into the conversation: a follow-up after an answer (it
    begins a new turn), a steer while the task works, a fork's or a resume's."""

    type: Literal["user_message"] = "user_message"
    content: str
    message_id: str | None = None
    sender: str | None = None
    via: MessageVia | None = None
    turn: int = Field(default=0, description="The turn it belongs to: 0 is the task's own.")
    max_steps: int | None = Field(default=None, description="The turn's max_steps from now on.")
    interrupted: bool = Field(
        default=False, description="It cancelled the model call in flight (see `interrupted`)."
    )


class Interrupted(EventBase):
    """A message cancelled the model call of `interrupted_step`: the text its attempts up to
    `attempt` streamed is void, and the step starts again with the message."""

    type: Literal["interrupted"] = "interrupted"
    interrupted_step: int
    attempt: int
    message_id: str | None = None


class ContextCompacted(EventBase):
    """Messages [start, end) of the conversation were replaced by a summary."""

    type: Literal["context_compacted"] = "context_compacted"
    summary: str
    start: int
    end: int
    usage: Usage = Field(default_factory=Usage)


class Done(EventBase):
    """The answer of a turn (the task's own, turn 0, or a follow-up's)."""

    type: Literal["done"] = "done"
    result: str
    turn: int = 0
    usage: Usage | None = Field(default=None, description="The task's usage so far.")
    output: Any | None = Field(
        default=None, description="With an output_schema: the answer as data, validated."
    )


class OutputRejected(EventBase):
    """A final answer that does not fit the output schema: the model is told why (in the
    conversation) and asked again."""

    type: Literal["output_rejected"] = "output_rejected"
    problem: str
    message: str = Field(description="What the model is told.")


class WaitingWorker(EventBase):
    """The worker that took the step's model call lacks what the task needs (a tool, a
    sub-agent, a model endpoint): the task waits for a worker that has it."""

    type: Literal["waiting_worker"] = "waiting_worker"
    missing: list[str] = Field(description="What the worker lacked, by name.")
    message: str


class WorkerFound(EventBase):
    """A worker that has what the task needs took it up: the step goes on."""

    type: Literal["worker_found"] = "worker_found"
    worker: str | None = Field(
        default=None, description="The worker's identity (None: its call failed)."
    )


class WaitingQuota(EventBase):
    """The step's model call waits for its turn under a model endpoint's quota (it said so,
    signal `quota_notice`): the task shows `waiting_quota` until the call has its turn."""

    type: Literal["waiting_quota"] = "waiting_quota"
    quota: str = Field(description="The quota's key: ENDPOINT or ENDPOINT:MODEL.")
    limit: QuotaLimitKind | None = Field(
        default=None, description="The limit the call waits for (`paused`: a provider's pause)."
    )
    expected_seconds: float | None = Field(
        default=None, ge=0, description="How long the wait should last, as the call began it."
    )
    attempt: int = Field(description="The call's attempt that waits (as a thought's `attempt`).")


class QuotaGranted(EventBase):
    """The call that waited for its quota has its turn (or ended meanwhile): the wait is over."""

    type: Literal["quota_granted"] = "quota_granted"
    quota: str
    waited_seconds: float = Field(ge=0, description="How long the call waited.")


class ModelSwitched(EventBase):
    """The step's model kept failing with an outage past the task's fallback_after_seconds:
    the step goes on with the next model of its fallback_models (the next turn starts at
    the first model again)."""

    type: Literal["model_switched"] = "model_switched"
    from_model: str
    to_model: str
    reason: str = Field(description="The last failure of the model left, in one sentence.")
    reasoning_dropped: int = Field(
        default=0,
        description="Reasoning items of the conversation the new model's provider cannot "
        "be sent (another protocol or model): left out of its requests.",
    )


class Failed(EventBase):
    type: Literal["failed"] = "failed"
    kind: RecordedFailureKind = Field(description="A FailureKind.")
    reason: str


class Cancelled(EventBase):
    type: Literal["cancelled"] = "cancelled"
    reason: str = "cancelled by request"


AgentEvent = Annotated[
    TaskStarted
    | MemoryRecalled
    | Thought
    | Action
    | Observation
    | AgentStarted
    | ApprovalRequested
    | ApprovalResolved
    | QuestionAsked
    | QuestionAnswered
    | ErrorEvent
    | Resumed
    | Repaired
    | UserMessage
    | Interrupted
    | ContextCompacted
    | Done
    | OutputRejected
    | WaitingWorker
    | WorkerFound
    | WaitingQuota
    | QuotaGranted
    | ModelSwitched
    | Failed
    | Cancelled,
    Field(discriminator="type"),
]
agent_event_adapter: TypeAdapter[AgentEvent] = TypeAdapter(AgentEvent)
# The events that end a turn are named as the statuses they leave.
TERMINAL_EVENT_TYPES: frozenset[str] = TERMINAL_STATUSES

E = TypeVar("E", bound=EventBase)
_UNSTAMPED = datetime(1970, 1, 1, tzinfo=UTC)


def draft(event_type: type[E], step: int, /, **fields: Any) -> E:
    """An event as pure code decides it; the log stamps its seq and time when it is appended."""
    return event_type(seq=0, step=step, at=_UNSTAMPED, **fields)


def price_in(task: AgentTask, model: str) -> ModelPrice | None:
    """What `model` (as the task names it) costs by the prices the task was created with."""
    return (task.prices or {}).get(model)


def thought_of(step: int, result: LlmResult, price: ModelPrice | None) -> Thought:
    """The event of a model's answer, its usage priced at `price` (None: unpriced); its
    tool calls are kept as the model objects."""
    left_out = {"tool_calls", "stale_servers", "output", "output_problem", "worker", "usage"}
    fields = result.model_dump(exclude=left_out)
    usage = result.usage.priced(price)
    return draft(Thought, step, **fields, usage=usage, tool_calls=result.tool_calls)


def action_of(step: int, call: ToolCall) -> Action:
    """The event announcing a call; approval is asked only for a call that can run."""
    return draft(
        Action,
        step,
        call_id=call.call_id,
        tool=call.tool,
        arguments=call.arguments,
        raw_arguments=call.raw_arguments,
        needs_approval=call.needs_approval and call.runnable,
    )


def messages_of(event: AgentEvent) -> list[ChatMessage]:
    """The messages an event adds to the conversation (most add none)."""
    match event:
        case TaskStarted():
            return task_messages(event.task.system_prompt, event.task.task)
        case MemoryRecalled() if event.items:
            return [ChatMessage(role="system", content=recalled_prompt(event.items))]
        case Thought():
            return [assistant_message(event.content, event.tool_calls, event.reasoning)]
        case Observation():
            return [tool_message(event.call_id, event.output)]
        case UserMessage():
            return [ChatMessage(role="user", content=event.content)]
        case ContextCompacted():
            return [summary_message(event.summary)]
        case OutputRejected():
            return [ChatMessage(role="user", content=event.message)]
    return []


def request_digest(tool: str, arguments: dict[str, Any]) -> str:
    """What a person is shown of a call that asks for approval, its tool and arguments, as
    a digest: a decision names it to say which call it is for, and a call runs on an
    approval only when its own digest is the one the request showed."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{tool}\0{text}".encode()).hexdigest()


def call_signature(call: ToolCall) -> str:
    """Identical calls (same tool, same arguments) have the same signature."""
    arguments = (
        json.dumps(call.arguments, sort_keys=True, separators=(",", ":"))
        if call.arguments is not None
        else call.raw_arguments
    )
    return hashlib.sha256(f"{call.tool}\0{arguments}".encode()).hexdigest()[:16]


class PendingApproval(Contract):
    request_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    reason: str | None = None
    model_reason: str | None = None
    requested_at: datetime
    step: int
    digest: str | None = Field(
        default=None,
        description="The call as shown (tool and arguments), as a digest a decision may name "
        "in `shown` to be refused if the request is for anything else.",
    )

    @property
    def shown(self) -> str:
        """The digest of the call this request shows (a request carried from a run that
        did not record it is digested now, from the same fields)."""
        return self.digest or request_digest(self.tool, self.arguments)


class PendingQuestion(Contract):
    request_id: str
    call_id: str
    question: str
    choices: list[str] | None = None
    details: str | None = None
    requested_at: datetime
    step: int


class OpenStep(Contract):
    """The step whose tool calls have not all been observed yet."""

    step: int
    calls: list[ToolCall]
    model_reason: str | None = None
    announced: list[str] = Field(
        default_factory=list, description="call ids whose action event is in the log"
    )
    outputs: dict[str, str] = Field(
        default_factory=dict, description="call id -> the start of its observation"
    )
    timed_out: bool = Field(
        default=False, description="A request of this step waited past its deadline."
    )

    def unannounced(self) -> list[ToolCall]:
        return [c for c in self.calls if c.call_id not in self.announced]

    def unobserved(self) -> list[ToolCall]:
        return [c for c in self.calls if c.call_id not in self.outputs]


class ChildAgent(Contract):
    """A sub-agent a call of this task started, and how it is doing."""

    call_id: str
    agent: str
    task_id: str
    step: int
    status: Literal["running", TerminalStatus] = "running"


class RecentCall(Contract):
    step: int = Field(description="The latest step that made the call.")
    output: str = Field(description="The start of what the call gave when it ran.")
    ran_at: int | None = Field(
        default=None, description="The step whose run gave `output`, when it is not `step`."
    )

    @property
    def result_step(self) -> int:
        return self.step if self.ran_at is None else self.ran_at


class RejectedCall(Contract):
    step: int
    message: str | None = None


class QuotaWait(Contract):
    """What a task whose status is waiting_quota waits for: its model call's turn."""

    quota: str = Field(description="The quota's key: ENDPOINT or ENDPOINT:MODEL.")
    limit: QuotaLimitKind | None = None
    expected_seconds: float | None = Field(
        default=None, description="How long the wait should last, as it was last told."
    )
    step: int
    attempt: int
    since: datetime = Field(description="When the call began to wait.")


class AgentState(Contract):
    """The fold of a task's events: what drives the loop, and what queries and the API show."""

    task_id: str = ""
    status: TaskStatus = "pending"
    step: int = 0
    conversation: list[MessageRef] = Field(
        default_factory=list,
        description="The messages the model is sent, by reference (content in the events).",
    )
    open_step: OpenStep | None = None
    pending_approvals: dict[str, PendingApproval] = Field(default_factory=dict)
    decisions: dict[str, DecisionOutcome] = Field(default_factory=dict)
    pending_questions: dict[str, PendingQuestion] = Field(default_factory=dict)
    answers: dict[str, AnswerOutcome] = Field(
        default_factory=dict, description="Answers to the latest questions (and timeouts)."
    )
    result: str | None = None
    failure: str | None = None
    failure_kind: RecordedFailureKind | None = None
    errors: list[str] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    step_usage: dict[int, Usage] = Field(
        default_factory=dict, description="Usage of each of the latest steps."
    )
    last_seq: int = -1
    repeated_steps: int = Field(
        default=0, description="Consecutive steps that repeated an identical tool call."
    )
    recent_calls: dict[str, RecentCall] = Field(
        default_factory=dict,
        description="Signature -> each call of the latest closed steps (a repeat of one is "
        "answered with its result instead of being run again).",
    )
    rejected_calls: dict[str, RejectedCall] = Field(
        default_factory=dict, description="Signatures of calls a person rejected (latest)."
    )
    context_limit_cap: int | None = Field(
        default=None, description="Tokens the model's endpoint said it takes, when it said so."
    )
    turn: int = Field(default=0, description="Turns begun: 0 is the task's own, then follow-ups.")
    turn_first_step: int = Field(
        default=0, description="The step count when the turn began (max_steps is per turn)."
    )
    message_ids: list[str] = Field(
        default_factory=list,
        description="Ids of the latest messages taken: a repeated send of one counts once.",
    )
    interrupts: int = Field(
        default=0, description="Model calls of the next step that messages interrupted."
    )
    output_rejections: int = Field(
        default=0, description="Final answers of this turn that did not fit output_schema."
    )
    output: Any | None = Field(default=None, description="The last answer's data, if typed.")
    children: dict[str, ChildAgent] = Field(
        default_factory=dict, description="Sub-agents started by the latest calls, by call id."
    )
    missing: list[str] = Field(
        default_factory=list,
        description="With status waiting_worker: what the worker that took the task lacked.",
    )
    model: str | None = Field(
        default=None,
        description="The model the task's steps call since a fallback took over "
        "(model_switched); None: the task's own model. Each turn starts again at that one.",
    )
    quota_wait: QuotaWait | None = Field(
        default=None,
        description="With status waiting_quota: the quota the model call waits for, and since "
        "when.",
    )

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


Changes = dict[str, Any]


def _latest(mapping: dict[Any, Any], kept: int) -> dict[Any, Any]:
    return dict(list(mapping.items())[-kept:]) if len(mapping) > kept else mapping


def _task_started(state: AgentState, event: TaskStarted) -> Changes:
    messages = messages_of(event)
    return {
        "task_id": event.task_id,
        "status": "running",
        "conversation": [ref_of(m) for m in messages],
    }


def _memory_recalled(state: AgentState, event: MemoryRecalled) -> Changes:
    """The recalled items join the system prompt: right after it, before the task."""
    refs = [ref_of(m) for m in messages_of(event)]
    return {"conversation": [*state.conversation[:1], *refs, *state.conversation[1:]]}


def _thought(state: AgentState, event: Thought) -> Changes:
    recent = {k: v for k, v in state.step_usage.items() if k > event.step - STEP_USAGE_KEPT}
    repeats = any(call_signature(c) in state.recent_calls for c in event.tool_calls)
    changes: Changes = {
        "conversation": [*state.conversation, *(ref_of(m) for m in messages_of(event))],
        "usage": state.usage + event.usage,
        "step_usage": {**recent, event.step: event.usage},
        "repeated_steps": state.repeated_steps + 1 if repeats else 0,
        "open_step": None,
        "interrupts": 0,
    }
    if event.tool_calls:
        changes["open_step"] = OpenStep(
            step=event.step, calls=event.tool_calls, model_reason=event.content or None
        )
    return changes


def _action(state: AgentState, event: Action) -> Changes:
    step = state.open_step
    if step is None or event.call_id in step.announced:
        return {}
    return {"open_step": step.model_copy(update={"announced": [*step.announced, event.call_id]})}


def _observation(state: AgentState, event: Observation) -> Changes:
    changes: Changes = {
        "conversation": [*state.conversation, *(ref_of(m) for m in messages_of(event))]
    }
    if event.tool == FINAL_ANSWER_TOOL and event.is_error:
        changes["output_rejections"] = state.output_rejections + 1
    if event.usage is not None:
        changes["usage"] = state.usage + event.usage
    child = state.children.get(event.call_id)
    if child is not None and event.agent_status is not None:
        finished = child.model_copy(update={"status": event.agent_status})
        changes["children"] = {**state.children, event.call_id: finished}
    step = state.open_step
    if step is None or event.call_id not in {c.call_id for c in step.calls}:
        return changes
    outputs = {**step.outputs, event.call_id: event.output[:RESULT_EXCERPT_CHARS]}
    # By id, not by count: a history recorded before call ids were made unique may hold two
    # calls under one id, and its step must close all the same (one output then stands for
    # both), never wait for an observation no call can give.
    if any(c.call_id not in outputs for c in step.calls):
        changes["open_step"] = step.model_copy(update={"outputs": outputs})
        return changes
    # The step closes: remember what its calls gave, and forget decisions of long ago.
    changes["open_step"] = None
    recent = {
        k: v for k, v in state.recent_calls.items() if v.step > step.step - REPEAT_WINDOW_STEPS
    }
    for c in step.calls:
        signature = call_signature(c)
        # A repeat was answered with a note, not run (workflows/calls.py): what it gave is
        # still the first run's result, so a third repeat quotes that, not the note.
        earlier = state.recent_calls.get(signature)
        recent[signature] = (
            RecentCall(step=step.step, output=earlier.output, ran_at=earlier.result_step)
            if earlier is not None
            else RecentCall(step=step.step, output=outputs[c.call_id])
        )
    changes["recent_calls"] = recent
    changes["decisions"] = _latest(state.decisions, DECISIONS_KEPT)
    return changes


def _approval_requested(state: AgentState, event: ApprovalRequested) -> Changes:
    pending = PendingApproval(
        request_id=event.request_id,
        call_id=event.call_id,
        tool=event.tool,
        arguments=event.arguments,
        reason=event.reason,
        model_reason=event.model_reason,
        requested_at=event.at,
        step=event.step,
        digest=request_digest(event.tool, event.arguments),
    )
    approvals = {**state.pending_approvals, event.request_id: pending}
    return {
        "pending_approvals": approvals,
        "status": waiting_status(approvals, state.pending_questions),
    }


def _approval_resolved(state: AgentState, event: ApprovalResolved) -> Changes:
    request = state.pending_approvals.get(event.request_id)
    remaining = {k: v for k, v in state.pending_approvals.items() if k != event.request_id}
    outcome = DecisionOutcome(
        request_id=event.request_id,
        decision=event.decision,
        approver=event.approver,
        message=event.message,
        arguments=event.arguments,
        decision_id=event.decision_id,
        shown=request.shown if request is not None else None,
    )
    changes: Changes = {
        "pending_approvals": remaining,
        "decisions": {**state.decisions, event.request_id: outcome},
        "status": waiting_status(remaining, state.pending_questions),
    }
    if event.decision == "timeout" and state.open_step is not None:
        changes["open_step"] = state.open_step.model_copy(update={"timed_out": True})
    if event.decision == "reject" and request is not None:
        call = ToolCall(
            call_id=request.call_id,
            tool=request.tool,
            raw_arguments="",
            arguments=request.arguments,
        )
        rejected = {
            **state.rejected_calls,
            call_signature(call): RejectedCall(step=event.step, message=event.message),
        }
        changes["rejected_calls"] = _latest(rejected, REJECTED_CALLS_KEPT)
    return changes


def waiting_status(
    approvals: dict[str, PendingApproval], questions: dict[str, PendingQuestion]
) -> TaskStatus:
    """Whom a running task waits for: an approver first (a question and an approval of one
    step wait together), then whoever answers questions."""
    if approvals:
        return "waiting_approval"
    return "waiting_input" if questions else "running"


def _question_asked(state: AgentState, event: QuestionAsked) -> Changes:
    pending = PendingQuestion(
        request_id=event.request_id,
        call_id=event.call_id,
        question=event.question,
        choices=event.choices,
        details=event.details,
        requested_at=event.at,
        step=event.step,
    )
    questions = {**state.pending_questions, event.request_id: pending}
    return {
        "pending_questions": questions,
        "status": waiting_status(state.pending_approvals, questions),
    }


def _question_answered(state: AgentState, event: QuestionAnswered) -> Changes:
    remaining = {k: v for k, v in state.pending_questions.items() if k != event.request_id}
    outcome = AnswerOutcome(
        request_id=event.request_id,
        answer=event.answer,
        answerer=event.answerer,
        timed_out=event.timed_out,
        answer_id=event.answer_id,
    )
    return {
        "pending_questions": remaining,
        "answers": _latest({**state.answers, event.request_id: outcome}, ANSWERS_KEPT),
        "status": waiting_status(state.pending_approvals, remaining),
    }


def _error(state: AgentState, event: ErrorEvent) -> Changes:
    changes: Changes = {"errors": [*state.errors, f"{event.kind}: {event.message}"][-ERRORS_KEPT:]}
    if event.context_limit is not None:
        cap = state.context_limit_cap
        changes["context_limit_cap"] = min(cap, event.context_limit) if cap else event.context_limit
    return changes


def _resumed(state: AgentState, event: Resumed) -> Changes:
    # A task stopped for repeating itself, or for a request nobody decided, goes on: the
    # next repeat is counted afresh and the undecided calls are reported as not run.
    step = state.open_step
    return {
        "status": "running",
        "failure": None,
        "failure_kind": None,
        "result": None,
        "repeated_steps": 0,
        "output_rejections": 0,
        "open_step": step.model_copy(update={"timed_out": False}) if step else None,
        # A person said go on: the models that failed are worth trying again, first first.
        "model": None,
    }


def _context_compacted(state: AgentState, event: ContextCompacted) -> Changes:
    summary = [ref_of(m) for m in messages_of(event)]
    refs = state.conversation
    return {
        "conversation": [*refs[: event.start], *summary, *refs[event.end :]],
        "usage": state.usage + event.usage,
    }


def _user_message(state: AgentState, event: UserMessage) -> Changes:
    changes: Changes = {
        "conversation": [*state.conversation, *(ref_of(m) for m in messages_of(event))],
        "status": "running",
        "result": None,
        "repeated_steps": 0,
    }
    if event.turn > state.turn:
        changes["turn"] = event.turn
        changes["turn_first_step"] = state.step
        changes["output_rejections"] = 0
        changes["output"] = None
        # A person asked again: a call like one of the last turn's is theirs to have run.
        changes["recent_calls"] = {}
        changes["model"] = None  # a new turn tries the task's own model first
    if event.message_id is not None:
        changes["message_ids"] = [*state.message_ids, event.message_id][-MESSAGE_IDS_KEPT:]
    return changes


def _agent_started(state: AgentState, event: AgentStarted) -> Changes:
    child = ChildAgent(
        call_id=event.call_id, agent=event.agent, task_id=event.child_id, step=event.step
    )
    return {"children": _latest({**state.children, event.call_id: child}, CHILDREN_KEPT)}


def _interrupted(state: AgentState, event: Interrupted) -> Changes:
    return {"interrupts": state.interrupts + 1}


def _done(state: AgentState, event: Done) -> Changes:
    return {"status": "done", "result": event.result, "output": event.output}


def _output_rejected(state: AgentState, event: OutputRejected) -> Changes:
    return {
        "conversation": [*state.conversation, *(ref_of(m) for m in messages_of(event))],
        "output_rejections": state.output_rejections + 1,
    }


def _waiting_worker(state: AgentState, event: WaitingWorker) -> Changes:
    return {"status": "waiting_worker", "missing": event.missing}


def _worker_found(state: AgentState, event: WorkerFound) -> Changes:
    return {"status": "running", "missing": []}


def _waiting_quota(state: AgentState, event: WaitingQuota) -> Changes:
    earlier = state.quota_wait
    same_wait = earlier is not None and (earlier.step, earlier.attempt) == (
        event.step,
        event.attempt,
    )
    wait = QuotaWait(
        quota=event.quota,
        limit=event.limit,
        expected_seconds=event.expected_seconds,
        step=event.step,
        attempt=event.attempt,
        # A call told to wait for another limit still waits since it first did.
        since=earlier.since if earlier is not None and same_wait else event.at,
    )
    return {"status": "waiting_quota", "quota_wait": wait, "missing": []}


def _quota_granted(state: AgentState, event: QuotaGranted) -> Changes:
    return _quota_wait_over(state)


def _quota_wait_over(state: AgentState) -> Changes:
    """A call's wait for its quota ends with the call's turn, or with any end of the call."""
    if state.quota_wait is None and state.status != "waiting_quota":
        return {}
    changes: Changes = {"quota_wait": None}
    if state.status == "waiting_quota":
        changes["status"] = "running"
    return changes


def _model_switched(state: AgentState, event: ModelSwitched) -> Changes:
    return {"model": event.to_model}


def _failed(state: AgentState, event: Failed) -> Changes:
    return {"status": "failed", "failure": event.reason, "failure_kind": event.kind}


def _cancelled(state: AgentState, event: Cancelled) -> Changes:
    return {
        "status": "cancelled",
        "failure": event.reason,
        "pending_approvals": {},
        "pending_questions": {},
    }


def _nothing(state: AgentState, event: Any) -> Changes:
    return {}


# One rule per event type (tests/test_events.py checks that every type has one).
APPLY_RULES: dict[str, Callable[[AgentState, Any], Changes]] = {
    "task_started": _task_started,
    "memory_recalled": _memory_recalled,
    "thought": _thought,
    "action": _action,
    "observation": _observation,
    "approval_requested": _approval_requested,
    "approval_resolved": _approval_resolved,
    "question_asked": _question_asked,
    "question_answered": _question_answered,
    "error": _error,
    "resumed": _resumed,
    "repaired": _nothing,
    "user_message": _user_message,
    "interrupted": _interrupted,
    "agent_started": _agent_started,
    "context_compacted": _context_compacted,
    "done": _done,
    "output_rejected": _output_rejected,
    "waiting_worker": _waiting_worker,
    "worker_found": _worker_found,
    "waiting_quota": _waiting_quota,
    "quota_granted": _quota_granted,
    "model_switched": _model_switched,
    "failed": _failed,
    "cancelled": _cancelled,
}


def apply(state: AgentState, event: AgentEvent) -> AgentState:
    """Return the state after `event`. Pure: `state` is not modified."""
    if event.seq != state.last_seq + 1:
        raise ValueError(
            f"event seq {event.seq} does not follow {state.last_seq}: the log has a gap"
        )
    changes = APPLY_RULES[event.type](state, event)
    if event.type != "waiting_quota":
        # The loop closes a wait with quota_granted before whatever ends the call; a log
        # that lacks it still leaves the wait with the event after it (its status, if any).
        changes = {**_quota_wait_over(state), **changes}
    changes["last_seq"] = event.seq
    changes["step"] = max(state.step, event.step)
    # model_copy keeps any key it is given: a misspelled field would be state nobody reads.
    if unknown := changes.keys() - AgentState.model_fields.keys():
        raise ValueError(f"the {event.type} rule changes fields the state lacks: {sorted(unknown)}")
    return state.model_copy(update=changes)


def fold(events: Iterable[AgentEvent], initial: AgentState | None = None) -> AgentState:
    """The state a log describes: `reduce(apply, events)`."""
    return reduce(apply, events, initial if initial is not None else AgentState())


def conversation_of(events: list[AgentEvent], state: AgentState | None = None) -> list[ChatMessage]:
    """The messages the model is sent after `events` (their content is in the events)."""
    content = {message_digest(m): m for event in events for m in messages_of(event)}
    folded = state if state is not None else fold(events)
    return [content[ref.digest] for ref in folded.conversation]
