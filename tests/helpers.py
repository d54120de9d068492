"""Small waits and look-ups shared by the tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from runtime.agent_runtime import NoWorkerError, TaskHandle
from workflows.events import AgentEvent, AgentState
from workflows.models import AgentTask, ModelSettings


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
