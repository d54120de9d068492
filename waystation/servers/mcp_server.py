"""waystation as an MCP server: any MCP client (an IDE, a desktop assistant, another agent)
starts durable tasks, follows them and decides their approvals.

    ws mcp                         # stdio, the caller is the local user (an approver)
    POST /mcp on the HTTP API      # streamable HTTP, the API's bearer tokens and roles

One place defines the tools (`build_mcp_server`); both transports serve it. Every tool is
a thin layer over AgentRuntime, like the HTTP API's routes.
"""

from __future__ import annotations

import asyncio
import getpass
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Literal, TypeVar

from fastapi import FastAPI
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field, ValidationError
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from temporalio.service import RPCError

from waystation.client.agent_runtime import AgentRuntime, DecisionError, TaskError, TaskHandle
from waystation.client.starting import default_model
from waystation.client.task_rights import TaskRefusedError
from waystation.servers.api.auth import Caller, identify
from waystation.servers.api.errors import ApiError, send_error
from waystation.servers.mcp_memory import add_memory_tools
from waystation.servers.usage import TaskUsage
from waystation.settings import Settings
from waystation.settings.commands import command
from waystation.settings.validation import validation_sentence
from waystation.vocabulary import TaskStatus
from waystation.workflows.events import AgentState

T = TypeVar("T")

QUERY_TIMEOUT_SECONDS = 10.0  # queries and Updates need a worker: never hang a client
UPDATE_TIMEOUT_SECONDS = 30.0  # a decision's queries, in all (TaskHandle.approve's `within`)
DECISION_BACKSTOP_SECONDS = 45.0  # and the signal between them, should Temporal not answer it
MAX_EVENTS = 1_000
CALLER_SCOPE_KEY = "waystation.caller"
MCP_PATH = "/mcp"
INSTRUCTIONS = (
    "Durable AI-agent tasks on Temporal. run_task starts one and returns its id; "
    "task_status shows its state and the tool calls waiting for approval; task_events "
    "pages through its event log; approve / reject decide a pending call; answer answers a "
    "question the agent asked; send_message "
    "follows up a task that answered (the same task goes on) or steers one that works; "
    "cancel stops it. The memory_* tools read and write the memory tasks keep across tasks."
)


class TaskRef(BaseModel):
    task_id: str
    status: TaskStatus | Literal["cancelling"] = Field(
        description="cancelling: cancel asked it to stop (task_status says when it has)."
    )


class PendingApprovalView(BaseModel):
    request_id: str
    tool: str
    arguments: dict[str, Any]
    reason: str | None = None


class PendingQuestionView(BaseModel):
    request_id: str
    question: str
    choices: list[str] | None = None
    details: str | None = None


class TaskStatusView(BaseModel):
    task_id: str
    status: TaskStatus
    step: int
    result: str | None = None
    failure: str | None = None
    pending_approvals: list[PendingApprovalView] = Field(default_factory=list)
    pending_questions: list[PendingQuestionView] = Field(default_factory=list)
    usage: TaskUsage


class AnswerView(BaseModel):
    task_id: str
    request_id: str
    answer: str | None
    answerer: str | None = None
    duplicate: bool = False


class EventPage(BaseModel):
    events: list[dict[str, Any]] = Field(description="AgentEvent objects, oldest first.")
    next_seq: int = Field(description="Pass as `since` to read on.")


class MessageView(BaseModel):
    task_id: str
    message_id: str
    follow_up: bool = Field(description="The task had answered: the message began a new turn.")


class DecisionView(BaseModel):
    task_id: str
    request_id: str
    decision: Literal["approve", "reject", "timeout"]
    approver: str | None = None
    message: str | None = None
    duplicate: bool = False


CallerOf = Callable[[Context], Caller]


def local_caller() -> Caller:
    """Who decides over stdio: the user who started the server (it is their process)."""
    try:
        return Caller(name=f"{getpass.getuser()}@mcp", role="approver")
    except (KeyError, OSError):
        return Caller(name="mcp", role="approver")


