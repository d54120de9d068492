"""Never stalled (issue 12, item 6): a model call whose useful work has ended does not keep
its activity alive by heartbeating. The stream's own clocks cover a quiet endpoint; the
watchdog covers what comes after the last chunk, as when the SDK's stream flusher on
Python 3.11 swallowed the cancel that should stop it and the call heartbeat on until its
start-to-close timeout (20 minutes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import Failure
from temporalio.testing import WorkflowEnvironment

from tests.helpers import of_type
from waystation.activities.chat import ChatDelta
from waystation.activities.openai_chat import OpenAIChat
from waystation.client.agent_runtime import AgentRuntime, TaskHandle
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, stall, text
from waystation.testing.workers import running_worker
from waystation.workflows.models import AgentTask, ModelSettings

HUNG_MODEL = "hangs-after-its-answer"


class HangsAfterItsAnswer:
    """The fake OpenAI server's answer through the real client; on the first attempt the
    stream then never ends, like an exit that waits on a flusher that will not stop.
    With `swallow_cancel` it also ignores being cancelled, as `asyncio.wait_for` did."""

    def __init__(self, fake: FakeOpenAI, scripted: str, *, swallow_cancel: bool) -> None:
        self._chat = OpenAIChat("sk-test", fake.url)
        self._scripted = scripted
        self._swallow_cancel = swallow_cancel
        self.attempts = 0
        self.release = asyncio.Event()  # the test's end: let a swallowing attempt go

    async def stream(
        self,
        messages: Any,
        tools: list[dict[str, Any]],
        model: ModelSettings,
        *,
        response_format: dict[str, Any] | None = None,
    ) -> AsyncIterator[ChatDelta]:
        self.attempts += 1
        served = model.model_copy(update={"name": self._scripted})
        async for delta in self._chat.stream(messages, tools, served):
            yield delta
        if self.attempts == 1:
            await self._hang()

    async def close(self) -> None:
        await self._chat.close()

    async def _hang(self) -> None:
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                if not self._swallow_cancel:
                    raise


def hung_task(heartbeat_seconds: float) -> AgentTask:
    # The watchdog allows request_timeout + 5 s without progress once the stream began.
    model = ModelSettings(
        name=HUNG_MODEL, request_timeout_seconds=1, first_chunk_timeout_seconds=30
    )
    return AgentTask(task="say hi", model=model, heartbeat_timeout_seconds=heartbeat_seconds)


async def llm_retry_causes(handle: TaskHandle, runtime: AgentRuntime) -> list[Failure]:
    """Why each retried call_llm attempt was retried: the failure its next attempt records."""
    history = await runtime.client.get_workflow_handle(handle.id).fetch_history()
    causes: list[Failure] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            if started.attempt > 1:
                causes.append(started.last_failure)
    return causes


def said(failure: Failure) -> list[str]:
    """The messages of a failure and its causes (the server may trim the outer one)."""
    messages = [failure.message]
    while failure.HasField("cause"):
        failure = failure.cause
        messages.append(failure.message)
    return messages


async def run_with(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    backend: HangsAfterItsAnswer,
    heartbeat_seconds: float = 2,
) -> tuple[TaskHandle, list[Failure]]:
    runtime = AgentRuntime(dev_env.client, settings)
    try:
        async with running_worker(dev_env.client, settings, backends={HUNG_MODEL: backend}):
            try:
                handle = await runtime.run(hung_task(heartbeat_seconds))
                outcome = await asyncio.wait_for(handle.result(), 90)
                assert outcome.result == "answered again"
                [thought] = of_type(await handle.events(), "thought")
                assert thought.attempt == 2
                return handle, await llm_retry_causes(handle, runtime)
            finally:
                backend.release.set()
    finally:
        await backend.close()  # its own HTTP client: the worker closes only the endpoint's


async def test_a_model_call_that_hangs_after_its_answer_is_retried_by_the_watchdog(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    scripted = fake_openai.script([text("answered once"), text("answered again")])
    backend = HangsAfterItsAnswer(fake_openai, scripted, swallow_cancel=False)
    # The watchdog's last beat goes out before it cancels the call: a heartbeat timeout
    # well past that leaves a busy machine time to report the watchdog's failure first.
    _, [cause] = await run_with(dev_env, settings, backend, heartbeat_seconds=10)
    assert "no progress for 6 s while streaming the answer" in said(cause), cause
    assert backend.attempts == 2


async def test_a_call_that_ignores_its_cancel_stops_heartbeating_and_is_retried(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    scripted = fake_openai.script([text("answered once"), text("answered again")])
    backend = HangsAfterItsAnswer(fake_openai, scripted, swallow_cancel=True)
    _, [cause] = await run_with(dev_env, settings, backend)
    # Temporal saw the heartbeats stop, long before the call's start-to-close timeout.
    assert cause.timeout_failure_info.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT, cause
    assert backend.attempts == 2


async def test_a_stream_that_stalls_mid_answer_fails_the_attempt_and_the_retry_answers(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    # Chunks: role, "half ", then nothing for longer than the idle timeout.
    name = fake_openai.script(
        [stall("half an answer", before_chunk=2, seconds=30), text("answered again")]
    )
    model = ModelSettings(name=name, request_timeout_seconds=1, first_chunk_timeout_seconds=30)
    handle = await dev_runtime.run(AgentTask(task="hi", model=model))
    assert (await asyncio.wait_for(handle.result(), 90)).result == "answered again"
    [cause] = await llm_retry_causes(handle, dev_runtime)
    assert "the model's stream stalled for 1 s" in said(cause), cause
    [thought] = of_type(await handle.events(), "thought")
    assert thought.attempt == 2 and fake_openai.calls(name) == 2
