"""A retried `remember`, its worker SIGKILLed between the write and the activity's
completion, writes once: the retry finds the ledger's `started` entry and the item that
names its call, and finishes without writing again. Real worker processes on the dev
server; the kill happens while the write is provably committed and the call provably
unfinished (a worker build that stalls after the write)."""

from __future__ import annotations

import asyncio

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task
from waystation.activities.storage import Storage
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import BUILTIN_TOOLS_MODULE, Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.workers import WorkerProcess

MEMORY_TOOLS_MODULE = "waystation.activities.memory_tools"


async def test_a_remember_killed_after_its_write_writes_once(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    settings = settings.model_copy(update={"tools": [BUILTIN_TOOLS_MODULE, MEMORY_TOOLS_MODULE]})
    address = dev_env.client.service_client.config.target_host
    stalling = await WorkerProcess(
        address, settings, module="tests.memory_chaos.stalling_worker"
    ).ready()
    model = fake_openai.script(
        [tools(("remember", {"key": "plan", "text": "ship on Friday"})), text("Noted.")]
    )
    runtime = AgentRuntime(dev_env.client, settings)
    handle = await runtime.run(agent_task(model, timeout=30), tenant="acme", task_id="remembers")
    key = f"{handle.id}/1/call_1_0"
    rescuer: WorkerProcess | None = None
    try:
        async with Storage.from_settings(settings) as storage:
            async with asyncio.timeout(60):  # the write is committed, the call not finished
                while not (
                    await storage.memory.written_by("acme:main", "plan") == key
                    and (entry := await storage.ledger.lookup(key)) is not None
                    and entry.state == "started"
                ):
                    await asyncio.sleep(0.05)
            stalling.kill()
            rescuer = await WorkerProcess(address, settings).ready()
            assert (await handle.result()).result == "Noted."
            item = await storage.memory.get("acme:main", "plan")
            assert item is not None and item.value == "ship on Friday"
            assert item.revision == 1  # written once, by the killed attempt
            finished = await storage.ledger.lookup(key)
            assert finished is not None and finished.state == "done"
        observations = [e for e in await handle.events() if e.type == "observation"]
        assert [(o.output, o.is_error) for o in observations] == [("remembered 'plan'", False)]
    finally:
        stalling.kill()
        if rescuer is not None:
            rescuer.kill()
    history = await dev_env.client.get_workflow_handle(handle.id).fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert max(attempts) >= 2  # the tool call was retried on the second worker
