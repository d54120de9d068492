"""Streaming: every event and token live, from any offset, across retries and continue-as-new."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import QueryWorkflowInput
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, pending_requests, run_histories, same_unless_restamped
from waystation.client import stream_wire
from waystation.client.agent_runtime import AgentRuntime, TaskNotFoundError
from waystation.client.streaming import POLL_TIMEOUT, StreamGap, StreamItem, in_sequence
from waystation.settings import Settings
from waystation.testing.client_hooks import ClientHooks
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.workflows.stream import LlmAttemptStarted, TokenDelta


def five_step_script(fake: FakeOpenAI) -> str:
    """Four steps that stream for a few hundred ms each, then an instant final answer."""
    return fake.script(
        [
            tools(
                ("calculator", {"expression": f"{i} * 2"}),
                content=f"step {i} now",
                chunk_delay=0.05,
            )
            for i in range(4)
        ]
        + [text("all five steps are done, the answer is 6")]
    )


async def collect(stream: AsyncIterator[StreamItem], limit: int | None = None) -> list[StreamItem]:
    items: list[StreamItem] = []
    async with asyncio.timeout(60):
        async for item in stream:
            items.append(item)
            if limit is not None and len(items) >= limit:
                break
    return items


async def test_a_live_stream_equals_the_event_log(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    handle = await dev_runtime.run(agent_task(five_step_script(fake_openai)))
    items = await collect(dev_runtime.stream(handle.id, since=0))
    offsets = [i.offset for i in items]
    assert offsets == list(range(len(items)))  # global, strictly increasing, no gap
    streamed_events = [i.data for i in items if i.topic == "events"]
    await same_unless_restamped(
        dev_runtime.client, handle.id, streamed_events, await handle.events()
    )
    assert streamed_events[-1].type == "done" and items[-1].terminal
    tokens = [i.data for i in items if i.topic == "tokens"]
    assert tokens and all(isinstance(t, TokenDelta) for t in tokens)
    # The tokens of each streaming step spell the step's thought, and come before it. The
    # instant last answer comes whole with its thought; it publishes tokens only when its
    # call outlasts the first batch's interval (a busy machine), and then they spell it too.
    thoughts = [e for e in streamed_events if e.type == "thought"]
    streamed_steps = {t.step for t in tokens}  # type: ignore[union-attr]
    assert streamed_steps >= {thought.step for thought in thoughts[:-1]}
    for thought in (t for t in thoughts if t.step in streamed_steps):
        spelled = "".join(t.text for t in tokens if t.step == thought.step)  # type: ignore[union-attr]
        assert spelled == thought.content
        first_token = next(
            i.offset
            for i in items
            if isinstance(i.data, TokenDelta) and i.data.step == thought.step
        )
        assert first_token < next(i.offset for i in items if i.data is thought)


async def test_reconnect_at_random_cut_points_loses_and_repeats_nothing(
    dev_env: WorkflowEnvironment,
    dev_runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    # Steps slow enough to stream tokens, so cut points fall among tokens and events.
    handle = await dev_runtime.run(agent_task(five_step_script(fake_openai)))
    rng = random.Random(20261129)
    received: list[StreamItem] = []
    while not (received and received[-1].terminal):
        # Each reconnect is a new process's view: a fresh runtime, its own fan-out hub.
        viewer = AgentRuntime(dev_env.client, settings)
        since = received[-1].offset + 1 if received else 0
        received += await collect(viewer.stream(handle.id, since=since), limit=rng.randint(1, 6))
    everything = await collect(AgentRuntime(dev_env.client, settings).stream(handle.id, since=0))
    assert [i.offset for i in received] == [i.offset for i in everything]
    await same_unless_restamped(dev_env.client, handle.id, received, everything)


async def test_a_lost_poll_is_asked_again_and_the_live_stream_goes_on(
    dev_env: WorkflowEnvironment,
    dev_runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    deadlines: list[timedelta | None] = []

    async def lose_polls_three_and_four(input: QueryWorkflowInput) -> None:
        if input.query == stream_wire.POLL_QUERY:
            deadlines.append(input.rpc_timeout)
            if len(deadlines) in (3, 4):
                # How the SDK fails a query past its deadline: one lost with a run the SDK
                # evicted, or one a paused worker could not answer.
                raise RPCError("Timeout expired", RPCStatusCode.CANCELLED, b"")

    hooks = ClientHooks(before_query=lose_polls_three_and_four)
    viewer = AgentRuntime(hooks.client(dev_env.client), settings)
    model = fake_openai.script(
        [tools(("run_shell", {"command": "echo held"}), content="asking first"), text("done")]
    )
    handle = await dev_runtime.run(agent_task(model))
    [request] = await pending_requests(handle)  # the task is held at its approval
    following = asyncio.create_task(collect(viewer.stream(handle.id, since=0)))
    async with asyncio.timeout(60):
        while len(deadlines) < 6 and not following.done():
            await asyncio.sleep(0.05)
    await handle.approve(request)
    items = await following
    assert [i.offset for i in items] == list(range(len(items)))
    assert items[-1].terminal
    live = [i.data for i in items if i.topic == "events"]
    await same_unless_restamped(dev_env.client, handle.id, live, await handle.events())
    # Each poll lost in a row doubles the next one's deadline; the one answered is kept.
    assert deadlines[:6] == [POLL_TIMEOUT] * 3 + [POLL_TIMEOUT * 2] + [POLL_TIMEOUT * 4] * 2


async def test_a_finished_task_streams_everything_then_ends(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    handle = await dev_runtime.run(agent_task(five_step_script(fake_openai)))
    await handle.result()
    items = await collect(dev_runtime.stream(handle.id, since=0))
    assert items[0].data.type == "task_started" and items[-1].data.type == "done"
    later = await collect(dev_runtime.stream(handle.id, since=items[5].offset))
    assert later == items[5:]
    events_only = await collect(dev_runtime.stream(handle.id, since=0, topics=["events"]))
    assert [i.data for i in events_only] == await handle.events()


async def test_a_retried_attempt_marks_its_partial_text_void(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            # Slow enough to go live before the cut: its partial tokens are in the stream.
            Reply(
                content="this partial answer will be cut off", cut_after_chunks=4, chunk_delay=0.05
            ),
            text("the real answer"),
        ]
    )
    handle = await dev_runtime.run(agent_task(model))
    items = await collect(dev_runtime.stream(handle.id, since=0))
    tokens = [i.data for i in items if isinstance(i.data, TokenDelta)]
    by_attempt: dict[int, str] = {}
    for token in tokens:
        by_attempt[token.attempt] = by_attempt.get(token.attempt, "") + token.text
    assert set(by_attempt) == {1, 2}
    assert by_attempt[1] == "this partial answer "
    assert by_attempt[2] == "the real answer"
    markers = [i for i in items if isinstance(i.data, LlmAttemptStarted)]
    assert [(m.data.step, m.data.attempt) for m in markers] == [(1, 2)]  # type: ignore[union-attr]
    first_token_of_retry = next(
        i for i in items if isinstance(i.data, TokenDelta) and i.data.attempt == 2
    )
    assert markers[0].offset < first_token_of_retry.offset
    thought = next(i.data for i in items if i.data.type == "thought")
    assert thought.content == by_attempt[2] and thought.attempt == 2


async def test_fifty_subscribers_share_one_upstream_subscription(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([tools(("run_shell", {"command": "echo hi"})), text("done")])
    handle = await dev_runtime.run(agent_task(model))
    [request] = await pending_requests(handle)  # the task parks: everyone can attach
    subscribers = [
        asyncio.create_task(collect(dev_runtime.stream(handle.id, since=0))) for _ in range(50)
    ]
    await handle.approve(request)
    results = await asyncio.gather(*subscribers)
    assert all(r == results[0] for r in results)
    assert results[0][-1].data.type == "done"
    # Watchers follow by Query: nothing they do reaches the task's history.
    history = await dev_env.client.get_workflow_handle(handle.id).fetch_history()
    updates = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]
    assert updates == []


async def test_subscribing_before_the_task_exists(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    with pytest.raises(TaskNotFoundError, match="no task with id 'not-yet'"):
        await collect(dev_runtime.stream("not-yet"))
    with pytest.raises(TaskNotFoundError, match=r"within 0.3 s"):
        await collect(dev_runtime.stream("never", wait_for_start=timedelta(seconds=0.3)))
    model = fake_openai.script([text("hello there")])
    waiting = asyncio.create_task(
        collect(dev_runtime.stream("soon", wait_for_start=timedelta(seconds=20)))
    )
    await asyncio.sleep(0.5)  # gives the subscriber time to ask first; never a race
    await dev_runtime.run(agent_task(model), task_id="soon")
    items = await waiting
    assert items[-1].data.type == "done"


async def test_offsets_keep_increasing_across_continue_as_new(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    handle = await dev_runtime.run(
        agent_task(five_step_script(fake_openai), continue_as_new_after_steps=2)
    )
    items = await collect(dev_runtime.stream(handle.id, since=0))
    assert [i.offset for i in items] == list(range(len(items)))
    live = [i.data for i in items if i.topic == "events"]
    await same_unless_restamped(dev_env.client, handle.id, live, await handle.events())
    history = await dev_env.client.get_workflow_handle(handle.id).fetch_history()
    assert history.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    assert (await handle.result()).steps == 5


def test_truncated_offsets_become_an_explicit_gap() -> None:
    items = [
        StreamItem(
            offset=offset,
            topic="tokens",
            data=TokenDelta(step=1, attempt=1, index=offset, text="x"),
        )
        for offset in (2, 7, 8, 8, 9)
    ]
    batch, next_offset = in_sequence(3, items)
    assert isinstance(batch[0].data, StreamGap)
    assert (batch[0].data.start, batch[0].data.end) == (3, 7)
    assert [i.offset for i in batch[1:]] == [7, 8, 9]  # the old 2 and the repeated 8 dropped
    assert next_offset == 10


async def test_continue_as_new_carries_a_bounded_snapshot(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    words = " ".join(f"w{i}" for i in range(300))
    model = fake_openai.script(
        [
            tools(("calculator", {"expression": f"{i}+1"}), content=words, chunk_delay=0.001)
            for i in range(7)
        ]
        + [text("eight steps done")]
    )
    handle = await dev_runtime.run(agent_task(model, continue_as_new_after_steps=2))
    assert (await handle.result()).steps == 8

    # Each run's input stays small and does not grow with the task: no full log, no
    # full stream, only the fold and the stream's latest items.
    sizes = [
        sum(
            len(p.data)
            for p in h.events[0].workflow_execution_started_event_attributes.input.payloads
        )
        for h in await run_histories(dev_env.client, handle.id)
    ]  # newest first
    assert len(sizes) == 4  # three continue-as-new hops
    carried = list(reversed(sizes))[1:]
    assert max(carried) < 1.5 * min(carried) and max(carried) < 500_000

    # The audit trail reads across the chain of runs, without gaps.
    events = await handle.events(0)
    assert [e.seq for e in events] == list(range(len(events)))
    assert events[0].type == "task_started" and events[-1].type == "done"

    # A subscriber from offset 0 is told which early offsets are gone, then gets the rest.
    items = await collect(dev_runtime.stream(handle.id, since=0))
    assert isinstance(items[0].data, StreamGap) and items[0].data.start == 0
    assert [i.offset for i in items[1:]] == list(range(items[0].data.end, items[-1].offset + 1))
    assert items[-1].data.type == "done"


async def test_a_terminated_task_ends_its_subscriptions(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    """Terminated from outside (Temporal CLI, Web UI), a task writes no terminal event:
    its subscribers still end, with everything it published."""
    model = fake_openai.script([tools(("run_shell", {"command": "echo hi"})), text("done")])
    handle = await dev_runtime.run(agent_task(model))
    await pending_requests(handle)
    items: list[StreamItem] = []
    caught_up = asyncio.Event()

    async def watch() -> None:
        async for item in dev_runtime.stream(handle.id, since=0):
            items.append(item)
            if item.topic == "events" and item.data.type == "approval_requested":
                caught_up.set()

    watching = asyncio.create_task(watch())
    await asyncio.wait_for(caught_up.wait(), 60)  # it has read everything: it waits for more
    await dev_env.client.get_workflow_handle(handle.id).terminate("operator stopped it")
    await asyncio.wait_for(watching, 60)
    assert [i.data.type for i in items if i.topic == "events"][-1] == "approval_requested"
    assert [i.offset for i in items] == list(range(len(items)))
