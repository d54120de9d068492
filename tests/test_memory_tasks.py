"""Memory across tasks, end to end on the time-skipping server against the fake model: a task
remembers, a later task of the same tenant and agent recalls it (by tool, and with --recall
at its start); another tenant's task cannot; a sub-agent has a namespace of its own."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task
from waystation.activities.storage import Storage
from waystation.activities.tool_modules import load_tools
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.starting import with_defaults
from waystation.client.task_rights import TaskRefusedError, admit
from waystation.settings import BUILTIN_TOOLS_MODULE, Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.postgres import PostgresServer
from waystation.testing.settings import isolated_settings
from waystation.testing.workers import running_worker
from waystation.workflows.memory import child_namespace, with_namespace
from waystation.workflows.models import AgentSpec, ApprovalSettings

PARIS = "Acme's on-call lives in Europe/Paris"
MEMORY_TOOLS_MODULE = "waystation.activities.memory_tools"


@pytest.fixture(params=["sqlite", "postgresql"])
def memory_settings(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    postgres: PostgresServer,
) -> Settings:
    """The memory tools offered; the storage on SQLite or on PostgreSQL."""
    shared = {"database_url": postgres.create_database()} if request.param == "postgresql" else {}
    return isolated_settings(
        tmp_path, fake_openai.url, tools=[BUILTIN_TOOLS_MODULE, MEMORY_TOOLS_MODULE], **shared
    )


@pytest.fixture
async def runtime(
    ts_env: WorkflowEnvironment, memory_settings: Settings
) -> AsyncIterator[AgentRuntime]:
    async with running_worker(ts_env.client, memory_settings):
        yield AgentRuntime(ts_env.client, memory_settings)


async def test_a_task_remembers_and_a_later_task_recalls_it(
    runtime: AgentRuntime, fake_openai: FakeOpenAI, memory_settings: Settings
) -> None:
    first = fake_openai.script(
        [
            tools(("remember", {"key": "timezone", "text": PARIS})),
            text("Noted."),
        ]
    )
    handle = await runtime.run(agent_task(first), tenant="acme", task_id="remembers")
    assert (await handle.result()).result == "Noted."
    observed = [e for e in await handle.events() if e.type == "observation"]
    assert observed[0].output == "remembered 'timezone'" and not observed[0].is_error

    later = fake_openai.script([tools(("recall", {"query": "which timezone?"})), text("Paris.")])
    recalled = await runtime.run(agent_task(later), tenant="acme", task_id="recalls")
    await recalled.result()
    outputs = [e.output for e in await recalled.events() if e.type == "observation"]
    assert outputs == ["timezone: Acme's on-call lives in Europe/Paris"]

    # Another tenant's task, same agent: its namespace is its own, and holds nothing.
    foreign = fake_openai.script([tools(("recall", {"query": "timezone"})), text("?")])
    other = await runtime.run(agent_task(foreign), tenant="globex", task_id="foreign")
    await other.result()
    outputs = [e.output for e in await other.events() if e.type == "observation"]
    assert outputs == ["nothing remembered matches 'timezone'"]

    # Loaded at the start with --recall: stated in an event, and in the system prompt.
    loaded = fake_openai.script([text("It is Paris.")])
    task = agent_task(loaded, recall="timezone of the on-call")
    started = await runtime.run(task, tenant="acme", task_id="loads")
    await started.result()
    events = await started.events()
    assert [e.type for e in events][:2] == ["task_started", "memory_recalled"]
    memory = events[1]
    assert memory.type == "memory_recalled" and memory.namespace == "acme:main"
    assert [(i.key, i.value) for i in memory.items] == [
        ("timezone", "Acme's on-call lives in Europe/Paris")
    ]
    sent = fake_openai.requests[loaded][0]["messages"]
    assert [m["role"] for m in sent] == ["system", "system", "user"]
    assert "Europe/Paris" in sent[1]["content"]

    async with Storage.from_settings(memory_settings) as storage:
        item = await storage.memory.get("acme:main", "timezone")
        assert item is not None and item.revision == 1


async def test_a_namespace_of_another_tenant_is_refused_and_a_sub_agent_has_its_own(
    runtime: AgentRuntime,
) -> None:
    task = agent_task("offline", memory_namespace="globex:main")
    with pytest.raises(TaskRefusedError) as refused:
        await runtime.run(task, tenant="acme")
    assert refused.value.kind == "forbidden_namespace" and refused.value.status == 403
    parent = with_namespace(agent_task("offline", tenant="acme"))
    assert parent.memory_namespace == "acme:main"
    helper = AgentSpec(name="helper", description="helps")
    assert child_namespace(parent, helper) == "acme:helper"
    shared = helper.model_copy(update={"shared_memory": True})
    assert child_namespace(parent, shared) == "acme:main"
    assert with_namespace(agent_task("offline")).memory_namespace == "main"


def test_the_memory_approval_setting_fills_the_policy_and_a_reader_may_not_loosen_it(
    memory_settings: Settings,
) -> None:
    strict = memory_settings.model_copy(update={"memory_approval": "always"})
    registry = load_tools(strict.tools)
    task = with_defaults(strict, agent_task("offline"), frozenset(registry.names()))
    assert task.approval.policy == {"remember": "always", "forget": "always"}
    loose = agent_task("offline", approval=ApprovalSettings(policy={"remember": "never"}))
    loose = with_defaults(strict, loose, frozenset(registry.names()))
    assert loose.approval.policy["remember"] == "never"
    with pytest.raises(TaskRefusedError) as refused:
        admit(loose, "reader", strict, registry, {})
    assert refused.value.setting == "approval.policy.remember" and refused.value.status == 403
    admit(loose, "approver", strict, registry, {})  # an approver may loosen it
    recall_only = with_defaults(strict, agent_task("offline", tools=["recall"]))
    assert recall_only.approval.policy == {}  # recall never asks


async def test_a_sub_agent_remembers_in_its_own_namespace_unless_it_shares_its_callers(
    ts_env: WorkflowEnvironment, memory_settings: Settings, fake_openai: FakeOpenAI
) -> None:
    own = AgentSpec(name="helper", description="keeps notes", tools=["remember"])
    shared = AgentSpec(
        name="scribe",
        description="keeps the caller's notes",
        tools=["remember"],
        shared_memory=True,
    )
    agents = json.dumps([spec.model_dump(mode="json") for spec in (own, shared)])
    settings = memory_settings.model_copy(update={"agents": agents})
    model = fake_openai.script(
        [
            tools(("agent__helper", {"task": "note the plan"})),
            tools(("remember", {"key": "plan", "text": "the helper's note"})),
            text("noted"),
            tools(("agent__scribe", {"task": "note the plan"})),
            tools(("remember", {"key": "plan", "text": "the scribe's note"})),
            text("noted"),
            text("both noted"),
        ]
    )
    async with running_worker(ts_env.client, settings):
        runtime = AgentRuntime(ts_env.client, settings)
        handle = await runtime.run(agent_task(model), tenant="acme", task_id="tree")
        assert (await handle.result()).result == "both noted"
    async with Storage.from_settings(settings) as storage:
        helper = await storage.memory.get("acme:helper", "plan")
        caller = await storage.memory.get("acme:main", "plan")
    assert helper is not None and helper.value == "the helper's note"
    assert caller is not None and caller.value == "the scribe's note"
