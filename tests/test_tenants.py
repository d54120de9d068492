"""Tenants, as a promise table: a token bound to a tenant sees and decides only that tenant's
tasks, on every route of the HTTP API that names a task and through every MCP tool; another
tenant's task is answered as an unknown one is (404), so its existence is not told. An
unbound token reaches every task. Lists and the inbox show a bound token its tenant's only.
Where a task's tenant comes from (the token, the caller), that sub-agents, follow-ups and
forks keep it, and that Temporal sees it (AgentTenant, the fairness key): the dev server, a
worker, the fake OpenAI server, the real API on a port."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from fastapi.routing import APIRoute
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, api_with_tokens, of_type, wait_for_state
from tests.test_cli import starter
from tests.test_resume_fork_edges import run_closed, steps_then_answer
from waystation.activities.agent_tools import agent_tool
from waystation.activities.builtin_tools import builtin_registry
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.task_list import task_tenant
from waystation.client.temporal import temporal_binary
from waystation.client.tenant_priority import FEW_RUNNING, PRIORITY_FEW, PRIORITY_MANY
from waystation.servers.api.auth import owned_task
from waystation.servers.http_api import create_app
from waystation.settings import TENANT_NAME_PATTERN, ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows.models import TENANT_PATTERN, AgentSpec, ModelSettings

ACME, GLOBEX, OPS = "acme-token", "globex-token", "ops-token"


def tokens(names: dict[str, str]) -> dict[str, ApiToken]:
    return {
        ACME: ApiToken(role="approver", name="acme-bot", tenant=names["acme"]),
        GLOBEX: ApiToken(role="approver", name="globex-bot", tenant=names["globex"]),
        OPS: ApiToken(role="approver", name=names["ops"]),  # unbound: every task
    }


def as_(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def names() -> dict[str, str]:
    """The test's tenants (and the unbound token's name): the dev server is shared, and a
    list of a tenant's tasks must hold this test's only."""
    suffix = uuid.uuid4().hex[:8]
    return {name: f"{name}-{suffix}" for name in ("acme", "globex", "ops", "initech")}


@pytest.fixture
async def api(
    dev_env: WorkflowEnvironment, settings: Settings, names: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    """The API (and its /mcp) on a free port with the three tokens, and a worker."""
    async with api_with_tokens(dev_env, settings, tokens(names)) as client:
        yield client


@asynccontextmanager
async def mcp_as(api: httpx.AsyncClient, token: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=as_(token), timeout=60) as http,
        Client(streamable_http_client(f"{api.base_url}/mcp", http_client=http)) as client,
    ):
        yield client


def shell_task(model: str, **fields: Any) -> dict[str, Any]:
    """A task whose first step asks for approval (run_shell's default rule)."""
    return {"task": "go", "model": {"name": model, "request_timeout_seconds": 30}, **fields}


async def started_waiting(api: httpx.AsyncClient, fake: FakeOpenAI, token: str) -> str:
    # Replies to spare: a fork, and a message, each take one.
    model = fake.script([tools(("run_shell", {"command": "echo ran"}))] + [text("done")] * 4)
    created = await api.post("/tasks", json=shell_task(model), headers=as_(token))
    assert created.status_code == 201, created.text
    task_id: str = created.json()["id"]
    await status_when(api, task_id, "waiting_approval")
    return task_id


async def status_when(api: httpx.AsyncClient, task_id: str, *statuses: str) -> dict[str, Any]:
    async with asyncio.timeout(60):
        while True:
            view: dict[str, Any] = (await api.get(f"/tasks/{task_id}", headers=as_(OPS))).json()
            if view["state"]["status"] in statuses:
                return view
            await asyncio.sleep(0.05)


# Every route that names a task: (method, path after the id, JSON body). Reads first, then
# those that change the task, so each allowed call finds the task as the table expects.
TASK_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "", None),
    ("GET", "/log", None),
    ("GET", "/events?since=0", None),
    ("GET", "/messages", None),
    ("GET", "/console/api/timeline", None),
    ("POST", "/fork", {"at_seq": 0}),
    ("POST", "/messages", {"content": "also this"}),
    ("POST", "/answer", {"answer": "yes"}),
    ("POST", "/repair", None),
    ("POST", "/resume", None),
    ("POST", "/approve", {}),
    ("POST", "/reject", {}),
    ("POST", "/cancel", None),
]


