"""Small waits and look-ups shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from waystation.client.agent_runtime import AgentRuntime, NoWorkerError, TaskHandle
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings
from waystation.testing.proc import free_port
from waystation.testing.workers import running_worker
from waystation.workflows.events import AgentEvent, AgentState
from waystation.workflows.models import AgentTask, ModelSettings


def agent_task(model: str, task: str = "do the thing", **kw: Any) -> AgentTask:
    timeout = kw.pop("timeout", 5)
    settings = ModelSettings(
        name=model, request_timeout_seconds=timeout, first_chunk_timeout_seconds=timeout
    )
    return AgentTask(task=task, model=settings, **kw)


async def wait_for_state(
    handle: TaskHandle, predicate: Callable[[AgentState], bool], timeout: float = 60.0
) -> AgentState:
    """Poll the state query until `predicate` holds (bounded: fails after `timeout`). A
    query no worker answers in time (workers dying, replaying) is asked again."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                state = await handle.state()
            except NoWorkerError:
                continue
            if predicate(state):
                return state
            await asyncio.sleep(0.05)


async def pending_requests(handle: TaskHandle, count: int = 1, timeout: float = 60.0) -> list[str]:
    state = await wait_for_state(handle, lambda s: len(s.pending_approvals) >= count, timeout)
    return list(state.pending_approvals)


def of_type(events: list[AgentEvent], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]


# The stamps a retried workflow task gives its events anew.
RESTAMPED = ("at", "history_length")
_RETRIED = (EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)


async def run_histories(client: Client, task_id: str) -> list[WorkflowHistory]:
    """Every run of the task's chain, newest first (each run names the one it continues)."""
    histories = [await client.get_workflow_handle(task_id).fetch_history()]
    while (
        earlier := histories[-1]
        .events[0]
        .workflow_execution_started_event_attributes.continued_execution_run_id
    ):
        histories.append(await client.get_workflow_handle(task_id, run_id=earlier).fetch_history())
    return histories


async def workflow_tasks_retried(client: Client, task_id: str) -> int:
    """How many workflow tasks of the task's runs timed out or failed (each then retried)."""
    histories = await run_histories(client, task_id)
    return sum(1 for h in histories for e in h.events if e.event_type in _RETRIED)


def _unstamped(item: BaseModel | dict[str, Any]) -> dict[str, Any]:
    """An event, a stream item or an SSE item (a dict), without its event's stamps."""
    whole = dict(item) if isinstance(item, dict) else item.model_dump(mode="json")
    event = whole
    if isinstance(whole.get("data"), dict):  # a stream item's event
        event = whole["data"] = dict(whole["data"])
    for stamp in RESTAMPED:
        event.pop(stamp, None)
    return whole


async def same_unless_restamped(
    client: Client,
    task_id: str,
    live: Sequence[BaseModel | dict[str, Any]],
    durable: Sequence[BaseModel | dict[str, Any]],
) -> None:
    """What a reader saw live equals the durable log, item for item. A reader sees a workflow
    task's state before Temporal has accepted the task; when a busy worker finished one past
    its timeout, the retry records the same events with its own stamps (`at`,
    `history_length`): only those may differ, and only then (docs/never-stuck.md)."""
    if list(live) == list(durable):
        return
    assert await workflow_tasks_retried(client, task_id), "live and durable differ, no retry"
    assert [_unstamped(i) for i in live] == [_unstamped(i) for i in durable]


@contextlib.asynccontextmanager
async def serving_api(app: FastAPI) -> AsyncIterator[int]:
    """`app` served by uvicorn on a free loopback port until the block ends; yields the port."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        await serving


@contextlib.asynccontextmanager
async def api_with_tokens(
    env: WorkflowEnvironment, settings: Settings, tokens: Mapping[str, ApiToken]
) -> AsyncIterator[httpx.AsyncClient]:
    """The API (and its /mcp) on a free port with `tokens`, a worker of the settings' queue,
    and a client of the API."""
    settings = settings.model_copy(update={"api_tokens": dict(tokens)})
    app = create_app(settings, AgentRuntime(env.client, settings), sse_ping_seconds=0.5)
    async with serving_api(app) as port:
        async with running_worker(env.client, settings):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                yield client
