"""Model endpoints (issue 40): a model named `ENDPOINT:MODEL` is called at that endpoint, in
its protocol, with the key its worker holds; a task naming an endpoint no live worker has is
refused before it starts; keys stay out of settings output, offers and events; and the model
facts a task runs with are resolved when it is created, never read by workflow code from a
table that may change (a task created before keeps its old values)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type
from tests.test_capable_workers import started_tasks, until_polled
from tests.test_cli import starter
from tests.test_resume_fork_edges import api_over
from waystation.activities import model_backends
from waystation.activities.agent_tools import agent_tool, with_model_facts
from waystation.activities.chat import ChatDelta
from waystation.activities.llm import reasoning_of
from waystation.activities.model_backends import ModelBackends
from waystation.activities.openai_chat import OpenAIChat
from waystation.activities.tool_modules import load_tools
from waystation.activities.tools import ToolRegistry
from waystation.activities.worker_offer import WorkerOffer, offer_of
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.known_secrets import known_secrets
from waystation.client.starting import check_model, with_defaults
from waystation.client.task_rights import TaskRefusedError
from waystation.settings import Settings
from waystation.settings.errors import SettingsProblem, load_settings
from waystation.settings.model_endpoints import ModelEndpoint, split_model_name
from waystation.testing.fake_openai import FakeOpenAI, text
from waystation.testing.workers import running_worker
from waystation.vocabulary import OFFLINE_MODEL
from waystation.workflows import errors, outputs
from waystation.workflows.conversation import context_limit
from waystation.workflows.models import (
    AgentSpec,
    AgentTask,
    ChatMessage,
    ModelSettings,
    ReasoningItem,
    Usage,
)

KEY = "sk-endpoint-secret-0123456789"
LITERAL_HEADER = "literal-header-secret-9876543210"
CLAUDE = "anthropic:claude-sonnet-4-5"


# --- names and settings ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("[1", "WAYSTATION_MODEL_ENDPOINTS: is not JSON"),
        ("[]", "WAYSTATION_MODEL_ENDPOINTS: must be a JSON object"),
        ('{"Local": {"protocol": "chat"}}', "model endpoint name 'Local' must be"),
        ('{"local": {"protocol": "grpc"}}', "model endpoint 'local': protocol: Input should be"),
        ('{"local": {"protocol": "chat", "key": "x"}}', "model endpoint 'local': key: Extra"),
        ('{"local": {"protocol": "chat", "api_key_env": "A-B"}}', "'local': api_key_env"),
    ],
)
def test_a_bad_declaration_is_one_sentence_when_settings_load(
    monkeypatch: pytest.MonkeyPatch, value: str, said: str
) -> None:
    monkeypatch.setenv("WAYSTATION_MODEL_ENDPOINTS", value)
    with pytest.raises(SettingsProblem) as problem:
        load_settings()
    sentence = str(problem.value)
    assert sentence.startswith("invalid settings: WAYSTATION_MODEL_ENDPOINTS: "), sentence
    assert said in sentence and "\n" not in sentence, sentence


def test_names_and_the_endpoints_configured_here(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = {
        "local": {"protocol": "chat", "base_url": "http://127.0.0.1:9/v1"},
        "gateway": {"protocol": "anthropic", "api_key_env": "GATEWAY_KEY"},
    }
    monkeypatch.setenv("WAYSTATION_MODEL_ENDPOINTS", json.dumps(declared))
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "WAYSTATION_OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.model_endpoints["local"].protocol == "chat"
    assert set(settings.endpoints()) == {
        "openai",
        "openai-responses",
        "anthropic",
        "local",
        "gateway",
    }
    assert settings.configured_endpoints({}) == ["local"]  # a base URL is enough
    assert settings.configured_endpoints(
        {"ANTHROPIC_BASE_URL": "http://a", "GATEWAY_KEY": "k"}
    ) == [
        "anthropic",
        "gateway",
        "local",
    ]
    aliased = settings.model_copy(update={"openai_base_url": "http://o/v1"})
    assert aliased.configured_endpoints({}) == ["local", "openai", "openai-responses"]
    endpoints = settings.endpoints()
    assert split_model_name(CLAUDE, endpoints) == ("anthropic", "claude-sonnet-4-5")
    assert split_model_name("local:my-model", endpoints) == ("local", "my-model")
    # A bare name, as today: Ollama's tags, a provider path, an undeclared prefix.
    for bare in ("qwen2.5:7b", "gpt-4o", "openai/gpt-4o", "nowhere:model", "anthropic:"):
        assert split_model_name(bare, endpoints) == (None, bare)


# --- routing -----------------------------------------------------------------------------


class StandIn:
    """A protocol client as the other helpers write them: records how it was built and what
    each call was given, and answers with one reasoning item and a text."""

    built: list[StandIn] = []

    def __init__(
        self, api_key: str | None, base_url: str | None, headers: Mapping[str, str] | None = None
    ) -> None:
        self.api_key, self.base_url, self.headers = api_key, base_url, dict(headers or {})
        self.calls: list[tuple[list[ChatMessage], ModelSettings]] = []
        self.closed = False
        StandIn.built.append(self)

    async def stream(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        model: ModelSettings,
        *,
        response_format: dict[str, Any] | None = None,
    ) -> AsyncIterator[ChatDelta]:
        self.calls.append((messages, model))
        thought = {"type": "thinking", "thinking": "hm", "signature": f"sig-{len(self.calls)}"}
        yield ChatDelta(
            reasoning=ReasoningItem(protocol="anthropic", model=model.name, data=thought)
        )
        if len(self.calls) == 1 and tools:
            yield ChatDelta(
                tool_call_index=0,
                tool_call_id="toolu_1",
                tool_name="calculator",
                tool_arguments='{"expression": "6 * 7"}',
            )
            yield ChatDelta(finish_reason="tool_calls", usage=Usage(input_tokens=3))
            return
        yield ChatDelta(text="42", finish_reason="stop", usage=Usage(input_tokens=5))

    async def close(self) -> None:
        self.closed = True


class ResponsesStandIn(StandIn):
    pass


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The responses and anthropic protocols built as stand-ins (their clients are written
    elsewhere; the chat protocol's is the real one)."""
    StandIn.built = []
    monkeypatch.setitem(model_backends.PROTOCOL_CLIENTS, "anthropic", (__name__, StandIn.__name__))
    monkeypatch.setitem(
        model_backends.PROTOCOL_CLIENTS, "responses", (__name__, ResponsesStandIn.__name__)
    )
    yield
    StandIn.built = []


