"""Who is calling: bearer tokens from settings; without any, every local caller approves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from fastapi import Depends, Header, Request
from pydantic import BaseModel

from waystation.client.agent_runtime import AgentRuntime
from waystation.servers.api.errors import ApiError
from waystation.settings import ApiToken, Settings


class Caller(BaseModel):
    name: str
    role: Literal["reader", "approver"]


def settings_of(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def runtime_of(request: Request) -> AgentRuntime:
    return request.app.state.runtime  # type: ignore[no-any-return]


def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    return identify(settings_of(request).api_tokens, authorization)


def identify(tokens: Mapping[str, ApiToken], authorization: str | None) -> Caller:
    """The caller an Authorization header names (the API's routes and its MCP endpoint)."""
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
