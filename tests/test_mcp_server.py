"""waystation as an MCP server, driven by the `mcp` SDK's own client against the dev server:
over stdio (`python starter.py mcp` as a subprocess hosting its worker) and over streamable
HTTP at the API's /mcp (bearer tokens: a reader starts and reads, an approver decides)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from temporalio.testing import WorkflowEnvironment

from tests.helpers import serving_api
from waystation.client.agent_runtime import AgentRuntime
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.workers import REPO, running_worker, worker_environment

READER = "reader-token"
APPROVER = "approver-token"
TOOLS = {
    "run_task",
    "task_status",
    "task_events",
    "approve",
    "reject",
    "answer",
    "send_message",
    "cancel",
}


def shell_then_answer(fake_openai: FakeOpenAI) -> str:
    """A model that runs a shell command (always needs approval), then answers."""
    return fake_openai.script(
        [tools(("run_shell", {"command": "echo approved >> effects.txt"})), text("ran it")]
    )


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def status_when(client: Client, task_id: str, status: str) -> dict[str, Any]:
    """task_status, polled until the task reaches `status` (bounded)."""
    async with asyncio.timeout(60):
        while True:
            view = await call(client, "task_status", task_id=task_id)
            if view["status"] == status:
                return view
            await asyncio.sleep(0.1)


async def approve_round_trip(client: Client, model: str, settings: Settings) -> dict[str, Any]:
    """Start a task, see its approval request, approve it, and read it done."""
    assert TOOLS <= {t.name for t in (await client.list_tools()).tools}
    started = await call(client, "run_task", task="write it down", model=model)
    task_id = started["task_id"]
    waiting = await status_when(client, task_id, "waiting_approval")
    [pending] = waiting["pending_approvals"]
    assert pending["tool"] == "run_shell"
    assert (settings.workspace_dir / "effects.txt").exists() is False
    decided = await call(
        client, "approve", task_id=task_id, request_id=pending["request_id"], message="go"
    )
    assert decided["decision"] == "approve" and decided["duplicate"] is False
    done = await status_when(client, task_id, "done")
    assert done["result"] == "ran it"
    assert (settings.workspace_dir / "effects.txt").read_text() == "approved\n"
    page = await call(client, "task_events", task_id=task_id, since=0)
    kinds = [e["type"] for e in page["events"]]
    assert kinds[0] == "task_started" and kinds[-1] == "done"
    assert "approval_resolved" in kinds and page["next_seq"] == len(kinds)
    later = await call(client, "task_events", task_id=task_id, since=page["next_seq"] - 1)
    assert [e["type"] for e in later["events"]] == ["done"]
    return decided


async def test_an_mcp_client_drives_a_task_over_stdio(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    address = dev_env.client.service_client.config.target_host
    server = StdioServerParameters(
        command=sys.executable,
        args=[str(REPO / "starter.py"), "mcp"],
        env=worker_environment(address, settings),
        cwd=REPO,
    )
    async with Client(server) as client:
        decided = await approve_round_trip(client, shell_then_answer(fake_openai), settings)
        assert decided["approver"].endswith("@mcp")  # the local user, over stdio
        missing = await client.call_tool("task_status", {"task_id": "no-such-task"})
        assert missing.is_error and "no task with id 'no-such-task'" in str(missing.content)


@pytest.fixture
async def api(dev_env: WorkflowEnvironment, settings: Settings) -> AsyncIterator[str]:
    """The HTTP API on a free port with a reader and an approver token, and a worker."""
    settings = settings.model_copy(
        update={
            "api_tokens": {
                READER: ApiToken(role="reader", name="rita"),
                APPROVER: ApiToken(role="approver", name="alice"),
            }
        }
    )
    app = create_app(settings, AgentRuntime(dev_env.client, settings))
    async with serving_api(app) as port:
        async with running_worker(dev_env.client, settings):
            yield f"http://127.0.0.1:{port}/mcp"


@asynccontextmanager
async def mcp_client(url: str, token: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


async def test_over_http_a_reader_starts_and_reads_but_only_an_approver_decides(
    api: str, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = shell_then_answer(fake_openai)
    async with mcp_client(api, READER) as reader:
        started = await call(reader, "run_task", task="write it down", model=model)
        task_id = started["task_id"]
        waiting = await status_when(reader, task_id, "waiting_approval")
        [pending] = waiting["pending_approvals"]
        refused = await reader.call_tool("approve", {"task_id": task_id})
        assert refused.is_error
        assert "rita may read and start tasks, not decide" in str(refused.content)
        not_cancelled = await reader.call_tool("cancel", {"task_id": task_id})
        assert not_cancelled.is_error
        assert (await call(reader, "task_status", task_id=task_id))["status"] == (
            "waiting_approval"
        )
    async with mcp_client(api, APPROVER) as approver:
        decided = await call(approver, "approve", task_id=task_id, request_id=pending["request_id"])
        assert decided["approver"] == "alice"  # from the token, as on the REST routes
        assert (await status_when(approver, task_id, "done"))["result"] == "ran it"


async def test_over_http_the_round_trip_of_an_approver(
    api: str, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    async with mcp_client(api, APPROVER) as client:
        decided = await approve_round_trip(client, shell_then_answer(fake_openai), settings)
        assert decided["approver"] == "alice"


async def test_over_http_a_request_without_a_known_token_is_refused(api: str) -> None:
    async with httpx.AsyncClient() as plain:
        answer = await plain.post(api, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer"
    with pytest.raises(ExceptionGroup) as refused:
        async with mcp_client(api, "wrong-token") as client:
            await client.list_tools()
    assert refused.group_contains(MCPError)


async def test_over_http_an_approver_rejects_one_task_and_cancels_another(
    api: str, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    async with mcp_client(api, APPROVER) as client:
        first = await call(client, "run_task", task="one", model=shell_then_answer(fake_openai))
        second = await call(client, "run_task", task="two", model=shell_then_answer(fake_openai))
        await status_when(client, first["task_id"], "waiting_approval")
        rejected = await call(client, "reject", task_id=first["task_id"], message="not today")
        assert (rejected["decision"], rejected["message"]) == ("reject", "not today")
        await status_when(client, first["task_id"], "done")
        page = await call(client, "task_events", task_id=first["task_id"])
        [resolved] = [e for e in page["events"] if e["type"] == "approval_resolved"]
        assert (resolved["decision"], resolved["approver"]) == ("reject", "alice")
        await status_when(client, second["task_id"], "waiting_approval")
        cancelling = await call(client, "cancel", task_id=second["task_id"])
        assert cancelling == {"task_id": second["task_id"], "status": "cancelling"}
        await status_when(client, second["task_id"], "cancelled")
        bad_page = await client.call_tool("task_events", {"task_id": first["task_id"], "limit": 0})
        assert bad_page.is_error and "limit 1..1000" in str(bad_page.content)
    assert not (settings.workspace_dir / "effects.txt").exists()  # neither command ran


async def test_over_http_send_message_follows_up_a_task_that_answered(
    api: str, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("first"), text("the follow-up's answer")])
    async with mcp_client(api, APPROVER) as client:
        started = await call(client, "run_task", task="hello", model=model)
        task_id = started["task_id"]
        await status_when(client, task_id, "done")
        sent = await call(client, "send_message", task_id=task_id, content="and then?")
        assert sent["follow_up"] is True and sent["message_id"]
        async with asyncio.timeout(60):
            while (view := await call(client, "task_status", task_id=task_id))[
                "result"
            ] != "the follow-up's answer":
                await asyncio.sleep(0.1)
        assert view["status"] == "done"
        empty = await client.call_tool("send_message", {"task_id": task_id, "content": " "})
        assert empty.is_error and "invalid message" in str(empty.content)
    async with mcp_client(api, READER) as reader:
        refused = await reader.call_tool("send_message", {"task_id": task_id, "content": "hi"})
        assert refused.is_error and "not decide, send messages or cancel" in str(refused.content)


async def test_over_http_an_approver_answers_a_question_the_agent_asked(
    api: str, fake_openai: FakeOpenAI
) -> None:
    def reply(body: dict[str, Any]) -> Any:
        told = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if not told:
            return tools(("ask_person", {"question": "Your name?"}))
        return text(f"hello, {told[-1]}")

    model = fake_openai.script(reply)
    async with mcp_client(api, APPROVER) as client:
        task_id = (await call(client, "run_task", task="greet me", model=model))["task_id"]
        waiting = await status_when(client, task_id, "waiting_input")
        [question] = waiting["pending_questions"]
        assert question["question"] == "Your name?"
        answered = await call(client, "answer", task_id=task_id, answer="Ada")
        assert (answered["answer"], answered["answerer"]) == ("Ada", "alice")
        done = await status_when(client, task_id, "done")
        assert done["result"] == "hello, alice answered: Ada"
