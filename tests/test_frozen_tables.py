"""Nothing a replay reads changes under a task: what its workflow code reads is resolved into
the task when it starts (prices, model facts, limits, approval rules, what it needs of a
worker), so a worker restarted with other settings between two of its steps, as a deploy
restarts them, changes neither what the task does nor what its history replays to.

Real worker processes on the dev server, against the fake OpenAI-protocol server (whose
usage per reply is known): the task takes a step, waits for a person, its worker stops and
another starts with other settings, and the task finishes (and takes a follow-up turn) as it
started; then every run of it replays on the workflow code."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from tests.helpers import agent_task, of_type, pending_requests
from waystation.activities.payload_codec import data_converter
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.handle import TaskHandle
from waystation.prices import ModelPrice
from waystation.settings import Settings
from waystation.settings.model_endpoints import BARE_NAME_ENDPOINT, DEFAULT_ENDPOINTS
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import AgentTask, ApprovalSettings

# US dollars per million tokens: what the task starts with, and what the restarted worker's
# settings say (the deployment changed its prices while the task waited).
PRICE = ModelPrice(input=2.0, output=10.0)
REPRICED = ModelPrice(input=1.0, output=4.0)
STEP_USAGE = (1000, 100)
STOP_WITHIN_SECONDS = 60.0
RUNS_LISTED_WITHIN_SECONDS = 30.0


def endpoints_env(price: ModelPrice) -> dict[str, str]:
    """WAYSTATION_MODEL_ENDPOINTS with `price` on the endpoint the fake's bare names call."""
    bare = DEFAULT_ENDPOINTS[BARE_NAME_ENDPOINT].model_copy(update={"prices": {"*": price}})
    declared = {BARE_NAME_ENDPOINT: bare.model_dump(mode="json", exclude_none=True)}
    return {"WAYSTATION_MODEL_ENDPOINTS": json.dumps(declared)}


def with_endpoints(settings: Settings, price: ModelPrice) -> Settings:
    bare = DEFAULT_ENDPOINTS[BARE_NAME_ENDPOINT].model_copy(update={"prices": {"*": price}})
    return settings.model_copy(update={"model_endpoints": {BARE_NAME_ENDPOINT: bare}})


async def stop(worker: WorkerProcess) -> None:
    """Stop a worker as a deploy does (SIGTERM: it finishes and says goodbye to the server)."""
    worker.process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.to_thread(worker.process.wait), STOP_WITHIN_SECONDS)
    finally:
        worker.kill()


def step_cost(price: ModelPrice) -> float:
    return price.cost(STEP_USAGE[0], STEP_USAGE[1], 0, 0)


def waiting_task(model: str) -> AgentTask:
    """A task whose first step waits for a person: a point a deploy is sure to meet."""
    policy = ApprovalSettings(policy={"calculator": "always"})
    return agent_task(model, "add one and one", approval=policy, max_steps=5)


async def started_waiting(
    runtime: AgentRuntime, settings: Settings, model: str, env: dict[str, str]
) -> TaskHandle[Any]:
    """The task, started with a worker of `env` that takes its first step and then stops
    while the task waits for the approval."""
    address = runtime.client.service_client.config.target_host
    first = await WorkerProcess(address, settings, env).ready()
    try:
        handle = await runtime.run(waiting_task(model))
        await pending_requests(handle)
    finally:
        await stop(first)
    return handle


