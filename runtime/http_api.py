"""The HTTP API: the REST face of AgentRuntime. Every endpoint is a thin layer over it.

    python starter.py api            # or: uvicorn runtime.http_api:app

Bearer tokens come from settings (`WAYSTATION_API_TOKENS`); with none configured the server
binds to localhost only and lets every local caller in as an approver named "local".
"""

import asyncio
import base64
import binascii
import hashlib
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, TypeVar

from cryptography.exceptions import InvalidTag
from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from google.protobuf import json_format
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse, ServerSentEvent
from temporalio.api.common.v1 import Payloads
from temporalio.service import RPCError

from runtime.agent_runtime import (
    AgentRuntime,
    DecisionError,
    TaskError,
    TaskHandle,
    TaskNotFoundError,
    TaskSummary,
)
from runtime.settings import ApiToken, Settings
from runtime.temporal import connect
from workflows import errors
from workflows.events import AgentEvent, AgentState, TaskStarted
from workflows.models import AgentTask, ModelSettings

SSE_PING_SECONDS = 15
ANSWERS_KEPT = 10_000  # Idempotency-Key answers remembered per process
PAGE_TOKEN_CHECK_BYTES = 8
# Queries and Updates need a worker; an API call must not hang when none answers.
QUERY_TIMEOUT_SECONDS = 10.0
UPDATE_TIMEOUT_SECONDS = 30.0

T = TypeVar("T")


async def within(seconds: float, work: Awaitable[T], what: str) -> T:
    try:
        return await asyncio.wait_for(work, seconds)
    except TimeoutError:
        raise ApiError(
            503,
            "no_worker",
            f"no worker answered {what} within {seconds:g} s; is one running (python worker.py)?",
        ) from None


class ErrorBody(BaseModel):
    """Every error answer: a machine-readable kind and a sentence for people."""

    error: str
    detail: str
    fields: list[dict[str, Any]] | None = None


class Links(BaseModel):
    self: str
    events: str
    approve: str


class TaskCreated(BaseModel):
    id: str
    status: str
    links: Links


class TaskPage(BaseModel):
    tasks: list[TaskSummary]
    next_page_token: str | None = None


class TaskView(BaseModel):
    id: str
    state: AgentState


class ApprovalBody(BaseModel):
    request_id: str | None = Field(default=None, description="Default: the only pending one.")
    message: str | None = Field(default=None, max_length=10_000)
    arguments: dict[str, Any] | None = None


class ApprovalResult(BaseModel):
    """The decision that took effect, the same for every repeat of it."""

    task_id: str
    request_id: str
    decision: Literal["approve", "reject", "timeout"]
    approver: str | None
    message: str | None
    arguments: dict[str, Any] | None


class ResumeBody(BaseModel):
    max_steps: int | None = Field(default=None, ge=1, le=100_000)
    token_budget: int | None = Field(default=None, ge=1, le=10**12)


class EventLogPage(BaseModel):
    events: list[AgentEvent]
    next_seq: int


class Caller(BaseModel):
    name: str
    role: Literal["reader", "approver"]


class ApiError(Exception):
    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 422, 503)
}


def _task_id_for(key: str) -> str:
    return "task-" + hashlib.sha256(key.encode()).hexdigest()[:20]


def _page_token_check(token: bytes) -> bytes:
    return hashlib.blake2b(token, digest_size=PAGE_TOKEN_CHECK_BYTES).digest()


def encode_page_token(token: bytes) -> str:
    """Temporal's page token with a checksum: the server chokes on tokens it did not make
    (it retries them for seconds, then fails), so the API refuses those itself."""
    return base64.urlsafe_b64encode(_page_token_check(token) + token).decode()


