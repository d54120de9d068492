"""Long runs: a 1,000-step task completes, every run's history stays small and flat per step."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, pending_requests, run_histories
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.streaming import StreamItem
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.models import Decision
from waystation.workflows.stream import LlmAttemptStarted, TokenDelta

STEPS = 2000
TWO_KB = "x" * 2048


async def runs_of(client: Client, task_id: str) -> list[tuple[int, int]]:
    """(history bytes as Temporal counts them, model calls) of each run, oldest first."""
    runs: list[tuple[int, int]] = []
    for history in reversed(await run_histories(client, task_id)):
        run = client.get_workflow_handle(task_id, run_id=history.run_id)
        size = (await run.describe()).raw_info.history_size_bytes
        calls = sum(
            1
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == "call_llm"
        )
        runs.append((size, calls))
    return runs


@pytest.mark.long(minutes=4)
@pytest.mark.timeout(1200)  # minutes when both cores are busy; pytest's default is 5
async def test_two_thousand_steps_with_default_settings_stay_flat(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    """No limit, window or continue-as-new setting: the defaults keep every run small, the
    cost of a step flat, and the whole log readable a page at a time."""

    def reply(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return text(f"summary of {len(body['messages'])} messages")  # summarize_context
        # The step is read from the conversation (step k asked for `k + 1`), not counted:
        # a retried request gets the same answer, so a busy machine cannot shorten the run.
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        step = int(results[-1]) if results else 1
        if step >= STEPS:
            return text("two thousand steps later")
        return tools(("calculator", {"expression": f"{step} + 1"}), content=TWO_KB)

    # Counted, not recorded: the 2,000 request bodies (~90 MB of JSON) would stay in the
    # session's fake server for every later test.
    model = fake_openai.script(reply, record=False)
    handle = await dev_runtime.run(agent_task(model, max_steps=STEPS + 10))
    outcome = await handle.result()
    assert outcome.result == "two thousand steps later" and outcome.steps == STEPS

    runs = await runs_of(dev_env.client, handle.id)
    per_step = [size / calls for size, calls in runs if calls]
    print(
        f"\n{outcome.steps} steps, {len(runs)} runs, KB per run {[s // 1000 for s, _ in runs]}, "
        f"bytes per step {[round(b) for b in per_step]}"
    )
    assert len(runs) >= 3  # it continued as new by itself, on history size
    assert max(size for size, _ in runs) < 2_000_000, runs
    complete = per_step[:-1] if runs[-1][1] < runs[0][1] // 2 else per_step
    assert complete[-1] < 1.5 * complete[0], per_step

    # The whole log, a page at a time: no gap, no repeat, each page from the runs it needs.
    seq, pages = 0, 0
    while True:
        # Closed runs are read from the event archive; one that is not there is replayed,
        # seconds on a busy machine: bounded generously, as a wait for a state.
        page = await handle.events(seq, limit=1000, within=timedelta(minutes=2))
        if not page:
            break
        assert [e.seq for e in page] == list(range(seq, seq + len(page)))
        seq, pages = page[-1].seq + 1, pages + 1
    assert seq == outcome.last_seq + 1 and pages >= 6


async def test_a_retry_after_a_crash_sends_the_same_conversation(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    """The worker is killed while step 2's answer is provably mid-stream (the fake server
    holds it open); the retry on another worker sends the model the same conversation."""
    address = dev_env.client.service_client.config.target_host
    gate = threading.Event()

    def reply(body: dict[str, Any]) -> Reply:
        if sum(m["role"] == "tool" for m in body["messages"]) == 0:
            return tools(("calculator", {"expression": "6*7"}), content="first")
        return Reply(content=" ".join(["slow"] * 50), hold_after_chunks=10, gate=gate)

    model = fake_openai.script(reply)
    first = await WorkerProcess(address, settings).ready()
    runtime = AgentRuntime(dev_env.client, settings)
    # The stream stays held while a second worker starts, which takes a while on a busy
    # machine: the model's idle clock must not end the attempt before the kill does.
    handle = await runtime.run(agent_task(model, timeout=120))
    second = None
    try:
        await fake_openai.until_streaming(model, chunks=10, request=1)
        second = await WorkerProcess(address, settings).ready()
        first.kill()  # step 2's stream is held open: the kill lands inside it
        gate.set()
        await handle.result()
    finally:
        gate.set()
        first.kill()
        if second is not None:
            second.kill()
    step_two = [r["messages"] for r in fake_openai.requests[model] if len(r["messages"]) > 2]
    assert len(step_two) == 2  # the killed attempt and its retry
    assert step_two[0] == step_two[1]


def effects(settings: Settings) -> list[str]:
    path = settings.workspace_dir / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


async def run_ids(client: Client, task_id: str) -> list[str]:
    """The task's runs, oldest first."""
    return [h.run_id for h in reversed(await run_histories(client, task_id))]