def http_caller(ctx: Context) -> Caller:
    """Who decides over HTTP: the caller the bearer guard put in the request's scope."""
    request = ctx.request_context.request
    caller = getattr(request, "scope", {}).get(CALLER_SCOPE_KEY)
    if not isinstance(caller, Caller):
        raise ToolError("unauthenticated request")  # the guard lets none through
    return caller


async def _within(seconds: float, work: Awaitable[T], what: str) -> T:
    try:
        return await asyncio.wait_for(work, seconds)
    except TimeoutError:
        raise ToolError(
            f"no worker answered {what} within {seconds:g} s; is one running ({command('worker')})?"
        ) from None


def _status_view(task_id: str, state: AgentState) -> TaskStatusView:
    return TaskStatusView(
        task_id=task_id,
        status=state.status,
        step=state.step,
        result=state.result,
        failure=state.failure,
        pending_approvals=[
            PendingApprovalView(
                request_id=p.request_id, tool=p.tool, arguments=p.arguments, reason=p.reason
            )
            for p in state.pending_approvals.values()
        ],
        pending_questions=[
            PendingQuestionView(
                request_id=q.request_id, question=q.question, choices=q.choices, details=q.details
            )
            for q in state.pending_questions.values()
        ],
        usage=TaskUsage.of(state.usage),
    )


