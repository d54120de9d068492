"""Long runs: a 1,000-step task completes, every run's history stays small and flat per step."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from runtime.agent_runtime import AgentRuntime
from runtime.settings import Settings
from runtime.streaming import StreamItem
from testing.fake_openai import FakeOpenAI, Reply, text, tools
from testing.workers import WorkerProcess
from tests.helpers import agent_task, pending_requests
from workflows.models import Decision
from workflows.stream import LlmAttemptStarted, TokenDelta

STEPS = 1000
TWO_KB = "x" * 2048


async def test_a_thousand_step_task_with_flat_history(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    steps = 0

    def reply(body: dict[str, Any]) -> Reply:
        nonlocal steps
        if not body.get("tools"):
            return text(f"summary: {len(body['messages'])} messages")  # summarize_context
        steps += 1
        if steps >= STEPS:
            return text("a thousand steps later")
        return tools(("calculator", {"expression": "1 + 1"}), content=TWO_KB)

    # The offline-free fake answers at once; the conversation carries 2 KB a step.
    model = fake_openai.script(reply)
    handle = await dev_runtime.run(
        agent_task(
            model,
            max_steps=STEPS + 10,
            context_limit_tokens=20_000,
            continue_as_new_after_steps=200,
        )
    )
    outcome = await handle.result()
    assert outcome.result == "a thousand steps later" and outcome.steps >= STEPS

    runs: list[tuple[int, int]] = []  # (history bytes, LLM steps) per run, newest first
    run_id: str | None = None
    while True:
        run = dev_env.client.get_workflow_handle(handle.id, run_id=run_id)
        history = await run.fetch_history()
        # Temporal's own accounting of the run's history, which its limits apply to.
        size = (await run.describe()).raw_info.history_size_bytes
        steps = sum(
            1
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == "call_llm"
        )
        runs.append((size, steps))
        started = history.events[0].workflow_execution_started_event_attributes
        if not started.continued_execution_run_id:
            break
        run_id = started.continued_execution_run_id
    runs.reverse()
    assert len(runs) >= 3  # it continued as new by itself, on history size
    assert max(size for size, _ in runs) < 2_000_000, runs
    # Flat: a step late in the task adds no more history than one early on. The first run
    # summarizes nothing yet, so its steps are cheapest; from then on the cost is steady.
    per_step = [size / steps for size, steps in runs[:-1]]
    print(
        f"\n{outcome.steps} steps, {len(runs)} runs, KB per run {[s // 1000 for s, _ in runs]}, "
        f"bytes per step {[round(b) for b in per_step]}"
    )
    assert per_step[-1] < 1.5 * per_step[1], per_step
    assert per_step[-1] < 2.0 * per_step[0], per_step


async def test_a_retry_after_a_crash_sends_the_same_conversation(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    address = dev_env.client.service_client.config.target_host

    def reply(body: dict[str, Any]) -> Reply:
        if sum(m["role"] == "tool" for m in body["messages"]) == 0:
            return tools(("calculator", {"expression": "6*7"}), content="first")
        return Reply(content=" ".join(["slow"] * 200), chunk_delay=0.02)  # step 2 streams slowly

    model = fake_openai.script(reply)
    first = await WorkerProcess(address, settings).ready()
    runtime = AgentRuntime(dev_env.client, settings)
    handle = await runtime.run(agent_task(model))
    second = None
    try:
        async for item in runtime.stream(handle.id, topics=["tokens"]):
            if item.data.step == 2:  # type: ignore[union-attr]
                second = await WorkerProcess(address, settings).ready()
                first.kill()  # mid-stream of step 2
                break
        await handle.result()
    finally:
        first.kill()
        if second is not None:
            second.kill()
    step_two = [r["messages"] for r in fake_openai.requests[model] if len(r["messages"]) > 2]
    assert len(step_two) >= 2  # the killed attempt and its retry
    assert all(messages == step_two[0] for messages in step_two)


def effects(settings: Settings) -> list[str]:
    path = settings.workspace_dir / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


async def run_ids(dev_env: WorkflowEnvironment, task_id: str) -> list[str]:
    """The task's runs, oldest first."""
    ids: list[str] = []
    run_id: str | None = None
    while True:
        handle = dev_env.client.get_workflow_handle(task_id, run_id=run_id)
        history = await handle.fetch_history()
        ids.append(history.run_id)
        started = history.events[0].workflow_execution_started_event_attributes
        if not started.continued_execution_run_id:
            return list(reversed(ids))
        run_id = started.continued_execution_run_id


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
    async with asyncio.timeout(20):  # the run hands over while both requests are open
        while len(await run_ids(dev_env, handle.id)) < 2:
            await asyncio.sleep(0.1)
    state = await handle.state()
    assert set(state.pending_approvals) == {first, second}
    await handle.approve(first, approver="alice")
    await dev_env.client.get_workflow_handle(handle.id).signal(
        "reject", Decision(request_id=second, decision="reject", message="one is enough")
    )
    outcome = await handle.result()
    await asyncio.wait_for(subscriber, 20)
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
    assert len(await run_ids(dev_env, handle.id)) >= 2