async def test_each_protocol_gets_its_client_built_once_with_the_workers_key_and_headers(
    stand_ins: None,
) -> None:
    declared = {
        "gateway": ModelEndpoint(
            protocol="anthropic",
            base_url="http://gateway.example/v1",
            api_key_env="GATEWAY_KEY",
            headers={"Authorization": "Bearer ${GATEWAY_KEY}", "X-Team": "agents"},
        )
    }
    environ = {
        "OPENAI_API_KEY": "sk-o",
        "OPENAI_BASE_URL": "http://openai.example/v1",
        "ANTHROPIC_API_KEY": "sk-a",
        "GATEWAY_KEY": KEY,
    }
    backends = ModelBackends(declared, environ)
    assert backends.configured() == ["anthropic", "gateway", "openai", "openai-responses"]

    chat, model = backends.route("openai:gpt-4o")
    assert isinstance(chat, OpenAIChat) and model == "gpt-4o"
    assert backends.route("gpt-4o-mini") == (chat, "gpt-4o-mini")  # a bare name: openai
    assert backends.route("qwen2.5:7b") == (chat, "qwen2.5:7b")
    responses, model = backends.route("openai-responses:o3")
    assert type(responses) is ResponsesStandIn and model == "o3"
    anthropic, model = backends.route(CLAUDE)
    assert type(anthropic) is StandIn and model == "claude-sonnet-4-5"
    assert (anthropic.api_key, anthropic.base_url) == ("sk-a", None)
    gateway, model = backends.route("gateway:claude-opus-4")
    assert isinstance(gateway, StandIn) and model == "claude-opus-4"
    assert gateway.api_key == KEY and gateway.base_url == "http://gateway.example/v1"
    assert gateway.headers == {"Authorization": f"Bearer {KEY}", "X-Team": "agents"}
    assert backends.route("gateway:other")[0] is gateway  # built once per endpoint
    assert backends.route(OFFLINE_MODEL)[0] is backends.offline
    assert len(StandIn.built) == 3

    await backends.close()
    assert all(built.closed for built in StandIn.built)