def decode_page_token(encoded: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(encoded.encode())
    except (binascii.Error, ValueError):
        raw = b""
    check, token = raw[:PAGE_TOKEN_CHECK_BYTES], raw[PAGE_TOKEN_CHECK_BYTES:]
    if not token or check != _page_token_check(token):
        raise ApiError(400, "invalid_page_token", "page_token is not one this API gave out")
    return token


def create_app(
    settings: Settings | None = None,
    runtime: AgentRuntime | None = None,
    *,
    sse_ping_seconds: float = SSE_PING_SECONDS,
) -> FastAPI:
    """The API over `runtime` (or one connected from `settings` at start-up)."""
    settings = settings or Settings()
    tokens: dict[str, ApiToken] = dict(settings.api_tokens)
    # A repeated approval with the same Idempotency-Key gets the first answer back.
    answered: OrderedDict[tuple[str, str], ApprovalResult] = OrderedDict()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if runtime is None:
            app.state.runtime = AgentRuntime(await connect(settings), settings)
        else:
            app.state.runtime = runtime
        yield

    app = FastAPI(
        title="waystation",
        version="0.1.0",
        description="Durable AI-agent tasks on Temporal: start, follow, approve, resume.",
        lifespan=lifespan,
        responses=_ERRORS,
    )

    def runtime_of(request: Request) -> AgentRuntime:
        return request.app.state.runtime  # type: ignore[no-any-return]

    def caller(authorization: Annotated[str | None, Header()] = None) -> Caller:
        if not tokens:
            return Caller(name="local", role="approver")
        if not authorization or not authorization.lower().startswith("bearer "):
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>")
        token = tokens.get(authorization[7:].strip())
        if token is None:
            raise ApiError(401, "unauthorized", "unknown token")
        return Caller(name=token.name, role=token.role)

    def approver(who: Annotated[Caller, Depends(caller)]) -> Caller:
        if who.role != "approver":
            raise ApiError(403, "forbidden", f"{who.name} may read and start tasks, not decide")
        return who

    Runtime = Annotated[AgentRuntime, Depends(runtime_of)]
    Reader = Annotated[Caller, Depends(caller)]
    Approver = Annotated[Caller, Depends(approver)]

    app.add_middleware(
        CORSMiddleware,
        allow_origins=settings.codec_cors_origins,
        allow_methods=["POST", "GET", "OPTIONS"],
        allow_headers=["Authorization", "Content-Type", "X-Namespace"],
    )
    codec = settings.payload_codec()

    async def run_codec(request: Request, encode: bool) -> JSONResponse:
        if codec is None:
            raise ApiError(404, "no_codec", "payload encryption is off on this server")
        try:
            payloads = json_format.Parse(await request.body(), Payloads())
        except json_format.ParseError as err:
            raise ApiError(400, "invalid_payloads", f"not a Payloads message: {err}") from None
        try:
            done = await (codec.encode if encode else codec.decode)(list(payloads.payloads))
        except (ValueError, InvalidTag) as err:
            raise ApiError(400, "undecodable", f"cannot decode these payloads: {err}") from None
        body = json_format.MessageToDict(Payloads(payloads=done))
        return JSONResponse(body)

    @app.post("/codec/decode", tags=["codec"], response_model=dict[str, Any])
    async def codec_decode(request: Request, who: Reader) -> JSONResponse:
        """Codec server: decrypt payloads for the Temporal Web UI and CLI (`--codec-endpoint`)."""
        return await run_codec(request, encode=False)

    @app.post("/codec/encode", tags=["codec"], response_model=dict[str, Any])
    async def codec_encode(request: Request, who: Reader) -> JSONResponse:
        """Codec server: encrypt payloads (for `temporal workflow signal` with a codec)."""
        return await run_codec(request, encode=True)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
        body = ErrorBody(error=err.error, detail=err.detail)
        return JSONResponse(body.model_dump(exclude_none=True), err.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        fields = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
            for e in err.errors()
        ]
        body = ErrorBody(error="invalid_request", detail="the request is not valid", fields=fields)
        return JSONResponse(body.model_dump(), 422)

    @app.exception_handler(TaskError)
    async def task_error(request: Request, err: TaskError) -> JSONResponse:
        status, kind = 409, "conflict"
        if isinstance(err, TaskNotFoundError):
            status, kind = 404, "not_found"
        elif isinstance(err, DecisionError):
            status, kind = {
                errors.UNKNOWN_REQUEST: (404, "unknown_request"),
                errors.DECISION_CONFLICT: (409, "decision_conflict"),
                errors.TASK_NOT_WAITING: (409, "task_not_waiting"),
            }.get(err.kind or "", (409, "conflict"))
        return JSONResponse(
            ErrorBody(error=kind, detail=str(err)).model_dump(exclude_none=True), status
        )

    @app.exception_handler(RPCError)
    async def temporal_error(request: Request, err: RPCError) -> JSONResponse:
        body = ErrorBody(error="temporal_unavailable", detail=f"Temporal answered: {err.message}")
        return JSONResponse(body.model_dump(exclude_none=True), 503)

    def links(task_id: str) -> Links:
        return Links(
            self=f"/tasks/{task_id}",
            events=f"/tasks/{task_id}/events",
            approve=f"/tasks/{task_id}/approve",
        )

    async def existing(runtime: AgentRuntime, task_id: str) -> TaskHandle:
        return await runtime.find(task_id)  # raises TaskNotFoundError (404)

    @app.post("/tasks", status_code=201, response_model=TaskCreated)
    async def create_task(
        body: AgentTask,
        runtime: Runtime,
        who: Reader,
        response: Response,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> TaskCreated:
        """Start a task. With an Idempotency-Key, a retried POST returns the same task."""
        if "model" not in body.model_fields_set:
            body = body.model_copy(
                update={"model": ModelSettings(name=runtime.settings.default_model)}
            )
        task_id = _task_id_for(idempotency_key) if idempotency_key else None
        if task_id is not None:
            try:
                handle = await existing(runtime, task_id)
            except TaskNotFoundError:
                handle = None
            if handle is not None:
                first = (await within(QUERY_TIMEOUT_SECONDS, handle.events(0), "a query"))[:1]
                if first and isinstance(first[0], TaskStarted) and first[0].task != body:
                    raise ApiError(
                        409, "idempotency_conflict", "Idempotency-Key reused with a different task"
                    )
                response.status_code = 200
                state = await within(QUERY_TIMEOUT_SECONDS, handle.state(), "a query")
                return TaskCreated(id=task_id, status=state.status, links=links(task_id))
        handle = await runtime.run(body, task_id=task_id)
        return TaskCreated(id=handle.id, status="running", links=links(handle.id))

    @app.get("/tasks", response_model=TaskPage)
    async def list_tasks(
        runtime: Runtime,
        who: Reader,
        status: Literal["running", "waiting_approval", "done", "failed", "cancelled"] | None = None,
        page_size: Annotated[int, Query(ge=1, le=500)] = 50,
        page_token: Annotated[str | None, Query(max_length=4096)] = None,
    ) -> TaskPage:
        """Tasks, newest first, from Temporal's visibility (paginated)."""
        token = decode_page_token(page_token) if page_token else None
        tasks, next_token = await runtime.list_tasks(status, page_size, token)
        encoded = encode_page_token(next_token) if next_token else None
        return TaskPage(tasks=tasks, next_page_token=encoded)

    @app.get("/tasks/{task_id}", response_model=TaskView)
    async def get_task(task_id: str, runtime: Runtime, who: Reader) -> TaskView:
        """The folded state: status, step, pending approvals, result, usage."""
        handle = await existing(runtime, task_id)
        state = await within(QUERY_TIMEOUT_SECONDS, handle.state(), "the state query")
        return TaskView(id=task_id, state=state)

    async def decide(
        task_id: str,
        body: ApprovalBody,
        reject: bool,
        runtime: AgentRuntime,
        who: Caller,
        key: str | None,
    ) -> ApprovalResult:
        if key is not None and (task_id, key) in answered:
            return answered[(task_id, key)]
        handle = await existing(runtime, task_id)
        decided = handle.approve(
            body.request_id,
            reject=reject,
            message=body.message,
            arguments=body.arguments,
            approver=who.name,  # from the token, never from the body
        )
        outcome = await within(
            UPDATE_TIMEOUT_SECONDS, decided, "the decision (it applies once a worker is back)"
        )
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

    @app.post("/tasks/{task_id}/approve", response_model=ApprovalResult)
    async def approve(
        task_id: str,
        runtime: Runtime,
        who: Approver,
        body: ApprovalBody | None = None,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> ApprovalResult:
        """Approve a pending tool call (the `decide` Update). Repeats get the same answer."""
        return await decide(task_id, body or ApprovalBody(), False, runtime, who, idempotency_key)

    @app.post("/tasks/{task_id}/reject", response_model=ApprovalResult)
    async def reject(
        task_id: str,
        runtime: Runtime,
        who: Approver,
        body: ApprovalBody | None = None,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> ApprovalResult:
        """Reject a pending tool call; the message reaches the model."""
        return await decide(task_id, body or ApprovalBody(), True, runtime, who, idempotency_key)

    @app.post("/tasks/{task_id}/resume", response_model=TaskView)
    async def resume(
        task_id: str, runtime: Runtime, who: Approver, body: ResumeBody | None = None
    ) -> TaskView:
        """Resume a failed task from its last good point, limits raised if given."""
        body = body or ResumeBody()
        handle = await runtime.resume(
            task_id, max_steps=body.max_steps, token_budget=body.token_budget
        )
        return TaskView(id=task_id, state=await handle.state())

    @app.post("/tasks/{task_id}/cancel", status_code=202, response_model=TaskView)
    async def cancel(task_id: str, runtime: Runtime, who: Approver) -> TaskView:
        """Request cancellation: the running call is cancelled, a `cancelled` event follows."""
        handle = await existing(runtime, task_id)
        await handle.cancel()
        state = await within(QUERY_TIMEOUT_SECONDS, handle.state(), "the state query")
        return TaskView(id=task_id, state=state)

    @app.get("/tasks/{task_id}/log", response_model=EventLogPage)
    async def event_log(
        task_id: str,
        runtime: Runtime,
        who: Reader,
        since: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    ) -> EventLogPage:
        """Plain JSON pages of the event log, by seq, for clients that cannot do SSE."""
        handle = await existing(runtime, task_id)
        events = (await within(QUERY_TIMEOUT_SECONDS, handle.events(since), "a query"))[:limit]
        return EventLogPage(events=events, next_seq=since + len(events))

    @app.get(
        "/tasks/{task_id}/events",
        response_class=EventSourceResponse,
        responses={200: {"content": {"text/event-stream": {}}, "description": "SSE stream"}},
    )
    async def events(
        task_id: str,
        runtime: Runtime,
        who: Reader,
        since: Annotated[int | None, Query(ge=0)] = None,
        topics: Annotated[
            str | None, Query(pattern=r"^(events|tokens)(,(events|tokens))*$")
        ] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> EventSourceResponse:
        """Server-Sent Events: `id` is the stream offset, `event` the item's type.

        Reconnect with `Last-Event-ID` (or `?since=`) to get exactly what was missed. The
        stream ends after the task's terminal event; comments keep proxies from timing out.
        """
        start = since or 0
        if last_event_id is not None:
            try:
                start = int(last_event_id) + 1
            except ValueError:
                raise ApiError(400, "invalid_last_event_id", "Last-Event-ID is an offset") from None
        await existing(runtime, task_id)
        wanted = topics.split(",") if topics else None

        async def items() -> AsyncIterator[ServerSentEvent]:
            async for item in runtime.stream(task_id, since=start, topics=wanted):
                yield ServerSentEvent(
                    data=item.data.model_dump_json(), event=item.data.type, id=str(item.offset)
                )

        return EventSourceResponse(items(), ping=sse_ping_seconds)

    return app


def main() -> None:
    import uvicorn

    settings = Settings()
    host = settings.api_host
    if not settings.api_tokens and host not in ("127.0.0.1", "localhost", "::1"):
        host = "127.0.0.1"
    if not settings.api_tokens:
        print(
            "no API tokens configured (WAYSTATION_API_TOKENS): binding to localhost only, "
            "every local caller may start tasks and decide approvals",
            file=sys.stderr,
        )
    print(f"waystation API on http://{host}:{settings.api_port} (docs: /docs)", file=sys.stderr)
    uvicorn.run(create_app(settings), host=host, port=settings.api_port)


def __getattr__(name: str) -> Any:
    # `uvicorn runtime.http_api:app` gets an app built from the environment on first use.
    if name == "app":
        return create_app()
    raise AttributeError(name)
