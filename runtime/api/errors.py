"""Every error answer of the API: a status, a machine-readable kind and a sentence."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from temporalio.service import RPCError

from runtime.agent_runtime import DecisionError, TaskError, TaskNotFoundError
from workflows import errors

T = TypeVar("T")


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
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 422, 503)
}


async def within(seconds: float, work: Awaitable[T], what: str) -> T:
    """`work`, or a 503 that says no worker answered in time (never a hung request)."""
    try:
        return await asyncio.wait_for(work, seconds)
    except TimeoutError:
        raise ApiError(
            503,
            "no_worker",
            f"no worker answered {what} within {seconds:g} s; is one running (python worker.py)?",
        ) from None


def _body(error: str, detail: str, fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return ErrorBody(error=error, detail=detail, fields=fields).model_dump(exclude_none=True)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
        return JSONResponse(_body(err.error, err.detail), err.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        fields = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
            for e in err.errors()
        ]
        return JSONResponse(_body("invalid_request", "the request is not valid", fields), 422)

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
        return JSONResponse(_body(kind, str(err)), status)

    @app.exception_handler(RPCError)
    async def temporal_error(request: Request, err: RPCError) -> JSONResponse:
        return JSONResponse(_body("temporal_unavailable", f"Temporal answered: {err.message}"), 503)
