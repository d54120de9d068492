"""Tasks that use MCP tools end to end: a third-party server, approval and retries as the
tools' annotations say, a worker SIGKILLed in the middle of an MCP call, a server that
restarts under a waiting task, one that cannot start, one whose tools change mid-task, and
a listing that fails past its retries."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.chaos.workload import replay_all
from tests.helpers import agent_task, of_type, wait_for_state
from waystation.activities.builtin_tools import builtin_registry
from waystation.activities.conversation_store import ConversationStore
from waystation.activities.event_archive import ArchiveActivities, EventArchive
from waystation.activities.llm import LlmActivities
from waystation.activities.notify.delivery import NotificationActivities, webhook_retry
from waystation.activities.payload_codec import payload_codec
from waystation.activities.sealed_blobs import SealedBlobs
from waystation.activities.storage import Storage
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.settings.mcp_servers import McpServerConfig
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.mcp import CallLog, demo_stdio, running_http_server
from waystation.testing.proc import parent_of
from waystation.testing.workers import WorkerProcess, running_worker
from waystation.worker import WORKFLOW_RUNNER
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.tool_catalog import ListToolsRequest, ToolCatalog

BIN = Path(sys.executable).parent


def with_servers(settings: Settings, servers: dict[str, Any]) -> Settings:
    return settings.model_copy(update={"mcp_servers": servers})


def scheduled_activities(history: Any) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


def answer_after_tools(*calls: tuple[str, dict[str, Any]]) -> Any:
    """A model that makes these calls in one step, then answers with what came back."""

    def reply(body: dict[str, Any]) -> Reply:
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if results:
            return text(" | ".join(results))
        return tools(*calls)

    return reply


async def test_a_task_uses_a_tool_of_a_third_party_mcp_server(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    time_server = McpServerConfig(
        command=str(BIN / "mcp-server-time"), args=["--local-timezone", "UTC"]
    )
    settings = with_servers(settings, {"time": time_server})
    model = fake_openai.script(
        answer_after_tools(("time__get_current_time", {"timezone": "Europe/Paris"}))
    )
    async with running_worker(dev_env.client, settings):
        runtime = AgentRuntime(dev_env.client, settings)
        handle = await runtime.run(agent_task(model))  # every configured server by default
        outcome = await handle.result()
        events = await handle.events()
    assert "Europe/Paris" in outcome.result and "datetime" in outcome.result
    offered = {t["function"]["name"] for t in fake_openai.requests[model][0]["tools"]}
    assert {"time__get_current_time", "time__convert_time", "calculator"} <= offered
    assert of_type(events, "approval_requested") == []  # a read-only tool asks nobody
    # The tool set the task saw is in its history: one listing, before the first model call.
    history = await dev_env.client.get_workflow_handle(handle.id).fetch_history()
    scheduled = scheduled_activities(history)
    assert scheduled[:2] == ["list_tools", "call_llm"] and scheduled.count("list_tools") == 1


async def test_approval_and_retries_follow_the_tools_annotations(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    log = CallLog(tmp_path / "calls.jsonl")
    settings = with_servers(settings, {"demo": demo_stdio(log)})
    model = fake_openai.script(
        answer_after_tools(
            ("demo__lookup", {"key": "k"}),
            ("demo__delete_note", {"name": "n"}),
            ("demo__set_flag", {"name": "f", "value": True}),
        )
    )
    async with running_worker(dev_env.client, settings):
        runtime = AgentRuntime(dev_env.client, settings)
        handle = await runtime.run(agent_task(model, mcp_servers=["demo"]))
        state = await wait_for_state(handle, lambda s: len(s.pending_approvals) == 2, 60)
        asked = sorted(p.tool for p in state.pending_approvals.values())
        assert asked == ["demo__delete_note", "demo__set_flag"]  # read-only: never asks
        for request in state.pending_approvals:
            await handle.approve(request, approver="ann")
        await handle.result()
        [thought] = of_type(await handle.events(), "thought")[:1]
    retry_safe = {c.tool: c.retry_safe for c in thought.tool_calls}
    assert retry_safe == {"demo__lookup": True, "demo__delete_note": False, "demo__set_flag": True}
    keys = {e["tool"]: e["key"] for e in log.entries() if e["event"] == "done"}
    assert keys == {
        tool: f"{handle.id}/1/call_1_{i}"
        for i, tool in enumerate(["lookup", "delete_note", "set_flag"])
    }


@pytest.mark.long(minutes=0.5)
async def test_a_worker_killed_inside_mcp_calls_retries_only_what_may_be_retried(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """The worker (the MCP server's parent) is SIGKILLed while each call provably runs: the
    idempotent call runs again on another worker; the other is reported, never repeated."""
    log = CallLog(tmp_path / "calls.jsonl")
    gates = {name: tmp_path / f"gate-{name}" for name in ("a", "b")}
    servers = {"demo": demo_stdio(log).model_dump(mode="json")}
    env = {"WAYSTATION_MCP_SERVERS": json.dumps(servers)}
    address = dev_env.client.service_client.config.target_host
    model = fake_openai.script(
        [
            tools(("demo__slow_idempotent", {"gate": str(gates["a"]), "label": "a"})),
            tools(("demo__slow", {"gate": str(gates["b"]), "label": "b"})),
            text("both settled"),
        ]
    )
    task = agent_task(model, mcp_servers=["demo"])
    task.approval.policy.update({"demo__slow_idempotent": "never", "demo__slow": "never"})
    workers = [await WorkerProcess(address, settings, extra_env=env).ready()]
    handle = await AgentRuntime(dev_env.client, settings).run(task)

    async def kill_the_worker_running(tool: str) -> None:
        async with asyncio.timeout(60):
            while not (
                runs := [e for e in log.entries() if (e["tool"], e["event"]) == (tool, "start")]
            ):
                await asyncio.sleep(0.05)  # another process writes the log: nothing to await
        victim = next(w for w in workers if w.pid == parent_of(runs[-1]["pid"]))
        workers.remove(victim)
        victim.kill()
        workers.append(await WorkerProcess(address, settings, extra_env=env).ready())

    try:
        await kill_the_worker_running("slow_idempotent")
        async with asyncio.timeout(60):  # the retry starts the call again on a new server
            while log.events("slow_idempotent").count("start") < 2:
                await asyncio.sleep(0.05)
        gates["a"].touch()
        await kill_the_worker_running("slow")
        outcome = await handle.result()
        observations = [o.output for o in of_type(await handle.events(), "observation")]
        await replay_all(dev_env.client, [handle])
    finally:
        for gate in gates.values():
            gate.touch()
        for worker in workers:
            worker.kill()
    assert outcome.result == "both settled"
    assert log.events("slow_idempotent").count("start") == 2  # retried: idempotent
    assert log.events("slow").count("start") == 1  # at most once
    assert observations[0] == "a: released"
    assert "may or may not have taken effect" in observations[1]


async def test_a_task_waiting_for_approval_survives_its_http_server_restarting(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """The issue's repro: the server restarts while a call waits at the approval gate. The
    approved call (retry-safe) runs on a new session; the next task gets the server's tools."""
    log = CallLog(tmp_path / "calls.jsonl")
    async with running_http_server(log, {"DEMO_UNKNOWN_SESSION": "400"}) as server:
        remote = McpServerConfig(url=server.url, protocol="legacy")  # a session-ful revision
        settings = with_servers(settings, {"remote": remote})
        model = fake_openai.script(
            answer_after_tools(("remote__set_flag", {"name": "f", "value": True}))
        )
        async with running_worker(dev_env.client, settings):
            runtime = AgentRuntime(dev_env.client, settings)
            handle = await runtime.run(agent_task(model, mcp_servers=["remote"]))
            state = await wait_for_state(handle, lambda s: len(s.pending_approvals) == 1, 60)
            await server.restart()
            await handle.approve(next(iter(state.pending_approvals)), approver="ann")
            outcome = await handle.result()
            following = await runtime.run(
                agent_task(fake_openai.script([text("ok")]), mcp_servers=["remote"])
            )
            await following.result()
            errors = of_type(await following.events(), "error")
    assert outcome.result == "f = True"
    assert log.events("set_flag") == ["done"]
    assert errors == []  # the next task listed the server's tools


async def test_the_model_is_told_which_servers_are_unavailable_and_why(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    log = CallLog(tmp_path / "calls.jsonl")
    servers = {"demo": demo_stdio(log), "quits": demo_stdio(log, env={"DEMO_FAIL_ON_START": "1"})}
    settings = with_servers(settings, servers)
    model = fake_openai.script(answer_after_tools(("quits__echo", {"text": "hi"})))
    async with running_worker(dev_env.client, settings):
        handle = await AgentRuntime(dev_env.client, settings).run(
            agent_task(model, mcp_servers=["demo", "quits"])
        )
        outcome = await handle.result()
        events = await handle.events()
    [first, second] = fake_openai.requests[model]
    for request in (first, second):  # each call is told, before anything else
        system = request["messages"][0]
        assert system["role"] == "system"
        note = system["content"].split("\n\n")[-1].splitlines()
        assert note[0] == "These MCP servers are unavailable; none of their tools can be called:"
        assert note[1].startswith("- MCP server 'quits' could not start: it exited; its stderr")
        assert "refusing to start (DEMO_FAIL_ON_START)" in note[1] and len(note) == 2
    offered = {t["function"]["name"] for t in first["tools"]}
    assert "demo__lookup" in offered and not any(n.startswith("quits__") for n in offered)
    assert outcome.result.startswith("'quits__echo' cannot be called: MCP server 'quits' could")
    assert "the MCP tools you can call are: demo__lookup" in outcome.result
    # History stays as it was: the note is made from the recorded catalog on each call.
    [error] = of_type(events, "error")
    assert error.kind == "mcp_server" and "refusing to start" in error.message
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_a_server_whose_tools_change_is_listed_again_before_the_next_step(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    tmp_path: Path,
    protocol: str,
) -> None:
    log = CallLog(tmp_path / "calls.jsonl")
    settings = with_servers(settings, {"demo": demo_stdio(log, protocol)})  # type: ignore[arg-type]
    model = fake_openai.script(
        [
            tools(("demo__add_tool", {"name": "fresh"})),  # announces tools/list_changed
            tools(("demo__fresh", {})),
            text("done"),
        ]
    )
    task = agent_task(model, mcp_servers=["demo"])
    task.approval.policy.update({"demo__add_tool": "never", "demo__fresh": "never"})
    async with running_worker(dev_env.client, settings):
        handle = await AgentRuntime(dev_env.client, settings).run(task)
        await handle.result()
        observations = [o.output for o in of_type(await handle.events(), "observation")]
        history = await dev_env.client.get_workflow_handle(handle.id).fetch_history()
    offered = [{t["function"]["name"] for t in r["tools"]} for r in fake_openai.requests[model]]
    assert "demo__fresh" not in offered[0] and "demo__fresh" in offered[1]
    assert observations == ["added fresh", "fresh ran"]
    assert scheduled_activities(history) == [
        "list_tools",
        "call_llm",
        "run_tool",
        "list_tools",
        "call_llm",
        "run_tool",
        "call_llm",
    ]
    await replay_all(dev_env.client, [handle])


async def test_a_listing_that_fails_past_its_retries_leaves_the_task_going_without_it(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """Every attempt of list_tools fails (here a worker whose listing breaks): the task does
    not fail raw; it goes on without the server's tools, with an error event, as when a
    server cannot start."""
    log = CallLog(tmp_path / "calls.jsonl")
    settings = with_servers(settings, {"demo": demo_stdio(log)})
    model = fake_openai.script(answer_after_tools(("demo__lookup", {"key": "k"})))
    async with listing_breaks(dev_env.client, settings):
        handle = await AgentRuntime(dev_env.client, settings).run(
            agent_task(model, mcp_servers=["demo"])
        )
        outcome = await handle.result()
        events = await handle.events()
        await replay_all(dev_env.client, [handle])
    [error] = of_type(events, "error")
    assert error.kind == "mcp_server"
    assert error.message.endswith(
        "MCP server 'demo': listing its tools failed past every retry: the listing broke"
    )
    assert outcome.result.startswith("'demo__lookup' cannot be called: MCP server 'demo': list")
    system = fake_openai.requests[model][0]["messages"][0]["content"]
    assert "- MCP server 'demo': listing its tools failed past every retry" in system
    assert log.events() == []  # the server was never started


@asynccontextmanager
async def listing_breaks(client: Client, settings: Settings) -> AsyncIterator[None]:
    """A worker with the agent workflow and worker.py's model activities, whose `list_tools`
    fails (for good: the workflow sees what it sees once the retries are spent)."""

    @activity.defn(name="list_tools")
    async def broken_listing(request: ListToolsRequest) -> ToolCatalog:
        raise ApplicationError("the listing broke", non_retryable=True)

    storage = Storage.from_settings(settings)
    await storage.open()
    blobs = SealedBlobs(storage.blobs, payload_codec(settings))
    store = ConversationStore(blobs)
    llm = LlmActivities(
        builtin_registry(), store, api_key=settings.api_key, base_url=settings.openai_base_url
    )
    # Every run asks its worker, by a local activity, whom it tells of what, and seals what
    # its readers need as it closes by another.
    notify = NotificationActivities(settings.webhook_endpoints(), webhook_retry(settings), None)
    archive = ArchiveActivities(
        EventArchive(SealedBlobs(storage.blobs, payload_codec(settings))), store
    )
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[AgentWorkflow],
        activities=[
            llm.call_llm,
            llm.save_conversation,
            broken_listing,
            notify.notification_targets,
            archive.seal_run,
        ],
        workflow_runner=WORKFLOW_RUNNER,
    )
    try:
        async with worker:
            yield
    finally:
        await llm.close()
        await storage.close()
