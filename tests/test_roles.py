"""What each role may set on a task, on every entry path: the real HTTP API and its MCP
endpoint (a reader and an approver token), the CLI as a subprocess, and AgentRuntime; the
dev server, a worker, the fake OpenAI server. Readers may only narrow a task's rights; the
deployment's caps hold for everyone; sub-agents' ids and parent links are the workflow's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, api_with_tokens, serving_api
from tests.test_cli import starter
from waystation.activities.agent_tools import agent_tool
from waystation.activities.builtin_tools import builtin_registry
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.task_rights import TaskRefusedError
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows.events import TaskStarted
from waystation.workflows.models import AgentSpec, ParentLink

READER = "reader-token"
APPROVER = "approver-token"
AS_READER = {"Authorization": f"Bearer {READER}"}
AS_APPROVER = {"Authorization": f"Bearer {APPROVER}"}
VICTIM_CHILD = "task-victim/1/call_1"  # workflows/agents.child_id's form
PARENT = {
    "task_id": "task-victim",
    "root_id": "task-victim",
    "path": ["x"],
    "depth": 1,
    "call_id": "c",
}


@pytest.fixture
async def api(dev_env: WorkflowEnvironment, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The API (and its /mcp) on a free port, a reader and an approver token, a worker."""
    tokens = {
        READER: ApiToken(role="reader", name="rita"),
        APPROVER: ApiToken(role="approver", name="alice"),
    }
    async with api_with_tokens(dev_env, settings, tokens) as client:
        yield client


@asynccontextmanager
async def mcp_as(api: httpx.AsyncClient, token: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(f"{api.base_url}/mcp", http_client=http)) as client,
    ):
        yield client


def new_task(model: str, **fields: Any) -> dict[str, Any]:
    return {"task": "go", "model": {"name": model, "request_timeout_seconds": 30}, **fields}


async def state_when(api: httpx.AsyncClient, task_id: str, *statuses: str) -> dict[str, Any]:
    async with asyncio.timeout(60):
        while True:
            state: dict[str, Any] = (
                await api.get(f"/tasks/{task_id}", headers=AS_APPROVER)
            ).json()["state"]
            if state["status"] in statuses:
                return state
            await asyncio.sleep(0.05)


async def test_a_reader_may_only_tighten_approval_an_approver_may_loosen_it(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    shell = fake_openai.script([tools(("run_shell", {"command": "echo ran"})), text("done")])
    for rules in (
        {"run_shell": "never"},
        {"write_file": "never"},
        {"run_shell": "outside_scratch"},
    ):
        refused = await api.post(
            "/tasks", json=new_task(shell, approval={"policy": rules}), headers=AS_READER
        )
        assert refused.status_code == 403, refused.text
        [(tool, rule)] = rules.items()
        body = refused.json()
        assert body["error"] == "forbidden_setting"
        assert body["detail"].startswith(f"approval.policy.{tool}: a reader may not set '{rule}'")
        assert "only an approver may loosen approval" in body["detail"]
    assert fake_openai.calls(shell) == 0  # nothing started, nothing ran

    stricter = fake_openai.script([tools(("write_file", {"path": "scratch/a", "content": "x"}))])
    tightened = await api.post(
        "/tasks",
        json=new_task(
            stricter, approval={"policy": {"write_file": "always", "read_file": "never"}}
        ),
        headers=AS_READER,
    )
    assert tightened.status_code == 201, tightened.text
    waiting = await state_when(api, tightened.json()["id"], "waiting_approval")
    [pending] = waiting["pending_approvals"].values()
    assert pending["tool"] == "write_file"  # in scratch/, yet asked: the reader's stricter rule
    await api.post(f"/tasks/{tightened.json()['id']}/cancel", headers=AS_APPROVER)

    loosened = await api.post(
        "/tasks",
        json=new_task(shell, approval={"policy": {"run_shell": "never"}}),
        headers=AS_APPROVER,
    )
    assert loosened.status_code == 201, loosened.text
    done = await state_when(api, loosened.json()["id"], "done", "waiting_approval")
    assert done["status"] == "done" and done["result"] == "done"
    # A fork is a task its caller starts: a reader may not fork the approver's loosening.
    forked = await api.post(
        f"/tasks/{loosened.json()['id']}/fork", json={"at_seq": 0}, headers=AS_READER
    )
    assert forked.status_code == 403, forked.text
    assert forked.json()["detail"].startswith("approval.policy.run_shell: a reader may not")


async def test_a_reader_names_only_the_mcp_servers_the_deployment_declares(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("ok")])
    widened = new_task(model, mcp_servers=["elsewhere"], tools=["elsewhere__run"])
    refused = await api.post("/tasks", json=widened, headers=AS_READER)
    assert refused.status_code == 403, refused.text
    assert refused.json()["detail"] == (
        "mcp_servers: a reader may name only the MCP servers the deployment declares, "
        "not 'elsewhere'"
    )
    assert fake_openai.calls(model) == 0
    narrowed = await api.post("/tasks", json=new_task(model, mcp_servers=[]), headers=AS_READER)
    assert narrowed.status_code == 201, narrowed.text


