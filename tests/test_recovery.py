"""Failure recovery: resume a failed task, fork from any event, cancel, once-only tools."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type, wait_for_state
from waystation.activities.builtin_tools import builtin_registry
from waystation.activities.storage.errors import StorageUnavailableError
from waystation.activities.tools import Tool, ToolContext
from waystation.client.agent_runtime import AgentRuntime, TaskCancelledError, TaskFailedError
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows.models import ApprovalSettings
from waystation.workflows.options import RETRY_SAFE_TOOL


def no_approval(**kw: Any) -> dict[str, Any]:
    return {
        "approval": ApprovalSettings(policy={"run_shell": "never", "write_file": "never"}),
        **kw,
    }


def effects(settings: Settings) -> list[str]:
    path = settings.workspace_dir / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


def step_script(fake: FakeOpenAI, steps: int, answer: str = "finished") -> str:
    replies = [
        tools(("run_shell", {"command": f"echo step{i} >> effects.txt"}), content=f"step {i}")
        for i in range(1, steps)
    ]
    return fake.script([*replies, text(answer)])


async def test_resume_after_max_steps_with_a_higher_limit(
    dev_env: WorkflowEnvironment,
    dev_runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    model = step_script(fake_openai, steps=4)
    handle = await dev_runtime.run(agent_task(model, **no_approval(max_steps=2)))
    with pytest.raises(TaskFailedError, match="max_steps=2"):
        await handle.result()
    assert effects(settings) == ["step1", "step2"]

    resumed = await dev_runtime.resume(handle.id, max_steps=10)
    outcome = await resumed.result()
    assert outcome.result == "finished" and outcome.steps == 4
    assert effects(settings) == ["step1", "step2", "step3"]  # nothing done twice
    events = await resumed.events()
    assert [e.seq for e in events] == list(range(len(events)))
    [note] = of_type(events, "resumed")
    assert note.failure_kind == "max_steps" and "max_steps=2" in note.failure
    assert note.max_steps == 10
    # The log shows the failure, then the resumption, then the rest of the work.
    types = [e.type for e in events]
    assert types.index("failed") + 1 == types.index("resumed") < types.index("done")
    history = await dev_env.client.get_workflow_handle(handle.id).fetch_history()
    assert history.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED


async def test_resume_after_a_non_retryable_llm_error_calls_the_model_again(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    model = fake_openai.script(
        [
            tools(("run_shell", {"command": "echo once >> effects.txt"})),
            error(401, "Incorrect API key provided"),
            text("works now"),
        ]
    )
    handle = await dev_runtime.run(agent_task(model, **no_approval()))
    with pytest.raises(TaskFailedError, match="401"):
        await handle.result()
    resumed = await dev_runtime.resume(handle.id)
    assert (await resumed.result()).result == "works now"
    assert fake_openai.calls(model) == 3
    assert effects(settings) == ["once"]
    [note] = of_type(await resumed.events(), "resumed")
    assert note.failure_kind == "llm_error" and "Incorrect API key" in note.failure


async def test_resume_after_the_token_budget(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [tools(("calculator", {"expression": "1+1"}), usage=(900, 200)), text("2", usage=(10, 1))]
    )
    handle = await dev_runtime.run(agent_task(model, token_budget=1000))
    with pytest.raises(TaskFailedError) as failure:
        await handle.result()
    assert failure.value.kind == "token_budget"
    resumed = await dev_runtime.resume(handle.id, token_budget=5000)
    assert (await resumed.result()).result == "2"


async def test_fork_from_an_event_leaves_the_original_untouched(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    seen: list[list[dict[str, Any]]] = []

    def model_reply(body: dict[str, Any]) -> Reply:
        seen.append(body["messages"])
        tool_results = [m for m in body["messages"] if m["role"] == "tool"]
        users = [m for m in body["messages"] if m["role"] == "user"]
        if len(users) > 1:
            return text(f"new direction: {users[-1]['content']}")
        if len(tool_results) < 2:
            return tools(("calculator", {"expression": f"{len(tool_results) + 1} * 10"}))
        return text(f"sum {tool_results[0]['content']} and {tool_results[1]['content']}")

    model = fake_openai.script(model_reply)
    original = await dev_runtime.run(agent_task(model))
    assert (await original.result()).result == "sum 10 and 20"
    before = await original.events()
    first_observation = of_type(before, "observation")[0]

    fork = await dev_runtime.fork(original.id, first_observation.seq)
    assert (await fork.result()).result == "sum 10 and 20"
    forked = await fork.events()
    assert forked[: first_observation.seq + 1] == before[: first_observation.seq + 1]
    # The fork's next model call saw exactly the conversation of that point.
    assert seen[-2] == seen[1]

    second_thought = of_type(before, "thought")[1]  # mid-step: its call not yet run
    mid = await dev_runtime.fork(original.id, second_thought.seq)
    assert (await mid.result()).result == "sum 10 and 20"
    assert len(of_type(await mid.events(), "observation")) == 2

    done = before[-1]
    edited = await dev_runtime.fork(original.id, done.seq, message="use hex instead")
    assert (await edited.result()).result == "new direction: use hex instead"
    assert await original.events() == before


async def test_cancel_stops_the_running_llm_call(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    # The answer is held open mid-way until the test ends: the cancel lands inside it.
    gate = threading.Event()
    held = Reply(content=" ".join(["slow"] * 40), hold_after_chunks=10, gate=gate)
    model = fake_openai.script([held])
    try:
        handle = await dev_runtime.run(agent_task(model, timeout=60))
        stream = dev_runtime.stream(handle.id, topics=["tokens"])
        await anext(stream)  # the model is streaming
        await stream.aclose()
        await handle.cancel()
        with pytest.raises(TaskCancelledError):
            await handle.result()
    finally:
        gate.set()
    events = await handle.events()
    assert events[-1].type == "cancelled"
    history = await dev_env.client.get_workflow_handle(handle.id).fetch_history()
    kinds = [e.event_type for e in history.events]
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED in kinds
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED in kinds
    assert kinds[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED


class ChargeArgs(BaseModel):
    amount: int


def once_only_registry(ledger_file: Path) -> Any:
    async def charge(args: ChargeArgs, context: ToolContext) -> str:
        with open(ledger_file, "a") as handle:
            handle.write(f"{context.idempotency_key}\n")
        await asyncio.sleep(30)  # the worker goes away meanwhile
        return "charged"

    registry = builtin_registry()
    registry.register(
        Tool(
            name="charge_card",
            description="Charge a card (not idempotent, no ledger).",
            arguments=ChargeArgs,
            function=charge,
        )  # not declared retry-safe: the default runs it at most once
    )
    return registry


async def test_a_lost_once_only_tool_call_is_reported_not_repeated(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings, tmp_path: Path
) -> None:
    attempts = tmp_path / "charges.txt"
    registry = once_only_registry(attempts)
    model = fake_openai.script(
        lambda body: (
            text("I could not confirm the charge; not retrying")
            if body["messages"][-1]["role"] == "tool"
            else tools(("charge_card", {"amount": 5}))
        )
    )
    runtime = AgentRuntime(dev_env.client, settings)
    async with running_worker(
        dev_env.client, settings, registry=registry, graceful_shutdown=timedelta(0)
    ):
        handle = await runtime.run(agent_task(model))
        async with asyncio.timeout(60):
            while not attempts.exists():
                await asyncio.sleep(0.05)
    # That worker is gone mid-call. Another one finishes the task.
    async with running_worker(dev_env.client, settings, registry=registry):
        outcome = await asyncio.wait_for(handle.result(), 60)
        [observation] = of_type(await handle.events(), "observation")
        state = await wait_for_state(handle, lambda s: s.status == "done")
    assert outcome.result == "I could not confirm the charge; not retrying"
    assert len(attempts.read_text().splitlines()) == 1
    assert observation.is_error and "may or may not have taken effect" in observation.output
    assert state.result == outcome.result


class NoteArgs(BaseModel):
    line: str


def note_registry(notes: Path, attempts: list[int], *, lost_before: int, lost_after: int) -> Any:
    """A retry-safe tool of our own that appends through the ledger. Its first `lost_before`
    attempts cannot reach the database; those up to `lost_after` lose the connection after
    the ledger has the result (an attempt that acted, whose answer never came back)."""

    async def note(args: NoteArgs, context: ToolContext) -> str:
        attempt = activity.info().attempt
        attempts.append(attempt)
        if attempt <= lost_before:
            raise StorageUnavailableError("the database cannot be reached")
        earlier = await context.ledger.claim(context.idempotency_key, "note")
        if earlier is not None and earlier.result is not None:
            result = earlier.result
        else:
            with open(notes, "a") as handle:
                handle.write(args.line + "\n")
            result = f"noted on attempt {attempt}"
            await context.ledger.finish(context.idempotency_key, result)
        if attempt <= lost_after:
            raise StorageUnavailableError("the connection dropped before the result came back")
        return result

    registry = builtin_registry()
    registry.register(
        Tool(
            name="note",
            description="Note a line.",
            arguments=NoteArgs,
            function=note,
            retry_safe=True,  # through the ledger
        )
    )
    return registry


def noting_model(fake: FakeOpenAI) -> str:
    def reply(body: dict[str, Any]) -> Reply:
        tool_messages = [m for m in body["messages"] if m["role"] == "tool"]
        if tool_messages:
            return text(f"done: {tool_messages[-1]['content']}")
        return tools(("note", {"line": "once"}))

    return fake.script(reply)


async def test_a_retry_safe_call_outlasts_more_lost_attempts_than_ten(
    ts_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings, tmp_path: Path
) -> None:
    """Fifteen attempts lost (to the database here; to dead or starved workers alike), the
    eighth after it acted: the call ends with its own result, acted on once, not as lost."""
    notes = tmp_path / "notes.txt"
    attempts: list[int] = []
    registry = note_registry(notes, attempts, lost_before=7, lost_after=15)
    async with running_worker(ts_env.client, settings, registry=registry):
        handle = await AgentRuntime(ts_env.client, settings).run(
            agent_task(noting_model(fake_openai))
        )
        outcome = await asyncio.wait_for(handle.result(), 120)
        [observation] = of_type(await handle.events(), "observation")
    assert outcome.result == "done: noted on attempt 8"
    assert not observation.is_error and notes.read_text() == "once\n"
    assert attempts == list(range(1, 17))


async def test_a_retry_safe_call_that_never_gets_through_ends_as_a_lost_call(
    ts_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    attempts: list[int] = []
    registry = note_registry(notes, attempts, lost_before=10**6, lost_after=0)
    async with running_worker(ts_env.client, settings, registry=registry):
        handle = await AgentRuntime(ts_env.client, settings).run(
            agent_task(noting_model(fake_openai))
        )
        outcome = await asyncio.wait_for(handle.result(), 120)
        [observation] = of_type(await handle.events(), "observation")
    assert observation.is_error and "may or may not have taken effect" in observation.output
    assert outcome.result.startswith("done: note did not complete")
    assert len(attempts) == RETRY_SAFE_TOOL.maximum_attempts and not notes.exists()