async def call(
    api: httpx.AsyncClient, token: str, task_id: str, route: tuple[str, str, Any]
) -> tuple[int, dict[str, Any]]:
    """One route on one task (the SSE stream: its status and first item only)."""
    method, rest, body = route
    path = f"/tasks/{task_id}{rest}"
    if rest.startswith("/console/"):
        path = f"/console/api/tasks/{task_id}/timeline"
    async with api.stream(method, path, json=body, headers=as_(token)) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    return response.status_code, {"first": json.loads(line[5:])}
        await response.aread()
        return response.status_code, response.json()


def test_every_route_that_names_a_task_checks_the_tenant_first() -> None:
    """A route added later is held to the promise too: it takes its id as OwnedTaskId."""
    app = create_app(Settings(api_tokens=tokens({n: n for n in ("acme", "globex", "ops")})))
    routes = list(app.routes)
    for included in routes:  # FastAPI keeps an included router's routes in it, nested
        routes += getattr(getattr(included, "original_router", None), "routes", [])
    named = [r for r in routes if isinstance(r, APIRoute) and "{task_id" in r.path]
    assert len(named) == len(TASK_ROUTES)
    for route in named:
        calls = [d.call for d in route.dependant.dependencies]
        assert owned_task in calls, f"{route.path} does not check the caller's tenant"
    assert TENANT_NAME_PATTERN == TENANT_PATTERN  # a token's tenant is a task's


async def test_a_bound_token_is_told_nothing_of_another_tenants_task_on_any_route(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI, names: dict[str, str]
) -> None:
    ours = await started_waiting(api, fake_openai, ACME)
    theirs = await started_waiting(api, fake_openai, GLOBEX)
    for route in TASK_ROUTES:
        unknown = await call(api, ACME, "task-nobody-has", route)
        status, body = await call(api, ACME, theirs, route)
        assert (status, body["error"]) == (404, "not_found"), (route, body)
        assert body["detail"] == unknown[1]["detail"].replace("task-nobody-has", theirs)
    # Nothing reached their task: it still waits for its decision, alone, unforked.
    view = await status_when(api, theirs, "waiting_approval")
    assert view["tenant"] == names["globex"]
    listed = (await api.get("/tasks", headers=as_(OPS))).json()["tasks"]
    assert not any(t["id"].startswith(f"{theirs}-fork") for t in listed)

    for token, task_id in ((ACME, ours), (OPS, theirs)):  # its own; any, unbound
        for route in TASK_ROUTES:
            status, body = await call(api, token, task_id, route)
            assert status != 404 or body.get("error") != "not_found", (token, route, body)
        await status_when(api, task_id, "cancelled", "done")
    forks = [t for t in (await api.get("/tasks", headers=as_(ACME))).json()["tasks"]]
    assert {t["id"] for t in forks if "-fork-" in t["id"]}  # acme's fork of its own task


