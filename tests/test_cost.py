"""Cost in money: each step priced from the prices the task was created with, summed over
turns, the task and its tree of agents; cost_budget stops a task (and shares itself with
sub-agents) as token_budget does. Real workers against the fake OpenAI-protocol server, whose
usage per reply is known."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type, serving_api
from tests.test_cli import starter
from waystation.activities.agent_tools import agent_tool
from waystation.activities.builtin_tools import builtin_registry
from waystation.cli.render import cost_text, render_state, spent_text
from waystation.client.agent_runtime import AgentRuntime, TaskFailedError
from waystation.client.task_rights import TaskRefusedError
from waystation.prices import ModelPrice
from waystation.servers.http_api import create_app
from waystation.servers.usage import TaskUsage
from waystation.settings import Settings
from waystation.settings.model_endpoints import BARE_NAME_ENDPOINT, DEFAULT_ENDPOINTS
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, text, tools
from waystation.testing.workers import running_worker
from waystation.vocabulary import FailureKind
from waystation.workflows import agents
from waystation.workflows.events import AgentState, Thought
from waystation.workflows.models import AgentSpec, AgentTask, ModelSettings, Usage
from waystation.workflows.plan import CallModel, Fail, RunProgress, next_move

# US dollars per million tokens: a call of (1,000 in, 200 out) costs 0.002 + 0.002.
PRICE = ModelPrice(input=2.0, output=10.0, cached_input=0.5)
CHEAPER = ModelPrice(input=1.0, output=4.0)


def priced(settings: Settings, prices: dict[str, ModelPrice]) -> Settings:
    """`settings` with these prices on the endpoint bare model names (the fake's) call."""
    bare = DEFAULT_ENDPOINTS[BARE_NAME_ENDPOINT].model_copy(update={"prices": prices})
    return settings.model_copy(update={"model_endpoints": {BARE_NAME_ENDPOINT: bare}})


def cost(price: ModelPrice, usage: tuple[int, int], cached: int = 0) -> float:
    return price.cost(usage[0], usage[1], cached, 0)


def test_a_calls_usage_is_priced_or_counted_as_unpriced_and_sums_never_make_up_a_cost() -> None:
    call = Usage(input_tokens=1000, output_tokens=200, cache_read_tokens=400)
    assert call.priced(PRICE).cost_usd == pytest.approx(0.0034)
    assert call.priced(None) == call.model_copy(update={"unpriced_tokens": 1200})
    assert (Usage() + Usage()).cost_usd is None
    mixed = call.priced(PRICE) + call.priced(None) + Usage()
    assert mixed.cost_usd == pytest.approx(0.0034) and mixed.unpriced_tokens == 1200
    assert cost_text(mixed) == "$0.0034 + 1,200 unpriced tokens"
    assert cost_text(call.priced(None)) is None and spent_text(call) == "1,200 tokens"


def test_the_plan_stops_at_the_cost_budget_and_shares_what_is_left() -> None:
    task = AgentTask(task="x", cost_budget=0.01, token_budget=1000)
    state = AgentState(status="running", usage=Usage(input_tokens=500, cost_usd=0.004))
    assert isinstance(next_move(state, task, limit=10**6, progress=RunProgress(0)), CallModel)
    spent = state.model_copy(update={"usage": Usage(input_tokens=500, cost_usd=0.01)})
    stop = next_move(spent, task, limit=10**6, progress=RunProgress(0))
    assert isinstance(stop, Fail) and stop.kind == FailureKind.COST_BUDGET
    assert "cost_budget of $0.01" in stop.reason and "kept" in stop.reason
    share = agents.budget_shares(task, state.usage, 2)
    assert share.tokens == 250 and share.cost_usd == pytest.approx(0.003)
    assert agents.budget_shares(AgentTask(task="x"), state.usage, 2) == agents.BudgetShare()


@pytest.fixture
async def worker(ts_env: WorkflowEnvironment, settings: Settings) -> AsyncIterator[None]:
    async with running_worker(ts_env.client, settings):
        yield


def runtime_of(env: WorkflowEnvironment, settings: Settings, **fields: Any) -> AgentRuntime:
    return AgentRuntime(env.client, settings, **fields)


async def test_a_scripted_tasks_cost_is_exact_per_step_and_in_total(
    ts_env: WorkflowEnvironment, worker: None, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    calc = ("calculator", {"expression": "6 * 7"})
    model = fake_openai.script(
        [tools(calc, usage=(1000, 200), cached_tokens=400), text("42", usage=(2000, 100))]
    )
    runtime = runtime_of(ts_env, priced(settings, {model: PRICE}))
    handle = await runtime.run(agent_task(model))
    outcome = await handle.result()
    first, second = cost(PRICE, (1000, 200), cached=400), cost(PRICE, (2000, 100))
    assert first == pytest.approx(0.0034) and second == pytest.approx(0.005)
    steps = [e.usage.cost_usd for e in await handle.events() if isinstance(e, Thought)]
    assert steps == [pytest.approx(first), pytest.approx(second)]
    assert outcome.usage.cost_usd == pytest.approx(first + second)
    state = await handle.state()
    assert state.usage.unpriced_tokens == 0
    assert TaskUsage.of(state.usage).cost_usd == pytest.approx(0.0084)
    assert "cost      $0.0084" in render_state(state, handle.id).splitlines()


async def test_a_model_without_a_price_shows_tokens_only(
    ts_env: WorkflowEnvironment, worker: None, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("free", usage=(300, 30))])
    runtime = runtime_of(ts_env, priced(settings, {"another-model": PRICE}))
    handle = await runtime.run(agent_task(model))
    await handle.result()
    state = await handle.state()
    [start] = of_type(await handle.events(), "task_started")
    assert start.task.prices is None  # only models that have a price are kept
    assert (state.usage.cost_usd, state.usage.unpriced_tokens) == (None, 330)
    assert TaskUsage.of(state.usage).cost_usd is None
    shown = render_state(state, handle.id)
    assert "300 in / 30 out" in shown and "cost" not in shown and "$" not in shown


async def test_a_cost_budget_on_an_unpriced_model_is_refused_at_start(
    ts_env: WorkflowEnvironment, worker: None, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("never asked")])
    runtime = runtime_of(ts_env, settings)
    with pytest.raises(TaskRefusedError, match="needs a price") as refused:
        await runtime.run(agent_task(model, cost_budget=0.5))
    assert refused.value.setting == "cost_budget" and refused.value.status == 400
    assert fake_openai.calls(model) == 0