def test_a_worker_without_an_endpoint_names_what_it_lacks() -> None:
    backends = ModelBackends({}, {"OPENAI_API_KEY": "sk-o"})
    assert backends.need("openai-responses:o3") is None
    assert backends.need(CLAUDE) == (
        "the model endpoint 'anthropic' (set ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL on the worker)"
    )
    assert ModelBackends().need("gpt-4o") == "a model endpoint for 'gpt-4o'"  # as before
    assert ModelBackends().need(OFFLINE_MODEL) is None
    with pytest.raises(ApplicationError) as failure:
        backends.route(CLAUDE)
    assert failure.value.type == errors.LLM_NOT_CONFIGURED and failure.value.non_retryable
    assert "lacks the model endpoint 'anthropic'" in failure.value.message


def test_a_model_is_sent_only_its_own_reasoning() -> None:
    mine = ReasoningItem(protocol="anthropic", model=CLAUDE, data={"signature": "a"})
    theirs = ReasoningItem(protocol="responses", model="openai-responses:o3", data={"id": "r"})
    plain = ChatMessage(role="user", content="hi")
    said = ChatMessage(role="assistant", content="ok", reasoning=[theirs, mine])
    sent = reasoning_of([plain, said], CLAUDE)
    assert sent[0] is plain
    assert sent[1].reasoning == [mine] and sent[1].content == "ok"
    assert reasoning_of([said], "openai:gpt-4o")[0].reasoning == []


