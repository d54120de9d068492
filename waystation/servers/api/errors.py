"""Every error answer of the API: a status, a machine-readable kind and a sentence."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.types import Send
from temporalio.service import RPCError

from waystation.activities.storage import StorageError
from waystation.activities.storage.memory import MemoryRequestError
from waystation.client.task_errors import (
    DecisionError,
    MessageRefusedError,
    NoWorkerError,
    TaskEndedError,
    TaskError,
    TaskNotFoundError,
    TaskStuckError,
    UnknownToolsError,
    UnreadableTaskError,
)
from waystation.client.task_rights import TaskRefusedError
from waystation.workflows import errors


class ErrorBody(BaseModel):
    """Every error answer: a machine-readable kind and a sentence for people."""

    error: str
    detail: str
    fields: list[dict[str, Any]] | None = None


class ApiError(Exception):
    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 421, 422, 503)
}


def _body(error: str, detail: str, fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return ErrorBody(error=error, detail=detail, fields=fields).model_dump(exclude_none=True)


async def send_error(send: Send, status: int, error: str, detail: str) -> None:
    """An error answer in the API's shape, from ASGI code that runs before any route (the
    guards in front of the routes and /mcp). What the client still sends of a refused body
    the server discards as it arrives; closing instead would reset the connection under the
    client, which could then lose this answer."""
    body = json.dumps(_body(error, detail)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
        return JSONResponse(_body(err.error, err.detail), err.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def no_route(request: Request, err: HTTPException) -> JSONResponse:
        # The router's own answers (no such path, method): the same shape as every other.
        kind = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        detail = f"{request.method} {request.url.path}: {err.detail}"
        return JSONResponse(_body(kind, detail), err.status_code, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        fields = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
            for e in err.errors()
        ]
        return JSONResponse(_body("invalid_request", "the request is not valid", fields), 422)

    @app.exception_handler(UnknownToolsError)
    async def unknown_tools(request: Request, err: UnknownToolsError) -> JSONResponse:
        fields = [{"loc": ["body", "tools"], "msg": f"unknown tool {n!r}"} for n in err.names]
        return JSONResponse(_body("unknown_tools", str(err), fields), 422)

    @app.exception_handler(TaskRefusedError)
    async def refused(request: Request, err: TaskRefusedError) -> JSONResponse:
        fields = [{"loc": ["body", *err.setting.split(".")], "msg": str(err)}]
        return JSONResponse(_body(err.kind, str(err), fields), err.status)

    @app.exception_handler(TaskError)
    async def task_error(request: Request, err: TaskError) -> JSONResponse:
        status, kind = 409, "conflict"
        if isinstance(err, TaskNotFoundError):
            status, kind = 404, "not_found"
        elif isinstance(err, NoWorkerError):
            status, kind = 503, "no_worker"
        elif isinstance(err, TaskStuckError):
            status, kind = 409, "stuck"
        elif isinstance(err, TaskEndedError):
            status, kind = 409, "task_ended"
        elif isinstance(err, UnreadableTaskError):
            status, kind = 500, "unreadable_task"
        elif isinstance(err, MessageRefusedError) and err.kind == errors.TOO_MANY_MESSAGES:
            status, kind = 429, "too_many_messages"
        elif isinstance(err, MessageRefusedError) and err.kind == errors.MESSAGE_TOO_LARGE:
            status, kind = 413, "message_too_large"
        elif isinstance(err, MessageRefusedError):
            status, kind = 409, "task_not_taking_messages"
        elif isinstance(err, DecisionError):
            status, kind = {
                errors.UNKNOWN_REQUEST: (404, "unknown_request"),
                errors.DECISION_CONFLICT: (409, "decision_conflict"),
                errors.DECISION_MISMATCH: (409, "decision_mismatch"),
                errors.TASK_NOT_WAITING: (409, "task_not_waiting"),
                errors.INVALID_CHOICE: (422, "invalid_choice"),
            }.get(err.kind or "", (409, "conflict"))
        return JSONResponse(_body(kind, str(err)), status)

    @app.exception_handler(MemoryRequestError)
    async def memory_refused(request: Request, err: MemoryRequestError) -> JSONResponse:
        return JSONResponse(_body(err.kind, str(err)), err.status)

    @app.exception_handler(StorageError)
    async def storage_error(request: Request, err: StorageError) -> JSONResponse:
        return JSONResponse(_body("storage_unavailable", str(err)), 503)

    @app.exception_handler(RPCError)
    async def temporal_error(request: Request, err: RPCError) -> JSONResponse:
        return JSONResponse(_body("temporal_unavailable", f"Temporal answered: {err.message}"), 503)