async def test_lists_and_the_inbox_show_a_bound_token_its_tenants_tasks_only(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI, names: dict[str, str]
) -> None:
    ours = await started_waiting(api, fake_openai, ACME)
    theirs = await started_waiting(api, fake_openai, GLOBEX)
    mine = await started_waiting(api, fake_openai, OPS)  # unbound: its name's
    tasks = (await api.get("/tasks", headers=as_(ACME))).json()["tasks"]
    assert [(t["id"], t["tenant"]) for t in tasks] == [(ours, names["acme"])]
    console = (await api.get("/console/api/tasks", headers=as_(ACME))).json()["tasks"]
    assert [t["id"] for t in console] == [ours]
    inbox = (await api.get("/approvals", headers=as_(ACME))).json()
    assert [i["task_id"] for i in inbox["approvals"]] == [ours]
    session = (await api.get("/console/api/session", headers=as_(ACME))).json()
    assert session["tenant"] == names["acme"]

    asked = await api.get(f"/tasks?tenant={names['globex']}", headers=as_(ACME))
    assert (asked.status_code, asked.json()["error"]) == (403, "forbidden_tenant")
    by_ops = (await api.get(f"/tasks?tenant={names['globex']}", headers=as_(OPS))).json()["tasks"]
    assert [t["id"] for t in by_ops] == [theirs]
    everyone = (await api.get("/tasks", headers=as_(OPS))).json()["tasks"]
    assert {ours, theirs, mine} <= {t["id"] for t in everyone}
    inbox = (await api.get("/approvals", headers=as_(OPS))).json()
    assert {ours, theirs, mine} <= {i["task_id"] for i in inbox["approvals"]}
    assert (await api.get("/tasks?tenant=x%22%20OR%20", headers=as_(OPS))).status_code == 422
    codec = await api.post("/codec/decode", content=b"{}", headers=as_(ACME))
    assert codec.status_code == 403  # it would decrypt any tenant's payloads
    for task_id in (ours, theirs, mine):
        await api.post(f"/tasks/{task_id}/cancel", headers=as_(OPS))


async def test_where_a_tasks_tenant_comes_from(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI, names: dict[str, str]
) -> None:
    acme, globex, ops, initech = names["acme"], names["globex"], names["ops"], names["initech"]
    model = fake_openai.script([text("done")] * 5)

    async def tenant_of(token: str, **fields: Any) -> tuple[int, Any]:
        created = await api.post("/tasks", json=shell_task(model, **fields), headers=as_(token))
        if created.status_code != 201:
            return created.status_code, created.json()
        return 201, (await status_when(api, created.json()["id"], "done"))["tenant"]

    assert await tenant_of(ACME) == (201, acme)  # bound: its tenant
    assert await tenant_of(ACME, tenant=acme) == (201, acme)
    refused = await tenant_of(ACME, tenant=globex)
    assert refused[0] == 403 and refused[1]["error"] == "forbidden_tenant"
    assert refused[1]["detail"] == (
        f"tenant: this token is bound to tenant {acme!r} and may not start a task for {globex!r}"
    )
    assert await tenant_of(OPS) == (201, ops)  # unbound: the token's name
    assert await tenant_of(OPS, tenant=initech) == (201, initech)  # or the one it names

    # One Idempotency-Key, two tenants: two tasks, neither finds the other's.
    key = {"Idempotency-Key": "same-key"}
    first = await api.post("/tasks", json=shell_task(model), headers=as_(ACME) | key)
    second = await api.post("/tasks", json=shell_task(model), headers=as_(GLOBEX) | key)
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]


async def test_mcp_tools_over_http_hold_a_bound_token_to_its_tenant(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI, names: dict[str, str]
) -> None:
    theirs = await started_waiting(api, fake_openai, GLOBEX)
    async with mcp_as(api, ACME) as mcp:
        unknown = await mcp.call_tool("task_status", {"task_id": "task-nobody-has"})
        unknown_said = unknown.content[0].text.split(": ", 1)[1]  # type: ignore[union-attr]
        for tool, arguments in (
            ("task_status", {}),
            ("task_events", {}),
            ("approve", {}),
            ("reject", {}),
            ("answer", {"answer": "yes"}),
            ("send_message", {"content": "hi"}),
            ("cancel", {}),
        ):
            refused = await mcp.call_tool(tool, {"task_id": theirs, **arguments})
            assert refused.is_error, tool
            said = refused.content[0].text.split(": ", 1)[1]  # type: ignore[union-attr]
            assert said == unknown_said.replace("task-nobody-has", theirs), tool
        model = fake_openai.script([text("done")])
        started = await mcp.call_tool("run_task", {"task": "go", "model": model, "task_id": "t1"})
        ours = started.structured_content["task_id"]  # type: ignore[index]
        assert ours == f"{names['acme']}:t1"  # a bound token's ids are its tenant's own
        other = await mcp.call_tool(
            "run_task", {"task": "go", "model": model, "tenant": names["globex"]}
        )
        assert other.is_error
        seen = await mcp.call_tool("task_status", {"task_id": ours})
        assert not seen.is_error
    assert (await status_when(api, ours, "done"))["tenant"] == names["acme"]
    assert (await status_when(api, theirs, "waiting_approval"))["state"]["step"] == 1
    await api.post(f"/tasks/{theirs}/cancel", headers=as_(OPS))