async def test_a_task_on_an_endpoint_runs_with_the_bare_id_and_its_reasoning_named_by_the_task(
    ts_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    stand_ins: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://anthropic.invalid")
    local = {"local": ModelEndpoint(protocol="chat", base_url=fake_openai.url)}
    settings = settings.model_copy(update={"model_endpoints": local})
    scripted = fake_openai.script([text("from the local endpoint")])
    async with running_worker(ts_env.client, settings) as worker:
        runtime = AgentRuntime(ts_env.client, settings)
        chat = await runtime.run(agent_task(f"local:{scripted}", "hello"))
        assert (await chat.result()).result == "from the local endpoint"
        assert fake_openai.calls(scripted) == 1  # asked for by its bare id
        handle = await runtime.run(agent_task(CLAUDE, "What is 6 * 7?", tools=["calculator"]))
        assert (await handle.result()).result == "42"
        events = await handle.events()
        seen = worker.llm.conversations.known(handle.id).values()
    [client] = StandIn.built
    assert [model.name for _, model in client.calls] == ["claude-sonnet-4-5"] * 2
    # The reasoning the endpoint gave is named by the task's model, whatever it called it.
    reasoned = [item for message in seen for item in message.reasoning]
    assert reasoned and {item.model for item in reasoned} == {CLAUDE}
    assert KEY not in json.dumps([e.model_dump(mode="json") for e in events])


# --- the refusal -------------------------------------------------------------------------


async def test_a_task_naming_an_endpoint_no_live_worker_has_is_refused_before_it_starts(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    offline_only = settings.model_copy(update={"openai_api_key": None, "openai_base_url": None})
    lacks = (
        "lacks the model endpoint 'anthropic' (set ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL "
        "on the worker)"
    )
    sub_agent = AgentSpec(
        name="critic", description="Reviews.", tools=[], model=ModelSettings(name=CLAUDE)
    )
    builtins = load_tools(settings.tools).allowed(None)  # what the CLI's tasks require
    served = ToolRegistry([*builtins, agent_tool(sub_agent)])
    async with running_worker(dev_env.client, offline_only, registry=served):
        await until_polled(dev_env, offline_only)
        runtime = AgentRuntime(dev_env.client, offline_only, tools=ToolRegistry())
        with pytest.raises(TaskRefusedError, match=re.escape(lacks)) as refused:
            await runtime.run(agent_task(CLAUDE))
        assert (refused.value.status, refused.value.kind) == (409, "no_capable_worker")
        fallback = AgentTask(
            task="hi", model=ModelSettings(name=OFFLINE_MODEL, fallback_models=[CLAUDE])
        )
        with pytest.raises(
            TaskRefusedError, match=re.escape(f"'{CLAUDE}', a fallback model: the worker {lacks}")
        ):
            await runtime.run(fallback)
        with_agent = AgentRuntime(
            dev_env.client, offline_only, tools=ToolRegistry([agent_tool(sub_agent)])
        )
        with pytest.raises(TaskRefusedError, match="the model of sub-agent 'critic'"):
            await with_agent.run(agent_task(OFFLINE_MODEL, tools=["agent__critic"]))
        # A bare name with a colon is no endpoint: served where bare names are (here nowhere).
        with pytest.raises(TaskRefusedError, match=re.escape("a model endpoint for 'qwen2.5:7b'")):
            await runtime.run(agent_task("qwen2.5:7b"))
        async with api_over(runtime) as api:
            answer = await api.post(
                "/tasks",
                json={"task": "hi", "model": {"name": "offline", "fallback_models": [CLAUDE]}},
            )
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"] == "no_capable_worker" and lacks in answer.json()["detail"]
        code, _, err = await starter(
            dev_env, offline_only, "run", "hi", "--no-worker", "--model", CLAUDE
        )
        assert code == 2 and err.count("\n") == 1 and lacks in err, err
        code, _, err = await starter(
            dev_env,
            offline_only,
            "run",
            "hi",
            "--no-worker",
            "--model",
            OFFLINE_MODEL,
            "--fallback",
            "offline",
            "--fallback",
            CLAUDE,
        )
        assert code == 2 and err.count("\n") == 1 and "a fallback model" in err, err
        assert await started_tasks(dev_env, settings) == 0


async def test_the_model_list_is_read_at_the_endpoint_the_name_selects(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    listing = FakeOpenAI(lists_models=True)
    try:
        listing.script([text("hi")], model="gpt-4")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://anthropic.invalid")
        local = {"local": ModelEndpoint(protocol="chat", base_url=listing.url)}
        settings = settings.model_copy(update={"model_endpoints": local})
        await check_model(settings, AgentTask(task="a", model=ModelSettings(name="local:gpt-4")))
        with pytest.raises(TaskRefusedError, match=r"did you mean 'local:gpt-4'\?"):
            await check_model(settings, AgentTask(task="a", model=ModelSettings(name="local:gpt4")))
        fallback = ModelSettings(name="local:gpt-4", fallback_models=["local:gtp-4"])
        with pytest.raises(TaskRefusedError, match="unknown model 'local:gtp-4'"):
            await check_model(settings, AgentTask(task="a", model=fallback))
        # Anthropic's list is never read: the name goes to the worker as it is.
        await check_model(settings, AgentTask(task="a", model=ModelSettings(name=CLAUDE)))
    finally:
        listing.close()


# --- keys --------------------------------------------------------------------------------


async def test_keys_stay_out_of_ws_config_and_offers_and_the_redactor_knows_them(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    declared = {
        "gateway": {
            "protocol": "chat",
            "api_key_env": "GATEWAY_KEY",
            "headers": {"Authorization": "Bearer ${GATEWAY_KEY}", "X-Token": LITERAL_HEADER},
        }
    }
    environ = {
        "GATEWAY_KEY": KEY,
        "ANTHROPIC_API_KEY": "sk-ant-secret-abcdef123456",
        "WAYSTATION_MODEL_ENDPOINTS": json.dumps(declared),
    }
    code, out, err = await starter(dev_env, settings, "config", extra_env=environ)
    assert code == 0, err
    shown = json.loads(out)["model_endpoints"]["gateway"]
    assert shown["headers"] == {"Authorization": "Bearer ${GATEWAY_KEY}", "X-Token": "****"}
    for secret in (KEY, LITERAL_HEADER, environ["ANTHROPIC_API_KEY"]):
        assert secret not in out

    with_gateway = settings.model_copy(
        update={"model_endpoints": {"gateway": ModelEndpoint.model_validate(declared["gateway"])}}
    )
    offer = offer_of(with_gateway, ToolRegistry(), [], settings.task_queue, environ)
    assert offer.endpoints == ["anthropic", "gateway", "openai", "openai-responses"]
    for secret in (KEY, LITERAL_HEADER, environ["ANTHROPIC_API_KEY"]):
        assert secret not in offer.model_dump_json()
    known = known_secrets(with_gateway, environ)
    assert {KEY, LITERAL_HEADER, environ["ANTHROPIC_API_KEY"]} <= set(known)


# --- model facts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "window", "way"),
    [
        (ModelSettings(name="gpt-4o-mini"), 128_000, "native"),
        (ModelSettings(name="openai-responses:gpt-5"), 400_000, "native"),
        (ModelSettings(name=CLAUDE), 200_000, "tool"),
        (ModelSettings(name="anthropic:gpt-4o"), 128_000, "tool"),  # not an OpenAI protocol
        (ModelSettings(name="qwen2.5:7b"), 32_768, "tool"),
        (ModelSettings(name="my-local-model"), 16_000, "tool"),
        (ModelSettings(name="gpt-4.1", fallback_models=["openai:gpt-4o"]), 128_000, "native"),
        (ModelSettings(name="gpt-4.1", fallback_models=[CLAUDE]), 200_000, "tool"),
        (ModelSettings(name=CLAUDE, context_window_tokens=9_000), 9_000, "tool"),
        (ModelSettings(name="gpt-4o", structured_output="tool"), 128_000, "tool"),
    ],
)
def test_model_facts_are_resolved_when_a_task_is_created(
    settings: Settings, model: ModelSettings, window: int, way: str
) -> None:
    task = with_defaults(settings, AgentTask(task="a", model=model))
    assert task.model.context_window_tokens == window
    assert task.model.structured_output == way
    assert with_defaults(settings, task) == task  # resolved once: the same task again


async def test_the_task_holds_its_facts_and_a_sub_agents_model_is_resolved_as_it_loads(
    ts_runtime: AgentRuntime,
) -> None:
    handle = await ts_runtime.run(agent_task(OFFLINE_MODEL, "What is 2 + 3?"))
    await handle.result()
    [started] = of_type(await handle.events(), "task_started")
    assert started.task.model.context_window_tokens == 16_000
    assert started.task.model.structured_output == "tool"

    spec = AgentSpec(name="critic", description="Reviews.", model=ModelSettings(name=CLAUDE))
    plain = AgentSpec(name="helper", description="Helps.")
    registry = with_model_facts(
        ToolRegistry([agent_tool(spec), agent_tool(plain)]), Settings().endpoints()
    )
    critic = registry.get("agent__critic")
    assert critic is not None and critic.agent is not None and critic.agent.model is not None
    assert critic.agent.model.context_window_tokens == 200_000
    assert critic.agent.model.structured_output == "tool"
    helper = registry.get("agent__helper")
    assert helper is not None and helper.agent is not None and helper.agent.model is None


def test_a_task_created_before_keeps_the_values_it_had() -> None:
    # Fields unset, as every task recorded before the client resolved them.
    assert context_limit(None, ModelSettings(name="gpt-4o-mini")) == 128_000 - 4_096
    assert context_limit(None, ModelSettings(name="claude-3-opus")) == 200_000 - 4_096
    assert context_limit(None, ModelSettings(name="my-local-model")) == 16_000 - 4_096
    assert outputs.mode(ModelSettings(name="gpt-4o")) == "native"
    assert outputs.mode(ModelSettings(name="openai/o3-mini")) == "native"
    assert outputs.mode(ModelSettings(name="claude-3-opus")) == "tool"
    # A resolved task reads only itself.
    resolved = ModelSettings(name="gpt-4o", context_window_tokens=50_000, structured_output="tool")
    assert context_limit(None, resolved) == 50_000 - 4_096
    assert outputs.mode(resolved) == "tool"


def test_an_offer_names_its_endpoints_and_serves_the_names_they_select() -> None:
    mine = WorkerOffer(project="p", task_queue="q", tools=[], endpoint="https://api.openai.com/v1")
    theirs = mine.model_copy(update={"endpoints": ["anthropic", "openai"]})
    assert theirs.serves_model(CLAUDE) and not mine.serves_model(CLAUDE)
    assert theirs.serves_model("qwen2.5:7b") and mine.serves_model("gpt-4o")  # bare names
    assert not theirs.serves_model("openai-responses:o3")
    assert mine.differences(theirs) == ["model endpoints: also anthropic, openai"]
