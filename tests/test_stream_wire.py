"""waystation/client/stream_wire.py reads streams through the contrib module's private poll Query;
this pins it to the SDK's public `subscribe()`, so an SDK upgrade that changes the wire
fails here rather than in a user's stream."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, pending_requests
from waystation.client import stream_wire
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.fake_openai import FakeOpenAI, text, tools

Item = tuple[int, str, Any]
# Streamed for longer than the first token batch interval, so tokens are published live.
SLOW_TEXT = "let me run this shell command and read what it prints before answering you"


async def read_ours(client: Client, task_id: str) -> tuple[list[Item], int]:
    decode = client.data_converter.payload_converter.from_payload
    items: list[Item] = []
    offset = 0
    while True:
        page = await stream_wire.poll(client, task_id, offset)
        items += [(i.offset, i.topic, decode(stream_wire.decode_data(i.data))) for i in page.items]
        offset = page.next_offset
        if not page.more_ready:
            return items, offset


async def read_sdks(client: Client, task_id: str, count: int | None) -> list[Item]:
    """The SDK's items from 0: `count` of them, or all a closed task holds."""
    items: list[Item] = []
    async with asyncio.timeout(60):
        async for item in WorkflowStreamClient.create(client, task_id).subscribe(from_offset=0):
            items.append((item.offset, item.topic, item.data))
            if len(items) == count:
                break
    return items


async def test_the_stream_wire_adapter_matches_the_sdk(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    script = fake_openai.script(
        [
            tools(("run_shell", {"command": "echo hi"}), content=SLOW_TEXT, chunk_delay=0.1),
            text("it said hi"),
        ]
    )
    handle = await dev_runtime.run(agent_task(script))
    [request] = await pending_requests(handle)
    client = dev_env.client

    # A running task: the SDK reads by Update, we by Query.
    ours, head = await read_ours(client, handle.id)
    assert {topic for _, topic, _ in ours} == {"events", "tokens"}
    assert await read_sdks(client, handle.id, len(ours)) == ours
    sdk_head = await WorkflowStreamClient.create(client, handle.id).get_offset()
    assert await stream_wire.head(client, handle.id) == sdk_head == head

    # A closed task: both read what it retained, and the runtime's stream agrees.
    await handle.approve(request)
    await handle.result()
    ours, head = await read_ours(client, handle.id)
    assert len(ours) > 5 and await read_sdks(client, handle.id, None) == ours
    streamed = [item async for item in dev_runtime.stream(handle.id, since=0)]
    assert [(s.offset, s.topic) for s in streamed] == [(o, t) for o, t, _ in ours]
