"""What a user hands the Python API: bad input is refused before anything starts, a fresh
workspace is ready for the tasks README shows, and a cancel beats a failing model call."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from tests.helpers import agent_task, of_type, pending_requests
from waystation.client.agent_runtime import AgentRuntime, TaskCancelledError, UnknownToolsError
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, hang, text, tools
from waystation.workflows.models import AgentTask


async def test_a_blank_task_is_a_validation_error(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("never asked")])
    with pytest.raises(ValidationError, match="must contain something other than whitespace"):
        await dev_runtime.run(" \n\t ")
    with pytest.raises(ValidationError, match="whitespace"):
        agent_task(model, task="   ")
    assert fake_openai.calls(model) == 0


async def test_unknown_tools_are_refused_naming_them_and_mcp_tools_of_the_tasks_servers_pass(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("never asked")])
    task = agent_task(model, tools=["calculator", "teleport", "docs__search", "git__log"])
    with pytest.raises(UnknownToolsError) as refused:
        await dev_runtime.run(task.model_copy(update={"mcp_servers": ["git"]}))
    assert refused.value.names == ["teleport", "docs__search"]
    assert "unknown tool(s) in the task's tools: 'teleport', 'docs__search'" in str(refused.value)
    assert "server__tool for the servers git" in str(refused.value)
    assert fake_openai.calls(model) == 0
    # The tools of a server the task names are listed by the worker, so any name of it passes.
    named = AgentTask(task="x", tools=["calculator", "git__log"], mcp_servers=["git"])
    dev_runtime.check_tools(named)


async def test_a_fresh_workspace_has_scratch_for_the_shell(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    model = fake_openai.script(
        [tools(("run_shell", {"command": "echo hi > scratch/x.txt"})), text("wrote it")]
    )
    handle = await dev_runtime.run(agent_task(model, task="Run `echo hi > scratch/x.txt`"))
    await pending_requests(handle)
    await handle.approve()
    assert (await handle.result()).result == "wrote it"
    [observation] = of_type(await handle.events(), "observation")
    assert not observation.is_error and "exit code 0" in observation.output, observation.output
    assert (settings.workspace_dir / "scratch" / "x.txt").read_text() == "hi\n"


async def test_a_cancel_wins_over_a_model_call_that_keeps_failing(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    # Each attempt hangs, then the connection drops: a failed attempt, retried. Heartbeats
    # are rare, so the attempt in flight fails before it hears of the cancel.
    model = fake_openai.script(lambda body: hang(2))
    task = agent_task(model, timeout=30, heartbeat_timeout_seconds=60)
    handle = await dev_runtime.run(task)
    async with asyncio.timeout(60):
        while fake_openai.calls(model) < 2:  # failed once, and retrying
            await asyncio.sleep(0.05)
    await handle.cancel()
    with pytest.raises(TaskCancelledError):
        await handle.result()
    events = await handle.events()
    assert events[-1].type == "cancelled" and not of_type(events, "failed")
    # Ended by the cancel, not by running out of attempts.
    assert fake_openai.calls(model) < task.model.max_attempts
