"""What the many-tasks benchmark rests on: the floor is an agent step and nothing more (one
activity streaming the model's reply, one local activity for the tool), on the instant
model and on the fake endpoint alike, and the bench counts a history's events by kind."""

from __future__ import annotations

import uuid
from collections import Counter

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.floor import FloorAgent, FloorCall, FloorModel, FloorWaiting, floor_tool
from bench.instant_model import INSTANT_MODEL
from bench.many_tasks import event_kind, floor_http_reply
from waystation.activities.openai_chat import OpenAIChat
from waystation.testing.fake_openai import FakeOpenAI


async def floor_kinds(client: Client, call: FloorCall, endpoint: OpenAIChat | None) -> Counter[str]:
    queue = f"floor-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[FloorAgent, FloorWaiting],
        activities=[FloorModel(endpoint).reply, floor_tool],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await client.start_workflow(
            FloorAgent.run, call, id=f"floor-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        assert await handle.result() == call.steps
    return Counter([event_kind(e) async for e in handle.fetch_history_events()])


async def test_a_floor_step_is_one_model_activity_and_one_local_tool_activity(
    dev_env: WorkflowEnvironment,
) -> None:
    kinds = await floor_kinds(dev_env.client, FloorCall(INSTANT_MODEL, 6, 16, 0), None)
    assert kinds["activity_task_scheduled:floor_model"] == 6
    assert kinds["marker_recorded:core_local_activity"] == 5  # the last step answers
    assert not [k for k in kinds if "upsert" in k or "signaled" in k or "timer" in k]


async def test_the_floor_streams_the_fake_endpoints_reply_too(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(floor_http_reply)
    endpoint = OpenAIChat("sk-test", fake_openai.url)
    try:
        kinds = await floor_kinds(dev_env.client, FloorCall(model, 4, 2048, 0), endpoint)
    finally:
        await endpoint.close()
    assert kinds["activity_task_scheduled:floor_model"] == 4
    assert fake_openai.calls(model) == 4
