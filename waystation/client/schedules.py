"""Schedules: tasks that start on a cron expression or an interval, on Temporal Schedules.

A schedule is a Temporal schedule whose id is its name, so it is listed by the Temporal UI
and `temporal schedule list`, survives a server restart, and keeps Temporal's overlap
policies, catch-up window, pause and trigger. Its action starts the agent workflow with the
task as `ws run` would start it (settings' defaults filled in and admitted for the caller's
role when the schedule is made), under the workflow id `schedule:NAME`, to which Temporal
appends the firing's scheduled time (`schedule:triage-2026-12-07T09:00:00Z`): Temporal
starts each scheduled time once, so a firing caught up or retried never runs twice, and the
task is listed, read and answered under that id like any other. No client may choose an id
that starts with `schedule:` (task_rights.check_task_id), so a schedule's firings reach
only the tasks it started, never another tenant's.

A `conversation` schedule starts a small workflow instead (workflows/scheduled_turn.py):
the first firing starts the task `schedule:NAME`, each later one sends it the schedule's
text as its next message, so the agent sees what it found last time.

What the schedule is for (its tenant, whether it converses, its text) is in its memo
(`waystation`): a token bound to a tenant sees only its tenant's schedules.
"""

from __future__ import annotations

import asyncio
import zoneinfo
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionExecution,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleBackfill,
    ScheduleCalendarSpec,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleRange,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.client import ScheduleSpec as TemporalSpec
from temporalio.common import Priority, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from waystation.client.starting import WORKFLOW_TASK_TIMEOUT, summary
from waystation.client.task_rights import TaskRefusedError
from waystation.workflows import search
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import (
    SCHEDULE_NAME_PATTERN,
    SCHEDULED_ID_PREFIX,
    AgentTask,
    ScheduleLink,
)
from waystation.workflows.run import AgentRun
from waystation.workflows.scheduled import ScheduledTurn
from waystation.workflows.scheduled_turn import ScheduledTurnWorkflow

Overlap = Literal[
    "skip", "buffer_one", "buffer_all", "cancel_other", "terminate_other", "allow_all"
]
OVERLAPS: dict[Overlap, ScheduleOverlapPolicy] = {
    "skip": ScheduleOverlapPolicy.SKIP,
    "buffer_one": ScheduleOverlapPolicy.BUFFER_ONE,
    "buffer_all": ScheduleOverlapPolicy.BUFFER_ALL,
    "cancel_other": ScheduleOverlapPolicy.CANCEL_OTHER,
    "terminate_other": ScheduleOverlapPolicy.TERMINATE_OTHER,
    "allow_all": ScheduleOverlapPolicy.ALLOW_ALL,
}
MEMO_KEY = "waystation"  # the schedule's memo: what it is for (ScheduleMemo)
FIRING_MEMO_SCHEDULE = "schedule"  # a firing's own memo: the schedule that started it
TURN_SUFFIX = "-turn"  # a conversation schedule's firings: schedule:NAME-turn-<scheduled time>
RUNS_SHOWN = 5  # next and recent runs a schedule's info shows
DEFAULT_CATCHUP = timedelta(days=365)  # Temporal's own default catch-up window


class ScheduleError(TaskRefusedError):
    """A schedule that cannot be made, found or changed as asked: `status` is the HTTP answer
    (404 unknown, 409 taken, 400 malformed), `kind` the error's name."""


def not_found(name: str) -> ScheduleError:
    return ScheduleError("name", 404, "schedule_not_found", f"no schedule named {name!r}")


