"""Who is calling: bearer tokens from settings; without any, every local caller approves.

A token bound to a tenant sees and decides only that tenant's tasks: every route that names
a task checks it first (`owned_task`), and answers another tenant's task as it answers an
unknown one (404), so its existence is not told."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from fastapi import Depends, Header, Request
from pydantic import BaseModel, Field

from waystation.client.agent_runtime import AgentRuntime
from waystation.client.task_errors import not_found
from waystation.client.task_list import task_tenant
from waystation.client.task_rights import TaskRefusedError
from waystation.servers.api.errors import ApiError
from waystation.servers.api.paths import TaskId
from waystation.settings import ApiToken, Settings


class Caller(BaseModel):
    name: str
    role: Literal["reader", "approver"]
    tenant: str | None = Field(
        default=None, description="The tenant the caller's token is bound to: it sees no other."
    )
    starts_for: str | None = Field(
        default=None, description="The tenant of a task it starts without naming one."
    )

    def tenant_of(self, named: str | None) -> str | None:
        """The tenant a task this caller starts carries, given the one it names (if any): a
        bound caller may name only its own (TaskRefusedError otherwise)."""
        if self.tenant is not None and named not in (None, self.tenant):
            raise TaskRefusedError(
                "tenant",
                403,
                "forbidden_tenant",
                f"tenant: this token is bound to tenant {self.tenant!r} and may not start a "
                f"task for {named!r}",
            )
        return named if named is not None else self.starts_for

    def listed_tenant(self, named: str | None) -> str | None:
        """The tenant whose tasks a listing shows, given the one asked for: a bound caller's
        own, whatever it asks (asking for another is refused)."""
        if self.tenant is not None and named not in (None, self.tenant):
            raise ApiError(
                403,
                "forbidden_tenant",
                f"this token is bound to tenant {self.tenant!r} and lists only its tasks",
            )
        return self.tenant if self.tenant is not None else named

    async def check_owns(self, runtime: AgentRuntime, task_id: str) -> None:
        """Raise TaskNotFoundError, as for an unknown task, when the caller is bound to a
        tenant and `task_id` is not that tenant's."""
        if self.tenant is not None and await task_tenant(runtime.client, task_id) != self.tenant:
            raise not_found(task_id)


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
    return Caller(
        name=token.name, role=token.role, tenant=token.tenant, starts_for=token.tenant_of_start()
    )


def approver(who: Annotated[Caller, Depends(caller)]) -> Caller:
    if who.role != "approver":
        raise ApiError(403, "forbidden", f"{who.name} may read and start tasks, not decide")
    return who


async def owned_task(
    task_id: TaskId,
    who: Annotated[Caller, Depends(caller)],
    runtime: Annotated[AgentRuntime, Depends(runtime_of)],
) -> str:
    """The route's task id, once the caller may see the task (404 when not its tenant's)."""
    await who.check_owns(runtime, task_id)
    return task_id


Runtime = Annotated[AgentRuntime, Depends(runtime_of)]
Reader = Annotated[Caller, Depends(caller)]
Approver = Annotated[Caller, Depends(approver)]
# The task id of a route that names a task: every such route takes it as this.
OwnedTaskId = Annotated[str, Depends(owned_task)]