async def test_sub_agents_follow_ups_and_forks_keep_the_tenant_and_temporal_sees_it(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, names: dict[str, str]
) -> None:
    acme = names["acme"]
    child_model = fake_openai.script([text("found it")])
    helper = AgentSpec(
        name="helper",
        description="helps",
        model=ModelSettings(name=child_model, request_timeout_seconds=30),
    )
    registry = builtin_registry()
    registry.register(agent_tool(helper))
    parent_model = fake_openai.script(
        [tools(("agent__helper", {"task": "look"})), text("done"), text("again"), text("forked")]
    )
    async with running_worker(dev_env.client, settings, registry=registry):
        runtime = AgentRuntime(dev_env.client, settings, tools=registry)
        handle = await runtime.run(agent_task(parent_model, timeout=30), tenant=acme)
        await handle.result()
        [started] = of_type(await handle.events(), "agent_started")
        child = runtime.get(started.child_id)
        [child_start] = of_type(await child.events(0, limit=1), "task_started")
        assert child_start.task.tenant == acme  # inherited
        for task_id in (handle.id, started.child_id):
            described = await runtime.get(task_id).describe()
            info = described.raw_description.workflow_execution_info
            assert info.priority.fairness_key == acme
            assert await task_tenant(dev_env.client, task_id) == acme
        await handle.send("and again")  # a follow-up: a new run of the task
        await wait_for_state(handle, lambda s: s.turn == 1 and s.status == "done")
        assert await task_tenant(dev_env.client, handle.id) == acme
        fork = await runtime.fork(handle.id, 0, message="from the start")
        [fork_start] = of_type(await fork.events(0, limit=1), "task_started")
        assert fork_start.task.tenant == acme
        assert await task_tenant(dev_env.client, fork.id) == acme
        listed, _ = await runtime.list_tasks(tenant=acme)
        assert {handle.id, started.child_id, fork.id} <= {t.id for t in listed}
        # Not cancelled: it may have answered already ("forked"), and a cancel would fail.
        assert (await fork.result()).result == "forked"
    address = dev_env.client.service_client.config.target_host
    listing = await asyncio.create_subprocess_exec(
        *(temporal_binary(), "workflow", "list", "--address", address, "--output", "json"),
        *("--query", f"AgentTenant='{acme}'"),
        stdout=subprocess.PIPE,
    )
    out, _ = await listing.communicate()
    assert listing.returncode == 0
    ids = {row["execution"]["workflowId"] for row in json.loads(out)}
    assert {handle.id, started.child_id, fork.id} <= ids


async def test_a_tenant_with_few_tasks_running_goes_ahead_of_a_busy_one(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, names: dict[str, str]
) -> None:
    """Temporal task priority by tenant: once a tenant has FEW_RUNNING tasks running, its
    next ones queue behind the tasks of a tenant with fewer (its tasks and sub-agents, and
    their activities, inherit the task's priority). No worker polls: the tasks stay running."""
    busy, quiet = names["acme"], names["globex"]
    runtime = AgentRuntime(dev_env.client, settings)
    model = fake_openai.script(lambda body: text("never asked"))
    first = [await runtime.run(agent_task(model), tenant=busy) for _ in range(FEW_RUNNING)]
    running = f'AgentTenant = "{busy}" AND ExecutionStatus = "Running"'
    async with asyncio.timeout(30):  # until visibility counts them all
        while (await dev_env.client.count_workflows(running)).count < FEW_RUNNING:
            await asyncio.sleep(0.1)
    late = await runtime.run(agent_task(model), tenant=busy)
    few = await runtime.run(agent_task(model), tenant=quiet)
    keys = {}
    for handle in (first[0], late, few):
        described = await handle.describe()
        keys[handle.id] = described.raw_description.workflow_execution_info.priority
    assert keys[first[0].id].priority_key == keys[few.id].priority_key == PRIORITY_FEW
    assert keys[late.id].priority_key == PRIORITY_MANY > PRIORITY_FEW
    assert {p.fairness_key for p in keys.values()} == {busy, quiet}
    for handle in (*first, late, few):
        await handle.cancel()


