"""The task routes: start, list, read, decide, resume, cancel, and follow a task."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import BaseModel, Field, computed_field, field_validator
from sse_starlette import EventSourceResponse, ServerSentEvent
from temporalio.service import RPCError

from waystation.client.agent_runtime import AgentRuntime, TaskHandle, TaskNotFoundError, TaskSummary
from waystation.client.starting import default_model
from waystation.client.task_errors import NoWorkerError, TaskStuckError
from waystation.client.task_list import task_tenant, with_latest_activity
from waystation.client.task_tree import TaskTree
from waystation.client.tree_stream import (
    CURSOR_CHARS,
    CURSOR_PATTERN,
    InvalidCursorError,
    parse_cursor,
)
from waystation.servers.api.auth import Approver, Caller, OwnedTaskId, Reader, Runtime
from waystation.servers.api.errors import ApiError
from waystation.servers.api.paging import decode_page_token, encode_page_token
from waystation.servers.api.paths import TASK
from waystation.servers.usage import TaskUsage
from waystation.vocabulary import StatusFilter, TaskStatus
from waystation.workflows.events import AgentEvent, AgentState, TaskStarted
from waystation.workflows.memory import with_namespace
from waystation.workflows.models import (
    ANSWER_CHARS,
    TASK_TEXT_CHARS,
    TENANT_PATTERN,
    AgentTask,
    Message,
    not_blank,
    not_too_deep,
)

# A tenant to list the tasks of (its form: no quote reaches the visibility query).
TenantQuery = Annotated[str | None, Query(pattern=TENANT_PATTERN)]

router = APIRouter(tags=["tasks"])

ANSWERS_KEPT = 10_000  # Idempotency-Key answers remembered per process
SSE_PING_SECONDS = 15.0


class Links(BaseModel):
    self: str
    events: str
    approve: str


class TaskCreated(BaseModel):
    id: str
    status: TaskStatus
    links: Links


class TaskPage(BaseModel):
    tasks: list[TaskSummary]
    next_page_token: str | None = None


class TaskView(BaseModel):
    id: str
    tenant: str | None = Field(
        default=None,
        description="Who the task is for (GET /tasks/{id}): its AgentTenant; null without one.",
    )
    state: AgentState
    tree: TaskTree | None = Field(
        default=None,
        description="The sub-agents below the task, nested, each with its own status, and "
        "the task that called it (GET /tasks/{id}).",
    )

    @computed_field(description="The task's tokens (state.usage) and its cache-hit ratio.")  # type: ignore[prop-decorator]
    @property
    def usage(self) -> TaskUsage:
        return TaskUsage.of(self.state.usage)


class ApprovalBody(BaseModel):
    request_id: str | None = Field(default=None, description="Default: the only pending one.")
    message: str | None = Field(default=None, max_length=10_000)
    arguments: dict[str, Any] | None = None
    shown: str | None = Field(
        default=None,
        max_length=64,
        description="The request's `digest` as the person was shown it: a request for any "
        "other call is refused (409 decision_mismatch).",
    )

    _arguments_not_too_deep = field_validator("arguments")(not_too_deep)


class ApprovalResult(BaseModel):
    """The decision that took effect, the same for every repeat of it."""

    task_id: str
    request_id: str
    decision: Literal["approve", "reject", "timeout"]
    approver: str | None
    message: str | None
    arguments: dict[str, Any] | None


class AnswerBody(BaseModel):
    request_id: str | None = Field(default=None, description="Default: the only pending one.")
    answer: str = Field(
        min_length=1,
        max_length=ANSWER_CHARS,
        description="The text, or one of the question's choices when it offers some.",
    )

    _answer_not_blank = field_validator("answer")(not_blank)


class AnswerResult(BaseModel):
    """The answer that took effect (the first one), the same for every repeat of it."""

    task_id: str
    request_id: str
    answer: str | None
    answerer: str | None
    timed_out: bool
    duplicate: bool = Field(description="An earlier answer took effect, not this one.")


class ResumeBody(BaseModel):
    max_steps: int | None = Field(default=None, ge=1, le=100_000)
    token_budget: int | None = Field(default=None, ge=1, le=10**12)
    cost_budget: float | None = Field(
        default=None, gt=0, le=10**9, description="US dollars: raise the task's cost_budget."
    )
    message: str | None = Field(
        default=None, min_length=1, max_length=100_000, description="Told to the model first."
    )


class ForkBody(BaseModel):
    at_seq: int = Field(
        ge=0, description="The event to fork after: the fork starts from the state just after it."
    )
    message: str | None = Field(
        default=None, min_length=1, max_length=100_000, description="A user message to add first."
    )
    max_steps: int | None = Field(default=None, ge=1, le=100_000)
    token_budget: int | None = Field(default=None, ge=1, le=10**12)
    cost_budget: float | None = Field(
        default=None, gt=0, le=10**9, description="US dollars: raise the task's cost_budget."
    )


class MessageBody(BaseModel):
    """A message to a task: a steer while it works, a follow-up once it has answered."""

    content: str = Field(min_length=1, max_length=TASK_TEXT_CHARS)
    interrupt: bool = Field(
        default=False,
        description="Cancel the model call in flight (its streamed text is void) and start "
        "the step again with this message; a tool call in flight is never interrupted.",
    )
    max_steps: int | None = Field(
        default=None, ge=1, le=100_000, description="The turn's max_steps from now on."
    )

    _content_not_blank = field_validator("content")(not_blank)


class MessageAccepted(BaseModel):
    """The message is kept durably; its `user_message` event carries its id once the task
    takes it (at its next model call)."""

    task_id: str
    message_id: str
    follow_up: bool = Field(description="The task had answered: the message began a new turn.")
    links: Links


class EventLogPage(BaseModel):
    events: list[AgentEvent]
    next_seq: int


def message_id_for(key: str) -> str:
    """The message id an Idempotency-Key stands for: a retried POST sends it once."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def task_id_for(key: str, tenant: str | None = None) -> str:
    """The task id an Idempotency-Key stands for: a retried POST finds the same task. A
    token bound to a tenant has keys of its own, so no key of its finds another's task."""
    scoped = key if tenant is None else f"{tenant}\0{key}"
    return "task-" + hashlib.sha256(scoped.encode()).hexdigest()[:20]


