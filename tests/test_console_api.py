"""What the API serves for the web console: the page and its files under a strict policy, the
inbox across tasks, tasks with their text, and a task's log with its stream head."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from importlib import resources
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import uvicorn
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, pending_requests
from waystation.client.agent_runtime import AgentRuntime
from waystation.servers.api import inbox
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.proc import free_port
from waystation.testing.workers import running_worker
from waystation.vocabulary import STATUS_FILTERS, TERMINAL_STATUSES

APPROVER = "console-approver"
READER = "console-reader"


class Api:
    """The API over HTTP on a free port; `restart()` gives a fresh process state."""

    def __init__(self, runtime: AgentRuntime) -> None:
        self.runtime = runtime
        self.server: uvicorn.Server | None = None
        self.serving: asyncio.Task[None] | None = None
        self.port = free_port()

    async def start(self) -> httpx.AsyncClient:
        app = create_app(self.runtime.settings, self.runtime)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.serving = asyncio.create_task(self.server.serve())
        while not self.server.started:
            await asyncio.sleep(0.02)
        return httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"Authorization": f"Bearer {APPROVER}"},
            timeout=60,  # past the API's longest wait: a decision's, 30 s, then a 503
        )

    async def stop(self) -> None:
        if self.server is not None and self.serving is not None:
            self.server.should_exit = True
            await self.serving


@pytest.fixture
def console_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "api_tokens": {
                APPROVER: ApiToken(role="approver", name="ada"),
                READER: ApiToken(role="reader", name="rob"),
            }
        }
    )


@pytest.fixture
def console_runtime(dev_env: WorkflowEnvironment, console_settings: Settings) -> AgentRuntime:
    return AgentRuntime(dev_env.client, console_settings)


@pytest.fixture
async def http(
    dev_env: WorkflowEnvironment, console_settings: Settings, console_runtime: AgentRuntime
) -> AsyncIterator[httpx.AsyncClient]:
    api = Api(console_runtime)
    async with running_worker(dev_env.client, console_settings), await api.start() as client:
        yield client
    await api.stop()


async def test_the_page_and_its_files_come_with_a_strict_policy(http: httpx.AsyncClient) -> None:
    page = await http.get("/", headers={"Authorization": ""})  # the page itself needs no token
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "require-trusted-types-for 'script'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "<script" not in re.sub(r'<script type="module" src="[^"]+"></script>', "", page.text)
    for path in re.findall(r'(?:src|href)="(/console/[^"]+)"', page.text):
        asset = await http.get(path)
        assert asset.status_code == 200, path
        assert asset.headers["content-security-policy"] == policy
    script = await http.get("/console/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    for imported in re.findall(r'from "\./([a-z]+\.js)"', script.text):
        assert (await http.get(f"/console/{imported}")).status_code == 200, imported
    for path in ("/console/nope.js", "/console/..%2Fhttp_api.py", "/console/.hidden.js"):
        assert (await http.get(path)).status_code == 404, path
    console = resources.files("waystation.servers") / "console"
    assert "innerHTML" not in "".join(f.read_text() for f in console.iterdir() if f.is_file())


def test_the_console_writes_out_one_set_of_statuses_the_vocabularys() -> None:
    """The filter's statuses come from the session; the one set of statuses the scripts
    write out, those a task ends a turn with, is the vocabulary's."""
    console = resources.files("waystation.servers") / "console"
    words = r"new Set\((\[(?:\s*\"[a-z_]+\",?)*\s*\])\)"  # a set of words, written out
    written = [
        (f.name, frozenset(json.loads(found)))
        for f in console.iterdir()
        if f.name.endswith(".js")
        for found in re.findall(words, f.read_text())
    ]
    # Others are rules about some of them (which endings close a stream), not a list.
    assert [(n, f) for n, f in written if f >= TERMINAL_STATUSES] == [
        ("stream.js", TERMINAL_STATUSES)
    ]


async def test_session_says_who_and_what_the_form_offers(http: httpx.AsyncClient) -> None:
    me = (await http.get("/console/api/session")).json()
    assert (me["name"], me["role"], me["tokens_required"]) == ("ada", "approver", True)
    assert me["statuses"] == list(STATUS_FILTERS)  # the task list's filter, stuck included
    assert {"name": "run_shell", "approval": "always"} in me["tools"]
    reader = await http.get("/console/api/session", headers={"Authorization": f"Bearer {READER}"})
    assert reader.json()["role"] == "reader"
    anonymous = await http.get("/console/api/session", headers={"Authorization": ""})
    assert anonymous.status_code == 401


