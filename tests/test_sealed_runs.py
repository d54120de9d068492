"""A closed run seals what its readers need (activities/event_archive.py): its state, its
events and what a follow-up continues from, read without a worker replaying it. With Worker
Versioning only a worker of a run's own version could answer a query on it, and after a
deploy none may be left (real dev server; no worker polls while the closed task is read)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, pending_requests
from waystation.activities.conversation_store import ConversationStore
from waystation.activities.event_archive import read_archived, read_sealed
from waystation.activities.payload_codec import codec_for
from waystation.activities.sealed_blobs import SealedBlobs
from waystation.activities.storage import Storage
from waystation.client import stream_wire
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows.models import ApprovalSettings

NO_WAIT = timedelta(seconds=2)


async def stored_messages(settings: Settings, digests: list[str]) -> set[str]:
    """Which of these messages the conversation store holds."""
    async with Storage.from_settings(settings) as storage:
        store = ConversationStore(SealedBlobs(storage.blobs, codec_for(settings, "worker")))
        return set(await store.get(digests))


async def test_a_done_task_reads_and_takes_a_follow_up_from_its_seal_with_no_worker(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [tools(("calculator", {"expression": "6 * 7"})), text("42."), text("Still 42.")]
    )
    runtime = AgentRuntime(dev_env.client, settings)
    async with running_worker(dev_env.client, settings):
        handle = await runtime.run(agent_task(model, task="6 * 7?"))
        assert (await handle.result()).result == "42."
        queried = await handle.state()
        listed = await handle.events()
        streamed = [i async for i in runtime.stream(handle.id)]
        polled = await stream_wire.poll(dev_env.client, handle.id, 0)  # a worker answers
    # No worker polls now: a query on the closed run would go unanswered.
    run_id = (await handle.overview()).run_id
    sealed = await read_sealed(settings, handle.id, run_id)
    assert sealed is not None and sealed.continuation.follow_up
    assert sealed.stream is not None and stream_wire.poll_sealed(sealed.stream, 0) == polled
    assert await runtime.sealed(handle.id, run_id) == sealed
    state = await handle.state(within=NO_WAIT)
    assert state == queried and state.result == "42."
    assert await handle.events(within=NO_WAIT) == listed
    assert [i async for i in AgentRuntime(dev_env.client, settings).stream(handle.id)] == streamed
    tail = streamed[-3].offset
    assert [i async for i in runtime.stream(handle.id, since=tail)] == streamed[-3:]
    archived = await read_archived(settings, handle.id, run_id)
    assert archived is not None and archived.events == listed
    # The follow-up reads the conversation from the store, not from the closed run.
    digests = [ref.digest for ref in sealed.continuation.state.conversation]
    assert len(digests) >= 4 and await stored_messages(settings, digests) == set(digests)

    await handle.send("And now?")  # started from the seal: no worker needed to send
    async with running_worker(dev_env.client, settings):
        second = await handle.result()
    assert second.result == "Still 42." and second.turn == 1
    assert fake_openai.requests[model][-1]["messages"][-1]["content"] == "And now?"


async def test_a_failed_and_a_cancelled_task_read_from_their_seals(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    failing = fake_openai.script([tools(("calculator", {"expression": "1 + 1"}))] * 3)
    asks = ApprovalSettings(policy={"run_shell": "always"})
    waiting = fake_openai.script([tools(("run_shell", {"command": "true"}))])
    runtime = AgentRuntime(dev_env.client, settings)
    async with running_worker(dev_env.client, settings):
        failed = await runtime.run(agent_task(failing, task="loop", max_steps=2))
        with pytest.raises(Exception, match="max_steps"):
            await failed.result()
        cancelled = await runtime.run(agent_task(waiting, task="wait", approval=asks))
        await pending_requests(cancelled)
        await cancelled.cancel()
        with pytest.raises(Exception):  # noqa: B017 - how a cancel surfaces is not the point
            await cancelled.result()
        expected = {h.id: await h.state() for h in (failed, cancelled)}
    for handle in (failed, cancelled):
        state = await handle.state(within=NO_WAIT)
        assert state == expected[handle.id]
    assert (await failed.state(within=NO_WAIT)).status == "failed"
    assert (await cancelled.state(within=NO_WAIT)).status == "cancelled"
