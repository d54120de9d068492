"""Usage (cached and reasoning tokens, the cache-hit ratio) and model switches as each
surface shows them: the live view, `ws status`, GET /tasks/{id} and MCP's task_status."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.helpers import serving_api
from waystation.cli.render import LiveView, model_in_use, render_state, usage_text
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.streaming import StreamItem
from waystation.servers.http_api import create_app
from waystation.servers.mcp_server import _status_view
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows.events import (
    AgentEvent,
    AgentState,
    ModelSwitched,
    TaskStarted,
    draft,
)
from waystation.workflows.models import AgentTask, ModelSettings, Usage


@pytest.fixture
async def api(dev_env: WorkflowEnvironment, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    runtime = AgentRuntime(dev_env.client, settings)
    async with serving_api(create_app(settings, runtime)) as port:
        async with running_worker(dev_env.client, settings):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                client._transport_runtime = runtime  # type: ignore[attr-defined]
                yield client


def shown(events: list[AgentEvent]) -> str:
    out = io.StringIO()
    view = LiveView(out, color=False)
    for offset, event in enumerate(events):
        view.show(StreamItem(offset=offset, topic="events", data=event))
    return out.getvalue()


async def test_cached_and_reasoning_tokens_reach_the_live_view_status_and_the_api(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            tools(
                ("calculator", {"expression": "2 + 2"}),
                usage=(1234, 56),
                cached_tokens=1100,
                reasoning_tokens=20,
            ),
            text("4", usage=(2000, 10), cached_tokens=1900),
        ]
    )
    created = await api.post("/tasks", json={"task": "add", "model": {"name": model}})
    task_id = created.json()["id"]
    runtime: AgentRuntime = api._transport_runtime  # type: ignore[attr-defined]
    await runtime.get(task_id).result()

    view = (await api.get(f"/tasks/{task_id}")).json()
    assert view["usage"] == {
        "input_tokens": 3234,
        "output_tokens": 66,
        "cache_read_tokens": 3000,
        "cache_write_tokens": 0,
        "reasoning_tokens": 20,
        "cost_usd": None,  # its model has no price: tokens only
        "unpriced_tokens": 3300,
        "cache_hit_ratio": pytest.approx(3000 / 3234),
    }
    assert view["state"]["usage"]["cache_read_tokens"] == 3000

    handle = runtime.get(task_id)
    events = await handle.events()
    lines = shown(events).splitlines()
    assert "  tokens 1,234 in (1,100 cached) · 56 out · 20 reasoning" in lines
    assert "  tokens 2,000 in (1,900 cached) · 10 out" in lines

    state = await handle.state()
    status = render_state(state, task_id, model=model_in_use(state, events)).splitlines()
    assert "tokens    3,234 in (3,000 cached) / 66 out (20 reasoning) · cache hit 93%" in status
    assert f"model     {model}" in status

    mcp = _status_view(task_id, state).model_dump()
    assert mcp["usage"]["cache_hit_ratio"] == pytest.approx(3000 / 3234)


def test_a_step_shows_only_the_counts_that_are_not_zero() -> None:
    assert usage_text(Usage(input_tokens=1234, output_tokens=56)) == "1,234 in · 56 out"
    written = Usage(input_tokens=900, output_tokens=3, cache_write_tokens=800)
    assert usage_text(written) == "900 in (800 to cache) · 3 out"
    assert usage_text(Usage()) == ""


def test_status_shows_no_cache_hit_where_the_endpoint_reported_no_caching() -> None:
    state = AgentState(status="done", usage=Usage(input_tokens=12, output_tokens=5))
    assert "tokens    12 in / 5 out" in render_state(state, "t").splitlines()


def started(model: str) -> TaskStarted:
    task = AgentTask(task="t", model=ModelSettings(name=model))
    return draft(TaskStarted, 0, task_id="t", task=task)


def test_a_model_switch_is_one_line_naming_both_models_and_the_reasoning_left_behind() -> None:
    switched = draft(
        ModelSwitched,
        2,
        from_model="anthropic:m1",
        to_model="openai:m2",
        reason="the endpoint is overloaded (529)",
        reasoning_dropped=3,
    )
    kept = switched.model_copy(update={"reasoning_dropped": 0})
    lines = shown([started("anthropic:m1"), switched, kept]).splitlines()
    assert lines[-2] == (
        "⇄ model anthropic:m1 failed (the endpoint is overloaded (529)): going on with "
        "openai:m2; 3 reasoning items could not carry over"
    )
    assert lines[-1].endswith("going on with openai:m2")


def test_the_model_in_use_is_the_fallbacks_once_one_took_over_else_the_tasks_own() -> None:
    first = [started("a:1")]
    assert model_in_use(AgentState(), first) == "a:1"
    assert model_in_use(AgentState(model="b:2"), first) == "b:2"
    assert model_in_use(AgentState(), []) is None
