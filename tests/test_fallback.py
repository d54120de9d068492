"""Fallback between models (ModelSettings.fallback_models): a step moves to the next model
when one keeps failing with an outage, says so in a model_switched event, and each turn
starts again at the first model. On the time-skipping server, against the fake endpoint
(each bare model name is a model of its own there)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.helpers import agent_task
from waystation.client.agent_runtime import AgentRuntime, TaskFailedError, TaskHandle
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, text
from waystation.vocabulary import FailureKind
from waystation.workflows.events import (
    AgentEvent,
    AgentState,
    Interrupted,
    ModelSwitched,
    UserMessage,
    apply,
    draft,
)
from waystation.workflows.models import AgentTask


def with_fallback(first: str, *fallbacks: str, after: float = 10, **model: Any) -> AgentTask:
    task = agent_task(first)
    settings = task.model.model_copy(
        update={"fallback_models": list(fallbacks), "fallback_after_seconds": after, **model}
    )
    return task.model_copy(update={"model": settings})


def overloaded_then_down(up: list[bool] | None = None) -> Any:
    """A model that answers 529 overloaded, then 503 on every request (until `up[0]`)."""
    asked = 0

    def reply(body: dict[str, Any]) -> Reply:
        nonlocal asked
        asked += 1
        if up and up[0]:
            return text("the first model is back")
        if asked == 1:
            return error(529, "Overloaded")
        return error(503, "Service Unavailable")

    return reply


async def switches(handle: TaskHandle) -> list[ModelSwitched]:
    return [e for e in await handle.events() if isinstance(e, ModelSwitched)]


async def test_an_outage_moves_the_step_to_the_fallback_and_the_next_turn_to_the_first(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    up = [False]
    first = fake_openai.script(overloaded_then_down(up))
    second = fake_openai.script([text("answered by the fallback")])
    handle = await ts_runtime.run(with_fallback(first, second, after=10))
    assert (await handle.result()).result == "answered by the fallback"
    # Retried after 1, 2 and 4 s; the next pause (8 s) would pass the 10 s: it moves on.
    assert fake_openai.calls(first) == 4
    [switch] = await switches(handle)
    assert (switch.from_model, switch.to_model) == (first, second)
    assert "503" in switch.reason and first in switch.reason
    assert switch.reasoning_dropped == 0
    assert (await handle.state()).model == second

    up[0] = True
    await handle.send("once more")
    assert (await handle.result()).result == "the first model is back"
    assert fake_openai.calls(first) == 5 and fake_openai.calls(second) == 1
    assert len(await switches(handle)) == 1
    assert (await handle.state()).model is None


@pytest.mark.parametrize("status", [400, 401])
async def test_a_refused_request_never_falls_back(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI, status: int
) -> None:
    first = fake_openai.script([error(status, "no such thing")])
    second = fake_openai.script([text("never asked")])
    handle = await ts_runtime.run(with_fallback(first, second))
    with pytest.raises(TaskFailedError) as failed:
        await handle.result()
    assert failed.value.kind == FailureKind.LLM_ERROR
    assert fake_openai.calls(first) == 1 and fake_openai.calls(second) == 0
    assert await switches(handle) == []


async def test_a_429_that_asks_for_longer_than_the_task_waits_falls_back_at_once(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    first = fake_openai.script([error(429, "Rate limit reached", {"Retry-After": "3600"})])
    second = fake_openai.script([text("answered by the fallback")])
    handle = await ts_runtime.run(with_fallback(first, second, after=60))
    assert (await handle.result()).result == "answered by the fallback"
    assert fake_openai.calls(first) == 1
    [switch] = await switches(handle)
    assert "429" in switch.reason


async def test_a_429_with_a_short_wait_is_retried_on_the_same_model(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    first = fake_openai.script(
        [error(429, "Rate limit reached", {"Retry-After": "5"}), text("done after a wait")]
    )
    second = fake_openai.script([text("never asked")])
    handle = await ts_runtime.run(with_fallback(first, second, after=60))
    assert (await handle.result()).result == "done after a wait"
    assert fake_openai.calls(first) == 2 and fake_openai.calls(second) == 0
    assert await switches(handle) == []
    assert (await handle.state()).model is None


async def test_a_message_that_interrupts_cuts_the_pause_before_a_retry(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    # Real time: the pause the 429 asks for would last 30 s; the message ends it at once.
    first = fake_openai.script(
        [error(429, "Rate limit reached", {"Retry-After": "30"}), text("hi")]
    )
    second = fake_openai.script([text("never asked")])
    handle = await dev_runtime.run(with_fallback(first, second, after=3600))
    async with asyncio.timeout(20):
        while fake_openai.calls(first) < 1:
            await asyncio.sleep(0.05)
        await handle.send("never mind, just say hi", interrupt=True)
        assert (await handle.result()).result == "hi"
    events = await handle.events()
    assert [e for e in events if isinstance(e, Interrupted)]
    assert any(isinstance(e, UserMessage) and e.interrupted for e in events)
    assert fake_openai.calls(first) == 2 and fake_openai.calls(second) == 0
    assert await switches(handle) == []


async def test_the_last_model_failing_fails_the_task(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    first = fake_openai.script(overloaded_then_down())
    second = fake_openai.script(overloaded_then_down())
    handle = await ts_runtime.run(with_fallback(first, second, after=2, max_attempts=3))
    with pytest.raises(TaskFailedError) as failed:
        await handle.result()
    assert failed.value.kind == FailureKind.LLM_ERROR
    assert "503" in str(failed.value)
    assert fake_openai.calls(second) == 3
    assert [(s.from_model, s.to_model) for s in await switches(handle)] == [(first, second)]


def test_the_state_names_the_model_in_use_until_the_next_turn() -> None:
    events: list[AgentEvent] = [
        draft(ModelSwitched, 1, from_model="a", to_model="b", reason="a kept failing"),
        draft(UserMessage, 1, content="steer", turn=0),
        draft(ModelSwitched, 1, from_model="b", to_model="c", reason="b kept failing"),
        draft(UserMessage, 2, content="again", turn=1),
    ]
    states: list[str | None] = []
    state = AgentState()
    for seq, event in enumerate(events):
        state = apply(state, event.model_copy(update={"seq": seq}))
        states.append(state.model)
    assert states == ["b", "b", "c", None]
