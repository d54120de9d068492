"""The two clocks of a model stream (first chunk, then between chunks) and `tool_choice`,
with the real `openai` client against the fake OpenAI server."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from waystation.activities.chat import ChatDelta
from waystation.activities.openai_chat import OpenAIChat
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, hang, stall, text, tools
from waystation.testing.typed_openai import CALCULATOR_TOOL
from waystation.testing.workers import running_worker
from waystation.workflows import errors
from waystation.workflows.models import AgentTask, ChatMessage, ModelSettings

PROMPT = [ChatMessage(role="user", content="hello")]


async def collect(
    fake_openai: FakeOpenAI,
    model: ModelSettings,
    offered: list[dict[str, Any]] | None = None,
    received: list[ChatDelta] | None = None,
) -> list[ChatDelta]:
    chat = OpenAIChat("sk-test", fake_openai.url)
    deltas = received if received is not None else []
    try:
        async for delta in chat.stream(PROMPT, offered or [], model):
            deltas.append(delta)
    finally:
        await chat.close()
    return deltas


@contextmanager
def a_retryable_timeout(match: str) -> Iterator[None]:
    """What the LLM activity raises for it: a retryable ApplicationError with the reason."""
    with pytest.raises(ApplicationError, match=match) as raised:
        yield
    assert raised.value.type == errors.LLM_UNAVAILABLE and not raised.value.non_retryable


def settings(name: str, *, first: float, idle: float, **kw: Any) -> ModelSettings:
    return ModelSettings(
        name=name, first_chunk_timeout_seconds=first, request_timeout_seconds=idle, **kw
    )


async def test_no_first_chunk_in_time_is_a_retryable_timeout(fake_openai: FakeOpenAI) -> None:
    # The server neither answers nor sends headers (a model still reading a long prompt).
    name = fake_openai.script([hang(30)])
    with a_retryable_timeout(r"no first chunk from the model within 0\.5 s"):
        await collect(fake_openai, settings(name, first=0.5, idle=60))


async def test_headers_without_a_first_chunk_count_as_no_first_chunk(
    fake_openai: FakeOpenAI,
) -> None:
    name = fake_openai.script([stall("never seen", before_chunk=0, seconds=30)])
    with a_retryable_timeout("no first chunk"):
        await collect(fake_openai, settings(name, first=0.5, idle=60))


async def test_a_slow_first_chunk_is_waited_for_beyond_the_idle_timeout(
    fake_openai: FakeOpenAI,
) -> None:
    # Headers sent, the first chunk held until the stream has been silent for twice the
    # idle timeout (a busy machine only makes that longer), well within the first one.
    # The idle timeout leaves room for a starved process between the later chunks.
    gate = threading.Event()
    name = fake_openai.script([Reply(content="late but whole", hold_after_chunks=0, gate=gate)])
    collecting = asyncio.create_task(collect(fake_openai, settings(name, first=60, idle=1.5)))
    try:
        await fake_openai.until_streaming(name, chunks=0)
        await asyncio.sleep(3.0)  # a lower bound on the silence, not a race
        assert not collecting.done()
    finally:
        gate.set()
    deltas = await collecting
    assert "".join(d.text for d in deltas) == "late but whole"
    assert deltas[-1].usage is not None


async def test_a_stream_that_stalls_after_it_began_times_out(fake_openai: FakeOpenAI) -> None:
    # Chunks: role, "one ", "two ", then held before "three" until the client gave up.
    gate = threading.Event()
    name = fake_openai.script([Reply(content="one two three", hold_after_chunks=3, gate=gate)])
    received: list[ChatDelta] = []
    try:
        with a_retryable_timeout(r"stream stalled for 2 s"):
            await collect(fake_openai, settings(name, first=60, idle=2), received=received)
    finally:
        gate.set()
    assert "".join(d.text for d in received) == "one two "


async def test_the_activity_retries_an_attempt_whose_first_chunk_never_came(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    # Only the first request is held without a first chunk; any later one answers, so a
    # retry the busy machine makes slower than the 1 s clock still ends the same way.
    never = threading.Event()
    asked = 0

    def reply(body: dict[str, Any]) -> Reply:
        nonlocal asked
        asked += 1
        if asked == 1:
            return Reply(content="too late", hold_after_chunks=0, gate=never)
        return text("answered on the retry")

    name = fake_openai.script(reply)
    model = settings(name, first=1, idle=60)
    try:
        handle = await dev_runtime.run(AgentTask(task="hi", model=model))
        outcome = await handle.result()
    finally:
        never.set()
    assert outcome.result == "answered on the retry"
    assert fake_openai.calls(name) >= 2


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        (None, None),
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ("calculator", {"type": "function", "function": {"name": "calculator"}}),
    ],
)
async def test_tool_choice_is_passed_through(
    fake_openai: FakeOpenAI, choice: str | None, sent: object
) -> None:
    name = fake_openai.script([tools(("calculator", {"expression": "1+1"}))])
    await collect(
        fake_openai, settings(name, first=30, idle=30, tool_choice=choice), [CALCULATOR_TOOL]
    )
    (request,) = fake_openai.requests[name]
    assert request.get("tool_choice") == sent


async def test_tool_choice_is_not_sent_without_tools(fake_openai: FakeOpenAI) -> None:
    # Endpoints refuse tool_choice when no tools come with it.
    name = fake_openai.script([text("no tools here")])
    await collect(fake_openai, settings(name, first=30, idle=30, tool_choice="required"))
    (request,) = fake_openai.requests[name]
    assert "tool_choice" not in request and "tools" not in request


def test_tool_choice_must_be_a_mode_or_a_tool_name() -> None:
    with pytest.raises(ValueError, match="tool_choice"):
        ModelSettings(tool_choice="calculator; rm -rf /")
    with pytest.raises(ValueError, match="tool_choice"):
        ModelSettings(tool_choice="")


def test_defaults_fit_a_model_served_on_cpu() -> None:
    model = ModelSettings()
    assert model.first_chunk_timeout_seconds == 300
    assert model.request_timeout_seconds == 120
    assert model.tool_choice is None


async def test_the_heartbeat_timeout_comes_from_the_task_or_the_settings(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    """WAYSTATION_HEARTBEAT_TIMEOUT fills tasks that set none; a task's own value wins; both
    reach the model and tool calls Temporal schedules."""
    configured = settings.model_copy(update={"heartbeat_timeout_seconds": 7.0})
    assert Settings(WAYSTATION_HEARTBEAT_TIMEOUT="9").heartbeat_timeout_seconds == 9.0  # type: ignore[call-arg]
    async with running_worker(dev_env.client, configured):
        runtime = AgentRuntime(dev_env.client, configured)
        timeouts = []
        for own in (None, 11.0):
            script = fake_openai.script(
                [tools(("write_file", {"path": "scratch/a.txt", "content": "a"})), text("ok")]
            )
            task = AgentTask(
                task="write it", model=ModelSettings(name=script), heartbeat_timeout_seconds=own
            )
            handle = await runtime.run(task)
            await handle.result()
            history = await dev_env.client.get_workflow_handle(handle.id).fetch_history()
            timeouts.append(
                {
                    e.activity_task_scheduled_event_attributes.activity_type.name: (
                        e.activity_task_scheduled_event_attributes.heartbeat_timeout.seconds
                    )
                    for e in history.events
                    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                }
            )
    assert timeouts == [{"call_llm": 7, "run_tool": 7}, {"call_llm": 11, "run_tool": 11}]


async def beats_heard(runtime: AgentRuntime, task_id: str, until_beat: int) -> set[int]:
    """The heartbeat numbers the server recorded for the task's first model call, polled
    from its pending activity until it has heard `until_beat` or a later one."""
    handle = runtime.client.get_workflow_handle(task_id)
    heard: set[int] = set()
    async with asyncio.timeout(60):
        while not heard or max(heard) < until_beat:
            [call] = (await handle.describe()).raw_description.pending_activities
            assert call.attempt == 1, "a live model call was abandoned and retried"
            if call.heartbeat_details.payloads:
                heard.add(json.loads(call.heartbeat_details.payloads[0].data)["beat"])
    return heard


async def test_every_heartbeat_of_a_live_model_call_reaches_the_server(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    # The SDK held each heartbeat back for 0.8x the timeout (4.8 s here) and sent only the
    # latest: the beat due at 4 s never reached the server, which heard the next one a
    # fifth of the timeout before its deadline; a slow worker lost live calls that way.
    mid_stream = threading.Event()
    name = fake_openai.script(
        [Reply(content="a long answer", hold_after_chunks=2, gate=mid_stream)]
    )
    task = AgentTask(task="hi", model=ModelSettings(name=name), heartbeat_timeout_seconds=6)
    handle = await dev_runtime.run(task)
    try:
        await fake_openai.until_streaming(name, 2, request=0)
        heard = await beats_heard(dev_runtime, handle.id, until_beat=3)
    finally:
        mid_stream.set()
    assert {1, 2} <= heard, heard
    assert (await asyncio.wait_for(handle.result(), 60)).result == "a long answer"