class WaystationTools:
    """The tools, one method each, over AgentRuntime. `caller_of` names who calls; readers
    may start and read tasks, approvers may also decide and cancel."""

    def __init__(self, runtime_of: Callable[[], AgentRuntime], caller_of: CallerOf) -> None:
        self._runtime_of = runtime_of
        self._caller_of = caller_of

    async def run_task(
        self,
        task: str,
        ctx: Context,
        model: str | None = None,
        tools: list[str] | None = None,
        max_steps: int | None = None,
        task_id: str | None = None,
        tenant: str | None = None,
    ) -> TaskRef:
        """Start an agent task. With `task_id`, a repeated call returns the same task (a
        token bound to a tenant gets the id `TENANT:task_id`). `tenant`: who the task is
        for (a token bound to a tenant starts that tenant's only)."""
        who = self._caller_of(ctx)
        runtime = self._runtime_of()
        try:
            tenant = who.tenant_of(tenant)
        except TaskRefusedError as err:
            raise ToolError(str(err)) from None
        fields: dict[str, Any] = {"model": default_model(runtime.settings, model)}
        if tenant is not None:
            fields["tenant"] = tenant
        if tools is not None:
            fields["tools"] = tools
        if max_steps is not None:
            fields["max_steps"] = max_steps
        try:
            agent_task = runtime.new_task(task, **fields)
        except ValidationError as err:
            raise ToolError(f"invalid task: {validation_sentence(err, 'task')}") from None
        if task_id is not None and who.tenant is not None:
            # A bound token's ids are its tenant's own (no tenant's name holds a colon), so
            # a repeated call never finds another tenant's task.
            task_id = f"{who.tenant}:{task_id}"
        handle = await _guarded(runtime.run(agent_task, task_id=task_id, role=who.role))
        if task_id is not None:
            await _guarded(who.check_owns(runtime, handle.id))  # an id taken by an unbound token
        return TaskRef(task_id=handle.id, status="running")

    async def task_status(self, task_id: str, ctx: Context) -> TaskStatusView:
        """A task's state: status, step, result or failure, and pending approval requests."""
        handle = await self._owned(ctx, task_id)
        state = await _within(QUERY_TIMEOUT_SECONDS, _guarded(handle.state()), "the state query")
        return _status_view(task_id, state)

    async def task_events(
        self, task_id: str, ctx: Context, since: int = 0, limit: int = 200
    ) -> EventPage:
        """The task's event log from seq `since` (at most `limit` events)."""
        if since < 0 or not 1 <= limit <= MAX_EVENTS:
            raise ToolError(f"since must be 0 or more and limit 1..{MAX_EVENTS}")
        handle = await self._owned(ctx, task_id)
        events = await _within(QUERY_TIMEOUT_SECONDS, _guarded(handle.events(since)), "a query")
        page = [event.model_dump(mode="json") for event in events[:limit]]
        return EventPage(events=page, next_seq=since + len(page))

    async def approve(
        self,
        task_id: str,
        ctx: Context,
        request_id: str | None = None,
        message: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> DecisionView:
        """Approve a pending tool call (the only one if no request_id), maybe with edited
        arguments. A repeat returns the first outcome."""
        return await self._decide(ctx, task_id, request_id, False, message, arguments)

    async def reject(
        self, task_id: str, ctx: Context, request_id: str | None = None, message: str | None = None
    ) -> DecisionView:
        """Reject a pending tool call; `message` tells the model why."""
        return await self._decide(ctx, task_id, request_id, True, message)

    async def answer(
        self, task_id: str, answer: str, ctx: Context, request_id: str | None = None
    ) -> AnswerView:
        """Answer a question the agent asked (the only pending one if no request_id); with
        choices, the answer must be one of them. The first answer wins: a repeat gets it."""
        who = self._approver(ctx)
        handle = await self._owned(ctx, task_id)
        answered = handle.answer(
            answer, request_id, answerer=who.name, within=timedelta(seconds=UPDATE_TIMEOUT_SECONDS)
        )
        try:
            outcome = await _within(DECISION_BACKSTOP_SECONDS, _guarded(answered), "the answer")
        except ValidationError as err:
            raise ToolError(f"invalid answer: {validation_sentence(err, 'task')}") from None
        return AnswerView(
            task_id=task_id,
            request_id=outcome.request_id,
            answer=outcome.answer,
            answerer=outcome.answerer,
            duplicate=outcome.duplicate,
        )

    async def send_message(
        self,
        task_id: str,
        content: str,
        ctx: Context,
        interrupt: bool = False,
        max_steps: int | None = None,
        message_id: str | None = None,
    ) -> MessageView:
        """Send a task a message: once it has answered, the same task goes on with it (a
        follow-up); while it works, it reaches the model at its next call (with `interrupt`,
        the model call in flight is cancelled for it). Follow it with task_status or
        task_events. A repeat with the same message_id counts once."""
        who = self._approver(ctx)
        await self._owned(ctx, task_id)
        handle = self._runtime_of().get(task_id)
        sent = handle.send(
            content,
            interrupt=interrupt,
            max_steps=max_steps,
            sender=who.name,
            message_id=message_id,
        )
        try:
            await _guarded(sent)
        except ValidationError as err:
            raise ToolError(f"invalid message: {validation_sentence(err, 'task')}") from None
        return MessageView(
            task_id=task_id, message_id=handle.awaited_message or "", follow_up=handle.began_turn
        )

    async def cancel(self, task_id: str, ctx: Context) -> TaskRef:
        """Cancel a task: its running call is cancelled and a `cancelled` event ends it."""
        self._approver(ctx)
        handle = await self._owned(ctx, task_id)
        await _guarded(handle.cancel())
        return TaskRef(task_id=task_id, status="cancelling")

    async def _owned(self, ctx: Context, task_id: str) -> TaskHandle:
        """The task's handle, once the caller may see it: another tenant's task is refused
        as an unknown one is (a token bound to a tenant is not told it exists)."""
        who = self._caller_of(ctx)
        runtime = self._runtime_of()
        await _guarded(who.check_owns(runtime, task_id))
        return await _guarded(runtime.find(task_id))

    def _approver(self, ctx: Context) -> Caller:
        who = self._caller_of(ctx)
        if who.role != "approver":
            raise ToolError(
                f"{who.name} may read and start tasks, not decide, send messages or cancel"
            )
        return who

    async def _decide(
        self,
        ctx: Context,
        task_id: str,
        request_id: str | None,
        reject: bool,
        message: str | None,
        arguments: dict[str, Any] | None = None,
    ) -> DecisionView:
        who = self._approver(ctx)
        handle = await self._owned(ctx, task_id)
        decided = handle.approve(
            request_id,
            reject=reject,
            message=message,
            arguments=arguments,
            approver=who.name,
            within=timedelta(seconds=UPDATE_TIMEOUT_SECONDS),
        )
        outcome = await _within(DECISION_BACKSTOP_SECONDS, _guarded(decided), "the decision")
        return DecisionView(
            task_id=task_id,
            request_id=outcome.request_id,
            decision=outcome.decision,
            approver=outcome.approver,
            message=outcome.message,
            duplicate=outcome.duplicate,
        )


def build_mcp_server(runtime_of: Callable[[], AgentRuntime], caller_of: CallerOf) -> MCPServer:
    """The MCP server both transports serve: WaystationTools with their annotations."""
    # The SDK configures the root logger with this level when nothing else has yet.
    server = MCPServer(
        "waystation", version="0.1.0", instructions=INSTRUCTIONS, log_level="WARNING"
    )
    tools = WaystationTools(runtime_of, caller_of)
    read = ToolAnnotations(read_only_hint=True)
    decide = ToolAnnotations(destructive_hint=True, idempotent_hint=True)
    server.add_tool(tools.run_task, annotations=ToolAnnotations(destructive_hint=False))
    server.add_tool(tools.task_status, annotations=read)
    server.add_tool(tools.task_events, annotations=read)
    server.add_tool(tools.approve, annotations=decide)
    server.add_tool(
        tools.reject, annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True)
    )
    server.add_tool(tools.answer, annotations=ToolAnnotations(destructive_hint=False))
    server.add_tool(tools.send_message, annotations=ToolAnnotations(destructive_hint=False))
    server.add_tool(tools.cancel, annotations=decide)
    add_memory_tools(server, runtime_of, caller_of)
    return server


