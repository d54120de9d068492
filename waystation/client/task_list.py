"""Tasks newest first by the time they started, a page at a time, from Temporal's visibility.

Visibility cannot be asked for an order: ORDER BY is refused by SQL visibility (the dev
server's SQLite, PostgreSQL, MySQL) and by Temporal Cloud, and is off by default on
Elasticsearch (`system.visibilityDisableOrderByClause`). Its own order is running
executions first, newest started first, then closed ones by close time. So a page is built
from two listings: running tasks, taken in the order they come, and closed ones, read in
close order until none unread can have started later than the page's oldest (a run closes
after it starts). The page token is the start time a page ended at: a task keeps its place
in the pages while it closes, and a task is listed once, as its latest run (a resumed or
repaired task's earlier run, and the runs a long task continued as new, are not listed).

A listed task's turns come from its memo, which the listing carries; when it last did
something is its close time once closed, and for a running task the time of its latest
history event, read from Temporal by `with_latest_activity` (a call per running task, no
worker), which callers that show it ask for.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError
from temporalio.api.common.v1 import SearchAttributes
from temporalio.api.common.v1 import WorkflowExecution as ExecutionRef
from temporalio.api.workflowservice.v1 import (
    DescribeWorkflowExecutionRequest,
    GetWorkflowExecutionHistoryReverseRequest,
)
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeValueType,
    TypedSearchAttributes,
)
from temporalio.converter import decode_typed_search_attributes
from temporalio.service import RPCError, RPCStatusCode

from waystation.client.busy import reading
from waystation.client.task_errors import task_errors
from waystation.vocabulary import STUCK
from waystation.workflows import search
from waystation.workflows.models import Usage

M = TypeVar("M")
Instant = tuple[int, int]  # (seconds, nanos): visibility's own precision, up to a nanosecond
# Closed runs that a later run of the same task may have replaced (a resume resets a failed,
# terminated or timed-out run; a repair terminates a stuck one).
_REPLACEABLE = frozenset(
    {
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.TIMED_OUT,
    }
)


# Running tasks whose latest event is read at once, and how long one read may take.
ACTIVITY_READS_AT_ONCE = 8
ACTIVITY_READ_SECONDS = 5.0


class TaskSummary(BaseModel):
    """One task as Temporal's visibility lists it (no worker needed)."""

    id: str
    status: str
    step: int | None = None
    started_at: datetime
    closed_at: datetime | None = None
    turns: int | None = Field(
        default=None,
        description="The conversation's turns: 1 for the task, one more per follow-up (null "
        "for a task that has not changed status since before waystation counted them, or "
        "whose memo is encrypted with a key this side lacks).",
    )
    last_activity_at: datetime | None = Field(
        default=None,
        description="When the task last did something: a closed run's close; a running "
        "task's latest event in Temporal's history where the lister reads it (a call per "
        "task: the HTTP API and the console do, AgentRuntime.list_tasks leaves it null).",
    )
    tenant: str | None = Field(
        default=None, description="Who the task is for (its AgentTenant); null without one."
    )
    usage: Usage | None = Field(
        default=None,
        description="The task's tokens as of its latest change of status (a closed task's "
        "final count), from its memo: null for a task that has not changed status since "
        "before waystation kept them there, or whose memo is encrypted with a key this "
        "side lacks.",
    )


class InvalidPageTokenError(ValueError):
    """A page token that no listing gave out."""


