"""The schedule routes: create, list, read, change, pause, resume, trigger and delete a
schedule whose firings each run a task (waystation/client/schedules.py, docs/schedules.md).

Rights follow the task routes': making a schedule is starting tasks, so a reader may, with
the same limits on what it sets (AgentRuntime.admit); firing one now is starting a task
(a reader may); pausing, resuming, changing and deleting one act on what another started,
as cancelling a task does (an approver). A token bound to a tenant makes its tenant's
schedules and sees no other: another tenant's is answered as an unknown one (404)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from waystation.client.schedules import ScheduleChange, ScheduleInfo, ScheduleSpec
from waystation.client.starting import default_model
from waystation.servers.api.auth import Approver, Reader, Runtime
from waystation.workflows.models import SCHEDULE_NAME_PATTERN, TENANT_PATTERN

router = APIRouter(tags=["schedules"])

ScheduleName = Annotated[str, Path(pattern=SCHEDULE_NAME_PATTERN, max_length=80)]
TenantQuery = Annotated[str | None, Query(pattern=TENANT_PATTERN)]


class ScheduleList(BaseModel):
    schedules: list[ScheduleInfo]


class ScheduleDeleted(BaseModel):
    name: str
    deleted: bool = True


class PauseBody(BaseModel):
    note: str | None = Field(default=None, max_length=500, description="Why: shown with it.")


@router.post("/schedules", status_code=201, response_model=ScheduleInfo)
async def create_schedule(body: ScheduleSpec, runtime: Runtime, who: Reader) -> ScheduleInfo:
    """Create a schedule: each firing runs `task` as POST /tasks would start it."""
    task = body.task
    if "model" not in task.model_fields_set:
        task = task.model_copy(update={"model": default_model(runtime.settings)})
    tenant = who.tenant_of(task.tenant)
    spec = body.model_copy(update={"task": task})
    return await runtime.create_schedule(spec, role=who.role, tenant=tenant)


@router.get("/schedules", response_model=ScheduleList)
async def list_schedules(runtime: Runtime, who: Reader, tenant: TenantQuery = None) -> ScheduleList:
    """The schedules, by name, with their next and recent runs (a bound token: its own)."""
    return ScheduleList(schedules=await runtime.schedules.list(tenant=who.listed_tenant(tenant)))


@router.get("/schedules/{name}", response_model=ScheduleInfo)
async def get_schedule(name: ScheduleName, runtime: Runtime, who: Reader) -> ScheduleInfo:
    return await runtime.schedules.describe(name, tenant=who.tenant)


@router.patch("/schedules/{name}", response_model=ScheduleInfo)
async def change_schedule(
    name: ScheduleName, body: ScheduleChange, runtime: Runtime, who: Approver
) -> ScheduleInfo:
    """Change when it fires, its overlap policy or its catch-up window (its task stays)."""
    return await runtime.schedules.change(name, body, tenant=who.tenant)


@router.delete("/schedules/{name}", response_model=ScheduleDeleted)
async def delete_schedule(name: ScheduleName, runtime: Runtime, who: Approver) -> ScheduleDeleted:
    """Delete it; the tasks it started go on."""
    await runtime.schedules.delete(name, tenant=who.tenant)
    return ScheduleDeleted(name=name)


@router.post("/schedules/{name}/pause", response_model=ScheduleInfo)
async def pause_schedule(
    name: ScheduleName, runtime: Runtime, who: Approver, body: PauseBody | None = None
) -> ScheduleInfo:
    await runtime.schedules.pause(name, note=body.note if body else None, tenant=who.tenant)
    return await runtime.schedules.describe(name)


@router.post("/schedules/{name}/resume", response_model=ScheduleInfo)
async def resume_schedule(name: ScheduleName, runtime: Runtime, who: Approver) -> ScheduleInfo:
    await runtime.schedules.resume(name, tenant=who.tenant)
    return await runtime.schedules.describe(name)


@router.post("/schedules/{name}/trigger", status_code=202, response_model=ScheduleInfo)
async def trigger_schedule(name: ScheduleName, runtime: Runtime, who: Reader) -> ScheduleInfo:
    """Fire it now, once (even while paused or while a firing runs)."""
    await runtime.schedules.trigger(name, tenant=who.tenant)
    return await runtime.schedules.describe(name)