async def test_continue_as_new_amid_a_retry_a_pending_approval_and_a_subscription(
    dev_env: WorkflowEnvironment,
    dev_runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    """Step 1's first model attempt streams and is cut; the retry asks for two shell calls,
    and the run hands over while both wait for a person; a subscriber reads throughout."""
    calls = [
        ("run_shell", {"command": "echo approved >> effects.txt"}),
        ("run_shell", {"command": "echo rejected >> effects.txt"}),
    ]
    model = fake_openai.script(
        [
            Reply(content="thinking out loud for a while", cut_after_chunks=3, chunk_delay=0.06),
            tools(*calls, content="two commands"),
            text("one ran, one was refused"),
        ]
    )
    handle = await dev_runtime.run(agent_task(model, continue_as_new_after_steps=1))
    items: list[StreamItem] = []

    async def subscribe() -> None:
        async for item in dev_runtime.stream(handle.id, since=0):
            items.append(item)

    subscriber = asyncio.create_task(subscribe())
    first, second = await pending_requests(handle, count=2)
    async with asyncio.timeout(60):  # the run hands over while both requests are open
        while len(await run_ids(dev_env.client, handle.id)) < 2:
            await asyncio.sleep(0.1)
    state = await handle.state()
    assert set(state.pending_approvals) == {first, second}
    await handle.approve(first, approver="alice")
    await dev_env.client.get_workflow_handle(handle.id).signal(
        "reject", Decision(request_id=second, decision="reject", message="one is enough")
    )
    outcome = await handle.result()
    await asyncio.wait_for(subscriber, 60)
    assert outcome.result == "one ran, one was refused"
    assert effects(settings) == ["approved"]  # once, in the run after the hand-over

    # The audit trail reads across the runs with no gap and no event twice.
    events = await handle.events()
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.type for e in events].count("approval_requested") == 2
    assert [e.type for e in events].count("action") == 2
    assert [e.type for e in events].count("approval_resolved") == 2
    assert [(e.tool, e.is_error) for e in events if e.type == "observation"] == [
        ("run_shell", False),
        ("run_shell", True),
    ]
    # The subscriber saw every event once, in order, and the void attempt's tokens before
    # the retry marker; the thought is the retry's.
    assert [i.data for i in items if i.topic == "events"] == events
    assert [i.offset for i in items] == sorted({i.offset for i in items})
    tokens = [i.data for i in items if isinstance(i.data, TokenDelta)]
    assert {t.attempt for t in tokens} >= {1}
    markers = [i.data for i in items if isinstance(i.data, LlmAttemptStarted)]
    assert [(m.step, m.attempt) for m in markers] == [(1, 2)]
    [thought] = [e for e in events if e.type == "thought" and e.step == 1]
    assert thought.attempt == 2 and thought.content == "two commands"
    # Both attempts of step 1 sent the model the same conversation.
    requests = fake_openai.requests[model]
    assert requests[0]["messages"] == requests[1]["messages"]
    assert len(await run_ids(dev_env.client, handle.id)) >= 2