def known_zone(zone: str | None) -> str | None:
    """`zone` if it is an IANA time zone this machine knows (Temporal's use the same names)."""
    if zone is not None:
        try:
            zoneinfo.ZoneInfo(zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {zone!r} (an IANA name: Europe/Paris)") from None
    return zone


def aware(end: datetime | None) -> datetime | None:
    if end is not None and end.tzinfo is None:
        raise ValueError("end_at needs a time zone (an ISO time ending in Z or +hh:mm)")
    return end


class ScheduleSpec(BaseModel):
    """A schedule to create: when it fires, what each firing runs, and how firings overlap."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=SCHEDULE_NAME_PATTERN,
        description="The schedule's id in Temporal, and the start of its firings' task ids.",
    )
    task: AgentTask = Field(description="What each firing runs, as POST /tasks takes it.")
    cron: str | None = Field(
        default=None, max_length=200, description='A cron expression, e.g. "0 9 * * 1-5".'
    )
    every_seconds: float | None = Field(
        default=None, ge=1, le=366 * 86400, description="Fire every this many seconds."
    )
    timezone: str | None = Field(
        default=None, max_length=100, description="The cron's time zone (IANA, default UTC)."
    )
    end_at: datetime | None = Field(default=None, description="No firing after this time.")
    conversation: bool = Field(
        default=False,
        description="Each firing is the next turn of one task (id: the schedule's name).",
    )
    overlap: Overlap = Field(
        default="skip", description="What a firing does while the previous one still runs."
    )
    catchup_window_seconds: float | None = Field(
        default=None,
        ge=10,
        le=366 * 86400,
        description="How late a firing missed while Temporal was down still runs (default "
        "365 days).",
    )
    paused: bool = Field(default=False, description="Create it paused.")

    _known_zone = field_validator("timezone")(known_zone)
    _aware = field_validator("end_at")(aware)

    @model_validator(mode="after")
    def _one_timing(self) -> ScheduleSpec:
        if (self.cron is None) == (self.every_seconds is None):
            raise ValueError("give exactly one of cron and every_seconds")
        return self


class ScheduleMemo(BaseModel):
    """What a schedule is for, kept in its memo: read without decoding its action."""

    tenant: str | None = None
    conversation: bool = False
    text: str = ""
    task_id: str | None = Field(default=None, description="A conversation schedule's task.")


class ScheduleRun(BaseModel):
    """A firing that started: when it was due, when it started, and the task it ran."""

    scheduled_at: datetime
    started_at: datetime
    task_id: str
    firing_id: str = Field(
        description="The workflow Temporal started: the task itself, or for a conversation "
        "schedule the firing's turn workflow (NAME-turn-<time>)."
    )


class ScheduleInfo(BaseModel):
    """A schedule as Temporal holds it."""

    name: str
    tenant: str | None = None
    text: str = Field(description="The task's text, shortened.")
    conversation: bool = False
    task_id: str | None = Field(
        default=None, description="A conversation schedule's task, which every firing continues."
    )
    cron: list[str] = Field(default_factory=list)
    every_seconds: list[float] = Field(default_factory=list)
    timezone: str | None = None
    end_at: datetime | None = None
    overlap: Overlap = "skip"
    paused: bool = False
    note: str | None = Field(default=None, description="Why it was paused, if it was.")
    next_runs: list[datetime] = Field(default_factory=list)
    recent_runs: list[ScheduleRun] = Field(default_factory=list)
    running: list[str] = Field(default_factory=list, description="Tasks of firings still running.")
    fired: int = Field(default=0, description="Firings that started a task.")
    skipped: int = Field(default=0, description="Firings skipped: the previous one still ran.")
    missed: int = Field(default=0, description="Firings missed past the catch-up window.")
    created_at: datetime | None = None


class ScheduleChange(BaseModel):
    """PATCH /schedules/{name}: what to change of when a schedule fires (its task stays;
    delete and create it again to change that)."""

    model_config = ConfigDict(extra="forbid")

    cron: str | None = Field(default=None, max_length=200)
    every_seconds: float | None = Field(default=None, ge=1, le=366 * 86400)
    timezone: str | None = Field(default=None, max_length=100)
    end_at: datetime | None = None
    overlap: Overlap | None = None
    catchup_window_seconds: float | None = Field(default=None, ge=10, le=366 * 86400)

    _known_zone = field_validator("timezone")(known_zone)
    _aware = field_validator("end_at")(aware)

    @model_validator(mode="after")
    def _one_timing(self) -> ScheduleChange:
        if self.cron is not None and self.every_seconds is not None:
            raise ValueError("give cron or every_seconds, not both")
        return self


def action_id(name: str, conversation: bool = False) -> str:
    """The workflow id of a schedule's action, to which Temporal appends each firing's time."""
    return SCHEDULED_ID_PREFIX + name + (TURN_SUFFIX if conversation else "")


def conversation_id(name: str) -> str:
    """The task every firing of a conversation schedule continues."""
    return SCHEDULED_ID_PREFIX + name


def firing_id(name: str, scheduled_at: datetime, conversation: bool = False) -> str:
    """The workflow id Temporal gives the firing of `name` due at `scheduled_at`."""
    moment = scheduled_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{action_id(name, conversation)}-{moment}"


def temporal_spec(
    cron: str | None,
    every_seconds: float | None,
    timezone: str | None,
    end_at: datetime | None,
) -> TemporalSpec:
    intervals = (
        [ScheduleIntervalSpec(every=timedelta(seconds=every_seconds))] if every_seconds else []
    )
    return TemporalSpec(
        cron_expressions=[cron] if cron else [],
        intervals=intervals,
        time_zone_name=timezone,
        end_at=end_at,
    )


def schedule_action(spec: ScheduleSpec, task_queue: str) -> ScheduleActionStartWorkflow:
    """What each firing starts: the agent workflow with the task, or a conversation's turn."""
    task = spec.task.model_copy(update={"schedule": ScheduleLink(name=spec.name)})
    tenant = task.tenant
    pairs: list[SearchAttributePair[Any]] = []
    if tenant is not None:
        pairs.append(SearchAttributePair(search.AGENT_TENANT, tenant))
    common: dict[str, Any] = {
        "task_queue": task_queue,
        "memo": {FIRING_MEMO_SCHEDULE: spec.name},
        "typed_search_attributes": TypedSearchAttributes(pairs),
        "static_summary": summary(task.task),
        "priority": Priority(fairness_key=tenant) if tenant is not None else Priority.default,
        "task_timeout": WORKFLOW_TASK_TIMEOUT,
    }
    if spec.conversation:
        turn = ScheduledTurn(schedule=spec.name, task_id=conversation_id(spec.name), task=task)
        return ScheduleActionStartWorkflow(
            ScheduledTurnWorkflow.run, turn, id=action_id(spec.name, conversation=True), **common
        )
    return ScheduleActionStartWorkflow(
        AgentWorkflow.run, AgentRun(task=task), id=action_id(spec.name), **common
    )


def temporal_schedule(spec: ScheduleSpec, task_queue: str) -> Schedule:
    catchup = (
        timedelta(seconds=spec.catchup_window_seconds)
        if spec.catchup_window_seconds is not None
        else DEFAULT_CATCHUP
    )
    return Schedule(
        action=schedule_action(spec, task_queue),
        spec=temporal_spec(spec.cron, spec.every_seconds, spec.timezone, spec.end_at),
        policy=SchedulePolicy(overlap=OVERLAPS[spec.overlap], catchup_window=catchup),
        state=ScheduleState(paused=spec.paused, note="created paused" if spec.paused else None),
    )


def _overlap_name(policy: ScheduleOverlapPolicy) -> Overlap:
    for name, value in OVERLAPS.items():
        if value == policy:
            return name
    return "skip"  # UNSPECIFIED: Temporal's default


# Each cron field's full range: a field that spans it reads `*`.
CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day_of_month", 1, 31), ("month", 1, 12))


def _cron_field(ranges: Sequence[ScheduleRange], low: int, high: int) -> str:
    if len(ranges) == 1 and (ranges[0].start, ranges[0].end, ranges[0].step) == (low, high, 1):
        return "*"
    parts = []
    for r in ranges:
        part = str(r.start) if r.end == r.start else f"{r.start}-{r.end}"
        if (r.start, r.end) == (low, high):
            part = "*"
        parts.append(part if r.step == 1 else f"{part}/{r.step}")
    return ",".join(parts)


def cron_of(calendar: ScheduleCalendarSpec) -> str:
    """A calendar as the cron expression it came from (Temporal keeps a cron as calendars)."""
    fields = [_cron_field(getattr(calendar, f), low, high) for f, low, high in CRON_FIELDS]
    fields.append(_cron_field(calendar.day_of_week, 0, 6))
    return " ".join(fields)


def _workflow_id(execution: ScheduleActionExecution) -> str:
    if isinstance(execution, ScheduleActionExecutionStartWorkflow):
        return execution.workflow_id
    return ""


def info_of(name: str, described: ScheduleDescription, memo: ScheduleMemo) -> ScheduleInfo:
    """What a description says of the schedule, for people and the API."""
    schedule, info = described.schedule, described.info
    spec = schedule.spec
    runs = [
        ScheduleRun(
            scheduled_at=action.scheduled_at,
            started_at=action.started_at,
            task_id=memo.task_id or _workflow_id(action.action),
            firing_id=_workflow_id(action.action),
        )
        for action in info.recent_actions[-RUNS_SHOWN:]
    ]
    running = [memo.task_id] if memo.task_id and info.running_actions else []
    running = running or [_workflow_id(a) for a in info.running_actions]
    return ScheduleInfo(
        name=name,
        tenant=memo.tenant,
        text=memo.text,
        conversation=memo.conversation,
        task_id=memo.task_id,
        cron=[*spec.cron_expressions, *(cron_of(c) for c in spec.calendars)],
        every_seconds=[i.every.total_seconds() for i in spec.intervals],
        timezone=spec.time_zone_name or None,
        end_at=spec.end_at,
        overlap=_overlap_name(schedule.policy.overlap),
        paused=schedule.state.paused,
        note=schedule.state.note or None,
        next_runs=list(info.next_action_times[:RUNS_SHOWN]),
        recent_runs=list(reversed(runs)),
        running=running,
        fired=info.num_actions,
        skipped=info.num_actions_skipped_overlap,
        missed=info.num_actions_missed_catchup_window,
        created_at=info.created_at,
    )


class Schedules:
    """The schedules of one Temporal namespace and task queue (AgentRuntime.schedules)."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self.client = client
        self.task_queue = task_queue

    async def create(self, spec: ScheduleSpec) -> ScheduleInfo:
        """Create the schedule; `spec.task` is as it will run (AgentRuntime.create_schedule
        fills in the settings' defaults and admits it). ScheduleError 409 if the name is taken,
        400 if Temporal refuses the timing (a malformed cron)."""
        memo = ScheduleMemo(
            tenant=spec.task.tenant,
            conversation=spec.conversation,
            text=summary(spec.task.task),
            task_id=conversation_id(spec.name) if spec.conversation else None,
        )
        try:
            await self.client.create_schedule(
                spec.name,
                temporal_schedule(spec, self.task_queue),
                memo={MEMO_KEY: memo.model_dump(mode="json")},
            )
        except ScheduleAlreadyRunningError:
            raise ScheduleError(
                "name", 409, "schedule_exists", f"a schedule named {spec.name!r} exists already"
            ) from None
        except RPCError as err:
            if err.status == RPCStatusCode.INVALID_ARGUMENT:
                raise ScheduleError("cron", 400, "invalid_schedule", err.message) from None
            raise
        return await self.describe(spec.name)

    async def memo(self, name: str) -> tuple[ScheduleHandle, ScheduleDescription, ScheduleMemo]:
        """The schedule's handle, description and memo; ScheduleError 404 for a schedule
        unknown or not made by waystation."""
        handle = self.client.get_schedule_handle(name)
        try:
            described = await handle.describe()
        except RPCError as err:
            if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                raise not_found(name) from None
            raise
        raw = await described.memo_value(MEMO_KEY, None)
        if raw is None:
            raise not_found(name)
        return handle, described, ScheduleMemo.model_validate(raw)

    async def describe(self, name: str, tenant: str | None = None) -> ScheduleInfo:
        """The schedule; with `tenant`, only if it is that tenant's (404 otherwise)."""
        _, described, memo = await self.memo(name)
        if tenant is not None and memo.tenant != tenant:
            raise not_found(name)
        return info_of(name, described, memo)

    async def list(self, tenant: str | None = None) -> list[ScheduleInfo]:
        """Every schedule waystation made (with `tenant`, that tenant's), by name."""
        found: list[ScheduleInfo] = []
        async for listed in await self.client.list_schedules():
            raw = await listed.memo_value(MEMO_KEY, None)
            if raw is None:
                continue  # a schedule some other program made
            memo = ScheduleMemo.model_validate(raw)
            if tenant is not None and memo.tenant != tenant:
                continue
            try:
                found.append(await self.describe(listed.id))
            except ScheduleError:
                continue  # deleted since it was listed
        return sorted(found, key=lambda info: info.name)

    async def pause(self, name: str, note: str | None = None, tenant: str | None = None) -> None:
        await self.describe(name, tenant)
        await self.client.get_schedule_handle(name).pause(note=note or "paused")

    async def resume(self, name: str, tenant: str | None = None) -> None:
        await self.describe(name, tenant)
        await self.client.get_schedule_handle(name).unpause(note="resumed")

    async def trigger(self, name: str, tenant: str | None = None) -> None:
        """Fire it now, whatever its overlap policy says (Temporal's `trigger` runs even
        while an earlier firing still runs: ALLOW_ALL for this one). Temporal names a firing
        by its second, so a trigger in the second of the latest firing waits for the next
        one: else both would be one firing (one id, one turn of a conversation)."""
        info = await self.describe(name, tenant)
        latest = max((run.scheduled_at for run in info.recent_runs), default=None)
        if latest is not None:
            next_second = latest.replace(microsecond=0) + timedelta(seconds=1)
            wait = (next_second - datetime.now(UTC)).total_seconds()
            if 0 < wait <= 1:
                await asyncio.sleep(wait)
        await self.client.get_schedule_handle(name).trigger(overlap=ScheduleOverlapPolicy.ALLOW_ALL)

    async def backfill(
        self, name: str, start: datetime, end: datetime, tenant: str | None = None
    ) -> None:
        """Run the firings due between `start` and `end` now (Temporal's backfill): for hours
        missed past the catch-up window. Temporal runs each time asked, even one that ran
        (its id then gets a second run, as a repeated backfill does in its UI): ask each
        range once."""
        await self.describe(name, tenant)
        handle = self.client.get_schedule_handle(name)
        await handle.backfill(
            ScheduleBackfill(start_at=start, end_at=end, overlap=ScheduleOverlapPolicy.ALLOW_ALL)
        )

    async def delete(self, name: str, tenant: str | None = None) -> None:
        """Delete the schedule; firings already started go on."""
        await self.describe(name, tenant)
        await self.client.get_schedule_handle(name).delete()

    async def change(
        self, name: str, change: ScheduleChange, tenant: str | None = None
    ) -> ScheduleInfo:
        """Change when it fires (and its overlap policy or catch-up window)."""
        await self.describe(name, tenant)

        def updated(given: ScheduleUpdateInput) -> ScheduleUpdate:
            schedule = given.description.schedule
            spec = schedule.spec
            if change.cron is not None or change.every_seconds is not None:
                spec.cron_expressions = [change.cron] if change.cron else []
                spec.intervals = (
                    [ScheduleIntervalSpec(every=timedelta(seconds=change.every_seconds))]
                    if change.every_seconds
                    else []
                )
                spec.calendars = []
            if change.timezone is not None:
                spec.time_zone_name = change.timezone
            if change.end_at is not None:
                spec.end_at = change.end_at
            if change.overlap is not None:
                schedule.policy.overlap = OVERLAPS[change.overlap]
            if change.catchup_window_seconds is not None:
                schedule.policy.catchup_window = timedelta(seconds=change.catchup_window_seconds)
            return ScheduleUpdate(schedule=schedule)

        try:
            await self.client.get_schedule_handle(name).update(updated)
        except RPCError as err:
            if err.status == RPCStatusCode.INVALID_ARGUMENT:
                raise ScheduleError("cron", 400, "invalid_schedule", err.message) from None
            raise
        return await self.describe(name)
