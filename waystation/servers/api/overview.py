"""What the console reads besides the task routes: who is calling, tasks with their text, and
a task's log with where its stream stands."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Iterable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from waystation.activities.run_history import read_run_input
from waystation.client.agent_runtime import QUERY_TIMEOUT, AgentRuntime, TaskSummary
from waystation.client.task_list import with_latest_activity
from waystation.servers.api.auth import OwnedTaskId, Reader, Runtime, settings_of
from waystation.servers.api.paging import decode_page_token, encode_page_token
from waystation.servers.api.paths import TASK
from waystation.servers.usage import TaskUsage
from waystation.vocabulary import STATUS_FILTERS, ApprovalRule, StatusFilter
from waystation.workflows.events import AgentEvent

router = APIRouter(tags=["console"])

TEXTS_KEPT = 10_000  # task texts remembered per process (a task's text never changes)
SCANNED_PER_SEARCH = 500  # tasks read for one page of search results, at most
LOOKUPS_AT_ONCE = 8
TEXT_TIMEOUT_SECONDS = 5.0
T = TypeVar("T")


class ToolInfo(BaseModel):
    name: str
    approval: ApprovalRule = Field(description="The tool's default approval rule.")


class ConsoleSession(BaseModel):
    """Who the caller is and what the start-task form offers."""

    name: str
    role: Literal["reader", "approver"]
    tokens_required: bool = Field(description="False when the API runs without tokens.")
    tenant: str | None = Field(
        default=None, description="The tenant the token is bound to: it sees no other's tasks."
    )
    default_model: str
    tools: list[ToolInfo] = Field(description="The deployment's tools and their default rules.")
    max_steps_cap: int = Field(description="The most max_steps a task may ask for.")
    statuses: list[StatusFilter] = Field(description="What the task list filters on.")


class ListedTask(TaskSummary):
    task: str = Field(description="The task's text (its first line, shortened).")
    usage: TaskUsage | None = Field(  # type: ignore[assignment]  # the counts, and their ratio
        default=None,
        description="The task's tokens and cache-hit ratio as of its latest change of status "
        "(a closed task's final count), from its memo: no worker is asked (null for a task "
        "that has not changed status since before they were kept there).",
    )


class ListedTaskPage(BaseModel):
    tasks: list[ListedTask]
    next_page_token: str | None = None
    scanned: int = Field(
        description="Tasks read to make this page (more than shown when searching)."
    )


class Timeline(BaseModel):
    """A task's whole event log, and where its stream stands, read at once."""

    events: list[AgentEvent]
    head: int = Field(description="The offset the task's next stream item will get.")


async def bounded(works: Iterable[Awaitable[T]], at_once: int) -> list[T]:
    """Await `works` concurrently, at most `at_once` at a time, results in order."""
    gate = asyncio.Semaphore(at_once)

    async def one(work: Awaitable[T]) -> T:
        async with gate:
            return await work

    return list(await asyncio.gather(*(one(w) for w in works)))


def offered_tools(runtime: AgentRuntime) -> list[ToolInfo]:
    """The deployment's tools, which the start form offers a rule for."""
    return [ToolInfo(name=t.name, approval=t.approval) for t in runtime.tools.allowed(None)]


def remembered(request: Request, name: str) -> OrderedDict[str, Any]:
    """A per-process memory of the app's, made on first use (least recently used first)."""
    memory: OrderedDict[str, Any] | None = getattr(request.app.state, name, None)
    if memory is None:
        memory = OrderedDict()
        setattr(request.app.state, name, memory)
    return memory


async def read_task_text(runtime: AgentRuntime, task_id: str) -> str:
    """A task's text: the summary its latest run was started with, or (a run continued as new
    has none) the task in the run's input. Needs Temporal only, never a worker."""
    description = await runtime.get(task_id).describe()
    summary = await description.static_summary()
    if summary:
        return summary
    run = await read_run_input(runtime.client, task_id)
    task = run.task if run is not None else None
    return " ".join(task.task.split())[:200] if task is not None else ""


async def task_text(request: Request, runtime: AgentRuntime, task_id: str) -> str:
    """The task's text, remembered per process; empty when Temporal does not answer in time."""
    texts: OrderedDict[str, str] = remembered(request, "console_task_texts")
    if task_id in texts:
        texts.move_to_end(task_id)
        return texts[task_id]
    try:
        async with asyncio.timeout(TEXT_TIMEOUT_SECONDS):
            text = await read_task_text(runtime, task_id)
    except Exception:  # a text is a nicety: a task that cannot be read is listed without one
        return ""
    texts[task_id] = text
    while len(texts) > TEXTS_KEPT:
        texts.popitem(last=False)
    return text


@router.get("/console/api/session", response_model=ConsoleSession)
async def session(request: Request, who: Reader, runtime: Runtime) -> ConsoleSession:
    """Who the token belongs to, and the defaults of the start-task form."""
    return ConsoleSession(
        name=who.name,
        role=who.role,
        tenant=who.tenant,
        tokens_required=bool(settings_of(request).api_tokens),
        default_model=runtime.settings.default_model,
        tools=offered_tools(runtime),
        max_steps_cap=runtime.settings.max_steps_cap,
        statuses=list(STATUS_FILTERS),
    )


@router.get("/console/api/tasks", response_model=ListedTaskPage)
async def listed_tasks(
    request: Request,
    runtime: Runtime,
    who: Reader,
    status: StatusFilter | None = None,
    q: Annotated[str | None, Query(max_length=200, description="Text the task contains.")] = None,
    page_size: Annotated[int, Query(ge=1, le=200)] = 25,
    page_token: Annotated[str | None, Query(max_length=4096)] = None,
) -> ListedTaskPage:
    """Tasks, newest first, with their text, turns and latest activity; `q` keeps those whose
    text contains it (case-insensitive), reading on through up to 500 tasks for one page of
    matches. A token bound to a tenant lists that tenant's tasks only."""
    token = decode_page_token(page_token) if page_token else None
    wanted = q.casefold().strip() if q else ""
    found: list[ListedTask] = []
    scanned = 0
    while True:
        tasks, token = await runtime.list_tasks(status, page_size, token, tenant=who.tenant)
        texts = await bounded((task_text(request, runtime, t.id) for t in tasks), LOOKUPS_AT_ONCE)
        scanned += len(tasks)
        found += [
            ListedTask(**t.model_dump(), task=text)
            for t, text in zip(tasks, texts, strict=True)
            if wanted in text.casefold()
        ]
        if not wanted or len(found) >= page_size or token is None:
            break
        if scanned >= SCANNED_PER_SEARCH:
            break
    found = [
        ListedTask(**t.model_dump())
        for t in await with_latest_activity(runtime.client, list(found))
    ]
    encoded = encode_page_token(token) if token else None
    return ListedTaskPage(tasks=found, next_page_token=encoded, scanned=scanned)


@router.get(f"/console/api/tasks/{TASK}/timeline", response_model=Timeline)
async def timeline(task_id: OwnedTaskId, runtime: Runtime, who: Reader) -> Timeline:
    """Everything a task page starts from, in one round: the log (across runs) and the
    stream's head, read concurrently (a finished task answers each by a replay)."""
    handle = await runtime.find(task_id)
    head = runtime.bounded(task_id, runtime.stream_head(task_id), QUERY_TIMEOUT, "a query")
    events, position = await asyncio.gather(handle.events(0), head)
    return Timeline(events=events, head=position)