async def test_the_inbox_lists_requests_across_tasks_oldest_first(
    http: httpx.AsyncClient, fake_openai: FakeOpenAI, console_runtime: AgentRuntime
) -> None:
    def model(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if any(m["role"] == "tool" for m in messages):
            return text("ok")
        return tools(("run_shell", {"command": f"echo {messages[1]['content']}"}), content="may I?")

    name = fake_openai.script(model)
    runtime = console_runtime
    first = await runtime.run(agent_task(name, "inbox first"))
    [first_request] = await pending_requests(first)
    second = await runtime.run(agent_task(name, "inbox second"))
    await pending_requests(second)
    mine = await _mine(http, {first.id, second.id}, 2)
    assert [(i["task_id"], i["task"]) for i in mine] == [
        (first.id, "inbox first"),
        (second.id, "inbox second"),
    ]
    assert mine[0]["tool"] == "run_shell" and mine[0]["reason"] == "this tool always needs approval"
    assert mine[0]["arguments"]["command"] == "echo inbox first"
    assert mine[0]["model_reason"] == "may I?"
    decided = await http.post(f"/tasks/{first.id}/approve", json={"request_id": first_request})
    assert decided.status_code == 200
    assert [i["task_id"] for i in await _mine(http, {first.id, second.id}, 1)] == [second.id]
    await second.cancel()


async def test_a_task_nobody_answers_for_is_listed_unreachable_not_waited_on(
    dev_env: WorkflowEnvironment,
    console_settings: Settings,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = fake_openai.script([tools(("run_shell", {"command": "true"})), text("ok")])
    runtime = AgentRuntime(dev_env.client, console_settings)
    async with running_worker(dev_env.client, console_settings):
        handle = await runtime.run(agent_task(name, "orphan"))
        await pending_requests(handle)
    # No worker now: the state query cannot be answered. A fresh API has nothing remembered.
    monkeypatch.setattr(inbox, "TASK_READ_TIMEOUT_SECONDS", 0.5)
    api = Api(runtime)
    async with await api.start() as client:
        async with asyncio.timeout(60):
            answer = (await client.get("/approvals")).json()
        assert handle.id in answer["unreachable"]
        assert handle.id not in [i["task_id"] for i in answer["approvals"]]
    await api.stop()
    await handle.cancel()


async def test_tasks_are_listed_with_their_text_and_found_by_it(
    http: httpx.AsyncClient, fake_openai: FakeOpenAI, console_runtime: AgentRuntime
) -> None:
    name = fake_openai.script(lambda body: text("done"))
    runtime = console_runtime
    marker = f"zebra-{free_port()}"
    wanted = await runtime.run(agent_task(name, f"Find the {marker} in the list"))
    other = await runtime.run(agent_task(name, "Something else entirely"))
    await wanted.result()
    await other.result()
    fork = await runtime.fork(wanted.id, 0, message="again")  # forks start without a summary
    await fork.result()
    found: list[dict[str, Any]] = []
    async with asyncio.timeout(60):
        while len(found) < 2:  # until visibility shows the fork
            page = (await http.get("/console/api/tasks", params={"q": marker.upper()})).json()
            found = page["tasks"]
            await asyncio.sleep(0.1)
    assert {t["id"] for t in found} == {wanted.id, fork.id}
    assert {t["task"] for t in found} == {f"Find the {marker} in the list"}
    listed = (await http.get("/console/api/tasks", params={"status": "done"})).json()["tasks"]
    assert {t["status"] for t in listed} == {"done"}
    stuck = await http.get("/console/api/tasks", params={"status": "stuck"})
    assert stuck.status_code == 200
    assert (await http.get("/console/api/tasks", params={"status": "nope"})).status_code == 422


async def test_a_listed_task_carries_its_tokens_and_cache_hit_ratio(
    http: httpx.AsyncClient, fake_openai: FakeOpenAI, console_runtime: AgentRuntime
) -> None:
    name = fake_openai.script([text("done", usage=(400, 20), cached_tokens=300)])
    handle = await console_runtime.run(agent_task(name, "Count my tokens"))
    await handle.result()
    row: dict[str, Any] = {}
    async with asyncio.timeout(60):
        while not row.get("usage"):  # until visibility lists it with its memo as done
            listed = (await http.get("/console/api/tasks")).json()["tasks"]
            row = next((t for t in listed if t["id"] == handle.id), {})
            await asyncio.sleep(0.1)
    assert row["usage"] == {
        "input_tokens": 400,
        "output_tokens": 20,
        "cache_read_tokens": 300,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
        "cost_usd": None,  # its model has no price: tokens only
        "unpriced_tokens": 420,
        "cache_hit_ratio": 0.75,
    }


async def test_a_followed_up_task_is_listed_by_its_own_text_and_first_start_in_any_process(
    dev_env: WorkflowEnvironment,
    http: httpx.AsyncClient,
    fake_openai: FakeOpenAI,
    console_runtime: AgentRuntime,
) -> None:
    name = fake_openai.script(lambda body: text("done"))
    runtime = console_runtime
    marker = f"okapi-{free_port()}"
    handle = await runtime.run(agent_task(name, f"Count the {marker}s"))
    await handle.result()

    async def listed(client: httpx.AsyncClient) -> dict[str, Any] | None:
        page = (await client.get("/console/api/tasks", params={"q": marker})).json()
        found: list[dict[str, Any]] = [t for t in page["tasks"] if t["id"] == handle.id]
        return found[0] if found else None

    async with asyncio.timeout(60):
        while (before := await listed(http)) is None:  # and this API process remembers it
            await asyncio.sleep(0.1)
    first_start = before["started_at"]
    followed = await handle.send("and the zebras too")
    await followed.result()
    latest = (await dev_env.client.get_workflow_handle(handle.id).describe()).run_id
    async with asyncio.timeout(60):  # until visibility lists the follow-up's run as closed
        while not [
            e
            async for e in dev_env.client.list_workflows(
                f'WorkflowId = "{handle.id}" AND ExecutionStatus = "Completed"'
            )
            if e.run_id == latest
        ]:
            await asyncio.sleep(0.1)

    fresh = Api(runtime)  # another API process: nothing remembered
    try:
        async with await fresh.start() as other:
            for client in (http, other):
                task = await listed(client)
                assert task is not None, "the task is listed by its own text"
                assert task["task"] == f"Count the {marker}s"
                assert task["started_at"] == first_start
                [row] = [
                    t for t in (await client.get("/tasks")).json()["tasks"] if t["id"] == handle.id
                ]
                assert row["started_at"] == first_start
    finally:
        await fresh.stop()


async def test_a_task_continued_as_new_is_listed_by_its_own_text_and_first_start(
    dev_env: WorkflowEnvironment,
    http: httpx.AsyncClient,
    fake_openai: FakeOpenAI,
    console_runtime: AgentRuntime,
) -> None:
    calls = [tools(("calculator", {"expression": f"{n} + 1"})) for n in range(3)]
    name = fake_openai.script([*calls, text("done")])
    marker = f"tapir-{free_port()}"
    handle = await console_runtime.run(
        agent_task(name, f"Add up the {marker}s", continue_as_new_after_steps=1)
    )
    first = await dev_env.client.get_workflow_handle(handle.id).describe()
    await handle.result()
    latest = (await dev_env.client.get_workflow_handle(handle.id).describe()).run_id
    assert latest != first.run_id  # it continued as new
    async with asyncio.timeout(60):  # until visibility lists the last run as closed
        while not [
            e
            async for e in dev_env.client.list_workflows(
                f'WorkflowId = "{handle.id}" AND ExecutionStatus = "Completed"'
            )
            if e.run_id == latest
        ]:
            await asyncio.sleep(0.1)
    page = (await http.get("/console/api/tasks", params={"q": marker})).json()
    assert [t["task"] for t in page["tasks"]] == [f"Add up the {marker}s"]
    [row] = [t for t in (await http.get("/tasks")).json()["tasks"] if t["id"] == handle.id]
    # When the client started it (the run's own start comes a moment later, at the server).
    listed_start = datetime.fromisoformat(row["started_at"])
    assert timedelta(0) <= first.start_time - listed_start < timedelta(seconds=5), row


async def test_a_task_page_starts_from_its_whole_log_and_stream_head(
    http: httpx.AsyncClient, fake_openai: FakeOpenAI, console_runtime: AgentRuntime
) -> None:
    name = fake_openai.script([tools(("calculator", {"expression": "6*7"})), text("42")])
    runtime = console_runtime
    handle = await runtime.run(agent_task(name, "multiply"))
    await handle.result()
    timeline = (await http.get(f"/console/api/tasks/{handle.id}/timeline")).json()
    assert [e["type"] for e in timeline["events"]] == [
        "task_started",
        "thought",
        "action",
        "observation",
        "thought",
        "done",
    ]
    assert timeline["head"] == await runtime.stream_head(handle.id)
    assert (await http.get("/console/api/tasks/nope/timeline")).status_code == 404


async def test_requests_inside_a_sub_agent_name_their_chain_and_decide_the_tree(
    dev_env: WorkflowEnvironment, console_settings: Settings, fake_openai: FakeOpenAI
) -> None:
    # root -> planner -> shell: the shell agent asks for an approval and a question at once.
    leaf = fake_openai.script(
        [
            tools(
                ("run_shell", {"command": "echo deep"}),
                ("ask_person", {"question": "Which host?", "choices": ["web-1", "web-2"]}),
            ),
            text("ran on the host"),
        ]
    )
    planner = fake_openai.script(
        [tools(("agent__shell", {"task": "run it deep"})), text("planned")]
    )
    root = fake_openai.script(
        [tools(("agent__planner", {"task": "plan the run"})), text("all done")]
    )
    agents = [
        {"name": "planner", "description": "plans", "model": {"name": planner}},
        {"name": "shell", "description": "runs commands", "model": {"name": leaf}},
    ]
    settings = console_settings.model_copy(update={"agents": json.dumps(agents)})
    runtime = AgentRuntime(dev_env.client, settings)
    api = Api(runtime)
    async with running_worker(dev_env.client, settings), await api.start() as http:
        handle = await runtime.run(agent_task(root, "the root task"))
        async with asyncio.timeout(60):
            while True:
                inbox = (await http.get("/approvals")).json()
                approvals = [i for i in inbox["approvals"] if i["task_id"].startswith(handle.id)]
                asked = [i for i in inbox["questions"] if i["task_id"].startswith(handle.id)]
                if approvals and asked:
                    break
                await asyncio.sleep(0.05)
        [approval], [question] = approvals, asked
        planner_id = f"{handle.id}/1/call_1_0"  # ids derive from the parent's, step and call
        expected = {
            "root_id": handle.id,
            "root_task": "the root task",
            "parent_id": planner_id,
            "parent_task": "planner: plan the run",
            "path": ["planner", "shell"],
        }
        assert approval["chain"] == expected and question["chain"] == expected
        assert approval["task"] == "shell: run it deep"
        assert question["task_id"] == approval["task_id"]
        # A sub-agent's id holds slashes: every task route takes it, as it is or encoded.
        leaf_id = approval["task_id"]
        assert leaf_id == f"{planner_id}/1/call_1_0"
        for path in (leaf_id, quote(leaf_id, safe="")):
            assert (await http.get(f"/tasks/{path}")).json()["id"] == leaf_id
            log = (await http.get(f"/tasks/{path}/log")).json()["events"]
            assert log[0]["task_id"] == leaf_id
            timeline = await http.get(f"/console/api/tasks/{path}/timeline")
            assert timeline.json()["events"][0]["task_id"] == leaf_id
        assert (await http.get(f"/tasks/{handle.id}/nope")).status_code == 404
        # Decided from the inbox's items, the tree finishes.
        decided = await http.post(
            f"/tasks/{leaf_id}/approve", json={"request_id": approval["request_id"]}
        )
        assert decided.status_code == 200
        answered = await http.post(
            f"/tasks/{leaf_id}/answer",
            json={"request_id": question["request_id"], "answer": "web-2"},
        )
        assert answered.json()["answerer"] == "ada"
        assert (await asyncio.wait_for(handle.result(), 60)).result == "all done"
        # A task of its own names no chain.
        alone_model = fake_openai.script([tools(("run_shell", {"command": "true"}))])
        alone = await runtime.run(agent_task(alone_model, "on its own"))
        await pending_requests(alone)
        [mine] = await _mine(http, {alone.id}, 1)  # once visibility lists it waiting
        assert mine["chain"] is None
        await alone.cancel()
    await api.stop()


async def _mine(http: httpx.AsyncClient, task_ids: set[str], count: int) -> list[dict[str, Any]]:
    """The inbox's requests of these tasks, once there are `count` of them (bounded wait)."""
    async with asyncio.timeout(60):
        while True:
            answer = (await http.get("/approvals")).json()
            mine = [i for i in answer["approvals"] if i["task_id"] in task_ids]
            if len(mine) == count:
                return mine
            await asyncio.sleep(0.05)
