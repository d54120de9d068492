"""The quota gate end to end, in a real worker process: a task whose call waits for its turn
shows `waiting_quota` (what it waits for) until the call has it, and another tenant's task
is served before the first tenant's backlog drains, the backlog's waiting calls holding
none of the worker's slots for other activities."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from tests.helpers import wait_for_state
from tests.test_quota_fleet import limited, workers
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.handle import TaskHandle
from waystation.testing.fake_openai import FakeOpenAI, Reply, text
from waystation.workflows.events import QuotaGranted, Thought, WaitingQuota
from waystation.workflows.models import AgentTask, ModelSettings

# Generous: only the gate ends the held call, however busy the machine.
HEARTBEAT_SECONDS = 30.0


def task(model: str, text_: str, tenant: str) -> AgentTask:
    return AgentTask(
        task=text_,
        model=ModelSettings(name=f"limited:{model}"),
        tenant=tenant,
        heartbeat_timeout_seconds=HEARTBEAT_SECONDS,
    )


class HeldFirst:
    """Replies to each request in order of arrival, holding the first open until `gate` is
    set; records each request's task text."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.tasks: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        with self._lock:
            self.tasks.append(user)
            first = len(self.tasks) == 1
        if first:
            return text("held then done", hold_after_chunks=1, gate=self.gate)
        return text("done")


async def until_waiting(handles: list[TaskHandle], count: int, within: float = 60.0) -> None:
    """Until `count` of the tasks show that their call waits for its turn."""
    async with asyncio.timeout(within):
        while True:
            states = [await h.state() for h in handles]
            if sum(s.status == "waiting_quota" for s in states) >= count:
                return
            await asyncio.sleep(0.1)


async def test_a_task_waiting_for_its_quota_shows_what_it_waits_for_until_its_turn(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    settings, declared = limited(fake_openai, tmp_path, {"concurrent_requests": 1})
    replies = HeldFirst()
    model = fake_openai.script(replies)
    runtime = AgentRuntime(dev_env.client, settings)
    try:
        async with workers(dev_env, settings, declared, 1):
            first = await runtime.run(task(model, "first", "a"))
            await fake_openai.until_streaming(model, 1, request=0)
            second = await runtime.run(task(model, "second", "b"))
            state = await wait_for_state(second, lambda s: s.status == "waiting_quota")
            assert state.quota_wait is not None
            assert (state.quota_wait.quota, state.quota_wait.limit) == (
                "limited",
                "concurrent_requests",
            )
            replies.gate.set()
            assert (await second.result()).result == "done"
            assert (await first.result()).result == "held then done"
            events = await second.events()
    finally:
        replies.gate.set()
    kinds = [type(e) for e in events if isinstance(e, WaitingQuota | QuotaGranted | Thought)]
    assert kinds == [WaitingQuota, QuotaGranted, Thought]
    assert replies.tasks == ["first", "second"]


async def test_another_tenants_task_goes_before_the_first_tenants_backlog_drains(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    settings, declared = limited(fake_openai, tmp_path, {"concurrent_requests": 1})
    replies = HeldFirst()
    model = fake_openai.script(replies)
    runtime = AgentRuntime(dev_env.client, settings)
    try:
        # Two slots for activities other than model calls: the waiting calls take none.
        slots = {"WAYSTATION_WORKER_ACTIVITY_SLOTS": "2"}
        async with workers(dev_env, settings, declared, 1, slots):
            backlog = [await runtime.run(task(model, f"a{n}", "a")) for n in range(6)]
            await fake_openai.until_streaming(model, 1, request=0)
            await until_waiting(backlog, 5)  # every other call of tenant a queues for its turn
            other = await runtime.run(task(model, "b0", "b"))
            await wait_for_state(other, lambda s: s.status == "waiting_quota")
            replies.gate.set()
            for handle in [*backlog, other]:
                await handle.result()
    finally:
        replies.gate.set()
    # Served in order of arrival, b0 would be last; the tenant with fewer calls goes next.
    assert len(replies.tasks) == 7
    assert replies.tasks.index("b0") == 1, replies.tasks