@pytest.mark.parametrize("token", [READER, APPROVER])
async def test_limits_above_the_deployments_caps_are_refused_for_every_role(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI, token: str
) -> None:
    who = {"Authorization": f"Bearer {token}"}
    model = fake_openai.script([text("ok")])
    for setting, value, cap in (
        ("max_steps", 100_000, 10_000),
        ("max_agent_depth", 20, 5),
        ("max_agent_calls", 100, 16),
    ):
        refused = await api.post("/tasks", json=new_task(model, **{setting: value}), headers=who)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == "over_cap"
        assert refused.json()["detail"].startswith(
            f"{setting} {value} is above this deployment's cap of {cap} (WAYSTATION_"
        )
    assert fake_openai.calls(model) == 0
    at_cap = await api.post("/tasks", json=new_task(model, max_steps=10_000), headers=who)
    assert at_cap.status_code == 201, at_cap.text
    task_id = at_cap.json()["id"]
    await state_when(api, task_id, "done")

    fork = await api.post(
        f"/tasks/{task_id}/fork", json={"at_seq": 0, "max_steps": 50_000}, headers=who
    )
    assert fork.status_code == 400 and "max_steps 50000 is above" in fork.json()["detail"]
    # Resuming and messages are an approver's: the cap holds for it too.
    resumed = await api.post(f"/tasks/{task_id}/resume", json={"max_steps": 50_000}, headers=who)
    sent = await api.post(
        f"/tasks/{task_id}/messages", json={"content": "more", "max_steps": 50_000}, headers=who
    )
    if token == APPROVER:
        assert resumed.status_code == 400 and "max_steps 50000 is above" in resumed.text
        assert sent.status_code == 400 and "max_steps 50000 is above" in sent.text
    else:
        assert resumed.status_code == sent.status_code == 403

    async with mcp_as(api, token) as client:
        over = await client.call_tool(
            "run_task", {"task": "go", "model": model, "max_steps": 50_000}
        )
        assert over.is_error
        assert "max_steps 50000 is above this deployment's cap of 10000" in str(over.content)


async def test_sub_agent_ids_and_parent_links_are_refused_on_every_client_path(
    api: httpx.AsyncClient,
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
) -> None:
    model = fake_openai.script([text("ok")])
    for who in (AS_READER, AS_APPROVER):
        posed = await api.post("/tasks", json=new_task(model, parent=PARENT), headers=who)
        assert posed.status_code == 400, posed.text
        assert posed.json()["detail"].startswith("parent is set only by a task that starts")

    async with mcp_as(api, READER) as client:
        taken = await client.call_tool(
            "run_task", {"task": "go", "model": model, "task_id": VICTIM_CHILD}
        )
        assert taken.is_error and "the form of a sub-agent's id" in str(taken.content)

    runtime = AgentRuntime(dev_env.client, settings)
    with pytest.raises(TaskRefusedError, match="the form of a sub-agent's id"):
        await runtime.run(agent_task(model), task_id=VICTIM_CHILD)
    linked = agent_task(model, parent=ParentLink(**PARENT))
    with pytest.raises(TaskRefusedError, match="parent is set only by a task"):
        await runtime.run(linked)
    with pytest.raises(TaskRefusedError, match="the form of a sub-agent's id"):
        await runtime.fork("task-victim", 0, new_task_id=VICTIM_CHILD)

    code, _, err = await starter(
        dev_env, settings, "run", "--no-worker", "--id", VICTIM_CHILD, "go"
    )
    assert code == 2, err
    assert f"error: task id {VICTIM_CHILD!r} contains '/'" in err
    assert fake_openai.calls(model) == 0
    for task_id in (VICTIM_CHILD, "task-victim"):
        described = await api.get(f"/tasks/{task_id}", headers=AS_APPROVER)
        assert described.status_code == 404  # nothing was started under either id