class _Cursor(BaseModel):
    """Where the next page starts: at tasks started at `seconds`.`nanos` or before, other
    than `listed` (the ones started at that very instant that a page already showed)."""

    seconds: int
    nanos: int = Field(ge=0, lt=10**9)
    listed: list[str] = []

    @property
    def instant(self) -> Instant:
        return (self.seconds, self.nanos)

    def bound(self) -> str:
        """The visibility filter for tasks started at this instant or before (RFC 3339)."""
        moment = datetime.fromtimestamp(self.seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        return f'StartTime <= "{moment}.{self.nanos:09d}Z"'


def is_page_token(token: bytes) -> bool:
    """Whether `token` reads as one `list_page` gives out."""
    try:
        _cursor(token)
    except InvalidPageTokenError:
        return False
    return True


def _cursor(token: bytes) -> _Cursor:
    try:
        return _Cursor.model_validate_json(token)
    except ValidationError:
        raise InvalidPageTokenError("not a page token of a task list") from None


@dataclass(frozen=True)
class _Listed:
    execution: WorkflowExecution
    started: Instant
    closed: Instant | None

    @classmethod
    def of(cls, execution: WorkflowExecution) -> _Listed:
        info = execution.raw_info
        closed = None
        if info.HasField("close_time"):
            closed = (info.close_time.seconds, info.close_time.nanos)
        return cls(execution, (info.start_time.seconds, info.start_time.nanos), closed)

    @property
    def id(self) -> str:
        return self.execution.id

    @property
    def order(self) -> tuple[Instant, str]:
        """Newest started first; tasks started at the same instant by id."""
        return (self.started, self.id)

    async def summary(self, client: Client) -> TaskSummary:
        e = self.execution
        first_start = e.typed_search_attributes.get(search.AGENT_TASK_STARTED)
        return TaskSummary(
            id=e.id,
            status=STUCK
            if search.reports_stuck(e.search_attributes)
            else e.typed_search_attributes.get(search.AGENT_STATUS) or "pending",
            step=e.typed_search_attributes.get(search.AGENT_STEP),
            started_at=first_start or e.start_time,
            closed_at=e.close_time,
            turns=await self._memo_field(client, search.MEMO_TURNS, int),
            last_activity_at=e.close_time,
            tenant=e.typed_search_attributes.get(search.AGENT_TENANT),
            usage=await self._memo_field(client, search.MEMO_USAGE, Usage),
        )

    async def _memo_field(self, client: Client, key: str, kind: type[M]) -> M | None:
        """One field of the memo, decoded alone (the rest of the memo is not needed)."""
        payload = self.execution.raw_info.memo.fields.get(key)
        if payload is None:
            return None
        try:
            [value] = await client.data_converter.decode([payload], [kind])
        except Exception:  # sealed with a key this side lacks: listed without it
            return None
        return value if isinstance(value, kind) else None


class _Page:
    """The `size` first tasks in the order (and whether more follow), from the cursor on."""

    def __init__(self, client: Client, size: int, cursor: _Cursor | None) -> None:
        self._client = client
        self._size = size
        self._cursor = cursor
        self._latest: dict[str, bool] = {}

    def _after_cursor(self, listed: _Listed) -> bool:
        cursor = self._cursor
        return cursor is None or listed.started != cursor.instant or listed.id not in cursor.listed

    def _listing(self, query: str) -> AsyncIterator[WorkflowExecution]:
        if self._cursor is not None:
            query += f" AND {self._cursor.bound()}"
        return self._client.list_workflows(query, page_size=self._size + 1)

    async def running(self, query: str) -> list[_Listed]:
        """Running tasks come newest started first: the first ones are the page's."""
        found: list[_Listed] = []
        async for execution in self._listing(f"{query} AND ExecutionStatus = 'Running'"):
            listed = _Listed.of(execution)
            if self._after_cursor(listed):
                found.append(listed)
                if len(found) > self._size:
                    break
        return found

    async def closed(self, query: str) -> list[_Listed]:
        """Closed tasks come by close time: read on until the oldest start kept is later
        than the close time reached, which no run read later can have started after."""
        wanted = self._size + 1
        kept: list[tuple[tuple[Instant, str], int, _Listed]] = []  # a min-heap of the newest
        tiebreak = itertools.count()
        ended = "ExecutionStatus != 'Running' AND ExecutionStatus != 'ContinuedAsNew'"
        async for execution in self._listing(f"{query} AND {ended}"):
            listed = _Listed.of(execution)
            reached = listed.closed or listed.started
            if len(kept) == wanted and kept[0][0][0] > reached:
                break
            if not self._after_cursor(listed):
                continue
            if len(kept) == wanted and listed.order <= kept[0][0]:
                continue
            if not await self._is_latest_run(listed):
                continue
            entry = (listed.order, next(tiebreak), listed)
            if len(kept) < wanted:
                heapq.heappush(kept, entry)
            else:
                heapq.heapreplace(kept, entry)
        return [listed for _, _, listed in kept]

    async def _is_latest_run(self, listed: _Listed) -> bool:
        if listed.execution.status not in _REPLACEABLE:
            return True
        if listed.id not in self._latest:
            latest = await _latest_run(self._client, listed.id)
            self._latest[listed.id] = latest == listed.execution.run_id
        return self._latest[listed.id]


def run_attributes(at: datetime, tenant: str | None) -> TypedSearchAttributes:
    """The search attributes a client sets on each run it starts: when the task first
    started (a run continued as new keeps it, so a long task is listed by its first start),
    and its tenant if it has one."""
    pairs: list[SearchAttributePair[Any]] = [SearchAttributePair(search.AGENT_TASK_STARTED, at)]
    if tenant is not None:
        pairs.append(SearchAttributePair(search.AGENT_TENANT, tenant))
    return TypedSearchAttributes(pairs)


@dataclass(frozen=True)
class TaskOrigin:
    """What a run that follows another one of the task carries from it, so the task is
    listed by its own text, first start and tenant, not by the run's."""

    started_at: datetime
    text: str | None
    tenant: str | None = None


async def task_origin(client: Client, task_id: str, run_id: str) -> TaskOrigin:
    """The task's first start time and text (its summary), as run `run_id` has them: set on
    it by the client when it followed an earlier run, else its own. Read without decoding
    the other search attributes (see waystation.client.health.TaskOverview)."""
    request = DescribeWorkflowExecutionRequest(
        namespace=client.namespace, execution=ExecutionRef(workflow_id=task_id, run_id=run_id)
    )
    raw = await reading(lambda: client.workflow_service.describe_workflow_execution(request))
    info = raw.workflow_execution_info
    started = info.start_time.ToDatetime(tzinfo=UTC)
    started = _attribute(info.search_attributes, search.AGENT_TASK_STARTED) or started
    tenant = _attribute(info.search_attributes, search.AGENT_TENANT)
    text = None
    if raw.execution_config.user_metadata.HasField("summary"):
        summary = raw.execution_config.user_metadata.summary
        [decoded] = await client.data_converter.decode([summary], [str])
        text = decoded if isinstance(decoded, str) and decoded else None
    return TaskOrigin(started, text, tenant)


def _attribute(
    attributes: SearchAttributes, key: SearchAttributeKey[SearchAttributeValueType]
) -> SearchAttributeValueType | None:
    """One search attribute, decoded alone (the others may not decode here)."""
    if key.name not in attributes.indexed_fields:
        return None
    only = SearchAttributes(indexed_fields={key.name: attributes.indexed_fields[key.name]})
    return decode_typed_search_attributes(only).get(key)


async def task_tenant(client: Client, task_id: str) -> str | None:
    """The tenant of the task's latest run (its AgentTenant; None without one): no worker
    needed. TaskNotFoundError for a task Temporal does not know."""
    request = DescribeWorkflowExecutionRequest(
        namespace=client.namespace, execution=ExecutionRef(workflow_id=task_id)
    )
    with task_errors(task_id):
        raw = await reading(lambda: client.workflow_service.describe_workflow_execution(request))
    return _attribute(raw.workflow_execution_info.search_attributes, search.AGENT_TENANT)


async def _latest_run(client: Client, task_id: str) -> str | None:
    """The run id of the task's latest run (None once Temporal has deleted the task); its
    memo is not decoded, so tasks encrypted with a key this side lacks are listed too."""
    request = DescribeWorkflowExecutionRequest(
        namespace=client.namespace, execution=ExecutionRef(workflow_id=task_id)
    )
    try:
        described = await reading(
            lambda: client.workflow_service.describe_workflow_execution(request)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return described.workflow_execution_info.execution.run_id


async def list_page(
    client: Client,
    query: str,
    page_size: int,
    page_token: bytes | None = None,
    *,
    running_only: bool = False,
) -> tuple[list[TaskSummary], bytes | None]:
    """A page of the tasks `query` finds, newest started first, and the token of the next
    page (None after the last). `running_only`: the query finds running tasks only."""
    cursor = _cursor(page_token) if page_token else None
    page = _Page(client, page_size, cursor)
    found = await page.running(query)
    if not running_only:
        found += await page.closed(query)
    # A task that closed between the two listings may be in both: keep its closed record.
    by_id: dict[str, _Listed] = {}
    for listed in found:
        seen = by_id.get(listed.id)
        if seen is None or (listed.started, listed.closed is not None) > (
            seen.started,
            seen.closed is not None,
        ):
            by_id[listed.id] = listed
    ordered = sorted(by_id.values(), key=lambda listed: listed.order, reverse=True)
    shown = ordered[:page_size]
    summaries = [await listed.summary(client) for listed in shown]
    if len(ordered) <= page_size:
        return summaries, None
    last = shown[-1].started
    listed_there = [listed.id for listed in shown if listed.started == last]
    if cursor is not None and cursor.instant == last:
        listed_there += cursor.listed
    after = _Cursor(seconds=last[0], nanos=last[1], listed=listed_there)
    return summaries, after.model_dump_json().encode()


async def with_latest_activity(client: Client, tasks: list[TaskSummary]) -> list[TaskSummary]:
    """`tasks` with `last_activity_at` of each running one: the time of its latest history
    event, one Temporal call each (a few at once). A task that cannot be read in time keeps
    none; a closed one has its close time already."""
    gate = asyncio.Semaphore(ACTIVITY_READS_AT_ONCE)

    async def latest(task: TaskSummary) -> TaskSummary:
        if task.closed_at is not None:
            return task
        async with gate:
            try:
                async with asyncio.timeout(ACTIVITY_READ_SECONDS):
                    at = await _latest_event_at(client, task.id)
            except (TimeoutError, RPCError):  # a nicety: the task is listed without it
                return task
        return task.model_copy(update={"last_activity_at": at})

    return list(await asyncio.gather(*(latest(task) for task in tasks)))


async def _latest_event_at(client: Client, task_id: str) -> datetime | None:
    """When the latest run of `task_id` recorded its latest history event."""
    request = GetWorkflowExecutionHistoryReverseRequest(
        namespace=client.namespace,
        execution=ExecutionRef(workflow_id=task_id),
        maximum_page_size=1,
    )
    response = await reading(
        lambda: client.workflow_service.get_workflow_execution_history_reverse(request)
    )
    events = response.history.events
    return events[0].event_time.ToDatetime(tzinfo=UTC) if events else None