def links(task_id: str) -> Links:
    return Links(
        self=f"/tasks/{task_id}",
        events=f"/tasks/{task_id}/events",
        approve=f"/tasks/{task_id}/approve",
    )


def _answered(request: Request) -> OrderedDict[tuple[str, str], ApprovalResult]:
    answers: OrderedDict[tuple[str, str], ApprovalResult] = request.app.state.answered
    return answers


@router.post("/tasks", status_code=201, response_model=TaskCreated)
async def create_task(
    body: AgentTask,
    runtime: Runtime,
    who: Reader,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> TaskCreated:
    """Start a task. With an Idempotency-Key, a retried POST returns the same task."""
    if "model" not in body.model_fields_set:
        body = body.model_copy(update={"model": default_model(runtime.settings)})
    body = body.model_copy(update={"tenant": who.tenant_of(body.tenant)})
    body = with_namespace(runtime.with_defaults(body))  # the task as `run` will start it
    runtime.admit(body, who.role)  # before the Idempotency-Key's task is looked up
    task_id = task_id_for(idempotency_key, who.tenant) if idempotency_key else None
    if task_id is not None:
        try:
            handle: TaskHandle | None = await runtime.find(task_id)
        except TaskNotFoundError:
            handle = None
        if handle is not None:
            first = await handle.events(0, limit=1)
            if first and isinstance(first[0], TaskStarted) and first[0].task != body:
                raise ApiError(
                    409, "idempotency_conflict", "Idempotency-Key reused with a different task"
                )
            response.status_code = 200
            state = await handle.state()
            return TaskCreated(id=task_id, status=state.status, links=links(task_id))
    handle = await runtime.run(body, task_id=task_id, role=who.role)
    return TaskCreated(id=handle.id, status="running", links=links(handle.id))


@router.get("/tasks", response_model=TaskPage)
async def list_tasks(
    runtime: Runtime,
    who: Reader,
    status: StatusFilter | None = None,
    tenant: TenantQuery = None,
    page_size: Annotated[int, Query(ge=1, le=500)] = 50,
    page_token: Annotated[str | None, Query(max_length=4096)] = None,
) -> TaskPage:
    """Tasks, newest first, from Temporal's visibility (paginated), with when each last did
    something (a running one's latest history event, read from Temporal). `tenant` keeps
    that tenant's tasks; a token bound to a tenant lists its own only."""
    token = decode_page_token(page_token) if page_token else None
    tenant = who.listed_tenant(tenant)
    tasks, next_token = await runtime.list_tasks(status, page_size, token, tenant=tenant)
    tasks = await with_latest_activity(runtime.client, tasks)
    encoded = encode_page_token(next_token) if next_token else None
    return TaskPage(tasks=tasks, next_page_token=encoded)


async def _state_or_stuck(handle: TaskHandle) -> AgentState:
    """The state; a task that answers no query because it is stuck says so, and why."""
    try:
        return await handle.state()
    except (RPCError, NoWorkerError) as err:
        if (found := await handle.stuck()) is None:
            raise
        raise TaskStuckError(
            handle.id,
            f"task {handle.id} is stuck: its workflow task failed {found.attempts} times in a "
            f"row: {found.problem}; repair it with POST /tasks/{handle.id}/repair",
        ) from err


async def _decide(
    request: Request,
    task_id: str,
    body: ApprovalBody,
    reject: bool,
    runtime: AgentRuntime,
    who: Caller,
    key: str | None,
) -> ApprovalResult:
    answered = _answered(request)
    if key is not None and (task_id, key) in answered:
        return answered[(task_id, key)]
    handle = await runtime.find(task_id)
    decided = handle.approve(
        body.request_id,
        reject=reject,
        message=body.message,
        arguments=body.arguments,
        approver=who.name,  # from the token, never from the body
        shown=body.shown,
    )
    outcome = await decided
    result = ApprovalResult(
        task_id=task_id,
        request_id=outcome.request_id,
        decision=outcome.decision,
        approver=outcome.approver,
        message=outcome.message,
        arguments=outcome.arguments,
    )
    if key is not None:
        answered[(task_id, key)] = result
        while len(answered) > ANSWERS_KEPT:  # the latest keys; older repeats still get
            answered.popitem(last=False)  # the same outcome from the workflow itself
    return result


@router.post(f"/tasks/{TASK}/approve", response_model=ApprovalResult)
async def approve(
    request: Request,
    task_id: OwnedTaskId,
    runtime: Runtime,
    who: Approver,
    body: ApprovalBody | None = None,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> ApprovalResult:
    """Approve a pending tool call (the `decide` Update). Repeats get the same answer."""
    return await _decide(
        request, task_id, body or ApprovalBody(), False, runtime, who, idempotency_key
    )


@router.post(f"/tasks/{TASK}/reject", response_model=ApprovalResult)
async def reject(
    request: Request,
    task_id: OwnedTaskId,
    runtime: Runtime,
    who: Approver,
    body: ApprovalBody | None = None,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> ApprovalResult:
    """Reject a pending tool call; the message reaches the model."""
    return await _decide(
        request, task_id, body or ApprovalBody(), True, runtime, who, idempotency_key
    )


@router.get(f"/tasks/{TASK}/messages", response_model=list[Message])
async def queued_messages(task_id: OwnedTaskId, runtime: Runtime, who: Reader) -> list[Message]:
    """Messages the task has received and not yet taken (at its next model call)."""
    handle = await runtime.find(task_id)
    return await handle.queued_messages()


@router.post(f"/tasks/{TASK}/messages", status_code=202, response_model=MessageAccepted)
async def send_message(
    task_id: OwnedTaskId,
    body: MessageBody,
    runtime: Runtime,
    who: Approver,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> MessageAccepted:
    """Send the task a message. While it works, the message reaches the model at its next
    call (after the step's tool calls); once it has answered, the same task goes on with it
    (same id, same event log, offsets going on). 409 for a failed task (resume it) or a
    cancelled one (fork it). With an Idempotency-Key a retried POST sends it once."""
    message = Message(
        content=body.content,
        message_id=message_id_for(idempotency_key) if idempotency_key else None,
        interrupt=body.interrupt,
        max_steps=body.max_steps,
        sender=who.name,
    )
    handle = runtime.get(task_id)
    await handle.send(
        message.content,
        interrupt=message.interrupt,
        max_steps=message.max_steps,
        sender=message.sender,
        message_id=message.message_id,
    )
    return MessageAccepted(
        task_id=task_id,
        message_id=handle.awaited_message or "",
        follow_up=handle.began_turn,
        links=links(task_id),
    )


@router.post(f"/tasks/{TASK}/answer", response_model=AnswerResult)
async def answer(
    task_id: OwnedTaskId, body: AnswerBody, runtime: Runtime, who: Approver
) -> AnswerResult:
    """Answer a question the model asked (the `ask_person` tool); the answer, and who gave
    it, is the call's observation. The first answer wins: a later one gets it back. An
    answer that is not one of the question's choices is refused (422) with the list."""
    handle = await runtime.find(task_id)
    outcome = await handle.answer(body.answer, body.request_id, answerer=who.name)
    return AnswerResult(
        task_id=task_id,
        request_id=outcome.request_id,
        answer=outcome.answer,
        answerer=outcome.answerer,
        timed_out=outcome.timed_out,
        duplicate=outcome.duplicate,
    )


@router.post(f"/tasks/{TASK}/resume", response_model=TaskView)
async def resume(
    task_id: OwnedTaskId, runtime: Runtime, who: Approver, body: ResumeBody | None = None
) -> TaskView:
    """Resume a failed task from its last good point, limits raised if given."""
    body = body or ResumeBody()
    handle = await runtime.resume(
        task_id,
        max_steps=body.max_steps,
        token_budget=body.token_budget,
        cost_budget=body.cost_budget,
        message=body.message,
    )
    return TaskView(id=task_id, state=await handle.state())


@router.post(f"/tasks/{TASK}/repair", response_model=TaskView)
async def repair(task_id: OwnedTaskId, runtime: Runtime, who: Approver) -> TaskView:
    """Reset a stuck task to its last good workflow task (signals and Updates re-applied)."""
    handle = await runtime.repair(task_id, by=who.name)
    return TaskView(id=task_id, state=await handle.state())


@router.post(f"/tasks/{TASK}/fork", status_code=201, response_model=TaskCreated)
async def fork(task_id: OwnedTaskId, body: ForkBody, runtime: Runtime, who: Reader) -> TaskCreated:
    """A new task from the state just after event `at_seq`; the original is untouched."""
    await runtime.find(task_id)
    handle = await runtime.fork(
        task_id,
        body.at_seq,
        message=body.message,
        max_steps=body.max_steps,
        token_budget=body.token_budget,
        cost_budget=body.cost_budget,
        role=who.role,
    )
    return TaskCreated(id=handle.id, status="running", links=links(handle.id))


@router.post(f"/tasks/{TASK}/cancel", status_code=202, response_model=TaskView)
async def cancel(task_id: OwnedTaskId, runtime: Runtime, who: Approver) -> TaskView:
    """Request cancellation: the running call is cancelled, a `cancelled` event follows.
    A task that has already ended is a 409 `task_ended`."""
    handle = await runtime.find(task_id)
    await handle.cancel()
    return TaskView(id=task_id, state=await handle.state())


@router.get(f"/tasks/{TASK}/log", response_model=EventLogPage)
async def event_log(
    task_id: OwnedTaskId,
    runtime: Runtime,
    who: Reader,
    since: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> EventLogPage:
    """Plain JSON pages of the event log, by seq, for clients that cannot do SSE."""
    handle = await runtime.find(task_id)
    events = await handle.events(since, limit=limit)
    return EventLogPage(events=events, next_seq=events[-1].seq + 1 if events else since)


@router.get(
    f"/tasks/{TASK}/events",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "SSE stream"}},
)
async def events(
    request: Request,
    task_id: OwnedTaskId,
    runtime: Runtime,
    who: Reader,
    since: Annotated[int | None, Query(ge=0)] = None,
    topics: Annotated[str | None, Query(pattern=r"^(events|tokens)(,(events|tokens))*$")] = None,
    follow: Annotated[
        bool, Query(description="Go on across the conversation's turns, past each answer.")
    ] = False,
    tree: Annotated[
        bool,
        Query(
            description="Include the sub-agents' items (and theirs), each marked with the "
            "task it comes from and its path."
        ),
    ] = False,
    # An id this stream sent: an offset (bounded like `since`, so both refuse a negative one
    # alike) or, on a tree's stream, a cursor.
    last_event_id: Annotated[
        str | None, Header(pattern=CURSOR_PATTERN, max_length=CURSOR_CHARS)
    ] = None,
) -> EventSourceResponse:
    """Server-Sent Events: `id` is the stream offset, `event` the item's type.

    Reconnect with `Last-Event-ID` (or `?since=`) to get exactly what was missed. The
    stream ends after the task's terminal event (an answer, a failure, a cancellation); with
    `?follow=true` it goes on across the conversation's turns and ends only when the task
    fails or is cancelled. Comments keep proxies from timing out.

    With `?tree=true` the task's sub-agents' items come too: each `data` is then
    `{task_id, path, offset, topic, data}` (`path` [] for the task's own items, `offset` the
    item's offset in its own task's stream), and `id` is a cursor that `Last-Event-ID`
    resumes in every stream of the tree (the plain offset while no sub-agent is open). The
    stream still ends with the task's own end; `?since=` counts the task's own offsets.
    """
    try:
        after = parse_cursor(last_event_id) if last_event_id is not None else None
    except InvalidCursorError as err:
        raise ApiError(422, "invalid_last_event_id", str(err)) from None
    # Unknown or unreadable (encrypted with a key this side lacks): an error, not a stream.
    await runtime.get(task_id).overview()
    wanted = topics.split(",") if topics else None

    async def items() -> AsyncIterator[ServerSentEvent]:
        if tree:
            cursor = after.text() if after is not None else None
            async for item in runtime.stream(
                task_id, since=since or 0, topics=wanted, follow=follow, tree=True, after=cursor
            ):
                yield ServerSentEvent(
                    data=item.model_dump_json(exclude={"cursor"}),
                    event=item.data.type,
                    id=item.cursor,
                )
            return
        start = after.root_next if after is not None else since or 0
        async for plain in runtime.stream(task_id, since=start, topics=wanted, follow=follow):
            yield ServerSentEvent(
                data=plain.data.model_dump_json(), event=plain.data.type, id=str(plain.offset)
            )

    return EventSourceResponse(items(), ping=request.app.state.sse_ping_seconds)


@router.get(f"/tasks/{TASK}", response_model=TaskView)
async def get_task(task_id: OwnedTaskId, runtime: Runtime, who: Reader) -> TaskView:
    """The folded state (status, step, pending approvals, result, usage) and the task's
    tree: its sub-agents, nested, each with its own status, and the task that called it."""
    handle = await runtime.find(task_id)
    tenant = await task_tenant(runtime.client, task_id)
    state = await _state_or_stuck(handle)
    return TaskView(id=task_id, tenant=tenant, state=state, tree=await handle.tree(state))