async def test_a_sub_agent_above_the_step_cap_is_refused_before_the_task_starts(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("ok")])
    registry = builtin_registry()
    registry.register(agent_tool(AgentSpec(name="long", description="runs long", max_steps=500)))
    planner = AgentSpec(name="planner", description="plans", tools=["agent__long"])
    registry.register(agent_tool(planner))
    capped = settings.model_copy(update={"max_steps_cap": 100})
    runtime = AgentRuntime(dev_env.client, capped, tools=registry)
    # Called by the planner, `long` is in the tree of a task that may call only the planner.
    with pytest.raises(TaskRefusedError) as refused:
        await runtime.run(agent_task(model, tools=["agent__planner"]))
    assert str(refused.value) == (
        "the sub-agent long's max_steps 500 is above this deployment's cap of 100 "
        "(WAYSTATION_MAX_STEPS_CAP)"
    )
    runtime.admit(runtime.with_defaults(agent_task(model, tools=["read_file"])))  # no `long`


MATH = {"name": "math", "description": "Works out arithmetic.", "tools": ["calculator"]}


async def test_a_reader_calls_only_the_deployments_sub_agents_an_approver_may_define_its_own(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    tokens = {
        READER: ApiToken(role="reader", name="rita"),
        APPROVER: ApiToken(role="approver", name="alice"),
    }
    settings = settings.model_copy(update={"api_tokens": tokens, "agents": json.dumps([MATH])})
    runtime = AgentRuntime(dev_env.client, settings)
    model = fake_openai.script(lambda body: text("ok"))
    # A definition of one's own: the same name with wider tools, or a new name.
    widened = {**MATH, "tools": ["run_shell"], "system_prompt": "Run what you are told."}
    shell = {"name": "shell", "description": "Runs commands.", "tools": ["run_shell"]}
    async with serving_api(create_app(settings, runtime)) as port:
        async with (
            running_worker(dev_env.client, settings),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as api,
        ):
            for agents, tools_named in (([widened], None), ([shell], ["agent__shell"])):
                body = new_task(model, agents=agents, tools=tools_named)
                refused = await api.post("/tasks", json=body, headers=AS_READER)
                assert refused.status_code == 403, refused.text
                name = agents[0]["name"]
                assert refused.json()["error"] == "forbidden_setting"
                assert refused.json()["detail"] == (
                    f"agents.{name}: a reader may call only the deployment's sub-agents as it "
                    "defines them (WAYSTATION_AGENTS); only an approver may define its own"
                )
            assert fake_openai.calls(model) == 0
            # The deployment's definitions, given or filled in, and none at all, start.
            held = {}
            for given in (None, [MATH], []):
                body = new_task(model, **({"agents": given} if given is not None else {}))
                started = await api.post("/tasks", json=body, headers=AS_READER)
                assert started.status_code == 201, started.text
                held[started.json()["id"]] = given
            # An approver may give a task a definition of its own, of tools that exist.
            unknown = {**shell, "tools": ["teleport"]}
            body = new_task(model, agents=[unknown], tools=["agent__shell"])
            refused = await api.post("/tasks", json=body, headers=AS_APPROVER)
            assert refused.status_code == 422 and "'teleport'" in refused.text, refused.text
            body = new_task(model, agents=[shell], tools=["agent__shell"])
            own = await api.post("/tasks", json=body, headers=AS_APPROVER)
            assert own.status_code == 201, own.text
            for task_id, given in [*held.items(), (own.json()["id"], [shell])]:
                [first] = await runtime.get(task_id).events(0, limit=1)
                assert isinstance(first, TaskStarted)
                expected = [MATH] if given is None else given
                assert first.task.agents == [AgentSpec.model_validate(a) for a in expected]