async def test_a_worker_restarted_with_other_settings_changes_nothing_in_a_running_task(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    address = dev_env.client.service_client.config.target_host
    model = fake_openai.script(
        [
            tools(("calculator", {"expression": "1 + 1"}), usage=STEP_USAGE),
            text("two", usage=STEP_USAGE),
            text("still two", usage=STEP_USAGE),
        ]
    )
    runtime = AgentRuntime(dev_env.client, with_endpoints(settings, PRICE))
    handle = await started_waiting(runtime, settings, model, endpoints_env(PRICE))

    # The deployment restarts its workers with other prices: they are not the running task's.
    second = await WorkerProcess(address, settings, endpoints_env(REPRICED)).ready()
    try:
        await handle.approve()
        done = await handle.result()
        assert done.result == "two"
        await handle.send("and again?")
        assert (await handle.result()).result == "still two"
        state = await handle.state()
        events = await handle.events()
    finally:
        await stop(second)

    # The task holds its tables from its start: the prices, and its model's facts.
    [started] = of_type(events, "task_started")
    assert started.task.prices == {model: PRICE}
    assert started.task.model.context_window_tokens is not None
    assert started.task.model.structured_output != "auto"
    # What the user sees: every step priced as when the task started, over both turns.
    thoughts = of_type(events, "thought")
    assert [t.usage.cost_usd for t in thoughts] == pytest.approx([step_cost(PRICE)] * 3)
    assert state.usage.cost_usd == pytest.approx(3 * step_cost(PRICE))
    assert fake_openai.calls(model) == 3

    await replays_without_failure(dev_env, handle.id, runs=2)


async def test_the_endpoint_is_the_deployments_and_a_restart_moves_a_waiting_task_to_its_new_place(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    """Deliberately not the task's: an endpoint moved while a task waits is where its next
    step calls the model (docs/production.md, "Frozen at
    the start"). What the loop does is unchanged, and the history replays."""
    address = dev_env.client.service_client.config.target_host
    model = fake_openai.script([tools(("calculator", {"expression": "1 + 1"}))])
    moved = FakeOpenAI()
    try:
        moved.script([text("two")], model=model)
        runtime = AgentRuntime(dev_env.client, settings)
        handle = await started_waiting(runtime, settings, model, {})
        second = await WorkerProcess(address, settings, {"OPENAI_BASE_URL": moved.url}).ready()
        try:
            await handle.approve()
            assert (await handle.result()).result == "two"
        finally:
            await stop(second)
        assert fake_openai.calls(model) == 1 and moved.calls(model) == 1
        [(request, _, _)] = moved.request_log(model)
        assert request["messages"][-1]["role"] == "tool"  # the step after the approved call
    finally:
        moved.close()
    await replays_without_failure(dev_env, handle.id, runs=1)


PROMPT = "You work out arithmetic, and answer with the number alone."


def agents_env(prompt: str, model: str) -> dict[str, str]:
    """WAYSTATION_AGENTS with one sub-agent, `math`, of this prompt and model."""
    math = {
        "name": "math",
        "description": "Works out arithmetic.",
        "system_prompt": prompt,
        "model": {"name": model},
        "tools": ["calculator"],
        "max_steps": 3,
    }
    return {"WAYSTATION_AGENTS": json.dumps([math])}


@pytest.mark.parametrize("change", ["removed", "redefined"])
async def test_a_worker_restarted_with_other_agents_runs_the_sub_agent_the_task_started_with(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, change: str
) -> None:
    address = dev_env.client.service_client.config.target_host
    model = fake_openai.script(
        [
            tools(("calculator", {"expression": "1 + 1"})),
            tools(("agent__math", {"task": "Work out 6 * 7"})),
            text("forty-two"),
        ]
    )
    child_model = fake_openai.script([text("42")])
    other_model = fake_openai.script([text("not the task's sub-agent")])
    started_with = agents_env(PROMPT, child_model)
    runtime = AgentRuntime(
        dev_env.client, settings.model_copy(update={"agents": started_with["WAYSTATION_AGENTS"]})
    )
    handle = await started_waiting(runtime, settings, model, started_with)

    # The deployment restarts its workers with the agent gone, or defined anew.
    changed = (
        {"WAYSTATION_AGENTS": "[]"}
        if change == "removed"
        else agents_env("You answer in riddles.", other_model)
    )
    second = await WorkerProcess(address, settings, changed).ready()
    try:
        await handle.approve()
        assert (await handle.result()).result == "forty-two"
        events = await handle.events()
        [delegated] = of_type(events, "agent_started")
        child = runtime.get(delegated.child_id)
        assert (await child.result()).result == "42"
        child_events = await child.events()
    finally:
        await stop(second)

    # The task holds the definition it started with, and needs no worker that has it.
    [started] = of_type(events, "task_started")
    [spec] = started.task.agents
    assert spec.system_prompt == PROMPT and spec.model.name == child_model
    assert "agent__math" not in (started.task.requires or [])
    # The restarted worker offered the task's own sub-agent, and the child ran its definition.
    step_after = fake_openai.request_log(model)[1][0]
    offered = {t["function"]["name"]: t["function"] for t in step_after["tools"]}
    assert "Works out arithmetic." in offered["agent__math"]["description"]
    [child_started] = of_type(child_events, "task_started")
    assert child_started.task.system_prompt == PROMPT
    assert child_started.task.model.name == child_model and child_started.task.agents == []
    [(child_request, _, _)] = fake_openai.request_log(child_model)
    assert child_request["messages"][0] == {"role": "system", "content": PROMPT}
    assert fake_openai.calls(other_model) == 0

    await replays_without_failure(dev_env, handle.id, runs=1)
    await replays_without_failure(dev_env, delegated.child_id, runs=1)


async def replays_without_failure(dev_env: WorkflowEnvironment, task_id: str, runs: int) -> None:
    """Every closed run of the task replays on the workflow code, none non-deterministic."""
    query = f"WorkflowId = '{task_id}' AND ExecutionStatus != 'Running'"
    async with asyncio.timeout(RUNS_LISTED_WITHIN_SECONDS):
        while (await dev_env.client.count_workflows(query)).count < runs:
            await asyncio.sleep(0.1)
    listed = [w async for w in dev_env.client.list_workflows(query)]
    assert [w.status for w in listed] == [WorkflowExecutionStatus.COMPLETED] * runs
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=data_converter(None))
    histories = dev_env.client.list_workflows(query).map_histories()
    result = await replayer.replay_workflows(histories, raise_on_replay_failure=False)
    assert result.replay_failures == {}