async def test_a_burst_of_one_tenants_tasks_is_counted_as_it_starts(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, names: dict[str, str]
) -> None:
    """Tasks started at once are not yet visible to one another's count: the burst shares
    one count and places its starts after it, so only the first FEW_RUNNING go ahead."""
    busy = names["acme"]
    runtime = AgentRuntime(dev_env.client, settings)
    model = fake_openai.script(lambda body: text("never asked"))
    burst = FEW_RUNNING + 5
    handles = await asyncio.gather(
        *(runtime.run(agent_task(model), tenant=busy) for _ in range(burst))
    )
    try:
        levels = []
        for handle in handles:
            described = await handle.describe()
            levels.append(described.raw_description.workflow_execution_info.priority.priority_key)
        assert sorted(levels) == [PRIORITY_FEW] * FEW_RUNNING + [PRIORITY_MANY] * 5
    finally:
        for handle in handles:
            await handle.cancel()


async def test_a_resumed_task_keeps_its_tenant(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, names: dict[str, str]
) -> None:
    acme = names["acme"]
    model = steps_then_answer(fake_openai, steps=2)
    async with running_worker(dev_env.client, settings):
        runtime = AgentRuntime(dev_env.client, settings)
        handle = await runtime.run(agent_task(model, max_steps=1, timeout=30), tenant=acme)
        await run_closed(dev_env, handle.id)  # failed on its step limit; reset, not signalled
        resumed = await runtime.resume(handle.id, max_steps=5)
        await wait_for_state(resumed, lambda s: s.status == "done")
        assert await task_tenant(dev_env.client, handle.id) == acme
        described = await resumed.describe()
        assert described.raw_description.workflow_execution_info.priority.fairness_key == acme


async def test_the_cli_runs_lists_and_shows_a_tenants_task(
    dev_env: WorkflowEnvironment, settings: Settings, names: dict[str, str]
) -> None:
    acme, globex, task_id = names["acme"], names["globex"], f"cli-{names['acme']}"
    code, _, err = await starter(
        dev_env, settings, "run", "--tenant", acme, "--id", task_id, "--quiet", "6 * 7?"
    )
    assert code == 0, err
    code, out, _ = await starter(dev_env, settings, "status", task_id)
    assert f"tenant    {acme}" in out.splitlines()
    code, out, _ = await starter(dev_env, settings, "list", "--tenant", acme)
    assert [line.split()[0] for line in out.splitlines()] == [task_id]
    code, out, err = await starter(dev_env, settings, "list", "--tenant", globex)
    assert (code, out) == (0, "") and f"no tasks of tenant {globex}" in err


async def test_a_run_continued_as_new_keeps_the_tenant(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, names: dict[str, str]
) -> None:
    acme = names["acme"]
    model = steps_then_answer(fake_openai, steps=3)
    async with running_worker(dev_env.client, settings):
        runtime = AgentRuntime(dev_env.client, settings)
        task = agent_task(model, timeout=30, continue_as_new_after_steps=1)
        handle = await runtime.run(task, tenant=acme)
        await handle.result()
        described = await handle.describe()
    info = described.raw_description.workflow_execution_info
    assert info.first_run_id != info.execution.run_id  # a later run than the first
    assert await task_tenant(dev_env.client, handle.id) == acme
    assert info.priority.fairness_key == acme