async def test_a_fallback_prices_each_step_at_the_model_it_called(
    ts_env: WorkflowEnvironment, worker: None, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    asked = 0

    def first_then_down(body: dict[str, Any]) -> Reply:
        nonlocal asked
        asked += 1
        if asked == 1:
            return tools(("calculator", {"expression": "1 + 1"}), usage=(1000, 200))
        return error(503, "Service Unavailable")

    first = fake_openai.script(first_then_down)
    second = fake_openai.script([text("2", usage=(3000, 500))])
    runtime = runtime_of(ts_env, priced(settings, {first: PRICE, second: CHEAPER}))
    task = agent_task(first)
    chain = {"fallback_models": [second], "fallback_after_seconds": 10}
    task = task.model_copy(update={"model": task.model.model_copy(update=chain)})
    handle = await runtime.run(task)
    assert (await handle.result()).result == "2"
    events = await handle.events()
    assert len(of_type(events, "model_switched")) == 1
    steps = [e.usage.cost_usd for e in events if isinstance(e, Thought)]
    expected = [cost(PRICE, (1000, 200)), cost(CHEAPER, (3000, 500))]
    assert steps == [pytest.approx(c) for c in expected]
    assert (await handle.state()).usage.cost_usd == pytest.approx(sum(expected))


async def test_prices_are_resolved_at_creation_and_kept_by_the_running_task(
    ts_env: WorkflowEnvironment, worker: None, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    gate = threading.Event()
    model = fake_openai.script(
        [
            text("first", usage=(1000, 0), hold_after_chunks=1, gate=gate),
            text("second", usage=(1000, 0)),
        ]
    )
    runtime = runtime_of(ts_env, priced(settings, {model: PRICE}))
    handle = await runtime.run(agent_task(model))
    try:
        await fake_openai.until_streaming(model, 1, request=0)
        # The deployment's price changes while the task runs: new tasks get the new one.
        repriced = runtime_of(ts_env, priced(settings, {model: CHEAPER}))
        assert repriced.with_defaults(agent_task(model)).prices == {model: CHEAPER}
    finally:
        gate.set()
    await handle.result()
    await handle.send("again")  # a follow-up keeps the task's table too
    assert (await handle.result()).result == "second"
    state = await handle.state()
    assert state.usage.cost_usd == pytest.approx(2 * cost(PRICE, (1000, 0)))


async def test_a_cost_budget_stops_the_task_with_its_work_kept_and_resume_raises_it(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    # Each step costs $0.001: 400 in at $1, 100 out at $6 a million.
    price = ModelPrice(input=1.0, output=6.0)
    calls = 0

    def working(body: dict[str, Any]) -> Reply:
        nonlocal calls
        calls += 1
        if calls > 4:
            return text("all done", usage=(400, 100))
        step = tools(("calculator", {"expression": f"{calls} + 1"}), usage=(400, 100))
        step.content = f"partial result {calls}"
        return step

    model = fake_openai.script(working)
    async with running_worker(dev_env.client, settings):
        runtime = runtime_of(dev_env, priced(settings, {model: price}))
        handle = await runtime.run(agent_task(model, cost_budget=0.0025))
        with pytest.raises(TaskFailedError, match=r"cost_budget of \$0\.0025") as failure:
            await handle.result()
        assert failure.value.kind == FailureKind.COST_BUDGET
        assert calls == 3  # $0.001, $0.002, $0.003: the third crossed it
        state = await handle.state()
        assert state.failure_kind == "cost_budget"
        assert state.usage.cost_usd == pytest.approx(0.003)
        said = [e.content for e in await handle.events() if isinstance(e, Thought)]
        assert said == ["partial result 1", "partial result 2", "partial result 3"]
        assert sum(1 for r in state.conversation if r.role == "tool") == 3

        resumed = await runtime.resume(handle.id, cost_budget=0.01)
        assert (await resumed.result()).result == "all done"
        [note] = of_type(await resumed.events(), "resumed")
        assert (note.failure_kind, note.cost_budget) == ("cost_budget", 0.01)


def agent(name: str, model: str, **fields: Any) -> AgentSpec:
    settings = ModelSettings(name=model, request_timeout_seconds=30)
    return AgentSpec(name=name, description=f"the {name}", model=settings, **fields)


async def test_a_tree_of_agents_sums_its_cost_and_its_unpriced_tokens(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    paid = fake_openai.script([text("paid answer", usage=(500, 50))])
    free = fake_openai.script([text("free answer", usage=(70, 7))])
    calls = (("agent__paid", {"task": "a"}), ("agent__free", {"task": "b"}))
    parent = fake_openai.script([tools(*calls, usage=(100, 10)), text("both", usage=(200, 20))])
    registry = builtin_registry()
    for spec in (agent("paid", paid), agent("free", free)):
        registry.register(agent_tool(spec))
    async with running_worker(dev_env.client, settings, registry=registry):
        runtime = runtime_of(
            dev_env, priced(settings, {parent: PRICE, paid: CHEAPER}), tools=registry
        )
        handle = await runtime.run(agent_task(parent))
        assert (await handle.result()).result == "both"
        [start] = of_type(await handle.events(), "task_started")
        assert start.task.prices == {parent: PRICE, paid: CHEAPER}  # its sub-agents' too
        observed = {o.tool: o.usage for o in of_type(await handle.events(), "observation")}
        state = await handle.state()
    assert observed["agent__paid"].cost_usd == pytest.approx(cost(CHEAPER, (500, 50)))
    assert observed["agent__free"].cost_usd is None
    own = cost(PRICE, (100, 10)) + cost(PRICE, (200, 20))
    assert state.usage.cost_usd == pytest.approx(own + cost(CHEAPER, (500, 50)))
    assert state.usage.unpriced_tokens == 77
    spent = f"${state.usage.cost_usd:,.4f} + 77 unpriced tokens"
    assert f"cost      {spent}" in render_state(state, handle.id).splitlines()


async def test_a_cost_budget_is_shared_across_the_tree(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    price = ModelPrice(input=1.0, output=6.0)  # each call below: $0.001
    spender = fake_openai.script(
        lambda body: tools(
            ("calculator", {"expression": f"{len(body['messages'])}+1"}), usage=(400, 100)
        )
    )
    calls = (("agent__spender", {"task": "a"}), ("agent__spender", {"task": "b"}))
    parent = fake_openai.script([tools(*calls, usage=(400, 100)), text("x")])
    registry = builtin_registry()
    registry.register(agent_tool(agent("spender", spender, max_steps=100)))
    async with running_worker(dev_env.client, settings, registry=registry):
        runtime = runtime_of(
            dev_env, priced(settings, {parent: price, spender: price}), tools=registry
        )
        handle = await runtime.run(agent_task(parent, cost_budget=0.0101))
        with pytest.raises(TaskFailedError, match="cost_budget"):
            await handle.result()
        state = await handle.state()
        ids = [c.task_id for c in state.children.values()]
        children = [await runtime.get(i).state() for i in ids]
        starts = [of_type(await runtime.get(i).events(0, 1), "task_started")[0] for i in ids]
    # Each child had half of what was left ($0.0101 less the parent's first $0.001), and
    # stopped once it had spent it; the parent counts every cent of its tree.
    assert [s.task.cost_budget for s in starts] == [pytest.approx(0.00455)] * 2
    assert [c.failure_kind for c in children] == ["cost_budget", "cost_budget"]
    assert all(c.usage.cost_usd == pytest.approx(0.005) for c in children)
    assert state.usage.cost_usd == pytest.approx(0.011)


@pytest.mark.long(minutes=0.6)
async def test_the_cli_runs_within_a_cost_budget_shows_the_cost_and_resumes_with_more(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    # Each step costs $0.001 (400 in at $1, 100 out at $6 a million).
    model = fake_openai.script(
        [
            *(
                tools(("calculator", {"expression": f"{n} + 1"}), usage=(400, 100))
                for n in range(3)
            ),
            text("done at last", usage=(400, 100)),
        ]
    )
    price = {"input": 1.0, "output": 6.0}
    openai: dict[str, Any] = {"protocol": "chat", "api_key_env": "OPENAI_API_KEY"}
    openai |= {"base_url_env": "OPENAI_BASE_URL", "prices": {model: price}}
    env = {"WAYSTATION_MODEL_ENDPOINTS": json.dumps({"openai": openai})}

    async def ws(*args: str) -> tuple[int, str, str]:
        return await starter(dev_env, settings, *args, endpoint=fake_openai, extra_env=env)

    code, out, err = await ws(
        "run", "--id", "costly", "--model", model, "--cost-budget", "0.002", "go"
    )
    assert code == 1 and "cost_budget of $0.002" in err, out + err
    code, out, err = await ws("status", "costly")
    assert "cost      $0.0020" in out.splitlines(), out + err
    code, out, err = await ws("resume", "costly", "--cost-budget", "1")
    assert code == 0 and "done at last" in out + err, out + err
    code, out, err = await ws("list")
    [row] = [line for line in out.splitlines() if line.startswith("costly ")]
    assert row.endswith("$0.0040"), row

    code, out, err = await ws("run", "--cost-budget", "0.5", "--model", "offline", "hi")
    assert code != 0 and "a cost_budget needs a price for the task's model 'offline'" in err


async def test_the_apis_start_body_takes_a_cost_budget_and_get_shows_the_cost(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("42", usage=(2000, 100))])
    api_settings = priced(settings, {model: PRICE})
    runtime = AgentRuntime(dev_env.client, api_settings)
    async with (
        serving_api(create_app(api_settings, runtime)) as port,
        running_worker(dev_env.client, settings),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http,
    ):
        unpriced = {"task": "add", "model": {"name": "offline"}, "cost_budget": 0.5}
        refused = await http.post("/tasks", json=unpriced)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == "unpriced_model"
        assert "needs a price" in refused.json()["detail"]
        # A caller's own prices are not the deployment's: the task gets the deployment's.
        body = {"task": "add", "model": {"name": model}, "cost_budget": 0.5}
        body["prices"] = {model: {"input": 0, "output": 0}}
        created = await http.post("/tasks", json=body)
        assert created.status_code == 201, created.text
        task_id = created.json()["id"]
        await runtime.get(task_id).result()
        view = (await http.get(f"/tasks/{task_id}")).json()
    assert view["usage"]["cost_usd"] == pytest.approx(cost(PRICE, (2000, 100)))
    assert view["usage"]["unpriced_tokens"] == 0


async def test_the_apis_resume_raises_a_cost_budget_that_stopped_a_task(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    price = ModelPrice(input=1.0, output=6.0)  # $0.001 a step below
    replies = [tools(("calculator", {"expression": f"{n} + 1"}), usage=(400, 100)) for n in (1, 2)]
    model = fake_openai.script([*replies, text("all done", usage=(400, 100))])
    api_settings = priced(settings, {model: price})
    runtime = AgentRuntime(dev_env.client, api_settings)
    async with (
        serving_api(create_app(api_settings, runtime)) as port,
        running_worker(dev_env.client, settings),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http,
    ):
        body = {"task": "add", "model": {"name": model}, "cost_budget": 0.0015}
        created = await http.post("/tasks", json=body)
        task_id = created.json()["id"]
        with pytest.raises(TaskFailedError, match="cost_budget"):
            await runtime.get(task_id).result()
        resumed = await http.post(f"/tasks/{task_id}/resume", json={"cost_budget": 0.01})
        assert resumed.status_code == 200, resumed.text
        assert (await runtime.get(task_id).result()).result == "all done"
        view = (await http.get(f"/tasks/{task_id}")).json()
    assert view["usage"]["cost_usd"] == pytest.approx(0.003)
