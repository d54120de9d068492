"""The same task on each endpoint: `openai` (chat completions), `openai-responses` and
`anthropic`, each through its provider's official client against the local fake of its
protocol, named `ENDPOINT:MODEL` as a user names them. The tour's task (two calculator
calls in one message, a shell command a person approves, an answer), a follow-up that a
sub-agent on another provider answers, and a typed result: the same events on each."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, pending_requests
from waystation import AgentRuntime, Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows.events import AgentEvent

ENDPOINTS = ("openai", "openai-responses", "anthropic")
# Each parent's sub-agent runs on another provider.
SUB_AGENT_ENDPOINT = {
    "openai": "anthropic",
    "openai-responses": "openai",
    "anthropic": "openai-responses",
}


def since_last_user(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = body["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return messages[last_user + 1 :]


def tour_model(body: dict[str, Any]) -> Reply:
    """The tour's task, then a follow-up for the sub-agent; replies chosen by what the
    conversation holds, so a retried request gets the same answer."""
    turn = sum(1 for m in body["messages"] if m["role"] == "user")
    results = [m for m in since_last_user(body) if m["role"] == "tool"]
    if turn == 1:
        if not results:
            return tools(
                ("calculator", {"expression": "(12 + 30) * 7"}),
                ("calculator", {"expression": "2^10"}),
                content="Computing both.",
            )
        if len(results) == 2:
            return tools(("run_shell", {"command": "echo hello"}))
        said = results[-1]["content"].splitlines()[-1]
        return text(f"294 and 1024; the shell said {said}")
    if not results:
        return tools(("agent__math", {"task": "What is 6 * 7?"}))
    return text(f"The math agent says: {results[-1]['content']}")


def math_model(body: dict[str, Any]) -> Reply:
    results = [m for m in since_last_user(body) if m["role"] == "tool"]
    if not results:
        return tools(("calculator", {"expression": "6 * 7"}))
    return text(results[-1]["content"])


def point_endpoints_at(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's environment, as a user's: each provider's usual variables."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.anthropic_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


def shape(events: list[AgentEvent]) -> list[tuple[str, ...]]:
    """What a user follows in the events: their types, the tools called and whether each
    call failed; not the wording, ids or times."""
    seen: list[tuple[str, ...]] = []
    for event in events:
        match event.type:
            case "action":
                seen.append(("action", event.tool))  # type: ignore[union-attr]
            case "observation":
                seen.append(("observation", event.tool, str(event.is_error)))  # type: ignore[union-attr]
            case _:
                seen.append((event.type,))
    return seen


async def run_tour(
    endpoint: str,
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake: FakeOpenAI,
    register: Callable[[Callable[[dict[str, Any]], Reply]], str],
) -> tuple[list[AgentEvent], list[str]]:
    parent = register(tour_model)
    child = register(math_model)
    agents = [
        {
            "name": "math",
            "description": "Does arithmetic with the calculator.",
            "tools": ["calculator"],
            "model": {"name": f"{SUB_AGENT_ENDPOINT[endpoint]}:{child}"},
        }
    ]
    settings = settings.model_copy(update={"agents": json.dumps(agents)})
    async with running_worker(dev_env.client, settings):
        runtime = AgentRuntime(dev_env.client, settings)
        task = agent_task(f"{endpoint}:{parent}", "What is (12 + 30) * 7 and 2^10?")
        handle = await runtime.run(task)
        [request] = await pending_requests(handle)
        await handle.approve(request, approver="alice")
        first = await handle.result()
        await handle.send("Ask the math agent what 6 * 7 is.")
        second = await handle.result()
        events = await handle.events()
    return events, [first.result, second.result]


@pytest.fixture
def register(fake_openai: FakeOpenAI) -> Callable[[Callable[[dict[str, Any]], Reply]], str]:
    return lambda script: fake_openai.script(script)


async def test_the_tour_gives_the_same_events_on_every_endpoint(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    register: Callable[[Callable[[dict[str, Any]], Reply]], str],
) -> None:
    point_endpoints_at(fake_openai, monkeypatch)
    shapes: dict[str, list[tuple[str, ...]]] = {}
    for endpoint in ENDPOINTS:
        events, answers = await run_tour(endpoint, dev_env, settings, fake_openai, register)
        assert answers == [
            "294 and 1024; the shell said hello",
            "The math agent says: 42",
        ], endpoint
        shapes[endpoint] = shape(events)
        thoughts = [e for e in events if e.type == "thought"]
        assert all(t.usage.input_tokens > 0 for t in thoughts), endpoint  # type: ignore[union-attr]
        assert all(t.model for t in thoughts), endpoint  # type: ignore[union-attr]
    assert shapes["openai-responses"] == shapes["openai"]
    assert shapes["anthropic"] == shapes["openai"]
    assert ("action", "agent__math") in shapes["openai"]
    assert ("observation", "calculator", "False") in shapes["openai"]


class Answer(BaseModel):
    product: int
    power: int


@pytest.mark.parametrize("endpoint", ENDPOINTS)
async def test_a_typed_result_on_each_endpoint(
    endpoint: str,
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    point_endpoints_at(fake_openai, monkeypatch)
    # The same answer to every request: a call retried on a busy machine gets it too.
    model = fake_openai.script(lambda _: tools(("final_answer", {"product": 294, "power": 1024})))
    async with running_worker(dev_env.client, settings):
        runtime = AgentRuntime(dev_env.client, settings)
        handle = await runtime.run(agent_task(f"{endpoint}:{model}", "Compute"), output_type=Answer)
        assert (await handle.result()).output == Answer(product=294, power=1024)


async def test_an_overloaded_anthropic_falls_back_to_responses_and_the_next_turn_comes_back(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anthropic thinks and calls a tool, then answers 529, then 503 forever: the step moves
    to the Responses model within fallback_after_seconds, says so (its thinking cannot go to
    another provider), finishes there; the follow-up turn asks Anthropic first again."""
    point_endpoints_at(fake_openai, monkeypatch)
    overloads = iter([error(529, "Overloaded")])

    def claude(body: dict[str, Any]) -> Reply:
        turn = sum(1 for m in body["messages"] if m["role"] == "user")
        if turn == 2:
            return text("Back on Claude.")
        if not since_last_user(body):
            return tools(("calculator", {"expression": "2^10"}), reasoning="Powers of two.")
        return next(overloads, error(503, "Service Unavailable"))

    anthropic = f"anthropic:{fake_openai.script(claude)}"
    responses = f"openai-responses:{fake_openai.script([text('1024')])}"
    # A starved worker's silent call (a heartbeat timeout) is an outage too: on a busy
    # machine it must not be the one that moves the step.
    task = agent_task(anthropic, "What is 2^10?", heartbeat_timeout_seconds=60)
    task.model = task.model.model_copy(
        update={
            "thinking_budget_tokens": 2048,
            "fallback_models": [responses],
            "fallback_after_seconds": 3,
        }
    )
    async with running_worker(dev_env.client, settings):
        runtime = AgentRuntime(dev_env.client, settings)
        handle = await runtime.run(task)
        assert (await handle.result()).result == "1024"
        await handle.send("Once more?")
        assert (await handle.result()).result == "Back on Claude."
        events = await handle.events()
    [switched] = [e for e in events if e.type == "model_switched"]
    assert (switched.from_model, switched.to_model) == (anthropic, responses)  # type: ignore[union-attr]
    assert "503" in switched.reason and switched.reasoning_dropped == 1  # type: ignore[union-attr]
    models = [e.model for e in events if e.type == "thought"]  # type: ignore[union-attr]
    assert len(models) == 3 and "fake" in models[0] and models[0] == models[2] != models[1]
    # Failed requests of the outage: the first 529, then 503s, within a few seconds' retries.
    claude_requests = fake_openai.requests[anthropic.split(":", 1)[1]]
    assert 3 <= len(claude_requests) <= 6