async def _guarded(work: Awaitable[T]) -> T:
    """The runtime's refusals as tool errors the client reads (never a protocol error)."""
    try:
        return await work
    except (TaskError, DecisionError, TaskRefusedError) as err:
        raise ToolError(str(err)) from None
    except RPCError as err:
        raise ToolError(f"Temporal answered: {err.message}") from None


async def serve_stdio(runtime: AgentRuntime) -> None:
    """Serve the tools on stdin/stdout until the client closes stdin."""
    caller = local_caller()
    server = build_mcp_server(lambda: runtime, lambda ctx: caller)
    await server.run_stdio_async()


def mount_http(app: FastAPI, settings: Settings) -> StreamableHTTPSessionManager:
    """Serve the tools at MCP_PATH on the API app, behind its bearer tokens.

    Returns the session manager, whose `run()` the app's lifespan must enter.
    """
    server = build_mcp_server(lambda: app.state.runtime, http_caller)
    # The app's own guards stand in front of every route, this one too: its Host and Origin
    # check (waystation/servers/api/hosts.py) and its body limit, with the API's error answers.
    server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=settings.api_max_body_bytes,
    )
    sessions = server.session_manager
    endpoint = BearerGuard(StreamableHTTPASGIApp(sessions), lambda: settings.api_tokens)
    app.router.routes.append(Route(MCP_PATH, endpoint=endpoint))
    return sessions


class BearerGuard:
    """The API's bearer tokens in front of the MCP endpoint: 401 without a known token."""

    def __init__(self, app: ASGIApp, tokens: Callable[[], Any]) -> None:
        self._app = app
        self._tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            try:
                scope[CALLER_SCOPE_KEY] = identify(self._tokens(), headers.get("authorization"))
            except ApiError as err:
                await send_error(send, err.status, err.error, err.detail)
                return
        await self._app(scope, receive, send)
