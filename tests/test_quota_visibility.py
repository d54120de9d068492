"""A model call waiting for its turn under a quota is visible: it tells its task (signal
`quota_notice`, as activities/quota_notices.py sends it), and the task shows
`waiting_quota` in its state and events, `ws status`, `ws list`, the API and its search
attribute until the call has its turn. A notice of an earlier step or attempt changes
nothing."""

from __future__ import annotations

import asyncio
import threading

from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type, wait_for_state
from tests.test_cli import listed_ids, starter
from tests.test_resume_fork_edges import api_over
from waystation.cli.render import render_state
from waystation.client.agent_runtime import AgentRuntime, TaskHandle
from waystation.testing.fake_openai import FakeOpenAI, Reply
from waystation.workflows import search
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.events import AgentState, fold
from waystation.workflows.models import QuotaNotice


async def tell(runtime: AgentRuntime, task_id: str, notice: QuotaNotice) -> None:
    """Signal the notice as the model call's activity would."""
    handle = runtime.client.get_workflow_handle(task_id)
    await handle.signal(AgentWorkflow.quota_notice, notice)


def waiting(limit: str = "requests_per_minute", attempt: int = 1, step: int = 1) -> QuotaNotice:
    return QuotaNotice.model_validate(
        {"state": "waiting", "step": step, "attempt": attempt, "quota": "openai"}
        | {"limit": limit, "expected_seconds": 12.0}
    )


def granted(attempt: int = 1, step: int = 1) -> QuotaNotice:
    return QuotaNotice(
        state="granted", step=step, attempt=attempt, quota="openai", waited_seconds=3.5
    )


async def held_call(
    runtime: AgentRuntime, fake_openai: FakeOpenAI, gate: threading.Event
) -> TaskHandle:
    """A task whose first model call streams one chunk, then is held until `gate` opens."""
    model = fake_openai.script([Reply(content="one two three", hold_after_chunks=1, gate=gate)])
    # Long clocks (the idle one below the fake's own limit on a held stream): only the gate
    # may end the held call, however busy the machine (a 5 s heartbeat timeout did once).
    task = agent_task(model, task="say three words", timeout=110, heartbeat_timeout_seconds=60)
    handle = await runtime.run(task)
    await fake_openai.until_streaming(model, 1, request=0)
    return handle


def limit_of(state: AgentState) -> str | None:
    return state.quota_wait.limit if state.quota_wait is not None else None


async def status_attribute(runtime: AgentRuntime, task_id: str) -> str | None:
    description = await runtime.client.get_workflow_handle(task_id).describe()
    return description.typed_search_attributes.get(search.AGENT_STATUS)


async def shown_everywhere(
    dev_env: WorkflowEnvironment, runtime: AgentRuntime, task_id: str
) -> None:
    """`ws status`, `GET /tasks/{id}`, the search attribute and `ws list` say the wait."""
    settings = runtime.settings
    code, out, err = await starter(dev_env, settings, "status", task_id, "--no-worker")
    assert code == 0, err
    assert "status    waiting_quota" in out
    wait_line = (
        "waiting   for its turn under the quota of openai (input tokens per minute), about 12 s"
    )
    assert wait_line in out
    async with api_over(runtime) as api:
        answer = await api.get(f"/tasks/{task_id}")
    assert answer.status_code == 200, answer.text
    shown = answer.json()["state"]
    assert shown["status"] == "waiting_quota"
    assert shown["quota_wait"]["quota"] == "openai"
    assert shown["quota_wait"]["limit"] == "input_tokens_per_minute"
    assert await status_attribute(runtime, task_id) == "waiting_quota"
    async with asyncio.timeout(60):  # until visibility lists it
        while task_id not in await listed_ids(dev_env, settings, "--status", "waiting_quota"):
            pass


async def test_a_call_waiting_for_its_quota_shows_until_it_has_its_turn(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    gate = threading.Event()
    try:
        handle = await held_call(dev_runtime, fake_openai, gate)
        await tell(dev_runtime, handle.id, waiting())
        state = await wait_for_state(handle, lambda s: s.status == "waiting_quota")
        assert state.quota_wait is not None
        assert (state.quota_wait.limit, state.quota_wait.attempt) == ("requests_per_minute", 1)
        since = state.quota_wait.since
        # Notices of an earlier attempt or step, or sent again, change nothing; the next
        # one is recorded.
        await tell(dev_runtime, handle.id, granted(attempt=0))
        await tell(dev_runtime, handle.id, waiting("concurrent_requests", step=0))
        await tell(dev_runtime, handle.id, waiting())
        await tell(dev_runtime, handle.id, waiting("input_tokens_per_minute"))
        state = await wait_for_state(handle, lambda s: limit_of(s) == "input_tokens_per_minute")
        assert state.status == "waiting_quota" and state.quota_wait is not None
        assert state.quota_wait.since == since  # the same wait, for another limit
        await shown_everywhere(dev_env, dev_runtime, handle.id)
        await tell(dev_runtime, handle.id, granted())
        state = await wait_for_state(handle, lambda s: s.status == "running")
        assert state.quota_wait is None
        assert await status_attribute(dev_runtime, handle.id) == "running"
        assert "waiting" not in render_state(state, handle.id)  # what `ws status` prints
    finally:
        gate.set()
    outcome = await handle.result()
    assert outcome.result == "one two three"
    events = await handle.events()
    kinds = [e.type for e in events]
    assert kinds == [
        "task_started",
        "waiting_quota",
        "waiting_quota",
        "quota_granted",
        "thought",
        "done",
    ]
    first, second = of_type(events, "waiting_quota")
    assert (first.quota, first.limit, first.expected_seconds, first.attempt) == (
        "openai",
        "requests_per_minute",
        12.0,
        1,
    )
    assert second.limit == "input_tokens_per_minute"
    [told] = of_type(events, "quota_granted")
    assert (told.quota, told.waited_seconds) == ("openai", 3.5)


async def test_a_call_that_ends_while_its_task_shows_a_wait_closes_it_before_its_thought(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    gate = threading.Event()
    try:
        handle = await held_call(dev_runtime, fake_openai, gate)
        await tell(dev_runtime, handle.id, waiting("paused"))
        await wait_for_state(handle, lambda s: s.status == "waiting_quota")
    finally:
        gate.set()
    outcome = await handle.result()
    assert outcome.result == "one two three"
    events = await handle.events()
    assert [e.type for e in events] == [
        "task_started",
        "waiting_quota",
        "quota_granted",
        "thought",
        "done",
    ]
    [closed] = of_type(events, "quota_granted")
    assert closed.quota == "openai" and closed.waited_seconds >= 0
    state = fold(events)
    assert (state.status, state.quota_wait) == ("done", None)
